"""llama.cpp's slot rules at their edges (prefix_routing/lab/slot_cache.py), worked out by hand from
the module docstring's rules (and llama.cpp's code it cites). One-token blocks unless said: a
sequence is (block ids, prompt tokens, held tokens), held = prompt + output - 1 (the last sampled
token is never decoded), the f_keep ratios over the prompt part."""

from __future__ import annotations

import math

import pytest

from prefix_routing.lab.slot_cache import MIB, SlotCache, common_tokens
from tests.prefix_routing.lab.test_slot_cache import A, serve, slots


def unrelated(start: int, n: int = 8) -> tuple:
    return tuple(range(start, start + n))


# ----------------------------------------------------------------------------- what a slot holds


@pytest.mark.parametrize("output, held", [(0, 8), (1, 8), (2, 9), (5, 12)])
def test_a_slot_holds_the_prompt_and_the_generated_tokens_but_the_last(output, held):
    cache = slots(1)
    serve(cache, A, 0.0, output=output)
    assert cache.seqs[0][0] == (A, 8, held)


def test_a_one_token_prompt_is_served_and_a_prompt_of_none_changes_nothing():
    cache = slots(1, ram=-1)
    serve(cache, (5,), 0.0)
    assert cache.seqs[0][0] == ((5,), 1, 1)
    serve(cache, A, 2.0)
    cached = cache.lookup(0, (), 0, 1, 4.0)  # nothing to compute: no similarity (0/0), no state loaded
    cache.occupy(0, 5.0)
    assert cached == 0 and cache.seqs[0][0][0] == A


def test_a_prompt_without_block_ids_matches_nothing():
    cache = slots(2)
    serve(cache, A, 0.0)
    assert cache.lookup(0, (), 5, 1, 2.0) == 0


def test_the_common_prefix_is_capped_by_the_held_prompt_not_its_block_ids():
    # Blocks of 100 tokens: the slot's prompt had 250 tokens in 3 blocks (the last one half full) and
    # generated 50 more. A 400-token prompt with the same 3 blocks shares 250 tokens, not 300.
    cache = SlotCache(1, slots=1, context_tokens=math.inf, block_tokens=100, cache_ram_mib=0)
    cache.lookup(0, (1, 2, 3), 250, 51, 0.0)
    cache.occupy(0, 1.0)
    assert cache.seqs[0][0] == ((1, 2, 3), 250, 300)
    assert cache.lookup(0, (1, 2, 3, 4), 400, 1, 2.0) == 250
    assert common_tokens(((1, 2, 3), 250, 300), (1, 2, 3, 4), 400, 100) == 250
    assert common_tokens(((1, 2, 3), 250, 300), (1, 2), 150, 100) == 150  # and by the new prompt
    assert common_tokens(((), 0, 0), (1,), 100, 100) == 0 and common_tokens(((1,), 100, 100), (), 0, 100) == 0


def test_the_fresh_cache_holds_nothing():
    cache = slots(2)
    assert cache.held_prefix_blocks(0, A) == 0 and cache.probes(A) == [set()]


# ----------------------------------------------------------------------------- choosing a slot


def test_the_deferred_queue_is_first_come_first_served():
    # The choice for a request is never before the previous choice on that copy.
    cache = slots(2)
    serve(cache, A, 40.0)
    serve(cache, unrelated(100), 20.0)  # arrives "earlier" but is chosen at 40
    assert cache.ready[0] == 40.0


def test_a_one_token_prompt_goes_to_its_similar_slot():
    cache = slots(2)
    serve(cache, unrelated(200, 2), 0.0)  # slot 1, released at 1: the LRU slot later
    serve(cache, (1, 50, 51), 2.0)  # slot 0, released at 3
    assert serve(cache, (1,), 4.0)[1] == 0  # 1/1 similar to slot 0, not the LRU slot 1


def test_a_slot_released_exactly_now_is_idle():
    cache = slots(2, ram=-1)
    serve(cache, A, 0.0, busy_s=2.0)  # slot 1 until 2
    assert serve(cache, A, 2.0) == (7, 1)  # similar and idle at 2


