"""What a backend is and what it returns: a response (whole or streamed), an error reply, a mid-stream failure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from prefix_routing.emulator.protocol import ERROR_STATUS, STREAM_ERROR_KINDS, RuntimeRequest


@dataclass(frozen=True)
class ErrorReply:
    """An error answered before any response byte: a code from :data:`ERROR_STATUS` (or any code with
    an explicit ``status``) and a message. ``ModelError`` may carry its modelled members."""

    code: str
    message: str
    status: int | None = None
    original_status_code: int | None = None
    original_message: str | None = None
    log_stream_arn: str | None = None

    @property
    def http_status(self) -> int:
        if self.status is not None:
            return self.status
        try:
            return ERROR_STATUS[self.code]
        except KeyError:
            raise ValueError(f"error code {self.code!r} has no default HTTP status; give status=") from None

    def body(self) -> dict[str, Any]:
        """The rest-json error body: ``Message`` plus the shape's other members that are set."""
        out: dict[str, Any] = {"Message": self.message}
        if self.original_status_code is not None:
            out["OriginalStatusCode"] = self.original_status_code
        if self.original_message is not None:
            out["OriginalMessage"] = self.original_message
        if self.log_stream_arn is not None:
            out["LogStreamArn"] = self.log_stream_arn
        return out


class StreamFailure(Exception):
    """Raise from a backend's chunk iterator to fail the answer mid-stream.

    ``kind`` is ``ModelStreamError`` (with an ``error_code`` such as ``ModelInvocationTimeExceeded``
    or ``StreamBroken``) or ``InternalStreamFailure``. On ``InvokeEndpoint`` (not streamed) the
    server answers ``ModelError`` 424 instead.
    """

    def __init__(self, kind: str = "ModelStreamError", message: str = "stream failed", error_code: str | None = None):
        if kind not in STREAM_ERROR_KINDS:
            raise ValueError(f"stream failure kind must be one of {STREAM_ERROR_KINDS}, got {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.error_code = error_code


@dataclass
class BackendResponse:
    """A successful start of an answer: the chunks are pulled lazily, one per ``PayloadPart``
    (or per SSE write on the OpenAI path; joined into one body when not streaming)."""

    chunks: Iterable[bytes]
    content_type: str = "application/json"
    #: ``x-Amzn-Invoked-Production-Variant``; default: the request's target variant, else ``AllTraffic``.
    invoked_variant: str | None = None
    custom_attributes: str | None = None
    #: ``InvokeEndpoint`` only; the server makes one up for ``SessionId="NEW_SESSION"`` if not set.
    new_session_id: str | None = None
    closed_session_id: str | None = None


@runtime_checkable
class Backend(Protocol):
    """What the server calls for every request that passed validation and fault injection.

    ``handle`` runs on the request's own thread (the server is threaded): it may block (a queue),
    and the returned iterator may sleep between chunks. Optional: a ``status() -> dict`` method,
    served as JSON under ``GET /status``.
    """

    def handle(self, request: RuntimeRequest) -> BackendResponse | ErrorReply: ...
