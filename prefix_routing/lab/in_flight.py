"""Each copy's requests in flight in the fleet model, as routing counts them: a request counts from
when it is routed to its last token (its finish, on the caller's clock), or until its client goes
away (:meth:`InFlight.release`)."""

from __future__ import annotations

import math
from heapq import heappop


class InFlight:
    """``out[g]``: copy g's requests in flight; ``done``: a heap of (finish, copy) to retire them;
    ``early``: the entries of ``done`` already released (retired without counting again)."""

    __slots__ = ("out", "done", "early")

    def __init__(self, n: int) -> None:
        self.out = [0] * n
        self.done: list = []
        self.early: dict = {}

    def retire(self, now: float) -> int:
        """Retire the requests whose last token is out by ``now``; returns how many."""
        done, out, retired = self.done, self.out, 0
        while done and done[0][0] <= now:
            entry = heappop(done)
            if self.early and self.early.get(entry):
                self.early[entry] -= 1
                continue
            out[entry[1]] -= 1
            retired += 1
        return retired

    def retire_scaled(self, now: float, pool, removed, evaluated) -> int:
        """``retire`` with copy autoscaling (``pool``: a ``CopyPool``): finishes and the pool's
        evaluations in time order. ``removed(g)`` for each copy an evaluation removes, then
        ``evaluated(t)``."""
        done, out, retired = self.done, self.out, 0
        while True:
            finish = done[0][0] if done else math.inf
            if pool.next_tick <= now and pool.next_tick <= finish:
                t = pool.next_tick
                for g in pool.tick(t, out):
                    removed(g)
                evaluated(t)
                continue
            if finish > now:
                break
            entry = heappop(done)
            if self.early and self.early.get(entry):
                self.early[entry] -= 1
                continue
            pool.record(entry[1], entry[0], out[entry[1]])
            out[entry[1]] -= 1
            retired += 1
        return retired

    def release(self, g: int, finish: float) -> None:
        """A request on copy ``g`` due to finish at ``finish`` ended early: out of the count now."""
        entry = (finish, g)
        self.out[g] -= 1
        self.early[entry] = self.early.get(entry, 0) + 1
