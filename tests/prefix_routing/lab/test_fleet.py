"""The fleet model (prefix_routing.lab.fleet): routing, spill, per-copy LRU caches, latency, timeouts, determinism."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from prefix_routing.lab.fleet import Fleet, Placement, Request
from prefix_routing.lab.fleet_config import REQUEST_OVERHEAD_S
from prefix_routing.lab.latency import LatencyModel
from prefix_routing.lab.routing import ROUTING_OVERHEAD_S, Strategy, stable_hash
from prefix_routing.stage.presets import get_preset
from tests.prefix_routing.lab.conftest import P5_8B, P5_70B, cfg, chain


def test_prefix_aware_sends_a_key_to_one_copy_and_ids_apart():
    fleet = Fleet(cfg(instances=8))
    homes = {fleet.submit(Request(9000, 10, chain(1, 18, 100)), t).instance for t in range(20)}
    assert len(homes) == 1  # same first two blocks: same key
    # Different PrefixAwareIds with identical prompts spread over the instances.
    tenants = {fleet.submit(Request(9000, 10, chain(1, 18, 100), routing_id=f"t{i}"), 30.0).instance for i in range(40)}
    assert len(tenants) >= 6


def test_prefix_aware_keys_within_the_first_block_pile_onto_one_instance():
    fleet = Fleet(cfg(instances=8, prefix_length=1024))
    placed = {fleet.submit(Request(4000, 10, chain(1, 8, 100 * i)), float(i)).instance for i in range(50)}
    assert len(placed) == 1
    fleet = Fleet(cfg(instances=8, prefix_length=4096))
    placed = {fleet.submit(Request(4000, 10, chain(1, 8, 100 * i)), float(i)).instance for i in range(50)}
    assert len(placed) >= 6


def test_spill_goes_to_another_copy_on_the_instance_then_another_instance():
    # 2 instances × 8 copies, threshold 1: the home copy is busy after one request.
    fleet = Fleet(cfg(instances=2, preset=P5_8B, concurrency_threshold=1))
    request = Request(3000, 500, chain(1, 6, 100))
    first = fleet.submit(request, 0.0)
    assert not first.spilled
    placements = [fleet.submit(request, 0.0) for _ in range(15)]
    same_instance = [p for p in placements[:7]]
    assert all(p.spilled for p in placements)
    assert {p.instance for p in same_instance} == {first.instance}
    assert len({p.copy for p in same_instance} | {first.copy}) == 8
    assert {p.instance for p in placements[7:]} == {1 - first.instance}
    assert fleet.spills == 15
    # Every copy is at the threshold now: the least loaded of all, home first on ties.
    last = fleet.submit(request, 0.0)
    assert (last.instance, last.copy) == (first.instance, first.copy) and not last.spilled


class Loads:
    """A PREFIX_AWARE fleet whose in-flight counts are set copy by copy, for the spill rule.

    A key is found for each copy (its home); requests on that key go home while the copy is below
    the threshold, so ``set(g, n)`` leaves exactly n requests in flight on copy g. Nothing retires:
    every request is submitted at t = 0 with a long answer and ``advance`` is never called.
    """

    def __init__(self, instances: int, copies: int, threshold: int):
        self.fleet = Fleet(cfg(instances=instances, copies=copies, preset=P5_8B, concurrency_threshold=threshold))
        self.copies = copies
        self.key_of: dict[int, str] = {}
        i = 0
        while len(self.key_of) < self.fleet.n:
            self.key_of.setdefault(self.fleet.home(f"key-{i}"), f"key-{i}")
            i += 1

    def submit(self, g: int) -> Placement:
        return self.fleet.submit(Request(100, 5000, (), key=self.key_of[g]), 0.0)

    def set(self, g: int, n: int) -> None:
        for _ in range(n):
            p = self.submit(g)
            assert (p.instance * self.copies + p.copy, p.spilled) == (g, False)

    def placed(self, p: Placement) -> int:
        return p.instance * self.copies + p.copy


def test_spill_takes_the_least_loaded_copy_on_the_home_instance():
    # 3 instances x 4 copies, threshold 3. Home copy 4 (instance 1, copy 0) is at the threshold; its
    # siblings carry 2, 1 and 2 requests. The rule: the least-loaded other copy of the home instance
    # below the threshold, i.e. copy 6, not the first one found (copy 5).
    loads = Loads(instances=3, copies=4, threshold=3)
    for g, n in {4: 3, 5: 2, 6: 1, 7: 2}.items():
        loads.set(g, n)
    p = loads.submit(4)
    assert (loads.placed(p), p.spilled) == (6, True)
    assert loads.fleet.spills == 1 and loads.fleet.outstanding()[6] == 2


def test_spill_ties_on_the_home_instance_go_to_the_next_copy_after_home():
    # Home copy 5 at the threshold; copies 4 and 7 both carry 1. "In order from the home copy": 6 (2),
    # 7 (1), 4 (1) -> copy 7, the first of the least loaded after home (a scan from copy 0 gives 4).
    loads = Loads(instances=3, copies=4, threshold=3)
    for g, n in {5: 3, 4: 1, 6: 2, 7: 1}.items():
        loads.set(g, n)
    assert loads.placed(loads.submit(5)) == 7


def test_spill_to_other_instances_takes_the_least_loaded_scanning_from_the_next_instance():
    # 4 instances x 2 copies, threshold 2. The home instance 1 (copies 2, 3) is full. Loads elsewhere:
    # instance 2: 1, 1; instance 3: 2, 0; instance 0: 0, 1. The least loaded below the threshold carry 0
    # (copies 7 and 0); scanning from the next instance (2, 3, 0) finds copy 7 first.
    # Bugs this catches: the first copy below the threshold (4), a scan from instance 0 (copy 0).
    loads = Loads(instances=4, copies=2, threshold=2)
    for g, n in {2: 2, 3: 2, 4: 1, 5: 1, 6: 2, 7: 0, 0: 0, 1: 1}.items():
        loads.set(g, n)
    p = loads.submit(2)
    assert (loads.placed(p), p.spilled) == (7, True)
    # Now 7 carries 1: the only copy at 0 is copy 0 (instance 0), reached last in the scan.
    assert loads.placed(loads.submit(3)) == 0
    # Then every copy below the threshold carries 1: the first of them from the next instance, copy 4.
    assert loads.placed(loads.submit(2)) == 4


def test_when_every_copy_is_at_the_threshold_the_least_loaded_of_all_home_first():
    # 3 instances x 2 copies, threshold 2, every copy at the threshold.
    loads = Loads(instances=3, copies=2, threshold=2)
    for g in range(6):
        loads.set(g, 2)
    first = loads.submit(2)  # all equal: home wins the tie, and it is not a spill
    assert (loads.placed(first), first.spilled) == (2, False)
    # Copy 2 now carries 3: the least loaded of all, scanning from the copy after home, is copy 3.
    second = loads.submit(2)
    assert (loads.placed(second), second.spilled) == (3, True)
    # Home copy 5 (instance 2): copies 0..4 carry 2 or 3; least loaded from 5 on wraps to copy 0.
    third = loads.submit(5)
    assert (loads.placed(third), third.spilled) == (5, False)  # 5 carries 2, the minimum: home first
    assert loads.placed(loads.submit(5)) == 0
    assert loads.fleet.spills == 2


def test_random_and_least_outstanding_spread_load():
    for strategy in (Strategy.RANDOM, Strategy.LEAST_OUTSTANDING_REQUESTS):
        fleet = Fleet(cfg(instances=8, strategy=strategy))
        for i in range(800):
            fleet.advance(i * 0.5)
            fleet.submit(Request(2000, 50, chain(1, 4, 10 * i)), i * 0.5)
        counts = [row["requests"] for row in fleet.instance_totals()]
        assert max(counts) / (sum(counts) / 8) < 1.25, (strategy, counts)


def test_least_outstanding_picks_the_idle_copy():
    fleet = Fleet(cfg(instances=4, strategy=Strategy.LEAST_OUTSTANDING_REQUESTS))
    busy = {fleet.submit(Request(30000, 2000, [i]), 0.0).instance for i in range(4)}
    assert busy == {0, 1, 2, 3}


def test_kv_aware_follows_the_cache():
    fleet = Fleet(cfg(instances=8, strategy=Strategy.KV_AWARE))
    home = fleet.submit(Request(12000, 10, chain(1, 24, 1000)), 0.0)
    fleet.advance(100.0)
    again = fleet.submit(Request(12500, 10, chain(1, 24, 1000) + [5000]), 100.0)
    assert (again.instance, again.copy) == (home.instance, home.copy)
    assert again.cached_tokens == 24 * 512


def test_lru_evicts_tails_first_and_keeps_chains_contiguous():
    fleet = Fleet(cfg(instances=1, cache_tokens=4 * 512))
    fleet.submit(Request(4 * 512, 1, [1, 2, 3, 4]), 0.0)
    fleet.submit(Request(2 * 512, 1, [1, 10]), 1.0)  # touches 1, adds 10: evicts 4 (a tail)
    cache = fleet._caches[0]
    assert set(cache) == {1, 2, 3, 10}
    again = fleet.submit(Request(4 * 512, 1, [1, 2, 3, 4]), 2.0)
    assert again.cached_tokens == 3 * 512


def test_infinite_cache_never_forgets():
    fleet = Fleet(cfg(instances=1, cache_tokens=math.inf))
    for i in range(100):
        fleet.submit(Request(5120, 1, chain(1, 10, 100 * i)), float(i))
    # all 10 blocks held; vLLM serves whole 16-token blocks short of the last token: floor(5,119 / 16) × 16
    assert fleet.submit(Request(5120, 1, chain(1, 10, 0)), 200.0).cached_tokens == 5104


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 6)), min_size=1, max_size=60
    ),
    capacity=st.integers(1, 12),
)
def test_cached_blocks_are_always_a_prefix_closed_set(requests, capacity):
    """With tail-first touching, a block is cached only if its parent is: cached = leading blocks."""
    fleet = Fleet(cfg(instances=1, cache_tokens=capacity * 512))
    parent = {}
    for t, (tree, depth) in enumerate(requests):
        # A chain in one of 6 trees: ids (tree, 0), (tree, 1), ... so chains of a tree share prefixes.
        blocks = [tree * 100 + d for d in range(depth)]
        for d in range(1, depth):
            parent[blocks[d]] = blocks[d - 1]
        held = fleet.caches.cached_prefix_blocks(0, blocks) * 512
        expected = min(held, depth * 512 - 1) // 16 * 16  # vLLM: whole 16-token blocks, never the last token
        p = fleet.submit(Request(depth * 512, 1, blocks), float(t))
        assert p.cached_tokens == expected
        cache = fleet._caches[0]
        assert len(cache) <= capacity
        assert all(b not in parent or parent[b] in cache for b in cache)


def test_a_cache_hit_shortens_the_time_to_first_token():
    fleet = Fleet(cfg(instances=1))
    miss = fleet.submit(Request(9750, 100, chain(1, 20, 100)), 0.0)
    fleet.advance(100.0)
    hit = fleet.submit(Request(9750, 100, chain(1, 20, 100)[:16] + [900, 901, 902, 903]), 100.0)
    assert hit.cached_tokens == 16 * 512
    assert miss.ttft_s > 0.35 and hit.ttft_s < 0.15
    assert miss.finish_s == pytest.approx(miss.first_token_s + 99 * miss.per_token_s)


def test_prefills_on_one_copy_queue():
    fleet = Fleet(cfg(instances=1))
    a = fleet.submit(Request(8000, 10, [1]), 0.0)
    b = fleet.submit(Request(8000, 10, [2]), 0.0)
    assert b.ttft_s == pytest.approx(2 * a.ttft_s - fleet._ttft_overhead, rel=0.02)


def test_kv_budget_makes_requests_wait_for_a_slot():
    fleet = Fleet(cfg(instances=1, cache_tokens=10_000))
    a = fleet.submit(Request(6000, 100, [1]), 0.0)
    b = fleet.submit(Request(6000, 100, [2]), 0.0)
    assert b.start_s == pytest.approx(a.finish_s - fleet._ttft_overhead)
    assert b.queued_s > 0


def test_requests_that_cannot_start_within_the_timeout_fail():
    fleet = Fleet(cfg(instances=1, timeout_s=1.0))
    placements = [fleet.submit(Request(10000, 10, [i]), 0.0) for i in range(5)]
    assert not placements[0].timed_out
    assert placements[-1].timed_out and placements[-1].ttft_s == math.inf
    assert fleet.timeouts == sum(p.timed_out for p in placements)
    assert fleet.outstanding() == [5]
    fleet.advance(1.0)  # the timed-out ones leave at the timeout
    assert fleet.outstanding()[0] <= 5 - fleet.timeouts
    fleet.advance(max(p.finish_s for p in placements))
    assert fleet.outstanding() == [0]


def test_advance_and_release_keep_the_in_flight_count():
    fleet = Fleet(cfg(instances=1))
    p = fleet.submit(Request(1000, 100, [1]), 0.0)
    q = fleet.submit(Request(1000, 100, [2]), 0.0)
    assert fleet.outstanding() == [2]
    fleet.release(q)
    assert fleet.outstanding() == [1]
    assert fleet.advance(p.finish_s) == 1  # p retires; q's entry is skipped, not counted twice
    fleet.advance(q.finish_s + 1)
    assert fleet.outstanding() == [0]


def test_slowdown_makes_an_instance_slower():
    fast, slow = Fleet(cfg(instances=1)), Fleet(cfg(instances=1))
    slow.set_slowdown(0, 3.0)
    a = fast.submit(Request(8000, 10, [1]), 0.0)
    b = slow.submit(Request(8000, 10, [1]), 0.0)
    # The engine's work (prefill and decode steps) takes 3 times as long; the request and routing
    # overheads (15 ms + 1.6 ms, outside the engine) do not.
    overhead = REQUEST_OVERHEAD_S + ROUTING_OVERHEAD_S
    assert b.ttft_s - overhead == pytest.approx(3.0 * (a.ttft_s - overhead), rel=1e-9)
    assert b.per_token_s == pytest.approx(3.0 * a.per_token_s, rel=1e-9)


def test_submit_and_the_fast_path_agree():
    config = cfg(instances=4, cache_tokens=20 * 512)
    a, b = Fleet(config), Fleet(config)
    for i in range(200):
        blocks = chain(1, 1 + i % 7, 1000 * (i % 13))
        now = i * 0.05
        a.advance(now)
        b.advance(now)
        p = a.submit(Request(len(blocks) * 512, 20, blocks), now)
        r = b._place(b.key_for(Request(0, 0, blocks)), blocks, len(blocks) * 512, 20, now)
        assert isinstance(p, Placement)
        assert (p.instance * config.copies + p.copy, p.cached_tokens, p.first_token_s, p.finish_s) == (r[0], r[1], r[2], r[4])


@pytest.mark.parametrize("strategy", list(Strategy))
def test_same_seed_same_placements(strategy):
    def run(seed):
        fleet = Fleet(cfg(instances=6, strategy=strategy, seed=seed, concurrency_threshold=2))
        out = []
        for i in range(300):
            now = i * 0.1
            fleet.advance(now)
            p = fleet.submit(Request(3000, 200, chain(1, 6, 100 * (i % 37))), now)
            out.append((p.instance, p.cached_tokens, round(p.ttft_s, 9)))
        return out

    assert run(1) == run(1)
    if strategy is not Strategy.LEAST_OUTSTANDING_REQUESTS:
        assert run(1) != run(2)


def test_latency_model_from_preset_is_exposed():
    lat = Fleet(cfg()).latency
    assert isinstance(lat, LatencyModel)
    assert lat.max_num_seqs == get_preset(P5_70B).max_num_seqs


def splitmix64_finalizer(x: int) -> int:
    """splitmix64's finalizer, written out from its reference (Steele, Lea & Flood)."""
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


