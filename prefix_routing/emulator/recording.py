"""What the server records of each request, for tests and the load tester's cross-checks: a bounded window of
the latest requests (bodies within a byte budget) and exact counts of every request since the start."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, replace

from prefix_routing.emulator.protocol import RequestHeaders, RuntimeRequest
from prefix_routing.rules.errors import UserError

#: Requests kept in the window by default (the latest; older ones are forgotten, their counts kept).
DEFAULT_RECORD_LIMIT = 10_000
#: Bytes of request bodies kept by default: the latest bodies that fit; older records keep ``b""``.
DEFAULT_RECORD_BODY_BYTES = 32 * 1024 * 1024
RECORD_LIMIT_RANGE = (1, 1_000_000)
RECORD_BODY_BYTES_RANGE = (0, 1024 * 1024 * 1024)


@dataclass
class RecordedRequest:
    """What the server saw and did for one request. Times are ``time.monotonic()``."""

    request: RuntimeRequest
    #: ``pending`` while being answered, then ``ok``, ``error`` (answered with an HTTP error),
    #: ``stream_error`` (an exception event or SSE error mid-stream), ``truncated`` (ended early,
    #: cleanly), ``dropped`` (connection closed mid-body) or ``client_disconnected``.
    outcome: str = "pending"
    status: int | None = None
    error_code: str | None = None
    #: The injected fault that decided the outcome: ``throttle``, ``error``, ``stream_error``,
    #: ``truncate``, ``drop``; ``slow_first_chunk`` when only the first chunk was delayed.
    fault: str | None = None
    chunks_sent: int = 0
    bytes_sent: int = 0
    headers_sent_at: float | None = None
    first_chunk_at: float | None = None
    finished_at: float | None = None
    #: False when the body was not kept (``record_bodies=False``, or it fell out of the byte budget):
    #: ``body`` is then ``b""`` and ``body_length`` still says how long it was.
    body_recorded: bool = True
    body_length: int = 0

    @property
    def operation(self) -> str:
        return self.request.operation

    @property
    def endpoint_name(self) -> str:
        return self.request.endpoint_name

    @property
    def headers(self) -> RequestHeaders:
        return self.request.headers

    @property
    def body(self) -> bytes:
        return self.request.body

    @property
    def ttft(self) -> float | None:
        """Server-side time to first chunk: arrival to the first chunk written."""
        return None if self.first_chunk_at is None else self.first_chunk_at - self.request.arrival

    @property
    def duration(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.request.arrival

    def _drop_body(self) -> None:
        self.request = replace(self.request, body=b"")
        self.body_recorded = False


class RequestLog:
    """The latest ``limit`` records, the bodies of the latest within ``body_bytes``, and exact counts.

    Not thread-safe: the server calls it under its own lock. Counts (requests, outcomes) cover every
    request since the start or the last :meth:`clear`, however many the window has forgotten.
    """

    def __init__(self, *, limit: int = DEFAULT_RECORD_LIMIT, body_bytes: int = DEFAULT_RECORD_BODY_BYTES,
                 record_bodies: bool = True):
        _check_range("record_limit", limit, RECORD_LIMIT_RANGE)
        _check_range("record_body_bytes", body_bytes, RECORD_BODY_BYTES_RANGE)
        self.limit = limit
        self.body_bytes = body_bytes if record_bodies else 0
        self._records: deque[RecordedRequest] = deque(maxlen=limit)
        self._bodied: deque[RecordedRequest] = deque()  # records holding a body, oldest first
        self._held = 0  # bytes of bodies held
        self._total = 0
        self._outcomes: Counter[str] = Counter()
        self._pending: set[int] = set()  # id() of records admitted since the last clear, not finished

    def admit(self, request: RuntimeRequest) -> RecordedRequest:
        size = len(request.body)
        record = RecordedRequest(request, body_length=size)
        if len(self._records) == self.limit and self._bodied and self._bodied[0] is self._records[0]:
            self._held -= len(self._bodied.popleft().body)  # about to leave the window
        if 0 < size <= self.body_bytes:
            self._bodied.append(record)
            self._held += size
            while self._held > self.body_bytes:
                oldest = self._bodied.popleft()
                self._held -= len(oldest.body)
                oldest._drop_body()
        elif size:
            record._drop_body()
        self._records.append(record)
        self._total += 1
        self._pending.add(id(record))
        return record

    def finish(self, record: RecordedRequest) -> None:
        """Count ``record``'s outcome (set by the caller), unless it was admitted before a clear."""
        if id(record) in self._pending:
            self._pending.discard(id(record))
            self._outcomes[record.outcome] += 1

    def snapshot(self) -> list[RecordedRequest]:
        return list(self._records)

    def clear(self) -> None:
        self._records.clear()
        self._bodied.clear()
        self._held = 0
        self._total = 0
        self._outcomes.clear()
        self._pending.clear()

    @property
    def total(self) -> int:
        """Requests admitted since the start or the last clear (the window may hold fewer)."""
        return self._total

    def outcome_counts(self) -> dict[str, int]:
        counts = dict(self._outcomes)
        if self._pending:
            counts["pending"] = len(self._pending)
        return counts

    def ttft_ms(self) -> dict[str, float | int | None]:
        """Time to first token as the server measured it, in wall milliseconds (request read to first chunk
        written: what a client on the same host sees, less its own send and receive), over the streamed
        requests answered ``ok`` in the window; percentiles interpolated linearly, as numpy (and AIPerf) do."""
        values = sorted(r.ttft * 1000.0 for r in self._records
                        if r.outcome == "ok" and r.request.stream and r.ttft is not None)
        return {"p50": _percentile(values, 0.5), "p90": _percentile(values, 0.9), "samples": len(values)}

    def window(self) -> dict[str, int]:
        return {"records": len(self._records), "limit": self.limit, "bodies": len(self._bodied),
                "body_bytes": self._held, "body_bytes_limit": self.body_bytes}


def _check_range(name: str, value: int, allowed: tuple[int, int]) -> None:
    low, high = allowed
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UserError(f"{name}={value!r}: allowed an integer from {low} to {high}")


def _percentile(sorted_values: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted values, interpolated between the two nearest ranks (numpy's default)."""
    if not sorted_values:
        return None
    position = q * (len(sorted_values) - 1)
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)
