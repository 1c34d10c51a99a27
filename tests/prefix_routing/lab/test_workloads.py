"""The long-context reconstruction (prefix_routing.lab.workloads)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prefix_routing import lab
from prefix_routing.lab.routing import Strategy


@pytest.fixture(scope="module")
def long_context():
    spec = lab.LongContextSpec()
    workload = lab.long_context_workload(spec, seed=0)
    results = lab.simulate_many(workload, spec.fleet_config(), [Strategy.RANDOM, Strategy.PREFIX_AWARE], progress=False)
    return spec, workload, {r.strategy: r for r in results}


def test_long_context_workload_shape(long_context):
    spec, workload, _ = long_context
    assert spec.instances == 7 and spec.preset == "p5.48xlarge-llama3.1-70b"
    assert 0.9 * spec.rate_rps * spec.duration_s < len(workload) < 1.1 * spec.rate_rps * spec.duration_s
    assert min(workload.prompt_tokens) >= 9500 and max(workload.prompt_tokens) <= 9800
    assert all(100 <= o <= 300 for o in workload.output_tokens)
    prefixes = {b[31] for b in workload.blocks}
    assert len(prefixes) == spec.prefixes
    assert lab.long_context_workload(spec, seed=0).blocks[:50] == workload.blocks[:50]


def test_long_context_reproduces_the_blog(long_context):
    """AWS: P50 TTFT −71 to −77 %, hit rate ≈25 % → 82 %. Acceptance: −60 % or better, ≈25 % → ≥ 75 %."""
    _, _, r = long_context
    random_, prefix = r["RANDOM"], r["PREFIX_AWARE"]
    assert 0.20 <= random_.hit_rate <= 0.30, random_.hit_rate
    assert prefix.hit_rate >= 0.75, prefix.hit_rate
    assert prefix.ttft_p50_s <= 0.40 * random_.ttft_p50_s
    assert prefix.max_mean_requests < 1.35
    assert random_.timeouts == prefix.timeouts == 0


def test_long_context_with_700_prefixes_keeps_the_direction():
    """The reconstruction's 700 prefixes: RANDOM lower than the blog's 25 %, same direction."""
    spec = replace(lab.LongContextSpec(), prefixes=700, duration_s=1800)
    workload = lab.long_context_workload(spec, seed=1)
    random_, prefix = lab.simulate_many(workload, spec.fleet_config(), [Strategy.RANDOM, Strategy.PREFIX_AWARE], progress=False)
    assert 0.10 <= random_.hit_rate <= 0.20
    assert prefix.hit_rate >= 0.65
    assert prefix.ttft_p50_s <= 0.40 * random_.ttft_p50_s