@pytest.mark.parametrize("seed", [0, 7])
def test_homes_are_the_documented_hashes(seed):
    # Integer keys: Fibonacci hashing of key XOR the seed's mix, top 48 bits, mod copies. Other keys:
    # the mix of their stable hash XOR the seed's mix, mod copies. The same homes in every process.
    fleet = Fleet(cfg(instances=5, seed=seed))
    m, seed_mix = (1 << 64) - 1, splitmix64_finalizer(seed)
    for key in (0, 1, 12_345, 2**40 + 3, 2**64 - 1):
        assert fleet.home(key) == ((((key ^ seed_mix) * 0x9E3779B97F4A7C15) & m) >> 16) % 5
    for key in ("tenant-a", ("t", 42)):
        assert fleet.home(key) == splitmix64_finalizer(stable_hash(key) ^ seed_mix) % 5
    assert len({fleet.home(k) for k in range(200)}) == 5
    # The router's fast path agrees with home() for both kinds of key.
    for key in (12_345, "tenant-a"):
        g = fleet.submit(Request(100, 2, (), key=key), 0.0)
        assert g.instance == fleet.home(key) and g.prompt_tokens == 100


def test_stable_hash_of_none_tuples_and_other_values():
    assert stable_hash(None) == 0x5BD1E995
    x = splitmix64_finalizer(0x9E3779B97F4A7C15 ^ stable_hash("a"))
    assert stable_hash(("a", 1)) == splitmix64_finalizer(x ^ 1)
    assert stable_hash(2.5) == stable_hash(repr(2.5)) != stable_hash(repr(3.5))


