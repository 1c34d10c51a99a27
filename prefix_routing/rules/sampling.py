"""Sampling the request log at the source: the bucket the front door logs, the filter the advisor reads with.

Each request line carries ``sample_bucket``, 0 to 9,999: a stable hash of its routing key (the
tenant's ``PrefixAwareId`` and the prefix fingerprint of its first PrefixLength bytes), so every
request of a key has the same bucket. A reader that wants a sample at rate R asks CloudWatch Logs
for the lines whose bucket is below R × 10,000 (:func:`filter_pattern`): only those cross the wire,
and a sampled key arrives with all its requests (the unit a miniature simulation needs: lab/sampling.py).

A prefix the replication rule counts as hot (rules/replication.py) is logged with ``sample_hot``:
its lines match every sample, so a hotspot is never sampled away because its one key's bucket fell
outside. A reader weighs those lines as read at rate 1 (it keeps one in 1/R of a hot key outside
the sample: ``lab.source_sample.SourceSample``), the others as read at rate R.

Standard library only: the front door, the advisor's function and the lab import it.
"""

from __future__ import annotations

import hashlib
import math
from typing import Final

from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LogField

#: A key is in the sample at rate R when its bucket is below R × SAMPLE_BUCKETS.
SAMPLE_BUCKETS: Final = 10_000
#: The lowest rate: one bucket.
MIN_RATE: Final = 1 / SAMPLE_BUCKETS


def sample_bucket(routing_id: str, fingerprint: str) -> int:
    """The routing key's bucket, 0 to SAMPLE_BUCKETS − 1: the first 8 bytes of BLAKE2b over the id and
    the fingerprint (a NUL between them: no id contains one), little-endian, mod SAMPLE_BUCKETS."""
    digest = hashlib.blake2b(f"{routing_id}\0{fingerprint}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SAMPLE_BUCKETS


def bucket_limit(rate: float) -> int:
    """The buckets a sample at ``rate`` keeps: those below this (at least one)."""
    if not MIN_RATE <= rate <= 1.0:
        raise ValueError(f"sample rate: got {rate!r}; allowed: from {MIN_RATE} to 1")
    return max(1, math.floor(rate * SAMPLE_BUCKETS + 1e-9))


def filter_pattern(rate: float) -> str:
    """The CloudWatch Logs filter pattern of the request lines in a sample at ``rate``: a sampled
    bucket, or a hot prefix. At rate 1, every request line (the reader's default pattern)."""
    message = f'$.{LogField.MESSAGE} = "{REQUEST_LOG_MESSAGE}"'
    limit = bucket_limit(rate)
    if limit >= SAMPLE_BUCKETS:
        return f"{{ {message} }}"
    return (f"{{ ({message}) && (($.{LogField.SAMPLE_BUCKET} < {limit}) || "
            f"($.{LogField.SAMPLE_HOT} IS TRUE)) }}")


def in_sample(line: dict, rate: float) -> bool:
    """Whether :func:`filter_pattern` matches a parsed log line: the same rule, for logs read from a file."""
    if line.get(LogField.MESSAGE) != REQUEST_LOG_MESSAGE:
        return False
    limit = bucket_limit(rate)
    if limit >= SAMPLE_BUCKETS:
        return True
    bucket = line.get(LogField.SAMPLE_BUCKET)
    numeric = isinstance(bucket, (int, float)) and not isinstance(bucket, bool)
    return (numeric and bucket < limit) or line.get(LogField.SAMPLE_HOT) is True


def rate_for_volume(requests: float, budget_lines: int) -> float:
    """The rate that keeps about ``budget_lines`` of a window of ``requests``: 1 when they fit, else a
    whole number of buckets (rounded down), at least one."""
    if requests <= budget_lines:
        return 1.0
    return max(MIN_RATE, math.floor(SAMPLE_BUCKETS * budget_lines / requests) / SAMPLE_BUCKETS)
