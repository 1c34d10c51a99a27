"""The front door's web app: the HTTP server the Lambda Web Adapter forwards every invocation to.

``lambda/normalizer/server.py`` starts it in Lambda; ``prefix_routing.frontdoor.local`` serves the same
app on 127.0.0.1 behind a stand-in for the Function URL. Standard library only. Routes:

- ``GET /healthz``: the adapter's readiness check (``AWS_LWA_READINESS_CHECK_PATH``): 200.
- any request whose ``x-amzn-request-context`` header is ``null``: a direct invocation passed
  through by the adapter (``POST /events``); the body is the Lambda event, the answer is the
  buffered result's JSON (always HTTP 200; the result carries its own ``statusCode``).
- anything else: a Function URL request; the answer streams (``Transfer-Encoding: chunked``) from
  the first ``PayloadPart`` on, or is a JSON error with its status.

No latency of its own: every accepted connection has ``TCP_NODELAY`` (without it the first chunk
after the headers waits for the client's delayed acknowledgement, about 40 ms), the status line and
headers go out in the same send as the first bytes of the answer, and every later event in one
send. The invoker takes the request's time to first token and its end when these sends return, so
the published figures are those of bytes handed to the client's socket.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prefix_routing.frontdoor.config import JSON_HEADERS
from prefix_routing.frontdoor.invoker import Buffered, Head, Invoker, Outcome
from prefix_routing.frontdoor.request import request_from_event, request_from_http
from prefix_routing.rules import MAX_BODY_BYTES_LIMIT

HEALTH_PATH = "/healthz"
# Largest request body read. Up to a little over the runtime's 6 MiB the normalizer answers (and logs)
# "too_large" itself; beyond, the body is refused unread (Function URLs refuse such bodies anyway).
MAX_READ_BYTES = MAX_BODY_BYTES_LIMIT + 64 * 1024
REQUEST_CONTEXT_HEADER = "x-amzn-request-context"
LAMBDA_CONTEXT_HEADER = "x-amzn-lambda-context"


def _json_header(value: str | None) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return None


def _no_failure_handler(error: Exception) -> Buffered:
    body = {"error": {"code": "configuration", "message": "the front door is misconfigured", "status": 500}}
    return Buffered(500, dict(JSON_HEADERS), body)


class _Direct:
    """A Lambda context stand-in for pass-through events (request id and deadline from LWA's header)."""

    def __init__(self, lambda_context: Any) -> None:
        data = lambda_context if isinstance(lambda_context, dict) else {}
        self.aws_request_id = data.get("request_id") or data.get("requestId")
        self._deadline_ms = data.get("deadline", data.get("deadline_ms"))

    def get_remaining_time_in_millis(self) -> float | None:
        if isinstance(self._deadline_ms, (int, float)) and not isinstance(self._deadline_ms, bool):
            return self._deadline_ms - time.time() * 1000
        return None


class FrontDoorHandler(BaseHTTPRequestHandler):
    """One connection of the web app. ``get_invoker`` returns the invoker (built once, at start-up);
    ``on_failure`` turns an error building it into the 500 answer (and logs it)."""

    protocol_version = "HTTP/1.1"
    server_version = "prefix-routing-normalizer"
    sys_version = ""
    get_invoker: Callable[[], Invoker]
    on_failure: Callable[[Exception], Buffered] = staticmethod(_no_failure_handler)

    def setup(self) -> None:
        super().setup()
        # Nagle's algorithm would hold each small event until the previous one is acknowledged.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the request log is our JSON line
        return

    # -- plumbing
    def _send_whole(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self._send_with_headers(body)

    def _send_with_headers(self, data: bytes) -> None:
        """The status line, the headers and ``data`` in one send."""
        self._headers_buffer.append(b"\r\n")
        self.wfile.write(b"".join(self._headers_buffer) + data)
        self._headers_buffer = []

    def _read_body(self) -> bytes | None:
        """The request body, or None (after answering 400) if it is too large or malformed."""
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            parts, size = [], 0
            while True:
                line = self.rfile.readline(1024)
                try:
                    length = int(line.split(b";", 1)[0].strip() or b"0", 16)
                except ValueError:
                    return self._reject("invalid_body", "malformed chunked request body")
                if length == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                size += length
                if size > MAX_READ_BYTES:
                    return self._reject("too_large", f"body: larger than {MAX_READ_BYTES} bytes")
                parts.append(self.rfile.read(length))
                self.rfile.readline(1024)
        raw_length = self.headers.get("content-length") or "0"
        try:
            length = int(raw_length)
        except ValueError:
            return self._reject("invalid_body", "content-length: not a number")
        if length < 0 or length > MAX_READ_BYTES:
            return self._reject("too_large", f"body: {length} bytes; allowed: at most {MAX_BODY_BYTES_LIMIT}")
        return self.rfile.read(length) if length else b""

    def _reject(self, code: str, message: str) -> None:
        self.close_connection = True  # the rest of the body is not read
        body = json.dumps({"error": {"code": code, "message": message, "status": 400, "field": "body"}}).encode()
        self._send_whole(400, dict(JSON_HEADERS), body)
        return None

    # -- where the request comes from (the local Function URL stand-in overrides this)
    def request_contexts(self) -> tuple[str | None, Any]:
        """The raw ``x-amzn-request-context`` header (``"null"`` for a direct invocation) and the
        parsed ``x-amzn-lambda-context``, as the adapter sets them."""
        return self.headers.get(REQUEST_CONTEXT_HEADER), _json_header(self.headers.get(LAMBDA_CONTEXT_HEADER))

    # -- routes
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.split("?", 1)[0] == HEALTH_PATH:
            self._send_whole(200, dict(JSON_HEADERS), b'{"status":"ok"}')
            return
        self._front()

    def _front(self) -> None:
        body = self._read_body()
        if body is None:
            return
        context_header, lambda_context = self.request_contexts()
        if context_header is not None and context_header.strip() == "null":
            self._direct(body, lambda_context)
            return
        request = request_from_http(self.command, dict(self.headers.items()), body,
                                    request_context=_json_header(context_header), lambda_context=lambda_context)
        try:
            invoker = self.get_invoker()
        except Exception as error:  # noqa: BLE001 - answered 500 and logged
            answer = self.on_failure(error)
            self._send_whole(answer.status, answer.headers, answer.body_bytes())
            return
        self._stream(invoker.stream(request))

    # Any other method: the invoker answers 405 with a JSON error (http.server would send HTML 501).
    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _front  # noqa: N815

    def _direct(self, body: bytes, lambda_context: Any) -> None:
        try:
            event = json.loads(body)
        except ValueError:
            event = None  # request_from_event answers "not a JSON object"
        request = request_from_event(event, _Direct(lambda_context))
        try:
            answer = self.get_invoker().buffered(request)
        except Exception as error:  # noqa: BLE001
            answer = self.on_failure(error)
        result = {"statusCode": answer.status, "headers": answer.headers, "body": answer.body}
        payload = json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        self._send_whole(200, dict(JSON_HEADERS), payload)

    def _stream(self, exchange: Iterator[Head | bytes | Outcome]) -> None:
        """Write the exchange's items as they come: a 200 head waits for the first bytes and goes out
        with them; every later event is one chunk in one send."""
        head: Head | None = None
        pending: list[bytes] = []
        streaming = headers_sent = False
        try:
            for item in exchange:
                if isinstance(item, Head):
                    head = item
                    if head.status == 200:
                        self.send_response(200)
                        for name, value in head.headers.items():
                            self.send_header(name, value)
                        self.send_header("transfer-encoding", "chunked")
                        streaming = True
                elif isinstance(item, bytes):
                    if not streaming:
                        pending.append(item)
                    elif item or not headers_sent:
                        chunk = b"%x\r\n%s\r\n" % (len(item), item) if item else b""
                        if headers_sent:
                            self.wfile.write(chunk)
                        else:
                            self._send_with_headers(chunk)
                            headers_sent = True
                elif isinstance(item, Outcome):
                    if streaming:
                        end = b"0\r\n\r\n"
                        if headers_sent:
                            self.wfile.write(end)
                        else:
                            self._send_with_headers(end)
                    elif head is not None:
                        self._send_whole(head.status, head.headers, b"".join(pending))
                    break
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True  # the caller went away; exchange.close() logs it as 499
        finally:
            exchange.close()


class FrontDoorServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def make_server(host: str, port: int, get_invoker: Callable[[], Invoker], *,
                on_failure: Callable[[Exception], Buffered] | None = None,
                handler_class: type[FrontDoorHandler] = FrontDoorHandler) -> FrontDoorServer:
    """A server bound to ``host:port`` (``port=0``: a free one) answering with ``get_invoker()``'s invoker."""
    members: dict[str, Any] = {"get_invoker": staticmethod(get_invoker)}
    if on_failure is not None:
        members["on_failure"] = staticmethod(on_failure)
    return FrontDoorServer((host, port), type("BoundFrontDoorHandler", (handler_class,), members))
