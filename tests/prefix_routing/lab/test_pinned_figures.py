"""The lab's figures on the Mooncake trace, pinned: work on the simulator's speed must not move them.

Recorded on 2026-12-02 (the figures the lab gave before its speed work: the same on the commit
before it and after). A change that moves them on purpose (a better model) updates them here and
says why in its commit; a speed-up must leave them exactly as they are.

Moved on 2026-12-06 by vLLM's whole-block rule (a copy serves whole 16-token blocks, never the
prompt's last token: the misses' ``last_block``): RANDOM, LEAST_OUTSTANDING_REQUESTS and PREFIX_AWARE
lose exactly their ``last_block`` tokens and keep every other figure; KV_AWARE's choices follow the
slightly longer prefills of full repeats.
"""

from __future__ import annotations

import pytest

from prefix_routing import lab
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.routing import Strategy

# The slice in tests/data (1,000 requests), 8 instances, 200,000-token LRU caches.
SLICE = {
    Strategy.RANDOM: (0.04151185645262953, 0.7562246787769311, 1.112,
                      {"last_block": 4.0, "first_touch": 10770168.0, "rekeyed": 0.0, "routed_away": 364916.0,
                       "evicted": 2027776.0}, 0),
    Strategy.LEAST_OUTSTANDING_REQUESTS: (
        0.03854322860415072, 0.639373655707363, 1.04,
        {"last_block": 11.0, "first_touch": 10770168.0, "rekeyed": 0.0, "routed_away": 318637.0,
         "evicted": 2114816.0}, 0),
    Strategy.PREFIX_AWARE: (0.06653780864467225, 0.698765497134147, 1.088,
                            {"last_block": 20.0, "first_touch": 10770168.0, "rekeyed": 0.0, "routed_away": 3584.0,
                             "evicted": 2045412.0}, 6),
    Strategy.KV_AWARE: (0.059825773701545716, 0.42032894705772605, 1.072,
                        {"last_block": 12.0, "first_touch": 10770168.0, "rekeyed": 0.0, "routed_away": 58620.0,
                         "evicted": 2082560.0}, 0),
}

# The whole trace (12,031 requests), 8 instances, the preset's caches: `simulate TRACE --strategy ...`.
WHOLE = {
    Strategy.PREFIX_AWARE: (0.2978286166254482, 0.3695063685806872, 1.0705677001080542,
                            {"last_block": 761.0, "first_touch": 90695412.0, "rekeyed": 0.0, "routed_away": 110080.0,
                             "evicted": 10863826.0}, 27),
    Strategy.RANDOM: (0.08760627861866732, 0.6086813842711649, 1.0246862272462804,
                      {"last_block": 101.0, "first_touch": 90695412.0, "rekeyed": 0.0, "routed_away": 28785563.0,
                       "evicted": 12627899.0}, 0),
    Strategy.LEAST_OUTSTANDING_REQUESTS: (
        0.0882465269253924, 0.5226756856277461, 1.0193666361898428,
        {"last_block": 111.0, "first_touch": 90695412.0, "rekeyed": 0.0, "routed_away": 28835544.0,
         "evicted": 12485204.0}, 0),
    Strategy.KV_AWARE: (0.26686331778117356, 0.25341576004393573, 1.0100573518410771,
                        {"last_block": 466.0, "first_touch": 90695412.0, "rekeyed": 0.0, "routed_away": 4585452.0,
                         "evicted": 10872333.0}, 0),
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
