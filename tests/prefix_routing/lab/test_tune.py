"""The PREFIX_AWARE grid, its frontier and recommendation (prefix_routing.lab.tune)."""

from __future__ import annotations

import pytest

from prefix_routing import lab
from prefix_routing.lab.fleet_config import FleetConfig


def test_tune_recommends_a_key_beyond_the_shared_block(trace, tmp_path):
    result = lab.tune(
        trace,
        FleetConfig(instances=8),
        prefix_lengths=[1024, 2048, 4096, 8192],
        thresholds=[1, 4, 16, 1024],
        progress=False,
    )
    rec = result["recommendation"]
    assert rec["prefix_length"] > 2048 and rec["key_blocks"] >= 2
    assert rec["hit_rate"] >= 0.95 * result["best_hit_rate"]
    assert rec["max_mean_requests"] <= 1.2
    assert f"prefix_length = {rec['prefix_length']}" in result["snippet"]
    assert f"concurrency_threshold = {rec['concurrency_threshold']}" in result["snippet"]
    # The hot spot of a first-block key is visible in the grid.
    hot = [p for p in result["points"] if p["prefix_length"] == 1024 and p["concurrency_threshold"] == 1024]
    assert hot[0]["max_mean_requests"] == 8.0
    # Low thresholds spill and lose hits.
    low = [p for p in result["points"] if p["prefix_length"] == 4096 and p["concurrency_threshold"] == 1]
    assert low[0]["spills"] > 0 and low[0]["hit_rate"] < rec["hit_rate"] - 0.05
    assert [b["strategy"] for b in result["baselines"]] == ["RANDOM", "LEAST_OUTSTANDING_REQUESTS"]
    assert result["frontier"]
    (path,) = lab.plot_tune(result, tmp_path)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_tune_rejects_out_of_range_settings(mooncake_slice):
    from prefix_routing.rules.errors import UserError

    with pytest.raises(UserError, match="prefix length 512"):
        lab.tune(mooncake_slice.head(10), FleetConfig(), prefix_lengths=[512], thresholds=[1])
    with pytest.raises(UserError, match="concurrency threshold 0"):
        lab.tune(mooncake_slice.head(10), FleetConfig(), prefix_lengths=[4096], thresholds=[0])
