"""The HTTP side of the emulator's handler: connections, request bodies (chunked or not), writes that notice a
caller who went away."""

from __future__ import annotations

import contextlib
import socket
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from prefix_routing.emulator.protocol import _READ_LIMIT

if TYPE_CHECKING:
    from prefix_routing.emulator.server import RuntimeServer


class _Disconnected(Exception):
    """The caller closed the connection while the server was writing."""


class HttpIO(BaseHTTPRequestHandler):
    """Connection plumbing shared by both wires: keep-alive, TCP_NODELAY, bodies and writes."""

    protocol_version = "HTTP/1.1"
    server: RuntimeServer
    server_version = "prefix-routing-runtime"
    sys_version = ""
    timeout = 120  # idle keep-alive connections

    def setup(self) -> None:
        super().setup()
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server._lock:
            self.server._connections.add(self.connection)

    def finish(self) -> None:
        with self.server._lock:
            self.server._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet by default
        pass

    # -- plumbing
    def _read_body(self) -> bytes | None:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts, total = [], 0
            while True:
                line = self.rfile.readline(1024)
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                total += size
                if total > _READ_LIMIT:
                    return None
                parts.append(self.rfile.read(size))
                self.rfile.readline(8)
        length = int(self.headers.get("Content-Length") or 0)
        if length > _READ_LIMIT:
            return None
        return self.rfile.read(length) if length else b""

    def _send(self, data: bytes) -> None:
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError) as exc:
            self.close_connection = True
            raise _Disconnected from exc

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
