"""The candidate grids and criteria of the lab, and the helpers every pass shares: percentiles,
distributions, a progress bar for long runs (tqdm, stderr, after two seconds)."""

from __future__ import annotations

import math
import sys
from typing import Sequence

CANDIDATE_PREFIX_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
CANDIDATE_THRESHOLDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)
KEY_GROUP_BLOCKS = (1, 2, 4, 8, 16, 32)
REUSE_CRITERION = 0.5  # the rule of thumb: prefix routing pays when more than half the requests reuse a prefix
SPREAD_SHARE = 0.05  # a key whose largest group is below this share spreads load
PROGRESS_DELAY_S = 2.0
_CHUNK = 4096


def _progress(total: int, desc: str, enabled: bool | None):
    """A tqdm bar on stderr that shows up only after two seconds (None: if stderr is a terminal)."""
    if enabled is False:
        return None
    if enabled is None and not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", unit_scale=True, delay=PROGRESS_DELAY_S, file=sys.stderr, leave=False)


def _percentiles(values: Sequence[float], qs=(50, 90, 99)) -> dict:
    """Percentiles with linear interpolation between the closest ranks (numpy's default), in pure
    Python: the lab runs in the advisor's Lambda, whose asset has no numpy."""
    if not len(values):
        return {f"p{q}": 0.0 for q in qs}
    ordered = sorted(map(float, values))
    return {f"p{q}": _interpolated(ordered, q) for q in qs}


def _interpolated(ordered: list[float], q: float) -> float:
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _distribution(values: Sequence[float]) -> dict:
    if not len(values):
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "mean": math.fsum(values) / len(values),
        **_percentiles(values, (50, 90, 99)),
        "max": float(max(values)),
    }
