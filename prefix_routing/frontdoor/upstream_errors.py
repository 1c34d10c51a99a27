"""What went wrong upstream (throttling, model errors, timeouts), as the status and JSON error the caller gets."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final


class UpstreamError(Exception):
    """The endpoint failed the request. ``status`` is what the caller gets, ``kind`` a stable code,
    ``retryable`` whether another attempt may succeed (only ever used before the first byte)."""

    def __init__(self, status: int, kind: str, message: str, *, retryable: bool = False,
                 upstream_code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.retryable = retryable
        self.upstream_code = upstream_code

    def body(self, attempts: int | None = None) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.kind, "message": self.message, "status": self.status}
        if self.upstream_code:
            error["upstream_code"] = self.upstream_code
        if attempts:
            error["attempts"] = attempts
        return {"error": error}


_THROTTLING_CODES: Final = frozenset({
    "ThrottlingException", "Throttling", "ThrottledException", "TooManyRequestsException",
    "RequestLimitExceeded", "RequestThrottled", "SlowDown", "ProvisionedThroughputExceededException",
})
_DENIED_CODES: Final = frozenset({
    "AccessDeniedException", "AccessDenied", "UnrecognizedClientException", "ExpiredTokenException",
    "InvalidSignatureException", "IncompleteSignature", "MissingAuthenticationToken", "SignatureDoesNotMatch",
})


#: The kind of a container's own 4xx (``ModelError`` with a 4xx ``OriginalStatusCode``).
MODEL_REJECTED: Final = "model_rejected"


def _is_callers_fault(status: Any) -> bool:
    """A container status that blames the request: 4xx, but for a timeout (408) or overload (429)."""
    return isinstance(status, int) and not isinstance(status, bool) and 400 <= status <= 499 and status not in (408, 429)


def _engine_message(original: Any) -> str | None:
    """The container's own words: ``message`` (or ``error.message``) of its JSON error, else its text."""
    if not isinstance(original, str) or not original.strip():
        return None
    try:
        data = json.loads(original)
    except ValueError:
        return one_line(original)
    if isinstance(data, Mapping):
        inner = data.get("error")
        for candidate in (data.get("message"), inner.get("message") if isinstance(inner, Mapping) else inner):
            if isinstance(candidate, str) and candidate:
                return one_line(candidate)
    return one_line(original)


def one_line(text: Any, limit: int = 300) -> str:
    text = str(text).replace("\r", " ").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def classify_error(exc: BaseException) -> UpstreamError:
    """Map an exception from the runtime call or from reading its stream to an :class:`UpstreamError`.

    Recognised by class name (botocore and urllib3 are not imported here): ``ClientError`` codes
    (throttling → 429 retryable; ``ModelNotReadyException``/``ServiceUnavailable`` → 503 retryable;
    ``InternalFailure``/``InternalDependencyException``/``InternalStreamFailure``/other 5xx → 502
    retryable; ``ModelError`` with a 4xx ``OriginalStatusCode`` (not 408 or 429) → that status,
    the caller's mistake (``model_rejected``); other ``ModelError``/``ModelStreamError`` → 502; ``ValidationError`` and access errors → 502),
    read timeouts → 504, connection failures (connect timeout, refused, closed, dropped mid-body,
    corrupt event stream) → 502 retryable.
    """
    if isinstance(exc, UpstreamError):
        return exc
    names = {cls.__name__ for cls in type(exc).__mro__}
    response = getattr(exc, "response", None)
    if "ClientError" in names and isinstance(response, Mapping):
        error = response.get("Error") or {}
        code = str(error.get("Code") or "Unknown")
        message = one_line(error.get("Message") or code)
        http = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if code in _THROTTLING_CODES:
            return UpstreamError(429, "throttled", f"the endpoint is throttling requests: {message}",
                                 retryable=True, upstream_code=code)
        if code == "ModelNotReadyException":
            return UpstreamError(503, "model_not_ready", f"the model is not ready: {message}", retryable=True,
                                 upstream_code=code)
        if code == "ServiceUnavailable":
            return UpstreamError(503, "upstream_unavailable", f"the endpoint is unavailable: {message}",
                                 retryable=True, upstream_code=code)
        if code == "ModelError":
            original = response.get("OriginalStatusCode")
            if _is_callers_fault(original):
                # The container refused the request itself (a prompt over the context length, a bad
                # parameter): the caller's mistake, answered with the container's own status and words.
                detail = _engine_message(response.get("OriginalMessage")) or message
                return UpstreamError(original, MODEL_REJECTED, f"the model rejected the request ({original}): {detail}",
                                     upstream_code=code)
            detail = f" (the model answered {original})" if isinstance(original, int) else ""
            return UpstreamError(502, "model_error", f"the model failed the request{detail}: {message}",
                                 upstream_code=code)
        if code == "ModelStreamError":
            return UpstreamError(502, "model_stream_error", f"the model's stream failed: {message}",
                                 upstream_code=code)
        if code == "InternalStreamFailure":
            return UpstreamError(502, "stream_failure", f"the endpoint's stream failed: {message}", retryable=True,
                                 upstream_code=code)
        if code in ("InternalFailure", "InternalDependencyException", "InternalServerError", "ServiceFailure") or (
            isinstance(http, int) and http >= 500
        ):
            return UpstreamError(502, "upstream_error", f"the endpoint failed: {code}: {message}", retryable=True,
                                 upstream_code=code)
        if code in _DENIED_CODES:
            return UpstreamError(502, "upstream_denied", f"the front door may not invoke the endpoint: {code}",
                                 upstream_code=code)
        return UpstreamError(502, "upstream_rejected", f"the endpoint rejected the request: {code}: {message}",
                             upstream_code=code)
    if "ReadTimeoutError" in names or "ReadTimeout" in names:
        return UpstreamError(504, "timeout", "the model did not answer in time (read timeout)")
    if names & {"ConnectTimeoutError", "EndpointConnectionError", "ConnectionClosedError", "ProtocolError",
                "ConnectionError", "ParserError", "IncompleteRead", "ChecksumMismatch"}:
        return UpstreamError(502, "upstream_connection",
                             f"the connection to the endpoint failed: {type(exc).__name__}", retryable=True)
    if isinstance(exc, TimeoutError):
        return UpstreamError(504, "timeout", "the model did not answer in time")
    return UpstreamError(500, "internal", f"internal error calling the endpoint: {type(exc).__name__}")
