"""The front door's replica steering in simulated time: the rule of ``rules/steering.py``, its state
in memory, each answer delivered when the fleet model says the request ends.

What the front door keeps in its shared store per hot prefix, this keeps in a dict; what the front
door learns when an answer's stream ends (the copy's cached tokens, and that the request left the
replica's in-flight count), this learns at the modelled finish, so requests sent before the first
answer of a fresh replica came back go where the front door would send them.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Hashable

from prefix_routing.rules.replication import HotPrefixes, ReplicationSettings
from prefix_routing.rules.steering import HotPrefixState


class SteeredReplicas:
    """Which replica number each request of a hot prefix goes to (0: the key itself)."""

    __slots__ = ("hot", "states", "_answers", "_seq")

    def __init__(self, settings: ReplicationSettings) -> None:
        self.hot = HotPrefixes(settings)
        self.states: dict[Hashable, HotPrefixState] = {}
        self._answers: list = []  # heap of (finish, seq, key, number, cached tokens or None, key tokens)
        self._seq = 0

    @property
    def collisions(self) -> int:
        """First answers of a replica that found the prefix already cached, over every prefix."""
        return sum(state.collisions for state in self.states.values())

    @property
    def redraws(self) -> int:
        """Replica numbers retired for a fresh one, over every prefix."""
        return sum(state.redraws for state in self.states.values())

    def summary(self) -> dict:
        """Its collisions and redraws, as the front door counts them."""
        return {"steering": {"replica_collisions": self.collisions, "replica_redraws": self.redraws}}

    def route(self, key: Hashable, now: float, copies: int) -> int:
        """The replica number for a request of ``key`` arriving at ``now`` on ``copies`` copies."""
        answers = self._answers
        while answers and answers[0][0] <= now:
            self._deliver(heappop(answers))
        replicas = self.hot.assign(key, now, copies)[1]
        if replicas == 1 and key not in self.states:
            return 0  # not hot: no state, as the front door keeps none for cold prefixes
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = HotPrefixState()
        return state.choose(replicas, copies).number

    def sent(self, key: Hashable, number: int, finish: float, cached_tokens: float | None, key_tokens: float) -> None:
        """A request of ``key`` went to replica ``number``; its answer ends at ``finish``."""
        if key in self.states:
            self._seq += 1
            heappush(self._answers, (finish, self._seq, key, number, cached_tokens, key_tokens))

    def _deliver(self, answer) -> None:
        _, _, key, number, cached, key_tokens = answer
        self.states[key].answered(number, None if cached is None else int(cached), key_tokens)
