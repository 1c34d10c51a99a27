"""llama.cpp's slots as a cache policy (prefix_routing.lab.slot_cache), alone and through the fleet.

The expected values are worked out by hand from llama-server's rules (the module docstring cites
them). Most tests use one-token blocks, so a sequence's tokens are its ids and an LCP is the count
of leading equal ids.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from prefix_routing.lab.fleet import Fleet, Request
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.simulate import simulate
from prefix_routing.lab.slot_cache import MIB, SlotCache
from prefix_routing.lab.traces import Trace
from prefix_routing.rules.errors import UserError
from prefix_routing.stage.presets import get_preset
from tests.prefix_routing.cli.test_lab_commands import run
from tests.prefix_routing.lab.conftest import P5_8B

A = tuple(range(1, 9))  # 8 tokens


def slots(n: int = 1, *, ram: float = 0, similarity: float = 0.10, bytes_per_token: float = 1.0,
          context: float = math.inf) -> SlotCache:
    """One copy with ``n`` slots of one-token blocks."""
    return SlotCache(1, slots=n, context_tokens=context, block_tokens=1, similarity=similarity,
                     cache_ram_mib=ram, bytes_per_token=bytes_per_token)


def serve(cache: SlotCache, blocks, now: float, *, output: int = 1, busy_s: float = 1.0) -> tuple[float, int]:
    """One request of len(blocks) tokens arriving at ``now``, running ``busy_s`` from its slot choice;
    returns (cached tokens, the slot it got)."""
    cached = cache.lookup(0, blocks, len(blocks), output, now)
    _, slot, _, _, start = cache._pending
    cache.occupy(0, start + busy_s)
    return cached, slot


def one_slot_preset(slots: int = 1):
    return replace(get_preset(P5_8B), max_num_seqs_override=slots)


# ----------------------------------------------------------------------------- one slot


def test_one_slot_without_cache_ram_keeps_only_the_last_sequence():
    # A, then B sharing 2 of A's 8 tokens, then A: the slot holds B, so A finds the common prefix.
    b = A[:2] + (20, 21, 22, 23, 24, 25)
    cache = slots(1)
    assert serve(cache, A, 0.0)[0] == 0
    assert serve(cache, b, 2.0)[0] == 2
    assert serve(cache, A, 4.0)[0] == 2


def test_one_slot_with_cache_ram_loads_the_saved_state_back():
    # B is similar (2/8 > 0.10) but keeps only 2/8 < 0.5 of A: A is saved and loaded back for A.
    b = A[:2] + (20, 21, 22, 23, 24, 25)
    cache = slots(1, ram=1)
    serve(cache, A, 0.0)
    serve(cache, b, 2.0)
    assert cache.states[0] == [(A, 8, 8)]
    assert serve(cache, A, 4.0)[0] == 7  # all but the last token, which is recomputed
    assert cache.states[0] == [(b, 8, 8)]  # A left the saved states when it was loaded


def test_an_identical_prompt_recomputes_its_last_token():
    cache = slots(1)
    serve(cache, A, 0.0)
    assert serve(cache, A, 2.0)[0] == 7


def test_a_slot_that_keeps_half_of_its_sequence_is_not_saved():
    # B shares exactly half of A: picked by similarity with f_keep = 4/8, not < 0.5, so A is not
    # saved and nothing is loaded: A again finds only 4 tokens, however large the cache-ram.
    b = A[:4] + (20, 21, 22, 23)
    cache = slots(1, ram=-1)
    serve(cache, A, 0.0)
    serve(cache, b, 2.0)
    assert cache.states[0] == []
    assert serve(cache, A, 4.0)[0] == 4


def test_the_context_is_shared_by_the_slots_and_a_longer_prompt_is_refused():
    # -c 32 over 2 slots: 16 tokens each; a prompt of 16 is refused (no cache, slot unchanged).
    cache = slots(2, context=32)
    long = tuple(range(100, 116))
    assert serve(cache, long, 0.0) == (0, 1)
    assert cache.seqs[0][1] == ((), 0, 0)
    assert serve(cache, long, 2.0)[0] == 0
    fifteen = long[:15]
    serve(cache, fifteen, 4.0, output=10)
    assert (fifteen, 15, 15) in cache.seqs[0]  # held: 15 + 9 generated, capped at 16 - 1


# ----------------------------------------------------------------------------- choosing a slot


def test_empty_slots_tie_and_the_last_one_wins():
    cache = slots(3)
    assert serve(cache, A, 0.0)[1] == 2


def test_similarity_sends_a_request_to_its_prefix_and_an_unrelated_one_to_the_lru_slot():
    cache = slots(2)
    x = tuple(range(1, 11))
    assert serve(cache, x, 0.0)[1] == 1
    y = tuple(range(100, 110))
    assert serve(cache, y, 2.0)[1] == 0  # nothing similar: the LRU slot (never used)
    assert serve(cache, x, 4.0) == (9, 1)  # similar: x's slot, released at 5 now
    assert serve(cache, x + tuple(range(11, 21)), 6.0) == (10, 1)  # 10/20: x's slot, not the LRU 0
    assert serve(cache, tuple(range(200, 210)), 8.0) == (0, 0)  # unrelated: the LRU (released at 3)


@pytest.mark.parametrize(
    "request_blocks, slot, cached",
    [
        ((1, *range(300, 309)), 0, 0),  # LCP 1 of 10 = 0.10: not more than the threshold: LRU
        ((1, 50, *range(300, 308)), 1, 2),  # LCP 2 of 10 = 0.20: the similar slot
        ((1, 50, 51, 52, *range(300, 340)), 0, 0),  # LCP 4 of 44 < 0.10 (4 of the slot's 10 is 0.4)
    ],
)
def test_the_similarity_is_the_lcp_over_the_prompt_and_must_exceed_the_threshold(request_blocks, slot, cached):
    cache = slots(2)
    serve(cache, (1, *range(50, 59)), 0.0)  # slot 1, released at 1
    serve(cache, tuple(range(200, 210)), 2.0)  # slot 0, released at 3: slot 1 is the LRU
    serve(cache, (1, *range(50, 59)), 4.0)  # slot 1 again (similar), released at 5: now slot 0 is
    assert serve(cache, request_blocks, 6.0) == (cached, slot)


@pytest.mark.parametrize("similarity, expected", [(0.10, (7, 0)), (0.0, (0, 1))])
def test_similarity_zero_turns_the_rule_off(similarity, expected):
    cache = slots(2, similarity=similarity)
    serve(cache, tuple(range(100, 108)), 0.0)  # slot 1, released at 1
    serve(cache, A, 2.0)  # slot 0, released at 3
    assert serve(cache, A, 4.0) == expected  # A's slot, or with the rule off the LRU slot 1


def test_busy_slots_are_not_chosen():
    cache = slots(2)
    serve(cache, A, 0.0, busy_s=100.0)  # slot 1 runs A until 100
    assert serve(cache, A, 10.0) == (0, 0)  # A's slot is busy: the idle one, empty


def test_when_every_slot_is_busy_the_request_waits_for_the_first_release():
    cache = slots(2)
    serve(cache, A, 0.0, busy_s=100.0)  # slot 1 until 100
    serve(cache, tuple(range(100, 108)), 0.0, busy_s=50.0)  # slot 0 until 50
    assert serve(cache, A, 10.0) == (0, 0)  # deferred to 50, when slot 0 frees
    assert cache.ready[0] == 50.0


def test_through_the_fleet_a_deferred_request_starts_at_the_engine_finish():
    preset = one_slot_preset(1)
    fleet = Fleet(FleetConfig(instances=1, copies=1, preset=preset, cache_tokens=100_000, block_tokens=16,
                              cache_policy="llamacpp-slots", cache_ram_mib=0, strategy=Strategy.RANDOM))
    blocks = list(range(64))
    first = fleet.submit(Request(1024, 50, blocks), 0.0)
    second = fleet.submit(Request(1024, 50, blocks), 0.0)
    overhead = fleet.config.request_overhead_s
    assert second.start_s == pytest.approx(first.finish_s - overhead)
    assert fleet._slots.ready[0] == pytest.approx(second.start_s)
    assert (first.cached_tokens, second.cached_tokens) == (0, 1023)


# ----------------------------------------------------------------------------- the saved states


@pytest.mark.parametrize("shared, cached", [(10, 10), (9, 0)])
def test_a_saved_state_is_loaded_only_if_a_quarter_of_it_matches(shared, cached):
    # S (40 tokens) is saved when an unrelated U takes the slot. R (20 tokens) shares `shared` of S's
    # tokens: 10/40 = 0.25 is enough, 9/40 is not, although 9/20 of R's prompt would be.
    s = tuple(range(1, 41))
    cache = slots(1, ram=-1)
    serve(cache, s, 0.0)
    serve(cache, tuple(range(100, 140)), 2.0)
    r = s[:shared] + tuple(range(500, 520 - shared))
    assert serve(cache, r, 4.0)[0] == cached


@pytest.mark.parametrize("q_tokens, cached", [(10, 6), (12, 4)])
def test_a_loaded_state_must_beat_the_slot_on_both_ratios(q_tokens, cached):
    # The slot holds s, which shares 4 of r's 20 tokens (f_keep 4/8 = 0.5, f_sim 0.2; not similar
    # at a 0.5 threshold: LRU, so the states are searched). The saved q shares 6 (f_sim 0.3): of 10
    # tokens (f_keep 0.6) it beats the slot on both and is loaded; of 12 (f_keep 0.5, a tie) it is not.
    q = (1, 2, 3, 4, 5, 6, *range(80, 74 + q_tokens))
    cache = slots(1, ram=-1, similarity=0.5)
    serve(cache, q, 0.0)
    serve(cache, (1, 2, 3, 4, 70, 71, 72, 73), 2.0)  # 4/8 not > 0.5: LRU; q saved
    assert cache.states[0] == [(q, q_tokens, q_tokens)]
    assert serve(cache, (1, 2, 3, 4, 5, 6, *range(600, 614)), 4.0)[0] == cached


@pytest.mark.parametrize(
    "ram_mib, conversations, all_hit",
    [(40, 2, True), (40, 3, False), (64, 4, True), (64, 5, False)],
)
def test_cache_ram_keeps_the_states_that_fit_one_slot_included(ram_mib, conversations, all_hit):
    # The measured figures: one slot, 8 KiB per token, states of 2,000 tokens (15.6 MiB): 40 MiB
    # holds 2 states and keeps 2 conversations cycling, 64 MiB holds 4 and keeps 4. The slot adds
    # none: the outgoing state is saved while the incoming one still takes its room.
    cache = slots(1, ram=ram_mib, bytes_per_token=8192)
    prompts = [tuple(range(10_000 * c, 10_000 * c + 1900)) for c in range(conversations)]
    t, later = 0.0, []
    for turn in range(4):
        for p in prompts:
            cached, _ = serve(cache, p, t, output=101)  # holds 1,900 + 100 tokens
            t += 2.0
            if turn:
                later.append(cached)
    assert all(c == 1899 for c in later) if all_hit else not any(later)
    assert sum(s[2] for s in cache.states[0]) * 8192 <= ram_mib * MIB


def test_without_a_byte_limit_the_states_are_limited_to_the_context():
    # -1: no byte limit, but the states hold at most n_ctx tokens (all slots' context, here 24).
    cache = slots(1, ram=-1, context=24)
    for c in range(5):
        serve(cache, tuple(range(100 * c, 100 * c + 10)), 2.0 * c)
    assert [s[0][0] for s in cache.states[0]] == [200, 300]  # 2 × 10 tokens <= 24 < 3 × 10


def test_saving_a_state_already_saved_changes_nothing_not_even_its_age():
    # Room for 3 states of 8 tokens. X is saved, then comes back into the slot without a load (Y,
    # of 2 tokens, shares 1: similar, and keeps 1/2, not < 0.5). When Q takes the slot, X is already
    # saved: it stays the oldest, so saving R evicts X, and X comes back uncached.
    cache = slots(1, ram=3, bytes_per_token=MIB / 8)
    serve(cache, A, 0.0)
    serve(cache, tuple(range(100, 108)), 2.0)  # A saved
    assert serve(cache, (1, 20), 4.0)[0] == 0  # A shares 1 of its 8 with Y: < 0.25, not loaded
    assert serve(cache, A, 6.0)[0] == 1
    serve(cache, tuple(range(200, 208)), 8.0)  # A is in the states already: not saved again
    serve(cache, tuple(range(300, 308)), 10.0)
    assert [s[0][0] for s in cache.states[0]] == [1, 100, 200]
    assert serve(cache, A, 12.0)[0] == 0  # saving 300.. made room by evicting A, the oldest


def test_idle_slots_are_saved_when_another_task_starts():
    # 2 slots. A goes to slot 1; when B starts on slot 0, idle A is saved. A2 then takes slot 1 by
    # similarity and keeps 6/8 of it (no save). Later A4, not similar to anything (6/80, 0/80), is
    # placed by LRU and finds A among the saved states: 8 tokens. Without the idle save, A would be
    # gone and A4 would get the 6 that A2 shares.
    a2 = A[:6] + (30, 31)
    a4 = A + tuple(range(50, 122))
    cache = slots(2, ram=-1)
    assert serve(cache, A, 0.0)[1] == 1
    assert serve(cache, tuple(range(100, 108)), 2.0)[1] == 0
    assert cache.states[0] == [(A, 8, 8)]
    assert serve(cache, a2, 4.0) == (6, 1)
    serve(cache, tuple(range(200, 208)), 6.0)  # slot 0 (released at 3) is the LRU
    assert serve(cache, a4, 8.0) == (8, 1)


# ----------------------------------------------------------------------------- through the fleet


def cycling(conversations: int, turns: int, *, block_tokens: int = 100) -> Trace:
    """Conversations taking turns round robin: each turn's prompt extends the previous one's."""
    arrivals, prompts, outputs, blocks = [], [], [], []
    for turn in range(turns):
        for c in range(conversations):
            n = 20 + 5 * turn  # blocks
            arrivals.append(float(len(arrivals)) * 5.0)
            prompts.append(n * block_tokens)
            outputs.append(50)
            blocks.append([100_000 * (c + 1) + j for j in range(n)])
    return Trace(arrivals, prompts, outputs, blocks, block_tokens=block_tokens)


def test_conversations_cycling_on_one_slot_lose_their_cache_without_cache_ram():
    trace = cycling(conversations=4, turns=5)
    base = dict(instances=1, copies=1, preset=one_slot_preset(1), cache_tokens=100_000, strategy=Strategy.RANDOM)
    vllm = simulate(trace, FleetConfig(**base))
    one_slot = simulate(trace, FleetConfig(**base, cache_policy="llamacpp-slots", cache_ram_mib=0))
    saved = simulate(trace, FleetConfig(**base, cache_policy="llamacpp-slots"))  # 8 GiB of states
    assert vllm.hit_rate > 0.6
    assert one_slot.hit_rate == 0.0  # each request finds another conversation in the slot
    assert saved.hit_rate == pytest.approx(vllm.hit_rate, abs=0.01)
    assert one_slot.as_dict()["cache_policy"] == "llamacpp-slots" and vllm.as_dict()["cache_policy"] == "vllm-blocks"


def test_kv_aware_probes_the_slots():
    # 8 prompts spread over 8 copies (the load penalty); each comes back to the copy whose slot holds it.
    config = FleetConfig(instances=8, copies=1, preset=one_slot_preset(2), cache_tokens=100_000,
                         strategy=Strategy.KV_AWARE, cache_policy="llamacpp-slots", block_tokens=16)
    fleet = Fleet(config)
    prompts = [list(range(1000 * i, 1000 * i + 64)) for i in range(1, 9)]
    homes = [fleet.submit(Request(1024, 10, blocks), 0.0).instance for blocks in prompts]
    assert sorted(homes) == list(range(8))
    fleet.advance(100.0)
    assert fleet.caches.cached_prefix_blocks(homes[0], prompts[0]) == 64
    again = [fleet.submit(Request(1024, 10, blocks), 100.0) for blocks in prompts]
    assert [(p.instance, p.cached_tokens) for p in again] == [(g, 1023) for g in homes]
    assert fleet.copy_stats()[homes[0]].cached_blocks == 64


def test_a_timed_out_request_never_reaches_the_slot():
    fleet = Fleet(FleetConfig(instances=1, copies=1, preset=one_slot_preset(1), cache_tokens=100_000,
                              cache_policy="llamacpp-slots", timeout_s=0.001, strategy=Strategy.RANDOM))
    p = fleet.submit(Request(4096, 10, list(range(8))), 0.0)
    assert p.timed_out and fleet._slots.seqs[0] == [((), 0, 0)] and fleet._slots.ready[0] == -math.inf


def test_the_default_policy_is_vllm_blocks_and_llama_cpp_defaults_are_its_own():
    config = FleetConfig()
    assert (config.cache_policy, config.slot_prompt_similarity, config.cache_ram_mib) == ("vllm-blocks", 0.10, 8192)
    assert Fleet(FleetConfig(instances=1))._slots is None


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"cache_policy": "sglang"}, "cache_policy='sglang': allowed: vllm-blocks, llamacpp-slots"),
        ({"slot_prompt_similarity": 1.5}, "slot_prompt_similarity=1.5: must be a number from 0 to 1"),
        ({"slot_prompt_similarity": "0.1"}, "slot_prompt_similarity='0.1'"),
        ({"cache_ram_mib": -2}, r"cache_ram_mib=-2: must be a number of MiB >= 0 \(0: off\) or -1"),
        ({"cache_ram_mib": math.inf}, "cache_ram_mib=inf"),
        ({"cache_ram_mib": True}, "cache_ram_mib=True"),
    ],
)
def test_bad_cache_settings_are_user_errors_naming_the_field(kw, message):
    with pytest.raises(UserError, match=message):
        FleetConfig(**kw)


# ----------------------------------------------------------------------------- the command line


def test_simulate_takes_the_cache_flags_and_reports_the_policy(capsys):
    argv = ["simulate", "--workload", "long-context", "--limit", "60", "--instances", "1", "--strategy", "RANDOM",
            "--no-plots", "--cache-policy", "llamacpp-slots", "--slot-prompt-similarity", "0.2", "--cache-ram", "64"]
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    result = json.loads(out)["results"][0]
    assert (result["cache_policy"], result["slot_prompt_similarity"], result["cache_ram_mib"]) == ("llamacpp-slots", 0.2, 64)
    code, out, err = run(capsys, *argv)
    assert code == 0 and "llamacpp-slots: 1024 slots of 1,363 tokens, slot-prompt-similarity 0.2, cache-ram 64 MiB" in out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--cache-policy", "lru"], "invalid choice: 'lru'"),
        (["--slot-prompt-similarity", "2"], "must be from 0 to 1"),
        (["--cache-ram", "-5"], "must be MiB >= 0 (0 = off) or -1 (no limit)"),
    ],
)
def test_bad_cache_flags_exit_2(capsys, flags, message):
    code, out, err = run(capsys, "tune", "--workload", "long-context", "--no-plots", *flags)
    assert code == 2 and message in err
