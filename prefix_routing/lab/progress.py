"""The progress bar of long lab runs: tqdm on stderr, shown only after two seconds."""

from __future__ import annotations

import sys

PROGRESS_DELAY_S = 2.0


def progress_bar(total: int, desc: str, enabled: bool | None):
    """A tqdm bar on stderr that shows up only after two seconds (None: if stderr is a terminal)."""
    if enabled is False:
        return None
    if enabled is None and not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", unit_scale=True, delay=PROGRESS_DELAY_S, file=sys.stderr, leave=False)