def test_of_two_equally_similar_slots_the_first_wins():
    cache = slots(2)
    serve(cache, (1, 2, 3, 50), 0.0, busy_s=100.0)  # slot 1, busy until 100
    serve(cache, (1, 2, 3, 60), 2.0)  # slot 1 is busy: the idle slot 0
    assert serve(cache, (1, 2, 3, 70), 200.0)[1] == 0  # 3/4 similar to both: the first


def test_f_keep_is_over_the_held_prompt_not_its_generated_tokens():
    # The slot holds A (8 prompt tokens, 12 held). B shares 5: similar, and keeps 5/8 = 0.625 of the
    # prompt (5/12 would be under 0.5): the states are not used, A is not saved.
    cache = slots(1, ram=-1)
    serve(cache, A, 0.0, output=5)
    serve(cache, A[:5] + (90, 91, 92), 2.0)
    assert cache.states[0] == []


# ----------------------------------------------------------------------------- saving


def test_idle_slots_are_saved_only_with_cache_ram():
    cache = slots(2, ram=0)
    serve(cache, A, 0.0)
    serve(cache, unrelated(100), 2.0)
    assert cache.states[0] == []


def test_a_slot_released_as_a_task_starts_is_idle_and_saved():
    cache = slots(2, ram=-1)
    serve(cache, A, 0.0, busy_s=2.0)  # slot 1 until 2
    serve(cache, unrelated(100), 2.0)  # slot 0; slot 1 is idle at 2
    assert cache.states[0] == [(A, 8, 8)]


def test_a_state_of_exactly_the_byte_limit_is_saved():
    cache = slots(1, ram=1, bytes_per_token=MIB / 8)  # 8 tokens = 1 MiB
    serve(cache, A, 0.0)
    serve(cache, unrelated(100), 2.0)
    assert cache.states[0] == [(A, 8, 8)]


def test_the_oldest_states_go_until_a_new_one_fits():
    # 2 MiB, 1 MiB per state: saving the third evicts the first only.
    cache = slots(1, ram=2, bytes_per_token=MIB / 8)
    for i, start in enumerate((100, 200, 300, 400)):
        serve(cache, unrelated(start), 2.0 * i)
    assert [s[0][0] for s in cache.states[0]] == [200, 300]


def test_saved_states_a_new_one_contains_are_dropped_whatever_they_generated():
    cache = slots(1, ram=-1)
    states = [(A, 8, 12)]
    assert cache._save(states, (A + (9, 10, 11, 12), 12, 12)) is True
    assert states == [(A + (9, 10, 11, 12), 12, 12)]


def test_a_state_contained_in_a_saved_one_is_not_saved_again():
    cache = slots(1, ram=-1)
    states = [(A + (9,), 9, 9)]
    assert cache._save(states, (A, 8, 12)) is False and states == [(A + (9,), 9, 9)]
    assert cache._save(states, ((), 0, 0)) is False


def test_the_default_is_a_byte_per_token():
    cache = SlotCache(1, slots=1, context_tokens=math.inf, block_tokens=1, cache_ram_mib=24 / MIB)  # 24 bytes
    for i, start in enumerate((100, 200, 300, 400)):
        cache.lookup(0, unrelated(start), 8, 1, 2.0 * i)
        cache.occupy(0, 2.0 * i + 1)
    assert [s[0][0] for s in cache.states[0]] == [100, 200, 300]  # 3 × 8 bytes


# ----------------------------------------------------------------------------- loading


def test_a_one_token_prompt_loads_its_saved_state():
    cache = slots(1, ram=-1)
    serve(cache, (5,), 0.0)
    serve(cache, unrelated(100), 2.0)  # (5,) saved
    serve(cache, (5,), 4.0)  # not similar to the slot: LRU, and its state is loaded
    assert cache.states[0] == [(unrelated(100), 8, 8)]


def test_an_empty_slot_loads_a_state_a_quarter_of_which_matches():
    # 3 slots. A runs on slot 2 and is saved when U starts on slot 1. R (40 tokens) shares 4 with A:
    # 4/40 is not similar to slot 2, so R takes the empty slot 0, and loads A (4/8 = 0.5 of it
    # matches): 4 tokens cached.
    cache = slots(3, ram=-1)
    serve(cache, A, 0.0)
    serve(cache, unrelated(100), 2.0)
    assert cache.states[0] == [(A, 8, 8)]
    assert serve(cache, A[:4] + unrelated(500, 36), 4.0) == (4, 0)


