"""The web app behind the Lambda Web Adapter: streams the normalizer's answers over HTTP/1.1 chunks.

Started by ``run.sh`` (the function's handler, executed by the adapter's ``/opt/bootstrap``); see
``handler.py`` for why. Standard library only. Routes:

- ``GET /healthz``: the adapter's readiness check (``AWS_LWA_READINESS_CHECK_PATH``); 200 once the
  invoker is built (it is built before the server listens, so always 200 when it answers).
- any request whose ``x-amzn-request-context`` header is ``null``: a direct invocation passed
  through by the adapter (``POST /events``); the body is the Lambda event, the answer is
  ``handler.handle_event``'s JSON (always HTTP 200; the result carries its own ``statusCode``).
- anything else: a Function URL request; the answer streams (``Transfer-Encoding: chunked``) from
  the first ``PayloadPart`` on, or is a JSON error with its status.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import handler as lambda_handler  # noqa: E402
from prefix_routing import frontdoor  # noqa: E402

HEALTH_PATH = "/healthz"
# Largest request body read. Up to a little over the runtime's 6 MiB the normalizer answers (and logs)
# "too_large" itself; beyond, the body is refused unread (Function URLs refuse such bodies anyway).
MAX_READ_BYTES = frontdoor.MAX_BODY_BYTES_LIMIT + 64 * 1024
_REQUEST_CONTEXT = "x-amzn-request-context"
_LAMBDA_CONTEXT = "x-amzn-lambda-context"


def _json_header(value: str | None) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return None


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
    protocol_version = "HTTP/1.1"
    server_version = "prefix-routing-normalizer"
    sys_version = ""
    #: Returns the invoker; the server sets it (tests give their own).
    get_invoker: Callable[[], frontdoor.Invoker] = staticmethod(lambda_handler.get_invoker)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the request log is our JSON line
        return

    # -- plumbing
    def _send_whole(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

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
            return self._reject("too_large", f"body: {length} bytes; allowed: at most {frontdoor.MAX_BODY_BYTES_LIMIT}")
        return self.rfile.read(length) if length else b""

    def _reject(self, code: str, message: str) -> None:
        self.close_connection = True  # the rest of the body is not read
        body = json.dumps({"error": {"code": code, "message": message, "status": 400, "field": "body"}}).encode()
        self._send_whole(400, dict(frontdoor.JSON_HEADERS), body)
        return None

    # -- routes
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.split("?", 1)[0] == HEALTH_PATH:
            self._send_whole(200, dict(frontdoor.JSON_HEADERS), b'{"status":"ok"}')
            return
        self._front()

    def _front(self) -> None:
        body = self._read_body()
        if body is None:
            return
        context_header = self.headers.get(_REQUEST_CONTEXT)
        lambda_context = _json_header(self.headers.get(_LAMBDA_CONTEXT))
        if context_header is not None and context_header.strip() == "null":
            self._direct(body, lambda_context)
            return
        request = frontdoor.request_from_http(
            self.command, dict(self.headers.items()), body,
            request_context=_json_header(context_header), lambda_context=lambda_context,
        )
        try:
            invoker = self.get_invoker()
        except Exception as error:  # noqa: BLE001 - answered 500 and logged
            answer = lambda_handler._configuration_failure(error)
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
        request = frontdoor.request_from_event(event, _Direct(lambda_context))
        try:
            answer = self.get_invoker().buffered(request)
        except Exception as error:  # noqa: BLE001
            answer = lambda_handler._configuration_failure(error)
        result = {"statusCode": answer.status, "headers": answer.headers, "body": answer.body}
        payload = json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        self._send_whole(200, dict(frontdoor.JSON_HEADERS), payload)

    def _stream(self, exchange) -> None:
        head: frontdoor.Head | None = None
        pending: list[bytes] = []
        streaming = False
        try:
            for item in exchange:
                if isinstance(item, frontdoor.Head):
                    head = item
                    if head.status == 200:
                        self.send_response(200)
                        for name, value in head.headers.items():
                            self.send_header(name, value)
                        self.send_header("transfer-encoding", "chunked")
                        self.end_headers()
                        self.wfile.flush()
                        streaming = True
                elif isinstance(item, bytes):
                    if streaming:
                        if item:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(item), item))
                            self.wfile.flush()
                    else:
                        pending.append(item)
                elif isinstance(item, frontdoor.Outcome):
                    if streaming:
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
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


def make_server(host: str = "127.0.0.1", port: int = 8080,
                get_invoker: Callable[[], frontdoor.Invoker] | None = None) -> FrontDoorServer:
    """A server bound to ``host:port`` (``port=0``: a free one); ``get_invoker`` for tests."""
    handler_class = FrontDoorHandler
    if get_invoker is not None:
        handler_class = type("BoundFrontDoorHandler", (FrontDoorHandler,), {"get_invoker": staticmethod(get_invoker)})
    return FrontDoorServer((host, port), handler_class)


def main() -> None:
    try:
        lambda_handler.get_invoker()  # cold start work now, in the init phase
    except Exception as error:  # noqa: BLE001 - every request will answer 500 and retry the setup
        lambda_handler._configuration_failure(error)
    port = int(os.environ.get("AWS_LWA_PORT") or os.environ.get("PORT") or 8080)
    server = make_server("127.0.0.1", port)
    print(json.dumps({"message": "prefix_routing.listening", "port": port}), flush=True)
    server.serve_forever(poll_interval=0.5)


if __name__ == "__main__":
    main()
