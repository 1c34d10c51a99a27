"""Which lines of a request log sampled at the source (rules/sampling.py) a miniature simulation
(lab/sampling.py) keeps, as the trace readers read them."""

from __future__ import annotations

from prefix_routing.rules import sampling as source
from prefix_routing.rules.sampling import SAMPLE_BUCKETS
from prefix_routing.rules.telemetry import LogField

#: Hot prefixes outside a source sample whose lines are counted (to keep one in 1/R of each): bounded.
MAX_HOT_KEYS = 100_000


class SourceSample:
    """Which lines of a request log sampled at the source (rules/sampling.py) a miniature at ``rate`` keeps.

    A line whose ``sample_bucket`` is in the sample is kept: its key arrives with all its requests.
    A line of a hot prefix (``sample_hot``) outside the sample was read at rate 1, so one in
    round(1/rate) of its key's lines is kept, the first always: the hotspot stays in the miniature, at
    the same share of its load as every sampled key. Any other line (a log read from a file, which
    no filter has thinned) is dropped. ``keep`` is the reader's hook; the counts go to the trace's notes.
    """

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.limit = source.bucket_limit(rate)
        self.every = max(1, round(1.0 / rate))
        self._hot_lines: dict = {}  # (routing id, fingerprint) -> lines seen outside the sample
        self.keyed = self.hot_kept = self.hot_thinned = self.outside = 0

    def keep(self, line: dict) -> bool:
        bucket = line.get(LogField.SAMPLE_BUCKET)
        if isinstance(bucket, int) and not isinstance(bucket, bool) and 0 <= bucket < self.limit:
            self.keyed += 1
            return True
        if line.get(LogField.SAMPLE_HOT) is not True:
            self.outside += 1
            return False
        key = (line.get(LogField.ROUTING_ID), line.get(LogField.PREFIX_FINGERPRINT))
        seen = self._hot_lines.get(key)
        if seen is None:
            if len(self._hot_lines) >= MAX_HOT_KEYS:  # bounded: past it, a new hot key keeps every line
                self.hot_kept += 1
                return True
            seen = 0
        self._hot_lines[key] = seen + 1
        if seen % self.every == 0:
            self.hot_kept += 1
            return True
        self.hot_thinned += 1
        return False

    def note(self) -> str:
        return (f"sampled at the source at rate {self.rate:g} (buckets below {self.limit:,} of {SAMPLE_BUCKETS:,}): "
                f"{self.keyed:,} lines of sampled keys; hot prefixes outside the sample: {len(self._hot_lines):,}, "
                f"their {self.hot_kept + self.hot_thinned:,} lines thinned to {self.hot_kept:,} (one in "
                f"{self.every:,}); {self.outside:,} lines outside the sample dropped")