def test_an_explicit_key_still_routes_apart_by_prefix_aware_id():
    fleet = Fleet(cfg(instances=8))
    assert fleet.key_for(Request(10, 1, (), key="k")) == "k"
    assert fleet.key_for(Request(10, 1, (), routing_id="t1", key="k")) == ("t1", "k")
    homes = {fleet.submit(Request(10, 1, (), routing_id=f"t{i}", key="k"), 0.0).instance for i in range(40)}
    assert len(homes) >= 6


def test_spills_are_counted_on_the_copy_that_took_them():
    loads = Loads(instances=3, copies=4, threshold=3)
    for g, n in {4: 3, 5: 2, 6: 1, 7: 2}.items():
        loads.set(g, n)
    loads.submit(4)  # to copy 6
    loads.submit(4)  # copy 6 now carries 2, like 5 and 7: the first after home, copy 5
    loads.submit(4)  # 5 carries 3 now: copy 6 (2) before copy 7 (2), its second spill
    spills_in = [s.spills_in for s in loads.fleet.copy_stats()]
    assert spills_in == [0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0]
    assert loads.fleet.spills == 3


def test_advance_retires_every_finished_request_on_every_copy():
    # Short requests on copies 0..3 (one copy per instance), all done within a
    # second: advancing to t = 1.5, less than the largest copy index, retires all four and says so.
    loads = Loads(instances=4, copies=1, threshold=5)
    placed = [loads.fleet.submit(Request(100, 2, (), key=loads.key_of[g]), 0.0) for g in range(4)]
    assert [p.instance for p in placed] == [0, 1, 2, 3]
    assert max(p.finish_s for p in placed) < 1.5
    assert loads.fleet.outstanding() == [1, 1, 1, 1]
    assert loads.fleet.advance(0.0) == 0
    assert loads.fleet.advance(1.5) == 4
    assert loads.fleet.outstanding() == [0, 0, 0, 0]


