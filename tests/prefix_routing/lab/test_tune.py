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


def test_tune_sweeps_replication_and_recommends_it_when_only_it_meets_the_imbalance_bound():
    from prefix_routing.lab.tune import tune
    from prefix_routing.lab.workloads import LongContextSpec, long_context_workload
    from prefix_routing.rules.replication import ReplicationSettings

    spec = LongContextSpec(zipf=1.1, duration_s=1200)
    trace = long_context_workload(spec, seed=1)
    quarter = ReplicationSettings(enabled=True, target_share_factor=0.25, max_replicas=16)
    result = tune(trace, spec.fleet_config(seed=1), prefix_lengths=[4096], thresholds=[10], baselines=(),
                  replications=[None, quarter], max_imbalance=1.6)
    off, on = sorted(result["points"], key=lambda p: p["replication"] is not None)
    assert off["replication"] is None and on["replication"] == 0.25
    assert off["max_mean_requests"] > 1.6 >= on["max_mean_requests"]  # Zipf piles the top prefixes up
    assert result["recommendation"]["replication"] == 0.25
    assert "[normalizer.replication]\nenabled = true\ntarget_share_factor = 0.25\nmax_replicas = 16" in result["snippet"]
    # Without a sweep the snippet is the routing table alone, as before.
    plain = tune(trace, spec.fleet_config(seed=1), prefix_lengths=[4096], thresholds=[10], baselines=())
    assert "replication" not in plain["snippet"] and plain["recommendation"]["replication"] is None


def _count_simulations(monkeypatch) -> list:
    """The configs tune simulates, in order (its simulate spied on)."""
    import sys

    tune_module = sys.modules["prefix_routing.lab.tune"]
    calls = []
    real = tune_module.simulate
    monkeypatch.setattr(tune_module, "simulate", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    return calls


def test_a_memo_kept_between_calls_simulates_each_setting_once_with_the_same_points(mooncake_slice, monkeypatch):
    calls = _count_simulations(monkeypatch)
    trace, config = mooncake_slice.head(300), FleetConfig(instances=4)
    memo: dict = {}
    first = lab.tune(trace, config, prefix_lengths=[1024, 4096], thresholds=[8], baselines=(), memo=memo)
    assert len(calls) == 2
    # The second pass repeats (4096, 8) and adds (4096, 2): one new simulation only.
    second = lab.tune(trace, config, prefix_lengths=[4096], thresholds=[2, 8], baselines=(), memo=memo)
    assert len(calls) == 3 and calls[-1].concurrency_threshold == 2
    fresh = lab.tune(trace, config, prefix_lengths=[4096], thresholds=[2, 8], baselines=())
    assert second["points"] == fresh["points"]
    assert [p for p in first["points"] if p["prefix_length"] == 4096] == [
        p for p in second["points"] if p["concurrency_threshold"] == 8]


def test_a_threshold_above_one_that_spilled_nothing_is_that_run_and_is_not_simulated_again(mooncake_slice, monkeypatch):
    calls = _count_simulations(monkeypatch)
    trace, config = mooncake_slice.head(300), FleetConfig(instances=4)
    result = lab.tune(trace, config, prefix_lengths=[4096], thresholds=[1, 64, 128, 1024], baselines=())
    spills = {p["concurrency_threshold"]: p["spills"] for p in result["points"]}
    assert spills[1] > 0 and spills[64] == 0  # threshold 1 spills; 64 spills nothing, so neither do 128, 1024
    assert [c.concurrency_threshold for c in calls] == [1, 64]
    for p in result["points"]:  # each point is what a run of its own gives
        own = lab.simulate(trace, FleetConfig(instances=4, prefix_length=4096,
                                              concurrency_threshold=p["concurrency_threshold"]))
        assert (p["hit_rate"], p["ttft_p50_s"], p["ttft_p99_s"], p["max_mean_requests"], p["spills"]) == (
            own.hit_rate, own.ttft_p50_s, own.ttft_p99_s, own.max_mean_requests, own.spills)
        assert p["concurrency_threshold"] == own.config.concurrency_threshold


def test_a_run_that_spilled_nothing_never_stands_for_a_lower_threshold(mooncake_slice, monkeypatch):
    calls = _count_simulations(monkeypatch)
    trace, config = mooncake_slice.head(300), FleetConfig(instances=4)
    memo: dict = {}
    lab.tune(trace, config, prefix_lengths=[4096], thresholds=[1024], baselines=(), memo=memo)
    result = lab.tune(trace, config, prefix_lengths=[4096], thresholds=[1], baselines=(), memo=memo)
    assert [c.concurrency_threshold for c in calls] == [1024, 1] and result["points"][0]["spills"] > 0


def test_a_grid_on_a_sample_gives_each_point_its_bands():
    # 1,000 keys alike, 10 % of them on 10 whole instances of 100: each point's bands are those of its
    # own run (lab/sampling.result_bands at the sampled key length); the whole trace's carry none.
    from prefix_routing.lab import sampling
    from prefix_routing.lab.trace_data import Trace

    n = 20_000
    trace = Trace([i * 0.01 for i in range(n)], [600] * n, [10] * n, [[i % 1000, 10_000 + i] for i in range(n)],
                  block_tokens=100, source="t", chained=False)
    config = FleetConfig(instances=100, block_tokens=100, block_bytes=1024, prefix_length=1024)
    part, fleet, share = sampling.shrink(trace, config, 0.1)
    memo: dict = {}
    result = lab.tune(part, fleet, prefix_lengths=[1024], thresholds=[8], baselines=(), progress=False, speed=1 / share,
                      sample_rate=0.1, memo=memo)
    (run,) = [r for key, r in memo.items() if len(key) == 3]  # the one simulation of the grid
    point = result["points"][0]
    assert point["bands"] == sampling.result_bands(run, part, 0.1, point["key_blocks"])
    assert 0 < point["bands"]["hit_rate"] < 0.05
    whole = lab.tune(part, fleet, prefix_lengths=[1024], thresholds=[8], baselines=(), progress=False)
    assert "bands" not in whole["points"][0]
