"""The fleet model's bookkeeping and engine rules at their edges (prefix_routing/lab/fleet.py,
engine_model.py), worked out by hand from their docstrings: a request released early leaves the
in-flight count once, a copy's next prefill waits for a slot when all are taken, KV_AWARE's cost is
wait + uncached prefill + load (ties to the first copy scanned)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from prefix_routing.lab.autoscaling import AutoscalingSettings
from prefix_routing.lab.engine_model import EngineModel
from prefix_routing.lab.fleet import Fleet, Request
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.latency import LatencyModel
from prefix_routing.lab.routing import Strategy
from prefix_routing.stage.presets import get_preset
from tests.prefix_routing.lab.conftest import P5_8B


def one_copy(**kwargs) -> Fleet:
    return Fleet(FleetConfig(instances=1, copies=1, preset=P5_8B, strategy=Strategy.RANDOM, **kwargs))


# ----------------------------------------------------------------------------- in flight, advance and release


def test_a_request_released_early_leaves_the_in_flight_count_once():
    fleet = one_copy()
    first = fleet.submit(Request(1000, 10, list(range(2))), 0.0)
    second = fleet.submit(Request(1000, 10, list(range(100, 102))), 0.0)
    assert second.finish_s > first.finish_s and fleet.outstanding() == [2]
    fleet.release(first)
    assert fleet.outstanding() == [1]
    assert fleet.advance(second.finish_s) == 1  # the first's own finish is skipped, the second retires
    assert fleet.outstanding() == [0]


def test_of_two_identical_finishes_one_released_the_other_still_retires():
    # Both time out at once (1 ms): two in-flight entries (0.001, copy 0). One client goes away.
    fleet = one_copy(timeout_s=0.001)
    a = fleet.submit(Request(4096, 10, list(range(8))), 0.0)
    fleet.submit(Request(4096, 10, list(range(100, 108))), 0.0)
    assert a.timed_out and fleet.outstanding() == [2]
    fleet.release(a)
    assert fleet.advance(1.0) == 1 and fleet.outstanding() == [0]


def test_a_request_retires_at_its_finish_exactly():
    fleet = one_copy()
    p = fleet.submit(Request(1000, 10, [1, 2]), 0.0)
    assert fleet.advance(p.finish_s - 1e-9) == 0 and fleet.advance(p.finish_s) == 1


def test_an_early_release_counts_in_autoscalings_time_averaged_concurrency():
    # One request in flight from 0 s to its release at 30 s: 0.5 on average over the first minute.
    fleet = one_copy(autoscaling=AutoscalingSettings(target_per_copy=4.0, min_copies=1, max_copies=1))
    p = fleet.submit(Request(1000, 100_000, [1, 2]), 0.0)  # a long answer: still running at 60 s
    fleet.release(p, 30.0)
    fleet.advance(60.0)
    assert fleet.pool.history[0][3] == pytest.approx(0.5)


# ----------------------------------------------------------------------------- the engine


def engines(max_num_seqs: int = 2) -> EngineModel:
    latency = LatencyModel.from_preset(replace(get_preset(P5_8B), max_num_seqs_override=max_num_seqs))
    return EngineModel(2, latency, budget=math.inf, overhead_s=0.0, timeout_s=math.inf)


def test_a_copy_with_every_slot_taken_is_ready_when_the_first_slot_frees():
    em = engines(2)
    em.prefill_free[0] = 5.0
    em.slots[0] = [(10.0, 2), (20.0, 2)]  # (finish, tokens): both slots taken
    assert em.ready_s(0) == 10.0
    em.slots[0] = [(10.0, 2)]  # a slot free: the prefill queue alone
    assert em.ready_s(0) == 5.0
    em.slots[0] = [(3.0, 2), (20.0, 2)]  # the first slot frees before the queue does
    assert em.ready_s(0) == 5.0


def kv(em, caches, out, *, blocks=(1, 2), prompt=1024, now=0.0, start=0, weight=0.01):
    return em.kv_aware_copy(caches, out, list(blocks), prompt, now, start=start, block_tokens=512, load_weight_s=weight)


def test_kv_aware_ties_go_to_the_first_copy_scanned():
    em = engines()
    assert kv(em, [set(), set()], [0, 0], start=0) == 0
    assert kv(em, [set(), set()], [0, 0], start=1) == 1


def test_kv_aware_weighs_the_load():
    em = engines()
    assert kv(em, [set(), set()], [3, 0]) == 1


def test_kv_aware_counts_cached_blocks_in_tokens():
    # Copy 0 holds both 512-token blocks (and has one request in flight): 0 new tokens there against
    # 1,024 on copy 1.
    em = engines()
    assert kv(em, [{1, 2}, set()], [1, 0], start=1, weight=0.001) == 0


def test_kv_aware_waits_for_a_busy_cached_copy_only_while_it_is_cheaper():
    em = engines()
    prefill = em.latency.prefill_compute_s(1024, 0)  # what copy 1 would spend
    em.prefill_free[0] = 1000.0 + prefill / 2  # copy 0 holds the prompt, busy for half that
    assert kv(em, [{1, 2}, set()], [0, 0], now=1000.0, start=1) == 0
    em.prefill_free[0] = 1000.0 + prefill * 2
    assert kv(em, [{1, 2}, set()], [0, 0], now=1000.0, start=1) == 1


def test_two_identical_finishes_both_released_retire_nothing_more():
    # Both time out at once (1 ms): two in-flight entries (0.001, copy 0), both clients go away.
    fleet = one_copy(timeout_s=0.001)
    a = fleet.submit(Request(4096, 10, list(range(8))), 0.0)
    b = fleet.submit(Request(4096, 10, list(range(100, 108))), 0.0)
    assert a.finish_s == b.finish_s and a.timed_out and b.timed_out
    fleet.release(a)
    fleet.release(b)
    assert fleet.outstanding() == [0]
    assert fleet.advance(1.0) == 0 and fleet.outstanding() == [0]


# ----------------------------------------------------------------------------- the engine's slots, by hand
# A toy engine whose times are exact in binary: a step of 1 s plus 0.5 s per running sequence, no cost
# per token; a prefill of up to 1,000 tokens is one step with the batch running beside it, a decode
# step 1 + 0.5 × (batch + 1) s; no request overhead. The clock starts at 1,000 s (so that times are
# far from the token counts).


def toy(max_num_seqs: int, *, timeout_s: float = math.inf, per_context_token_s: float = 0.0) -> EngineModel:
    latency = LatencyModel(prefill_s_per_token=0.0, attention_s_per_token_pair=0.0, step_base_s=1.0,
                           step_s_per_context_token=per_context_token_s, step_s_per_sequence=0.5, chunk_tokens=1000,
                           max_num_seqs=max_num_seqs)
    return EngineModel(1, latency, budget=math.inf, overhead_s=0.0, timeout_s=timeout_s)


T0 = 1000.0


def test_a_request_ending_as_another_arrives_frees_its_slot():
    em = toy(2)
    # A alone: prefill 1000..1001, 2 decode steps of 1.5 s: done at 1004.
    assert em.schedule(0, 100, 0, 3, T0) == (T0, T0 + 1, 1.5, T0 + 4)
    # B at 1004 finds A done: alone again (a step of 1 s, decode steps of 1.5 s).
    assert em.schedule(0, 100, 0, 3, T0 + 4) == (T0 + 4, T0 + 5, 1.5, T0 + 8)


def test_a_request_waits_for_a_slot_and_takes_every_slot_freed_then():
    em = toy(2)
    # A: prefill 1000..1001 alone, decode 1.5 s a step: 1001 + 5 × 1.5 = 1008.5.
    assert em.schedule(0, 100, 0, 6, T0) == (T0, T0 + 1, 1.5, T0 + 8.5)
    # B: its prefill waits for A's (1001), runs beside A (1.5 s): 1002.5; decode 2 s a step: 1008.5.
    assert em.schedule(0, 100, 0, 4, T0) == (T0, T0 + 2.5, 2.0, T0 + 8.5)
    # C: both slots taken until 1008.5, when both free: it runs alone from then.
    assert em.schedule(0, 100, 0, 3, T0) == (T0 + 8.5, T0 + 9.5, 1.5, T0 + 12.5)


def test_a_request_that_would_time_out_leaves_the_slots_it_waited_for_taken():
    em = toy(2, timeout_s=5.0)
    em.schedule(0, 100, 0, 6, T0)
    em.schedule(0, 100, 0, 4, T0)
    assert em.schedule(0, 100, 0, 3, T0) is None  # its first token at 1009.5: 9.5 s > 5 s
    assert em.schedule(0, 100, 0, 3, T0 + 8.5) == (T0 + 8.5, T0 + 9.5, 1.5, T0 + 12.5)


def test_the_slots_freed_while_waiting_give_their_kv_tokens_back():
    # As above, and a step costs 1/64 s per token the running requests reserve (prompt + output).
    em = toy(2, per_context_token_s=1 / 64)
    # A (60 + 4 = 64 tokens): prefill 1 s alone; decode 1 + 64/64 + 0.5 = 2.5 s a step: 1001 + 3 × 2.5.
    assert em.schedule(0, 60, 0, 4, T0) == (T0, T0 + 1, 2.5, T0 + 8.5)
    # B (126 + 2 = 128): prefill 1001..1003.5 beside A (1 + 64/64 + 0.5); decode 1 + 192/64 + 1 = 5 s.
    assert em.schedule(0, 126, 0, 2, T0) == (T0, T0 + 3.5, 5.0, T0 + 8.5)
    # C (62 + 2 = 64): both slots free at 1008.5 with their 192 tokens; C runs alone with its own 64.
    assert em.schedule(0, 62, 0, 2, T0) == (T0 + 8.5, T0 + 9.5, 2.5, T0 + 12.0)


# ----------------------------------------------------------------------------- placing on one copy


def test_a_request_on_the_only_copy_or_chosen_by_kv_aware_is_never_spilled():
    assert one_copy().submit(Request(1000, 10, [1, 2]), 0.0).spilled is False
    kv_fleet = Fleet(FleetConfig(instances=2, copies=1, preset=P5_8B, strategy=Strategy.KV_AWARE))
    assert kv_fleet.submit(Request(1000, 10, [1, 2]), 0.0).spilled is False and kv_fleet.spills == 0


def test_one_copy_counts_a_request_in_flight_from_its_arrival():
    # Arriving at 30 s and still running at 60 s: 1 in flight for half the first minute, 0.5.
    fleet = one_copy(autoscaling=AutoscalingSettings(target_per_copy=4.0, min_copies=1, max_copies=1))
    fleet.submit(Request(1000, 100_000, [1, 2]), 30.0)
    fleet.advance(60.0)
    assert fleet.pool.history[0][3] == pytest.approx(0.5)


def test_one_copy_scaled_to_zero_serves_nothing():
    fleet = one_copy(autoscaling=AutoscalingSettings(min_copies=0, max_copies=1, initial_copies=0))
    p = fleet.submit(Request(1000, 10, [1, 2]), 0.0)
    assert p.first_token_s == math.inf and fleet.no_capacity == 1 and fleet.outstanding() == [0]
    assert (p.instance, p.copy, p.cached_tokens, p.per_token_s, p.finish_s, p.spilled, p.timed_out) == (
        0, 0, 0, 0.0, 0.0, False, True)
    fleet.submit(Request(1000, 10, [1, 2]), 1.0)
    assert fleet.no_capacity == 2 and fleet.pool.no_capacity == 2  # each request that found no copy


def test_a_copys_counts_add_up_over_its_requests():
    fleet = one_copy(timeout_s=0.001)
    fleet.submit(Request(4096, 10, list(range(8))), 0.0)
    fleet.submit(Request(4096, 10, list(range(100, 108))), 0.0)
    assert fleet.copy_stats()[0].timeouts == 2
    fleet = one_copy()
    placed = []
    for i in range(3):
        fleet.advance(100.0 * i)
        placed.append(fleet.submit(Request(3000, 10, [1, 2, 3, 4, 5, 6]), 100.0 * i))
    stats = fleet.copy_stats()[0]
    assert placed[1].cached_tokens > 0 and stats.cached_tokens == sum(p.cached_tokens for p in placed)
    assert (stats.requests, stats.prompt_tokens) == (3, 9000)