def test_release_frees_the_copy_it_names():
    loads = Loads(instances=2, copies=2, threshold=5)
    p = loads.submit(3)  # instance 1, copy 1
    loads.set(2, 1)
    loads.fleet.release(p)
    assert loads.fleet.outstanding() == [0, 0, 1, 0]


# --------------------------------------------------------------------------- hot-prefix replication

from prefix_routing.rules.replication import ReplicationSettings  # noqa: E402

HOT = ReplicationSettings(enabled=True, target_share_factor=1.0, max_replicas=4)


def _homes(fleet, requests, gap_s=0.5):
    served = []
    for i, request in enumerate(requests):
        fleet.advance(i * gap_s)
        served.append(fleet.submit(request, i * gap_s).instance)
    return served


def test_replication_spreads_a_hot_prefix_over_its_replicas_and_keeps_a_cold_one_home():
    # One shared prefix of 4 blocks (the routing key covers the first 2), then a unique block.
    hot = [Request(prompt_tokens=2500, output_tokens=10, blocks=[7, 8, 9, 10, 10_000 + i]) for i in range(200)]
    plain = _homes(Fleet(cfg(instances=8)), hot)
    replicated_fleet = Fleet(cfg(instances=8, replication=HOT))
    replicated = _homes(replicated_fleet, hot)
    assert len(set(plain)) == 1  # one prefix, one home
    # Alone, the prefix has all the traffic: k = min(4, ceil(8 × 1 / 1)) = 4 replicas in turn, each
    # hashed to a copy of its own (ties possible), replica 0 still at the old home.
    assert 2 <= len(set(replicated[-40:])) <= 4 and plain[0] in replicated[-40:]
    # The first 31 requests build the evidence (shares count against at least 32 requests); then
    # replicas 1-3 take three requests in four.
    assert 100 <= replicated_fleet.replicated <= 150
    # A replica's key is the front door's, not the client's: none of its misses is re-keyed.
    assert replicated_fleet.misses.rekeyed == 0
    # A second, cold prefix among many others keeps its single home.
    cold = Fleet(cfg(instances=8, replication=HOT))
    mixed = [Request(prompt_tokens=2500, output_tokens=10, blocks=[100 + i % 50, 200 + i % 50, 10_000 + i])
             for i in range(500)]
    _homes(cold, mixed)
    assert cold.replicated == 0


def test_replication_is_off_for_strategies_that_ignore_ids():
    fleet = Fleet(cfg(instances=8, strategy=Strategy.RANDOM, replication=HOT))
    _homes(fleet, [Request(prompt_tokens=100, output_tokens=1, blocks=chain(7, 2, i)) for i in range(100)])
    assert fleet.replicated == 0 and not fleet.config.replicating
