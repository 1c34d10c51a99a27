"""The latency model inside the router (prefix_routing.lab.latency)."""

from __future__ import annotations

import math

import pytest

from prefix_routing.lab.fleet import Fleet, Request
from prefix_routing.lab.fleet_config import REQUEST_OVERHEAD_S
from prefix_routing.lab.routing import ROUTING_OVERHEAD_S, Strategy, key_blocks
from tests.prefix_routing.lab.conftest import cfg
from tests.prefix_routing.lab.test_fleet import Loads


def test_an_idle_copy_gives_the_latency_models_prefill_and_decode_step():
    # Module docstring: TTFT = wait + prefill(uncached part, at the copy's batch and context) +
    # request and routing overheads; each later token one step at the batch and context the copy has
    # when the request starts (itself included).
    fleet = Fleet(cfg(instances=1, cache_tokens=math.inf))
    lat, overhead = fleet.latency, REQUEST_OVERHEAD_S + ROUTING_OVERHEAD_S
    blocks = list(range(1, 41))  # 40 blocks: 20,480 tokens cover the 20,000-token prompt
    a = fleet.submit(Request(20_000, 50, blocks), 0.0)
    assert a.ttft_s == pytest.approx(lat.prefill_s(20_000, 0) + overhead, rel=1e-12)  # 3 chunks of 8,192
    assert a.per_token_s == pytest.approx(lat.step_s(1, 20_050), rel=1e-12)
    assert a.finish_s == pytest.approx(a.first_token_s + 49 * a.per_token_s, rel=1e-12)
    assert a.cached_tokens == 0 and a.prompt_tokens == 20_000
    # The same prompt again, while A still runs: all of it held (40 × 512 > 20,000 is capped at the
    # prompt), of which vLLM serves whole 16-token blocks short of the last token: floor(19,999 / 16) × 16
    # = 19,984 cached, 16 new: their prefill at batch 1 and A's context, after A's prefill.
    b = fleet.submit(Request(20_000, 1, blocks), 0.001)
    assert b.cached_tokens == 19_984
    prefill_free = a.first_token_s - overhead
    assert b.first_token_s == pytest.approx(prefill_free + lat.prefill_s(16, 19_984, 1, 20_050) + overhead,
                                            rel=1e-12)
    assert b.finish_s == pytest.approx(b.first_token_s, rel=1e-12)  # one output token: done at the first
    stats = fleet.copy_stats()[0]
    assert (stats.requests, stats.prompt_tokens, stats.cached_tokens, stats.outstanding) == (2, 40_000, 19_984, 2)


def test_a_timed_out_request_holds_its_place_and_leaves_no_trace_in_the_cache():
    fleet = Fleet(cfg(instances=1, cache_tokens=math.inf, timeout_s=5.0))
    big = fleet.submit(Request(1_000_000, 10, list(range(1, 1955))), 0.0)
    assert big.timed_out and big.first_token_s == math.inf and big.ttft_s == math.inf
    assert (big.cached_tokens, big.per_token_s, big.finish_s, big.start_s) == (0, 0.0, 5.0, 0.0)
    stats = fleet.copy_stats()[0]
    assert (stats.requests, stats.timeouts, stats.prompt_tokens, stats.outstanding) == (1, 1, 0, 1)
    assert fleet.timeouts == 1 and fleet.caches.cached_prefix_blocks(0, [1, 2]) == 0
    # Its slot was never taken: the next request starts at once.
    small = fleet.submit(Request(100, 2, [7]), 0.1)
    assert small.start_s == 0.1 and not small.timed_out
    assert fleet.advance(5.0) == 2 and fleet.outstanding() == [0]


def test_a_cache_that_is_exactly_full_keeps_every_block():
    fleet = Fleet(cfg(instances=1, cache_tokens=4 * 512))  # room for exactly 4 blocks
    fleet.submit(Request(2048, 2, [1, 2, 3, 4]), 0.0)
    again = fleet.submit(Request(2048, 2, [1, 2, 3, 4]), 10.0)
    assert again.cached_tokens == 2032  # all 4 held; vLLM serves floor(2,047 / 16) × 16
    assert fleet.copy_stats()[0].cached_blocks == 4


def test_a_sibling_below_the_threshold_wins_over_an_idler_copy_elsewhere():
    # 2 instances x 2 copies, threshold 2. Home copy 1 is full; its sibling, copy 0, carries 1; copy 2
    # on the other instance carries none. The home instance comes first: copy 0 (index 0 is a choice too).
    loads = Loads(instances=2, copies=2, threshold=2)
    for g, n in {1: 2, 0: 1}.items():
        loads.set(g, n)
    p = loads.submit(1)
    assert (loads.placed(p), p.spilled) == (0, True)


def test_two_copies_are_enough_for_prefix_routing():
    fleet = Fleet(cfg(instances=2))
    homes = {fleet.submit(Request(100, 2, (), key=f"k{i}"), 0.0).instance for i in range(20)}
    assert homes == {0, 1}


def test_least_outstanding_starts_its_scan_at_a_seeded_position_and_takes_the_least_loaded():
    import random

    for seed in (0, 1, 2, 3):
        fleet = Fleet(cfg(instances=4, strategy=Strategy.LEAST_OUTSTANDING_REQUESTS, seed=seed))
        start = int(random.Random(seed).random() * 4)  # the first draw of the fleet's seeded generator
        first = fleet.submit(Request(100, 5000, ()), 0.0)
        assert first.instance == start  # every copy idle: the first of the scan
        for _ in range(6):
            fleet.submit(Request(100, 5000, ()), 0.0)
        assert sorted(fleet.outstanding()) == [1, 2, 2, 2]  # always onto a least-loaded copy


def test_blocks_that_are_not_chained_are_touched_one_by_one():
    # Ids that do not form a chain (a cached id after an uncached one) take the slow path; it must
    # still touch every block, cached or not. Only the leading blocks held count, as an engine's
    # prefix cache matches: 1 and 2 were cached, but after 5, which was not.
    fleet = Fleet(cfg(instances=1, cache_tokens=100 * 512))
    fleet.submit(Request(1024, 2, [1, 2]), 0.0)
    p = fleet.submit(Request(1536, 2, [5, 1, 2]), 1.0)
    assert p.cached_tokens == 0
    assert fleet.caches.cached_prefix_blocks(0, [5, 1, 2]) == 3
    assert list(fleet._caches[0]) == [2, 1, 5]  # touched tail first: the head is the most recent
    q = fleet.submit(Request(1536, 2, [1, 2, 7]), 2.0)
    assert q.cached_tokens == 1024


def test_a_key_one_byte_past_the_json_before_the_prompt_covers_one_block():
    assert key_blocks(1025, key_offset_bytes=1024) == 1
    assert key_blocks(1024, key_offset_bytes=2000) == 0
