"""What each copy of the fleet model has served: its counters, and their totals per instance."""

from __future__ import annotations

from collections.abc import Sequence
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
