"""What the server records of each request, for tests and the load tester's cross-checks."""

from __future__ import annotations

from dataclasses import dataclass

from prefix_routing.emulator.protocol import RequestHeaders, RuntimeRequest


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
