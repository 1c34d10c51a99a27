"""What comes back: the answer's stream parsed as it arrives (TTFT, usage, in-band errors, truncation) and
each error classified into one of :data:`ERROR_KINDS`."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any

ERROR_KINDS = ("throttled", "model_error", "stream_error", "truncated", "timeout", "connection", "client_error")
RETRYABLE = ("throttled", "timeout", "connection")

_THROTTLE_CODES = frozenset(
    {
        "ThrottlingException",
        "Throttling",
        "ThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "SlowDown",
        "rate_limit_exceeded",
    }
)
#: Error codes of the normalizer front door (``prefix_routing.frontdoor``: ``{"error": {"code": ...}}``
#: before the stream, ``{"error": {"type": ...}}`` in it) that name one of our kinds.
FRONT_DOOR_KINDS = {
    "throttled": "throttled",
    "model_error": "model_error",
    "model_stream_error": "stream_error",
    "stream_failure": "stream_error",
    "truncated": "truncated",
    "timeout": "timeout",
}
_RAW_KEEP_LIMIT = 16 * 1024 * 1024


class StreamParser:
    """Incremental reader of a streamed chat answer: SSE (``data: ...`` events), JSON lines, or one
    JSON document (a non-streamed answer). Fed with payload bytes in any fragmentation."""

    def __init__(self) -> None:
        self._buffer = b""
        self._raw: list[bytes] = []
        self._raw_size = 0
        self.sse = False
        self.done = False  # "data: [DONE]" seen
        self.events = 0
        self.content_chunks = 0
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error: Any = None
        self.generated_tokens: int | None = None
        self.final_text = False  # TGI-style final event (generated_text) seen
        self.unparsed = 0

    def feed(self, data: bytes) -> None:
        if not data:
            return
        if self._raw_size < _RAW_KEEP_LIMIT:
            self._raw.append(data)
            self._raw_size += len(data)
        self._buffer += data
        while True:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                break
            line, self._buffer = self._buffer[:newline], self._buffer[newline + 1 :]
            self._line(line)

    def close(self) -> None:
        """End of stream: the last line without a line feed, or a whole (pretty-printed) document."""
        if self._buffer.strip():
            line, self._buffer = self._buffer, b""
            self._line(line)
        if self.events == 0 and not self.sse and self.unparsed and self._raw:
            try:
                obj = json.loads(b"".join(self._raw))
            except ValueError:
                return
            self.unparsed = 0
            self._event(obj)

    def _line(self, line: bytes) -> None:
        line = line.strip()
        if not line:
            return
        if line.startswith(b"data:"):
            self.sse = True
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                return
        elif line.startswith((b"event:", b"id:", b"retry:", b":")):
            self.sse = self.sse or not line.startswith(b":")
            return
        else:
            payload = line
        try:
            obj = json.loads(payload)
        except ValueError:
            self.unparsed += 1
            return
        self._event(obj)

    def _event(self, obj: Any) -> None:
        self.events += 1
        if not isinstance(obj, dict):
            return
        if obj.get("error") is not None or obj.get("object") == "error":
            self.error = obj.get("error", obj)
            return
        usage = obj.get("usage")
        if isinstance(usage, dict) and usage:
            self.usage = usage
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta") or choice.get("message") or {}
                text = delta.get("content") if isinstance(delta, dict) else None
                if text is None:
                    text = choice.get("text")
                if text:
                    self.content_chunks += 1
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
        # TGI / LMI streaming: {"token": {...}, "generated_text": null | "...", "details": {...}}
        if isinstance(obj.get("token"), dict):
            self.content_chunks += 1
        if obj.get("generated_text") is not None:
            self.final_text = True
            details = obj.get("details")
            self.finish_reason = (details or {}).get("finish_reason") if isinstance(details, dict) else None
            self.finish_reason = self.finish_reason or "stop"
            if isinstance(details, dict) and isinstance(details.get("generated_tokens"), int):
                self.generated_tokens = details["generated_tokens"]

    def verdict(self, expect_usage: bool) -> tuple[str | None, str | None]:
        """``(None, None)`` for a complete answer, else ``(kind, detail)``.

        Complete means: no error event, and the stream's own end was seen: ``data: [DONE]`` on an
        OpenAI-style SSE stream (TGI-style SSE: the event with ``generated_text``); otherwise (JSON
        lines, a whole JSON answer) a finish reason, plus the usage chunk when the body asked for it.
        """
        if self.error is not None:
            kind = "stream_error"
            if isinstance(self.error, dict):
                kind = FRONT_DOOR_KINDS.get(str(self.error.get("type")), kind)
            return kind, _error_text(self.error)
        if self.sse:
            if self.done or self.final_text:
                return None, None
            return "truncated", "the stream ended without 'data: [DONE]'"
        if self.events == 0:
            return "truncated", "unreadable answer" if self.unparsed else "the stream ended before any answer"
        if self.finish_reason is None:
            return "truncated", "the stream ended without a finish reason"
        if expect_usage and self.usage is None:
            return "truncated", "the stream ended without the usage chunk"
        return None, None

    @property
    def output_tokens(self) -> int | None:
        if self.usage and isinstance(self.usage.get("completion_tokens"), int):
            return self.usage["completion_tokens"]
        if self.generated_tokens is not None:
            return self.generated_tokens
        return self.content_chunks or None

    @property
    def prompt_tokens(self) -> int | None:
        value = (self.usage or {}).get("prompt_tokens")
        return value if isinstance(value, int) else None

    @property
    def cached_tokens(self) -> int | None:
        if not self.usage:
            return None
        details = self.usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            return details["cached_tokens"]
        if isinstance(self.usage.get("cached_tokens"), int):
            return self.usage["cached_tokens"]
        return None


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        code = error.get("code") or error.get("type") or ""
        message = error.get("message") or error.get("Message") or json.dumps(error)[:200]
        return f"{code}: {message}" if code else str(message)
    return str(error)[:300]


def expects_usage(body: bytes) -> bool:
    """Whether the body asked for usage in the stream (``stream_options.include_usage``)."""
    if b"include_usage" not in body:
        return False
    try:
        data = json.loads(body)
    except ValueError:
        return False
    options = data.get("stream_options") if isinstance(data, dict) else None
    return isinstance(options, dict) and options.get("include_usage") is True


@dataclass
class Attempt:
    """What one attempt gave: ``kind`` ``None`` for success."""

    kind: str | None = None
    detail: str | None = None
    status: int | None = None
    request_id: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    bytes_received: int = 0
    #: Client-side work before the request went on the wire (botocore: validation, endpoint
    #: resolution, signing), not part of ``ttft_s``/``e2e_s``.
    client_overhead_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.kind is None

    def finish(self, parser: StreamParser, expect_usage: bool) -> Attempt:
        parser.close()
        self.output_tokens = parser.output_tokens
        self.prompt_tokens = parser.prompt_tokens
        self.cached_tokens = parser.cached_tokens
        self.finish_reason = parser.finish_reason
        if self.kind is None:
            self.kind, self.detail = parser.verdict(expect_usage)
        return self


def classify_http(status: int, code: str | None) -> str:
    if code in _THROTTLE_CODES or status == 429 and code != "ModelNotReadyException":
        return "throttled"
    if code == "ModelError":
        return "model_error"
    if code in ("ModelStreamError", "InternalStreamFailure"):
        return "stream_error"
    return f"http_{status}"


def exception_kind(error: BaseException) -> str:
    """timeout / connection / client_error for exceptions raised while sending or reading."""
    names = {cls.__name__ for cls in type(error).__mro__}
    if isinstance(error, (socket.timeout, TimeoutError)) or any("Timeout" in name for name in names):
        return "timeout"
    if isinstance(error, (OSError, http.client.HTTPException)) or names & {
        "ProtocolError",
        "ConnectionClosedError",
        "EndpointConnectionError",
        "HTTPClientError",
        "IncompleteRead",
        "NewConnectionError",
        "ResponseStreamingError",
    }:
        return "connection"
    return "client_error"


def describe_error(error: BaseException) -> str:
    text = str(error).strip().replace("\n", " ")
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__