def test_a_states_quarter_is_of_its_prompt_not_its_generated_tokens():
    # As above, A generated 4 tokens (held 12) and R shares 2: 2/8 = 0.25 of A's prompt is enough.
    cache = slots(3, ram=-1)
    serve(cache, A, 0.0, output=5)
    serve(cache, unrelated(100), 2.0)
    assert serve(cache, A[:2] + unrelated(500, 38), 4.0) == (2, 0)


def test_a_state_that_matches_too_little_does_not_stop_the_search():
    # One slot: V, then A, then U; states [V, A]. R shares 4 with A: V is skipped, A loaded.
    cache = slots(1, ram=-1)
    for i, seq in enumerate((unrelated(300), A, unrelated(100))):
        serve(cache, seq, 2.0 * i)
    assert [s[0][0] for s in cache.states[0]] == [300, 1]
    assert serve(cache, A[:4] + unrelated(500, 36), 6.0)[0] == 4


def test_a_state_must_beat_the_slot_strictly_on_similarity_too():
    # Similarity threshold 0.5 (not met at 4/8: LRU). The slot holds S; Q keeps more of itself
    # (4/6 > 4/8) but is exactly as similar to R as S (4/8): not loaded, both stay saved.
    q, s, r = (1, 2, 3, 4, 80, 81), (1, 2, 3, 4, 70, 71, 72, 73), (1, 2, 3, 4, 90, 91, 92, 93)
    cache = slots(1, ram=-1, similarity=0.5)
    serve(cache, q, 0.0)
    serve(cache, s, 2.0)
    assert serve(cache, r, 4.0)[0] == 4
    assert [seq[0] for seq in cache.states[0]] == [q, s]


# ----------------------------------------------------------------------------- the limits


def test_states_of_exactly_the_context_are_kept():
    cache = slots(1, ram=-1, context=20)  # no byte limit: at most 20 tokens of states
    for i, start in enumerate((100, 200, 300)):
        serve(cache, unrelated(start, 10), 2.0 * i)
    assert [s[0][0] for s in cache.states[0]] == [100, 200]  # 10 + 10 = 20


def test_a_large_state_evicts_as_many_old_ones_as_it_takes():
    cache = slots(1, ram=-1, context=24)
    for i, (start, n) in enumerate(((100, 10), (200, 10), (300, 20), (400, 5))):
        serve(cache, unrelated(start, n), 2.0 * i)
    assert [s[0][0] for s in cache.states[0]] == [300]  # 10 + 10 + 20 > 24: both 10s go


def test_idle_saves_are_trimmed_too():
    # 2 slots, 20 tokens of context for the states (no byte limit), prompts of 8.
    cache = slots(2, ram=-1, context=20)
    for i, start in enumerate((100, 200, 300, 400)):
        serve(cache, unrelated(start), 2.0 * i)
    assert [s[0][0] for s in cache.states[0]] == [200, 300]


def test_with_a_byte_limit_the_token_limit_grows_to_what_the_bytes_hold():
    # llama.cpp's update(): with a byte limit, at most max(n_ctx, bytes ÷ max(1, bytes per token))
    # tokens. 30 bytes at 1 byte per token, n_ctx 24: 30 tokens (three states of 10), not 24.
    cache = slots(1, ram=30 / MIB, context=24)
    for i, start in enumerate((100, 200, 300, 400, 500)):
        serve(cache, unrelated(start, 10), 2.0 * i)
    assert [s[0][0] for s in cache.states[0]] == [200, 300, 400]


def test_occupy_needs_a_lookup_on_that_copy():
    cache = SlotCache(2, slots=1, context_tokens=math.inf, block_tokens=1)
    with pytest.raises(RuntimeError, match=r"^occupy\(0\) without a lookup on that copy$"):
        cache.occupy(0, 1.0)
    cache.lookup(0, A, 8, 1, 0.0)
    with pytest.raises(RuntimeError, match=r"^occupy\(1\) without a lookup on that copy$"):
        cache.occupy(1, 1.0)


