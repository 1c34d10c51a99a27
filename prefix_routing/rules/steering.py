"""Steering a hot prefix over its replicas by what the answers tell: load, and collisions.

Replication (:mod:`prefix_routing.rules.replication`) gives a hot prefix k replicas, each a
``PrefixAwareId`` (``<id>-r<j>``) that SageMaker's closed router hashes to a copy, like balls into
bins: two replicas may land on one copy (a *collision*: that copy gets twice the prefix's share and
another copy none of it). The front door cannot see where an id lands, but every answer tells it two
things about the copy that served it:

- its **cached tokens**: a replica's first answer that finds the prefix's key already cached came
  from a copy that already held the prefix (another replica's, or a spill's): a collision. The
  replica's number is retired and a fresh one drawn (up to ``max_redraws`` per prefix), so that the
  prefix's replicas end on distinct copies;
- its **end**: the replica's in-flight count (sent, not yet answered), kept in a store every
  execution environment shares, is the load the next choice looks at.

The rule (:meth:`HotPrefixState.choose`): the replica with the fewest requests in flight, ties to the
one sent the fewest requests since it was drawn, then to the lowest slot. On a lightly loaded
endpoint nothing is in flight and this is equal turns, so every replica carries the same share; a
replica whose copy is slow to answer keeps requests in flight longer and is passed over. (The power
of two choices avoids herding when decisions race on stale counts; here a choice reads the counts and
writes its increment in one conditional update, so the least loaded is exact, and the lab measured it
as good or better on every workload: docs/lab.md.)

The number of replicas used is capped at the endpoint's copies: more replicas than copies must
collide. Replica 0 is the tenant's own id (its copy is the one already warm) and is never retired.

The same code decides in the front door (state in the shared store) and in the lab (state in memory,
answers at the modelled finish), so ``simulate --replication on`` predicts the front door. Standard
library only; no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

#: The share of the routing key's tokens a replica's first answer must report cached to count as a
#: collision. Below 1 because engines report cached tokens in whole KV blocks; two different keys
#: differ within the key's bytes, so another prefix's blocks cover less than the whole key.
COLLISION_SHARE: Final = 0.9
#: Fresh replica numbers drawn per hot prefix, at most (a collision costs one cold prefill; with k
#: replicas on c copies the last distinct copy takes about c / (c - k + 1) draws).
MAX_REDRAWS: Final = 64
#: Replica numbers stay below this, so ``<id>-r<j>`` stays short (replica_id cuts the id to fit 64).
MAX_REPLICA_NUMBER: Final = 9999


@dataclass(slots=True)
class ReplicaSlot:
    """One replica of a hot prefix: its number j (``<id>-r<j>``; 0 is the tenant's own id)."""

    number: int
    in_flight: int = 0
    requests: int = 0  # sent to this number since it was drawn
    judged: bool = False  # its first answer has been looked at for a collision


@dataclass(slots=True)
class HotPrefixState:
    """The replicas of one hot prefix: what the shared store holds per (routing id, fingerprint)."""

    slots: list[ReplicaSlot] = field(default_factory=lambda: [ReplicaSlot(0)])
    next_number: int = 1  # the next fresh replica number
    redraws: int = 0
    collisions: int = 0

    def choose(self, replicas: int, copies: int) -> ReplicaSlot:
        """The replica for the next request when the prefix wants ``replicas`` replicas on ``copies``
        copies; counted as sent (the caller stores the state, then sends with ``slot.number``)."""
        wanted = max(1, min(replicas, copies))
        while len(self.slots) < wanted and self.next_number <= MAX_REPLICA_NUMBER:
            self.slots.append(ReplicaSlot(self.next_number))
            self.next_number += 1
        live = self.slots[:wanted]
        best = live[0]
        for slot in live[1:]:
            if (slot.in_flight, slot.requests) < (best.in_flight, best.requests):
                best = slot
        best.in_flight += 1
        best.requests += 1
        return best

    def answered(self, number: int, cached_tokens: int | None, key_tokens: float) -> bool:
        """The answer of a request sent to replica ``number`` ended (or failed: ``cached_tokens``
        None). Returns True when it revealed a collision and the replica got a fresh number."""
        slot = next((s for s in self.slots if s.number == number), None)
        if slot is None:
            return False  # retired meanwhile (its in-flight count went with its old number)
        if slot.in_flight > 0:
            slot.in_flight -= 1
        if slot.judged or cached_tokens is None:
            return False
        slot.judged = True
        if not reveals_collision(number, cached_tokens, key_tokens):
            return False
        self.collisions += 1
        if self.redraws >= MAX_REDRAWS or self.next_number > MAX_REPLICA_NUMBER:
            return False  # out of draws: keep it (a collided replica still serves)
        self.redraws += 1
        index = self.slots.index(slot)
        self.slots[index] = ReplicaSlot(self.next_number)
        self.next_number += 1
        return True


def reveals_collision(number: int, cached_tokens: int | None, key_tokens: float) -> bool:
    """Whether the first answer of replica ``number`` with these figures reveals a collision: not for
    replica 0 (the tenant's own id), nor without cached tokens or a key, else when at least
    :data:`COLLISION_SHARE` of the key's tokens were cached. (:meth:`HotPrefixState.answered` decides
    with it; the front door's store uses it to tell an answer that is only a release.)"""
    return (number != 0 and cached_tokens is not None and key_tokens > 0
            and cached_tokens >= COLLISION_SHARE * key_tokens)


def key_tokens(prompt_tokens: int | None, body_bytes: int | None, prefix_length: int) -> float:
    """The tokens the routing key covers, estimated from what the front door knows of a request: the
    key is the canonical body's first ``prefix_length`` bytes, so its share of the prompt's tokens is
    taken as its share of the body's bytes (all of them when the body is shorter). An estimate: the
    body's JSON punctuation and field names count as bytes but not as tokens, and the chat template
    adds tokens no byte stands for; both are small beside a prefix long enough to be hot, and the
    collision test already allows 10 % (:data:`COLLISION_SHARE`). 0 when the engine reported no
    prompt tokens (the answer is then never judged a collision)."""
    if not prompt_tokens or not body_bytes or prompt_tokens < 0 or body_bytes < 0:
        return 0.0
    return prompt_tokens * min(1.0, prefix_length / body_bytes)
