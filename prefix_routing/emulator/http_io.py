"""The HTTP side of the emulator's handler: connections (timeouts, see :mod:`.connections`), request bodies
(chunked or not, every size bounded), JSON errors for whatever HTTP itself refuses, writes that notice a
caller who went away."""

from __future__ import annotations

import contextlib
import json
import re
import socket
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol

from prefix_routing.emulator.connections import ConnectionGuard, ConnectionLimits, Watch
from prefix_routing.emulator.protocol import READ_LIMIT

_CHUNK_LINE = 1024  # a chunk-size line (hex size and extensions) longer than this is refused
_HEX_RE = re.compile(rb"[0-9a-fA-F]{1,16}")


class Disconnected(Exception):
    """The caller closed the connection while the server was reading or writing."""


class BadRequest(Exception):
    """A request HTTP itself cannot carry (a bad Content-Length, a malformed chunk): 400, then close."""


class TooLarge(Exception):
    """A body over the server's read limit: 413, then close."""


class TimedOut(Exception):
    """The request's headers and body did not arrive within ``request_timeout_s``: 408, then close."""


class ConnectionHost(Protocol):
    """What :class:`HttpIO` needs of its server: the connection bounds and the guard that enforces them."""

    limits: ConnectionLimits
    guard: ConnectionGuard


class HttpIO(BaseHTTPRequestHandler):
    """Connection plumbing shared by both wires: keep-alive, TCP_NODELAY, deadlines, bodies and writes."""

    protocol_version = "HTTP/1.1"
    server: ConnectionHost
    server_version = "prefix-routing-runtime"
    sys_version = ""
    _watch: Watch

    def setup(self) -> None:
        # The socket's own timeout bounds each blocked send (a caller that stops reading) and, as a
        # backstop, each read; the guard's deadlines bound a whole request (see connections.py).
        self.timeout = self.server.limits.send_timeout_s
        super().setup()
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._watch = self.server.guard.watch(self.connection)

    def finish(self) -> None:
        self.server.guard.forget(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet by default
        pass

    # -- deadlines
    def handle_one_request(self) -> None:
        self.server.guard.set_phase(self._watch, "idle")  # keep-alive: the next request line within idle_timeout_s
        try:
            super().handle_one_request()
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
            self.close_connection = True

    def parse_request(self) -> bool:
        self.server.guard.set_phase(self._watch, "request")  # the request line came: the rest within request_timeout_s
        if not super().parse_request():
            return False
        if self._watch.expired:  # the headers did not all come in time
            self._timed_out()
            return False
        return True

    def _answering(self) -> None:
        """The request is in: no read deadline while it is answered."""
        self.server.guard.set_phase(self._watch, "answer")

    def _timed_out(self) -> None:
        limit = self.server.limits.request_timeout_s
        self._json_error(408, f"Request timed out: the headers and body must arrive within {limit:g} s "
                              "of the request line", "RequestTimeoutException")

    # -- errors HTTP itself answers (bad request line, unknown method, header too long, ...): JSON, then close
    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        if code == HTTPStatus.NOT_IMPLEMENTED:  # no do_<METHOD>: an operation the runtime does not have
            self._json_error(404, f"Unknown operation: {self.command} {self.path}", "UnknownOperationException")
            return
        short = self.responses.get(code, ("Error", ""))[0]
        self._json_error(code, message or short)

    def _json_error(self, status: int, message: str, error_type: str | None = None) -> None:
        """An error answer with a JSON body, and the connection closed (the request body may be unread)."""
        body = json.dumps({"message": message}).encode()
        with contextlib.suppress(OSError):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if error_type:
                self.send_header("X-Amzn-ErrorType", error_type)
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.wfile.flush()
        self.close_connection = True

    # -- plumbing
    def _read_body(self) -> bytes:
        """The request body, whole. Raises BadRequest, TooLarge, TimedOut or Disconnected."""
        try:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                body = self._read_chunked()
            else:
                body = self._read_exactly(self._content_length())
        except (TimeoutError, ConnectionError) as exc:
            raise (TimedOut() if self._watch.expired else Disconnected()) from exc
        self._answering()
        return body

    def _content_length(self) -> int:
        raw = self.headers.get("Content-Length")
        if raw is None:
            return 0
        text = raw.strip()
        if not text.isdigit() or len(text) > 20:
            raise BadRequest(f"Content-Length {raw!r}: allowed a decimal integer from 0 to {READ_LIMIT}")
        length = int(text)
        if length > READ_LIMIT:
            raise TooLarge()
        return length

    def _read_exactly(self, size: int) -> bytes:
        data = self.rfile.read(size) if size else b""
        if len(data) < size:  # the caller went away, or the reaper cut a stalled body
            raise TimedOut() if self._watch.expired else Disconnected()
        return data

    def _read_chunked(self) -> bytes:
        parts, total = [], 0
        while True:
            line = self.rfile.readline(_CHUNK_LINE + 1)
            if not line.endswith(b"\n"):
                if len(line) > _CHUNK_LINE:
                    raise BadRequest(f"chunk-size line longer than {_CHUNK_LINE} bytes")
                raise TimedOut() if self._watch.expired else Disconnected()
            text = line.split(b";", 1)[0].strip()
            if not _HEX_RE.fullmatch(text):
                raise BadRequest(f"chunk size {text[:40]!r}: allowed 1 to 16 hexadecimal digits")
            size = int(text, 16)
            if size == 0:
                for _ in range(100):  # trailer fields, then the empty line
                    trailer = self.rfile.readline(_CHUNK_LINE + 1)
                    if trailer in (b"\r\n", b"\n"):
                        return b"".join(parts)
                    if not trailer.endswith(b"\n"):
                        raise TimedOut() if self._watch.expired else Disconnected()
                raise BadRequest("more than 100 trailer fields")
            total += size
            if total > READ_LIMIT:
                raise TooLarge()
            parts.append(self._read_exactly(size))
            if self.rfile.readline(8) not in (b"\r\n", b"\n"):
                raise BadRequest("chunk data not followed by CRLF")

    def _send(self, data: bytes) -> None:
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError) as exc:
            self.close_connection = True
            raise Disconnected from exc

    def _send_chunk(self, data: bytes) -> None:
        if data:
            self._send(b"%x\r\n%s\r\n" % (len(data), data))

    def _simple(self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self._send(body)
