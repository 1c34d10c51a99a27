"""What each copy of the fleet model has served: its counters, and their totals per instance."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class CopyStats:
    instance: int
    copy: int
    outstanding: int
    requests: int
    prompt_tokens: float
    cached_tokens: float
    cached_blocks: float  # blocks in the cache now (inf never)
    spills_in: int
    timeouts: int

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class CopyCounters:
    """What each copy has served so far, one list per counter (the fleet's hot path adds to them)."""

    __slots__ = ("requests", "prompt", "cached", "spills_in", "timeouts")

    def __init__(self, n: int) -> None:
        self.requests = [0] * n
        self.prompt = [0.0] * n
        self.cached = [0.0] * n
        self.spills_in = [0] * n
        self.timeouts = [0] * n

    def stats(self, copies: int, out: Sequence[int], blocks_held: Callable[[int], float]) -> list[CopyStats]:
        """Each copy's ``CopyStats`` (``copies`` per instance; ``out``: in flight; ``blocks_held(g)``)."""
        return [
            CopyStats(g // copies, g % copies, out[g], self.requests[g], self.prompt[g], self.cached[g],
                      blocks_held(g), self.spills_in[g], self.timeouts[g])
            for g in range(len(self.requests))
        ]


def instance_totals(stats: Sequence[CopyStats], instances: int) -> list[dict]:
    """Per instance: requests, prompt tokens, cached tokens, hit rate, in flight."""
    rows = []
    for i in range(instances):
        mine = [s for s in stats if s.instance == i]
        prompt = sum(s.prompt_tokens for s in mine)
        cached = sum(s.cached_tokens for s in mine)
        rows.append(
            {
                "instance": i,
                "requests": sum(s.requests for s in mine),
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "hit_rate": cached / prompt if prompt else 0.0,
                "outstanding": sum(s.outstanding for s in mine),
            }
        )
    return rows
