"""The replica steering rule: least in flight, then fewest sent, then lowest slot; collisions redrawn."""

from __future__ import annotations

from prefix_routing.rules.steering import (
    COLLISION_SHARE,
    MAX_REDRAWS,
    MAX_REPLICA_NUMBER,
    HotPrefixState,
    ReplicaSlot,
)


def test_a_new_hot_prefix_starts_with_its_own_id_and_grows_to_the_replicas_wanted_but_not_past_the_copies():
    state = HotPrefixState()
    assert [s.number for s in state.slots] == [0]
    assert state.choose(replicas=3, copies=7).number == 0  # all idle, none sent: the lowest slot
    assert [s.number for s in state.slots] == [0, 1, 2]
    state = HotPrefixState()
    state.choose(replicas=32, copies=4)
    assert [s.number for s in state.slots] == [0, 1, 2, 3]  # more replicas than copies must collide


def test_idle_replicas_take_equal_turns():
    state = HotPrefixState()
    picks = []
    for _ in range(6):
        slot = state.choose(replicas=3, copies=7)
        picks.append(slot.number)
        state.answered(slot.number, cached_tokens=0, key_tokens=1000)  # answered before the next one
    assert picks == [0, 1, 2, 0, 1, 2]


def test_the_fewest_in_flight_wins_over_the_fewest_sent():
    state = HotPrefixState(slots=[ReplicaSlot(0, in_flight=2, requests=1), ReplicaSlot(1, in_flight=1, requests=9),
                                  ReplicaSlot(2, in_flight=1, requests=5)], next_number=3)
    slot = state.choose(replicas=3, copies=7)
    assert slot.number == 2 and (slot.in_flight, slot.requests) == (2, 6)


def test_fewer_replicas_wanted_uses_the_first_slots_only():
    state = HotPrefixState(slots=[ReplicaSlot(0, in_flight=5), ReplicaSlot(7), ReplicaSlot(8)], next_number=9)
    assert state.choose(replicas=1, copies=7).number == 0


def test_a_first_answer_with_the_key_cached_is_a_collision_and_the_replica_gets_a_fresh_number():
    state = HotPrefixState()
    state.choose(replicas=2, copies=7)
    second = state.choose(replicas=2, copies=7)
    assert second.number == 1
    # 900 of the key's 1000 tokens cached (the share): the copy already held the prefix.
    assert state.answered(1, cached_tokens=int(COLLISION_SHARE * 1000), key_tokens=1000) is True
    assert [s.number for s in state.slots] == [0, 2] and state.next_number == 3
    assert (state.collisions, state.redraws) == (1, 1)
    # The fresh number is judged again by its own first answer; a miss there means a new copy.
    state.choose(replicas=2, copies=7)
    assert state.answered(2, cached_tokens=899, key_tokens=1000) is False
    assert [s.number for s in state.slots] == [0, 2]


def test_only_the_first_answer_is_judged_and_replica_zero_is_never_retired():
    state = HotPrefixState()
    state.choose(replicas=2, copies=7)
    state.choose(replicas=2, copies=7)
    assert state.answered(1, cached_tokens=0, key_tokens=1000) is False  # a cold first answer: a copy of its own
    assert state.answered(1, cached_tokens=1000, key_tokens=1000) is False  # later answers are warm by design
    assert state.answered(0, cached_tokens=1000, key_tokens=1000) is False
    assert [s.number for s in state.slots] == [0, 1] and state.collisions == 0


def test_a_failed_answer_frees_its_place_without_judging():
    state = HotPrefixState()
    state.choose(replicas=2, copies=7)
    slot = state.choose(replicas=2, copies=7)
    assert state.answered(1, cached_tokens=None, key_tokens=1000) is False
    assert (slot.in_flight, slot.judged) == (0, False)
    assert state.answered(1, cached_tokens=1000, key_tokens=1000) is True  # its first real answer


def test_an_answer_of_a_retired_number_changes_nothing():
    state = HotPrefixState(slots=[ReplicaSlot(0, in_flight=1)], next_number=5)
    assert state.answered(3, cached_tokens=1000, key_tokens=1000) is False
    assert state.slots == [ReplicaSlot(0, in_flight=1)]


def test_redraws_are_bounded_and_a_collided_replica_then_stays():
    state = HotPrefixState(slots=[ReplicaSlot(0), ReplicaSlot(1, in_flight=1)], next_number=2,
                           redraws=MAX_REDRAWS)
    assert state.answered(1, cached_tokens=1000, key_tokens=1000) is False
    assert [s.number for s in state.slots] == [0, 1] and state.collisions == 1
    state = HotPrefixState(slots=[ReplicaSlot(0), ReplicaSlot(1, in_flight=1)], next_number=MAX_REPLICA_NUMBER + 1)
    assert state.answered(1, cached_tokens=1000, key_tokens=1000) is False
    state = HotPrefixState(slots=[ReplicaSlot(0)], next_number=MAX_REPLICA_NUMBER + 1)
    state.choose(replicas=3, copies=7)
    assert len(state.slots) == 1  # no number left to draw: the prefix stays on what it has


def test_the_keys_tokens_are_the_prompts_in_proportion_of_the_bytes_the_key_covers():
    from prefix_routing.rules.steering import key_tokens

    assert key_tokens(1000, 8192, 4096) == 500.0  # the key is half the body
    assert key_tokens(1000, 2048, 4096) == 1000.0  # a body shorter than the key: all of it
    assert key_tokens(1000, 4096, 4096) == 1000.0
    assert key_tokens(None, 8192, 4096) == key_tokens(0, 8192, 4096) == key_tokens(1000, 0, 4096) == 0.0
    assert key_tokens(1000, None, 4096) == key_tokens(-5, 8192, 4096) == 0.0


def test_a_collision_is_a_replica_above_zero_with_nine_tenths_of_the_key_cached():
    from prefix_routing.rules.steering import reveals_collision

    assert reveals_collision(1, 450, 500.0) and not reveals_collision(1, 449, 500.0)
    assert not reveals_collision(0, 500, 500.0)  # the tenant's own id
    assert not reveals_collision(2, None, 500.0) and not reveals_collision(2, 10, 0.0)
