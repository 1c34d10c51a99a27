"""The server's guard over its connections: how many may be open, and how long a caller may take to send.

Each accepted connection gets a :class:`Watch`. While the server waits for the next request on a kept-alive
connection the watch's deadline is ``idle_timeout_s`` away; once the request line has come, the headers
and the whole body must arrive within ``request_timeout_s`` of it (a stalled or dripping body cannot hold a
thread for longer: a per-``recv`` socket timeout alone would let a byte every few seconds go on forever);
while the answer is being written there is no deadline (a caller that stops reading is caught by the
socket's own timeout, ``send_timeout_s``). A reaper thread shuts the reading half of an overdue connection:
its blocked read returns at once, and the handler either closes quietly (idle) or answers 408 and closes
(mid-request). Beyond ``max_connections`` open connections a new one is answered 503 ``ServiceUnavailable``
and closed at once, without a thread."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass

from prefix_routing.rules.errors import UserError

DEFAULT_MAX_CONNECTIONS = 512
DEFAULT_IDLE_TIMEOUT_S = 60.0
DEFAULT_REQUEST_TIMEOUT_S = 30.0
DEFAULT_SEND_TIMEOUT_S = 60.0
MAX_CONNECTIONS_RANGE = (1, 10_000)
TIMEOUT_RANGE_S = (0.05, 3600.0)


@dataclass
class Watch:
    """One connection's read deadline (``time.monotonic()``; None: none) and whether the reaper fired."""

    phase: str = "idle"  # "idle" (waiting for a request), "request" (reading one), "answer" (writing)
    deadline: float | None = None
    expired: bool = False


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds of :class:`RuntimeServer`'s connections, checked once."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S

    def __post_init__(self) -> None:
        low, high = MAX_CONNECTIONS_RANGE
        count = self.max_connections
        if isinstance(count, bool) or not isinstance(count, int) or not low <= count <= high:
            raise UserError(f"max_connections={count!r}: allowed an integer from {low} to {high}")
        low_s, high_s = TIMEOUT_RANGE_S
        for name in ("idle_timeout_s", "request_timeout_s", "send_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low_s <= value <= high_s:
                raise UserError(f"{name}={value!r}: allowed {low_s:g} to {high_s:g} seconds")


class ConnectionGuard:
    """Counts open connections, keeps their watches, and runs the reaper. Thread-safe."""

    def __init__(self, limits: ConnectionLimits):
        self.limits = limits
        self._lock = threading.Lock()
        self._open = 0
        self._watches: dict[socket.socket, Watch] = {}
        self.refused = 0
        self.timed_out = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- admission (the accepting thread)
    def admit(self) -> bool:
        """Count one more open connection, or False when ``max_connections`` are open already."""
        with self._lock:
            if self._open >= self.limits.max_connections:
                self.refused += 1
                return False
            self._open += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._open -= 1

    @property
    def open(self) -> int:
        with self._lock:
            return self._open

    def refuse(self, connection: socket.socket) -> None:
        """Answer 503 on a connection over the limit and close it (a few hundred bytes: no thread needed)."""
        body = json.dumps({"message": f"Too many connections: at most {self.limits.max_connections} at a time"})
        head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nX-Amzn-ErrorType: ServiceUnavailable\r\nConnection: close\r\n\r\n")
        with contextlib.suppress(OSError):
            connection.settimeout(1.0)
            connection.sendall(head.encode() + body.encode())
            connection.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            connection.close()

    # -- watches (the handlers' threads)
    def watch(self, connection: socket.socket) -> Watch:
        watch = Watch()
        with self._lock:
            self._watches[connection] = watch
        return watch

    def forget(self, connection: socket.socket) -> None:
        with self._lock:
            self._watches.pop(connection, None)

    def set_phase(self, watch: Watch, phase: str) -> None:
        timeout = {"idle": self.limits.idle_timeout_s, "request": self.limits.request_timeout_s}.get(phase)
        with self._lock:
            watch.phase = phase
            watch.deadline = None if timeout is None else time.monotonic() + timeout

    def connections(self) -> list[socket.socket]:
        with self._lock:
            return list(self._watches)

    # -- the reaper
    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._reap, name="runtime-server-reaper", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def reap_once(self, now: float | None = None) -> int:
        """Shut the reading half of every connection past its deadline; returns how many."""
        now = time.monotonic() if now is None else now
        overdue = []
        with self._lock:
            for connection, watch in self._watches.items():
                if watch.deadline is not None and not watch.expired and now >= watch.deadline:
                    watch.expired = True
                    overdue.append(connection)
            self.timed_out += len(overdue)
        for connection in overdue:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RD)
        return len(overdue)

    def _reap(self) -> None:
        interval = min(1.0, self.limits.idle_timeout_s / 4, self.limits.request_timeout_s / 4)
        while not self._stop.wait(interval):
            self.reap_once()

    def status(self) -> dict[str, int]:
        with self._lock:
            return {"open": self._open, "max": self.limits.max_connections, "refused": self.refused,
                    "timed_out": self.timed_out}
