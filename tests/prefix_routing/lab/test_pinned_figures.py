"""The lab's figures on the Mooncake trace, pinned: work on the simulator's speed must not move them.

Recorded on 2026-12-02 (the figures the lab gave before its speed work: the same on the commit
before it and after). A change that moves them on purpose (a better model) updates them here and
says why in its commit; a speed-up must leave them exactly as they are.
"""

from __future__ import annotations

import pytest

from prefix_routing import lab
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.routing import Strategy

# The slice in tests/data (1,000 requests), 8 instances, 200,000-token LRU caches.
SLICE = {
    Strategy.RANDOM: (0.04151214772302283, 0.7562246787769311, 1.112,
                      {"first_touch": 10770168.0, "rekeyed": 0.0, "routed_away": 364916.0, "evicted": 2027776.0}, 0),
    Strategy.LEAST_OUTSTANDING_REQUESTS: (
        0.03854402959773229, 0.639373655707363, 1.04,
        {"first_touch": 10770168.0, "rekeyed": 0.0, "routed_away": 318637.0, "evicted": 2114816.0}, 0),
    Strategy.PREFIX_AWARE: (0.06653926499663874, 0.698765497134147, 1.088,
                            {"first_touch": 10770168.0, "rekeyed": 0.0, "routed_away": 3584.0, "evicted": 2045412.0}, 6),
    Strategy.KV_AWARE: (0.0598266475127256, 0.42032894705772605, 1.072,
                        {"first_touch": 10770168.0, "rekeyed": 0.0, "routed_away": 58620.0, "evicted": 2082560.0}, 0),
}

# The whole trace (12,031 requests), 8 instances, the preset's caches: `simulate TRACE --strategy ...`.
WHOLE = {
    Strategy.PREFIX_AWARE: (0.2978338723745142, 0.3695063685806872, 1.0705677001080542,
                            {"first_touch": 90695412.0, "rekeyed": 0.0, "routed_away": 110080.0, "evicted": 10863826.0}, 27),
    Strategy.RANDOM: (0.08760697616223587, 0.6086813842711649, 1.0246862272462804,
                      {"first_touch": 90695412.0, "rekeyed": 0.0, "routed_away": 28785563.0, "evicted": 12627899.0}, 0),
    Strategy.LEAST_OUTSTANDING_REQUESTS: (
        0.0882472935326806, 0.5226756856277461, 1.0193666361898428,
        {"first_touch": 90695412.0, "rekeyed": 0.0, "routed_away": 28835544.0, "evicted": 12485204.0}, 0),
    Strategy.KV_AWARE: (0.2653733647187422, 0.25371759444851705, 1.0080625051949132,
                        {"first_touch": 90695412.0, "rekeyed": 0.0, "routed_away": 4849270.0, "evicted": 10824717.0}, 0),
}


def _figures(trace, strategy, **config):
    r = lab.simulate(trace, lab.config_for_trace(FleetConfig(instances=8, strategy=strategy, **config), trace))
    return r.hit_rate, r.ttft_p50_s, r.max_mean_requests, r.misses, r.spills


@pytest.mark.parametrize("strategy", list(SLICE))
def test_the_slice_gives_the_pinned_figures(mooncake_slice, strategy):
    assert _figures(mooncake_slice, strategy, cache_tokens=200_000) == SLICE[strategy]


@pytest.mark.parametrize("strategy", list(WHOLE))
def test_the_whole_trace_gives_the_pinned_figures(mooncake_trace, strategy):
    assert _figures(mooncake_trace, strategy) == WHOLE[strategy]
