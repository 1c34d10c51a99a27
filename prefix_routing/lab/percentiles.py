"""Percentiles and distributions of the lab's figures, in pure Python: the lab runs in the
advisor's Lambda, whose asset has no numpy."""

from __future__ import annotations

import math
from typing import Sequence


def percentiles(values: Sequence[float], qs=(50, 90, 99)) -> dict:
    """Percentiles with linear interpolation between the closest ranks (numpy's default)."""
    if not len(values):
        return {f"p{q}": 0.0 for q in qs}
    ordered = sorted(map(float, values))
    return {f"p{q}": interpolated(ordered, q) for q in qs}


def interpolated(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 to 100) of values sorted already, as :func:`percentiles` reads it."""
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: Sequence[float]) -> dict:
    """Mean, P50, P90, P99 and max (all 0.0 for no values)."""
    if not len(values):
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "mean": math.fsum(values) / len(values),
        **percentiles(values, (50, 90, 99)),
        "max": float(max(values)),
    }
