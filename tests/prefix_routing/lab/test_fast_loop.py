"""The simulator's inlined loop (lab/fast_loop.py) against the reference, Fleet._place, request by request."""

from __future__ import annotations

import math
import random

import pytest

from prefix_routing import lab
from prefix_routing.lab import fast_loop
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.misses import ClientKey
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.traces import Trace
from tests.prefix_routing.lab.conftest import P5_8B


def _run(trace, config, monkeypatch, *, fast, keys=None, speed=1.0, slow=None, chunks=1, chained=None):
    """A Simulator over ``trace`` (in ``chunks`` feeds, each with ``Trace.chained`` = ``chained``
    and, when True, said to be chained with the earlier), with or without the inlined loop."""
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(fast_loop, "eligible", lambda fleet: False)
        sim = lab.Simulator(lab.config_for_trace(config, trace), speed=speed)
        assert fast_loop.eligible(sim.fleet) is fast
        if slow:
            sim.fleet.set_slowdown(*slow)
        n = len(trace)
        bounds = [n * i // chunks for i in range(chunks + 1)]
        for lo, hi in zip(bounds, bounds[1:]):
            part = Trace(trace.arrivals[lo:hi], trace.prompt_tokens[lo:hi], trace.output_tokens[lo:hi],
                         trace.blocks[lo:hi], trace.block_tokens, trace.block_bytes,
                         trace.routing_ids[lo:hi] if trace.routing_ids else None, source=trace.source,
                         chained=chained)
            sim.feed(part, keys=None if keys is None else keys[lo:hi], chained_with_earlier=chained is True)
        return sim


def _state(sim):
    fleet, engines = sim.fleet, sim.fleet.engines
    result = sim.result().as_dict()
    result.pop("wall_s")
    return (
        result,
        list(sim.firsts), list(sim.cached), list(sim.copy_of), list(sim.ends), sim.last_finish,
        fleet._out, fleet._done, fleet._requests, fleet._prompt, fleet._cached, fleet._spills_in, fleet._timeouts,
        fleet.spills, fleet.timeouts, fleet.misses.as_dict(), fleet.misses.seen, fleet.misses.older,
        [list(c) for c in fleet._caches],
        engines.slots, engines.run_tokens, engines.last_start, engines.prefill_free,
    )


def _same(trace, config, monkeypatch, *, chain_caches=None, **kw):
    """The inlined loop's state equals the reference's (which keeps OrderedDict caches);
    ``chain_caches``: whether the inlined loop ended on chain caches (lab/chain_cache.py)."""
    run = _run(trace, config, monkeypatch, fast=True, **kw)
    if chain_caches is not None:
        assert run.fleet.caches.chained is chain_caches
    fast = _state(run)
    reference = _state(_run(trace, config, monkeypatch, fast=False, **kw))
    for a, b in zip(fast, reference):
        assert a == b
    return fast[0]


CONFIGS = {
    "prefix, small LRU, spills": FleetConfig(instances=8, cache_tokens=200_000, concurrency_threshold=2),
    "prefix, preset LRU": FleetConfig(instances=8),
    "prefix, infinite": FleetConfig(instances=4, cache_tokens=math.inf),
    "prefix, 8 copies per instance": FleetConfig(instances=2, preset=P5_8B, cache_tokens=100_000,
                                                 concurrency_threshold=3),
    # vLLM blocks that divide no trace block: every hit is rounded down (the misses' last block)
    "prefix, engine blocks of 100": FleetConfig(instances=8, cache_tokens=200_000, engine_block_tokens=100),
    "random": FleetConfig(instances=8, strategy=Strategy.RANDOM, cache_tokens=200_000),
    "least outstanding": FleetConfig(instances=8, strategy=Strategy.LEAST_OUTSTANDING_REQUESTS,
                                     cache_tokens=200_000),
}


@pytest.mark.parametrize("chained", [True, None])  # chain caches throughout; on the first feed only
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_inlined_loop_gives_what_place_gives(mooncake_slice, monkeypatch, name, chained):
    lru = not math.isinf(CONFIGS[name].cache_tokens or 0)
    result = _same(mooncake_slice, CONFIGS[name], monkeypatch, chunks=3, chained=chained,
                   chain_caches=lru and chained is True)
    assert result["requests"] == len(mooncake_slice)


@pytest.mark.parametrize("chunks", [1, 2])
def test_timeouts_and_slowdowns_too(mooncake_slice, monkeypatch, chunks):
    # A request that times out never reaches the cache: with chain caches, one that might is looked
    # up first and placed only once served; a bound that let it be placed early would show here.
    config = FleetConfig(instances=2, cache_tokens=200_000, timeout_s=2.0, concurrency_threshold=4)
    result = _same(mooncake_slice, config, monkeypatch, speed=8.0, slow=(1, 3.0), chunks=chunks, chained=True,
                   chain_caches=True)
    assert result["timeouts"] > 0 and result["spills"] > 0


def test_client_keys_and_string_keys(mooncake_slice, monkeypatch):
    config = FleetConfig(instances=4, cache_tokens=300_000)
    k = lab.config_for_trace(config, mooncake_slice).key_blocks
    keys = lab.trace_keys(mooncake_slice, k)
    mixed = [ClientKey(("raw", key)) if i % 3 == 0 else f"id-{key}" if i % 3 == 1 else key
             for i, key in enumerate(keys)]
    result = _same(mooncake_slice, config, monkeypatch, keys=mixed)
    assert result["misses"]["rekeyed"] > 0


def test_ids_that_are_not_chained(monkeypatch):
    """Repeated and shared ids in any position: the LRU touch's one-by-one fallback."""
    rng = random.Random(7)
    n = 400
    blocks = [[rng.randrange(60) for _ in range(rng.randrange(0, 12))] for _ in range(n)]
    trace = Trace([i * 0.05 for i in range(n)], [len(b) * 16 + rng.randrange(20) for b in blocks],
                  [rng.randrange(1, 50) for _ in range(n)], blocks, 16, None, None, source="random ids")
    for strategy in (Strategy.PREFIX_AWARE, Strategy.RANDOM):
        _same(trace, FleetConfig(instances=3, strategy=strategy, cache_tokens=16 * 20, concurrency_threshold=2),
              monkeypatch, chunks=2, chain_caches=False)


@pytest.mark.parametrize("engine_block", [1, 3, 16])
def test_token_sized_blocks_at_every_edge_of_the_whole_block_rule(monkeypatch, engine_block):
    """Trace blocks of one token and prompts that are a chain of them plus 0-2 tokens more: held reaches
    the prompt, its last token and the one before, where vLLM's rule turns (lab/copy_caches.py whole_blocks_cached)."""
    rng = random.Random(11)
    n, trunks = 300, [[rng.randrange(10**6) for _ in range(40)] for _ in range(5)]
    interned: dict = {}
    blocks, prompts = [], []
    for _ in range(n):
        tokens = rng.choice(trunks)[: rng.randrange(1, 41)] + [rng.randrange(10**6) for _ in range(rng.randrange(3))]
        ids, parent = [], -1
        for t in tokens:
            parent = interned.setdefault((parent, t), len(interned))
            ids.append(parent)
        blocks.append(ids)
        prompts.append(len(tokens) + rng.choice((0, 0, 1, 2)))  # up to 2 tokens past the blocks
    trace = Trace([i * 0.01 for i in range(n)], prompts, [rng.randrange(1, 8) for _ in range(n)], blocks, 1, None,
                  None, source="token blocks", chained=True)
    config = FleetConfig(instances=3, cache_tokens=150, engine_block_tokens=engine_block, concurrency_threshold=3)
    result = _same(trace, config, monkeypatch, chunks=2, chained=True, chain_caches=True)
    assert result["misses"]["last_block"] > 0


def test_a_producers_word_does_not_turn_caches_that_hold_blocks_into_chain_caches(mooncake_slice):
    sim = lab.Simulator(lab.config_for_trace(FleetConfig(instances=2, cache_tokens=50_000), mooncake_slice))
    sim.feed(mooncake_slice.head(10))  # the reader checked: chained
    assert sim.fleet.caches.chained
    sim.feed(mooncake_slice.head(20))  # chained, but not said to be chained with the first: OrderedDicts
    assert not sim.fleet.caches.chained
    sim = lab.Simulator(sim.config)
    sim.feed(mooncake_slice.head(10))
    sim.feed(mooncake_slice.head(20), chained_with_earlier=True)  # (the same ids again: chained together)
    assert sim.fleet.caches.chained
    sim.feed(Trace([60.0], [40], [5], [[1, 2, 1]], 16, None, None))  # not chained: OrderedDicts from now on
    assert not sim.fleet.caches.chained
    sim.feed(Trace([61.0], [40], [5], [[7, 8, 9]], 16, None, None, chained=True), chained_with_earlier=True)
    assert not sim.fleet.caches.chained and sim.fleet.caches.cached_prefix_blocks(0, [7, 8, 9]) + \
        sim.fleet.caches.cached_prefix_blocks(1, [7, 8, 9]) == 3


@pytest.mark.parametrize("capacity", [2_000, None])
@pytest.mark.parametrize("instances", [4, 1])  # this loop, and Fleet._place (one copy)
def test_without_the_misses_ledger_every_other_figure_is_the_same(mooncake_slice, capacity, instances):
    # tune's grid asks for no causes: the same run, its misses left out.
    trace = mooncake_slice.head(400)
    config = FleetConfig(instances=instances, prefix_length=4096, concurrency_threshold=4,
                         **({"cache_tokens": capacity} if capacity else {}))
    full, bare = lab.simulate(trace, config), lab.simulate(trace, config, explain_misses=False)
    assert bare.misses == {} and sum(full.misses.values()) > 0
    assert (bare.hit_rate, list(bare.ttft), bare.cached_tokens, bare.spills, bare.max_mean_requests) == (
        full.hit_rate, list(full.ttft), full.cached_tokens, full.spills, full.max_mean_requests)


def test_the_sure_wait_bounds_the_engine_models_prefill_from_above():
    from types import SimpleNamespace

    # (base, per_ctx, per_seq, chunk, a1, a2, max_seqs, budget, a0), as EngineModel._constants
    engines = SimpleNamespace(_constants=(0.01, 1e-6, 0.001, 512, 1e-4, 1e-9, 8, 10_000, 0.005),
                              slow=[1.0, 2.0], timeout_s=60.0, overhead_s=0.5)
    # By hand: the longest prompt 1,000 tokens, all uncached: 0.005 + 1000 × (1e-4 + 1e-9 × 500) = 0.1055 s;
    # ceil(1000 / 512) + 1 = 3 chunks at 0.01 + 1e-6 × 10,000 + 0.001 × 8 = 0.028 s each: 0.084 s;
    # 0.1895 s on the slowest copy (× 2) = 0.379 s; the margin × 1.001 + 1 µs.
    assert fast_loop._sure_wait(engines, [100, 1000]) == pytest.approx(60.0 - 0.5 - 0.379 * 1.001 - 1e-6, rel=1e-12)
    engines.timeout_s = math.inf
    assert fast_loop._sure_wait(engines, [100]) == math.inf


def test_a_fleet_turns_to_chain_caches_only_while_they_are_empty():
    fleet = lab.Simulator(FleetConfig(instances=2, cache_tokens=5_000)).fleet
    assert fleet.caches.use_chain_caches() is True and fleet.caches.chained  # empty: yes
    assert fleet.caches.use_chain_caches() is True  # already
    fleet.caches.use_ordered_caches()
    fleet._caches[1][7] = None  # a copy holds a block
    assert fleet.caches.use_chain_caches() is False and not fleet.caches.chained
    assert lab.Simulator(FleetConfig(instances=2, cache_tokens=math.inf)).fleet.caches.use_chain_caches() is False
