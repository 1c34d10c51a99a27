"""The bounds on what the trace readers accept from a file or a log: counts, sizes and times.

A trace is read from outside (a file someone exported, a log group anyone who can invoke the front
door writes to), so every count, size and time in it is bounded before the fleet model sees it:
one line with ``output_tokens: 10**12`` would otherwise keep a simulation busy for days. A value
out of bounds skips its line with a reason that names the field and the bound (counted and
reported like a malformed line; with ``--strict`` it is an error).

- Tokens per request: at most 10,000,000 prompt tokens and 1,000,000 output tokens (the presets'
  models take 128k tokens of context; these leave room for longer ones and stay cheap to model).
- Bytes: a request body, a line of a trace file and ``body_bytes`` at most the runtime's 6 MiB
  (``InvokeEndpoint``'s limit, the front door's too); block hashes at most what a body that size
  has (6 MiB ÷ ``block_bytes``), ``block_bytes`` within the normalizer's range.
- Times: epoch milliseconds from 2000-01-01 to a day after now (a Mooncake trace's relative
  milliseconds from 0); a trace's requests within 31 days of each other (those further than half
  of that from the trace's median arrival are skipped: a month of requests, and a bounded number
  of autoscaling periods to model).
"""

from __future__ import annotations

import time

from prefix_routing.rules.constants import BLOCK_BYTES_MAX, BLOCK_BYTES_MIN, MAX_BODY_BYTES_LIMIT

MAX_PROMPT_TOKENS = 10_000_000
MAX_OUTPUT_TOKENS = 1_000_000
MAX_BODY_BYTES = MAX_BODY_BYTES_LIMIT
#: A line of a trace file: a body at the limit, and room for a log line's fields around its hashes.
MAX_LINE_BYTES = MAX_BODY_BYTES_LIMIT + 64 * 1024
BLOCK_BYTES_RANGE = (BLOCK_BYTES_MIN, BLOCK_BYTES_MAX)
EPOCH_2000_MS = 946_684_800_000
FUTURE_SLACK_MS = 86_400_000  # a day: clocks that run ahead, not requests from next year
MAX_SPAN_S = 31 * 86_400.0
#: Raw bodies arrive evenly at this many per second (they carry no times).
BODY_RATE_RANGE = (0.001, 1_000_000.0)


def max_block_hashes(block_bytes: int) -> int:
    """The most block hashes a body of the runtime's largest size has."""
    return MAX_BODY_BYTES // block_bytes


def latest_ms(now_ms: float | None = None) -> float:
    """The latest timestamp accepted: a day after now."""
    return (time.time() * 1000.0 if now_ms is None else now_ms) + FUTURE_SLACK_MS


def count_problem(name: str, value: int, high: int) -> str | None:
    """The skip reason of a count above its bound (None when within it)."""
    return f"{name!r} above {high:,}" if value > high else None


def epoch_ms_problem(name: str, value: float, *, now_ms: float | None = None) -> str | None:
    """The skip reason of an epoch-milliseconds time before 2000 or more than a day ahead."""
    if value < EPOCH_2000_MS:
        return f"{name!r} before 2000-01-01"
    if value > latest_ms(now_ms):
        return f"{name!r} more than a day in the future"
    return None


def span_reason() -> str:
    return f"timestamp more than {MAX_SPAN_S / 2 / 86_400:g} days from the trace's median arrival"
