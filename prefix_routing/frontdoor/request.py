"""The request as the front door sees it, from a Lambda event or an HTTP request, and the 4xx errors about it."""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class RequestError(Exception):
    """The request is rejected before it reaches the endpoint (4xx).

    ``code`` is a stable machine-readable kind (``invalid_json``, ``missing_tenant``, ...), ``field``
    the JSON path or header at fault, ``status`` the HTTP status.
    """

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        #: Time spent normalizing before the body was found bad (None if normalization did not run).
        self.normalize_ms: float | None = None

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message, "status": self.status}
        if self.field is not None:
            error["field"] = self.field
        return {"error": error}


@dataclass(slots=True)
class FrontRequest:
    """One request as the front door sees it, whatever transport brought it.

    ``source`` is ``"http"`` (Function URL, API Gateway, or the web app behind the Lambda Web
    Adapter) or ``"direct"`` (a direct invocation). ``request_context`` is the event's
    ``requestContext`` (HTTP only: who is calling). ``tenant``/``application`` are the fields of a
    direct invocation. ``deadline`` is a ``time.monotonic()`` instant by which the answer must be
    complete (from the Lambda context), if known. ``problem`` is a :class:`RequestError` found while
    reading the event (answered without looking further).
    """

    body: bytes | str | Mapping | None
    headers: Mapping[str, str] = field(default_factory=dict)
    source: str = "http"
    method: str = "POST"
    request_context: Mapping | None = None
    tenant: Any = None
    application: Any = None
    request_id: str | None = None
    deadline: float | None = None
    problem: RequestError | None = None
    arrival: float = field(default_factory=time.monotonic)  # time.monotonic() when the request was read
    arrival_ms: int = field(default_factory=lambda: int(time.time() * 1000))  # epoch milliseconds, same moment


def _lower_headers(headers: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(headers, Mapping):
        for key, value in headers.items():
            if isinstance(key, str) and isinstance(value, str):
                out[key.lower()] = value
    return out


def _deadline_from_remaining_ms(remaining_ms: Any, margin_s: float = 1.5) -> float | None:
    if isinstance(remaining_ms, (int, float)) and not isinstance(remaining_ms, bool) and remaining_ms > 0:
        return time.monotonic() + max(0.0, remaining_ms / 1000.0 - margin_s)
    return None


def request_from_event(event: Any, context: Any = None) -> FrontRequest:
    """A :class:`FrontRequest` from a Lambda event: Function URL / API Gateway HTTP API (payload 2.0),
    API Gateway REST API (1.0), or a direct invocation ``{"body": {...} | "<json>", "tenant": ...,
    "application": ...}``. Never raises: a malformed event gives a request whose ``problem`` is set.
    """
    request_id = getattr(context, "aws_request_id", None)
    remaining = None
    if context is not None and callable(getattr(context, "get_remaining_time_in_millis", None)):
        try:
            remaining = context.get_remaining_time_in_millis()
        except Exception:  # noqa: BLE001 - a test double without it
            remaining = None
    deadline = _deadline_from_remaining_ms(remaining)
    if not isinstance(event, Mapping):
        return FrontRequest(
            body=None, source="direct", request_id=request_id, deadline=deadline,
            problem=RequestError(400, "invalid_event", "the event is not a JSON object", "event"),
        )
    context_data = event.get("requestContext")
    is_v2 = isinstance(context_data, Mapping) and isinstance(context_data.get("http"), Mapping)
    is_v1 = isinstance(context_data, Mapping) and isinstance(event.get("httpMethod"), str)
    if is_v2 or is_v1:
        method = context_data["http"].get("method") if is_v2 else event.get("httpMethod")
        headers = _lower_headers(event.get("headers"))
        raw = event.get("body")
        problem = None
        body: bytes | str | None
        if raw is None:
            body = b""
        elif not isinstance(raw, str):
            body, problem = None, RequestError(400, "invalid_event", "the event's body is not a string", "body")
        elif event.get("isBase64Encoded"):
            try:
                body = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                body, problem = None, RequestError(400, "invalid_base64", "the body is not valid base64", "body")
        else:
            body = raw.encode("utf-8", "surrogatepass")
        return FrontRequest(
            body=body, headers=headers, source="http", method=str(method or "").upper(),
            request_context=context_data, request_id=request_id or _str(context_data.get("requestId")),
            deadline=deadline, problem=problem,
        )
    if "body" not in event:
        return FrontRequest(
            body=None, source="direct", request_id=request_id, deadline=deadline,
            problem=RequestError(
                400, "invalid_event",
                'a direct invocation needs {"body": <request body object or JSON string>, "tenant": ...}',
                "body",
            ),
        )
    raw = event.get("body")
    problem = None
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    elif not isinstance(raw, Mapping):
        problem = RequestError(400, "invalid_event", "body: must be a JSON object or a JSON string", "body")
    return FrontRequest(
        body=raw, source="direct", tenant=event.get("tenant"), application=event.get("application"),
        request_id=request_id, deadline=deadline, problem=problem,
    )


def request_from_http(
    method: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    request_context: Mapping | None = None,
    lambda_context: Mapping | None = None,
) -> FrontRequest:
    """A :class:`FrontRequest` from an HTTP request forwarded by the Lambda Web Adapter.

    ``request_context`` and ``lambda_context`` are the parsed ``x-amzn-request-context`` and
    ``x-amzn-lambda-context`` headers (the adapter sets both and overwrites any client-sent value).
    """
    request_id = None
    deadline = None
    if isinstance(lambda_context, Mapping):
        request_id = _str(lambda_context.get("request_id") or lambda_context.get("requestId"))
        deadline_ms = lambda_context.get("deadline", lambda_context.get("deadline_ms"))
        if isinstance(deadline_ms, (int, float)) and not isinstance(deadline_ms, bool):
            deadline = _deadline_from_remaining_ms(deadline_ms - time.time() * 1000)
    if request_id is None and isinstance(request_context, Mapping):
        request_id = _str(request_context.get("requestId"))
    return FrontRequest(
        body=body, headers=_lower_headers(headers), source="http", method=method.upper(),
        request_context=request_context, request_id=request_id, deadline=deadline,
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