def test_a_new_state_evicts_the_oldest_ones_until_it_fits_even_the_one_asked_for():
    # 10 MiB at 1 MiB per token: states s1, s2, s3 of 3 tokens (9 MiB), the slot holds X (5 tokens).
    # s2 comes back: X is saved first, which takes evicting s1 (9 + 5 > 10) and s2 (6 + 5 > 10),
    # then the states are looked at: s2 is gone, nothing is cached.
    cache = slots(1, ram=10, bytes_per_token=MIB)
    s1, s2, s3, x = unrelated(100, 3), unrelated(200, 3), unrelated(300, 3), unrelated(400, 5)
    for i, seq in enumerate((s1, s2, s3, x)):
        serve(cache, seq, 2.0 * i)
    assert [s[0] for s in cache.states[0]] == [s1, s2, s3]
    assert serve(cache, s2, 8.0) == (0, 0)
    assert [s[0] for s in cache.states[0]] == [s3, x]


def test_a_state_must_beat_the_slots_f_keep_over_its_prompt_not_its_generated_tokens():
    # The slot holds A (8 prompt tokens, 16 held). R shares 2 with A: 2/8 = 0.25 similar (chosen),
    # f_keep 2/8 = 0.25 < 0.5 (A is saved, the states are looked at). S (16 tokens) shares 4 with R:
    # it keeps 4/16 = 0.25 of itself, not more than the slot's 2/8 = 0.25 (2/16 over A's held tokens
    # would be beaten): S is not loaded, R gets A's 2 tokens.
    s = (1, 2, 100, 101) + unrelated(200, 12)
    a = (1, 2) + unrelated(300, 6)
    r = (1, 2, 100, 101) + unrelated(500, 4)
    cache = slots(1, ram=-1)
    serve(cache, s, 0.0)
    assert serve(cache, a, 2.0, output=9) == (2, 0)
    assert cache.seqs[0][0] == (a, 8, 16)
    assert serve(cache, r, 4.0) == (2, 0)
    assert [seq[0] for seq in cache.states[0]] == [s, a]


@pytest.mark.parametrize("prompt, output, held", [(7, 1, 7), (7, 3, 7), (6, 3, 7), (5, 3, 7), (4, 3, 6)])
def test_generation_stops_one_token_short_of_the_slots_context(prompt, output, held):
    cache = SlotCache(1, slots=2, context_tokens=16, block_tokens=1, cache_ram_mib=0)  # 8 tokens a slot
    cache.lookup(0, unrelated(100, prompt), prompt, output, 0.0)
    cache.occupy(0, 1.0)
    assert cache.seqs[0][1] == (unrelated(100, prompt), prompt, held)


def test_a_fractional_slot_context_caps_at_itself_less_one():
    # -c 9 over 2 slots: 4.5 tokens a slot, generation stops at 3.5.
    cache = SlotCache(1, slots=2, context_tokens=9, block_tokens=1, cache_ram_mib=0)
    cache.lookup(0, (1, 2), 2, 2, 0.0)  # 2 + 2 - 1 = 3 held: under 3.5
    cache.occupy(0, 1.0)
    assert cache.seqs[0][1] == ((1, 2), 2, 3)
    cache.lookup(0, (5, 6, 7), 3, 2, 2.0)  # 4 held: capped at 3.5
    cache.occupy(0, 3.0)
    assert cache.seqs[0][0] == ((5, 6, 7), 3, 3.5)


def test_below_a_byte_per_token_the_token_limit_is_the_bytes():
    # llama.cpp's update(): max(n_ctx, bytes ÷ max(1, bytes per token)) tokens. 16 bytes at half a
    # byte per token, n_ctx 4: 16 tokens of states (not 8, 16 × 0.5): four states of 3 tokens stay.
    cache = slots(1, ram=16 / MIB, bytes_per_token=0.5, context=4)
    convs = [unrelated(100 * k, 3) for k in range(1, 6)]
    for i, seq in enumerate(convs):
        serve(cache, seq, 2.0 * i)
    assert [s[0] for s in cache.states[0]] == convs[:4]
