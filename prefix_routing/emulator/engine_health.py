"""Health checks of real engines, as SageMaker checks the copies of an inference component.

SageMaker stops routing to a copy that fails its health checks and routes to it again once it is
replaced. :class:`EngineHealth` does the same for the emulator's engines: each engine's ``GET /health``
(llama.cpp's ``llama-server`` answers 200 when it serves, 503 while it loads) every ``interval_s``,
each within ``timeout_s``. An engine is down after ``unhealthy_after`` failed checks in a row, at once
when its port refuses the connection (the process is gone), and at once when a request could not
connect to it (:meth:`connect_failed`); it is up again after one check that passes (a restarted engine
on the same port: SageMaker's replaced copy). ``on_change`` gets the indices of the engines up, after
every change, so that the router routes among those only.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prefix_routing.rules.errors import UserError

INTERVAL_RANGE_S = (0.05, 300.0)
TIMEOUT_RANGE_S = (0.05, 60.0)
UNHEALTHY_AFTER_RANGE = (1, 100)


@dataclass
class EngineState:
    """What the checks know of one engine."""

    healthy: bool = True
    failures_in_a_row: int = 0
    checks: int = 0
    checks_failed: int = 0
    went_down: int = 0  # times the engine was taken out of routing
    last_error: str | None = None
    since: float = 0.0  # time.monotonic() of the last change

    def as_dict(self, now: float) -> dict[str, Any]:
        return {"healthy": self.healthy, "checks": self.checks, "checks_failed": self.checks_failed,
                "failures_in_a_row": self.failures_in_a_row, "went_down": self.went_down,
                "last_error": self.last_error, "for_s": round(now - self.since, 3)}


class EngineHealth:
    """The health of ``urls`` (engine base URLs), checked on one daemon thread per engine once started."""

    def __init__(self, urls: Sequence[str], *, interval_s: float = 1.0, timeout_s: float = 2.0,
                 unhealthy_after: int = 2, on_change: Callable[[list[int]], None] | None = None):
        _check("health_interval_s", interval_s, INTERVAL_RANGE_S)
        _check("health_timeout_s", timeout_s, TIMEOUT_RANGE_S)
        _check("unhealthy_after", unhealthy_after, UNHEALTHY_AFTER_RANGE, integer=True)
        self.urls = list(urls)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.unhealthy_after = unhealthy_after
        self._on_change = on_change
        self._lock = threading.Lock()
        now = time.monotonic()
        self._states = [EngineState(since=now) for _ in self.urls]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- what the backend asks
    def healthy(self) -> list[int]:
        with self._lock:
            return [g for g, state in enumerate(self._states) if state.healthy]

    def is_healthy(self, g: int) -> bool:
        with self._lock:
            return self._states[g].healthy

    def status(self, g: int) -> dict[str, Any]:
        with self._lock:
            return self._states[g].as_dict(time.monotonic())

    # -- evidence
    def check(self, g: int) -> bool:
        """One ``GET /health`` of engine ``g``, booked; True if it passed."""
        refused = False
        try:
            with urllib.request.urlopen(f"{self.urls[g]}/health", timeout=self.timeout_s) as response:
                response.read(4096)
                ok, error = response.status == 200, None if response.status == 200 else f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:  # 503 while loading
            ok, error = False, f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            refused = isinstance(reason, ConnectionRefusedError)
            ok, error = False, f"{type(reason).__name__}: {reason}"
        self._book(g, ok, error, down_now=refused)
        return ok

    def check_all(self) -> list[int]:
        """One check of every engine (one after the other); returns the engines up."""
        for g in range(len(self.urls)):
            self.check(g)
        return self.healthy()

    def connect_failed(self, g: int, error: str) -> None:
        """A request could not connect to engine ``g``: it is down until a check passes."""
        self._book(g, False, f"request could not connect: {error}", down_now=True, counted=False)

    def _book(self, g: int, ok: bool, error: str | None, *, down_now: bool = False, counted: bool = True) -> None:
        with self._lock:
            state = self._states[g]
            was = state.healthy
            if counted:
                state.checks += 1
            if ok:
                state.failures_in_a_row = 0
                state.healthy = True
            else:
                state.checks_failed += counted
                state.failures_in_a_row += 1
                state.last_error = error
                if down_now or state.failures_in_a_row >= self.unhealthy_after:
                    state.healthy = False
            changed = state.healthy != was
            if changed:
                state.since = time.monotonic()
                state.went_down += not state.healthy
            up = [i for i, s in enumerate(self._states) if s.healthy]
        if changed and self._on_change is not None:
            self._on_change(up)

    # -- the checking threads
    def start(self) -> None:
        if self._threads:
            return
        self._stop.clear()
        for g in range(len(self.urls)):
            thread = threading.Thread(target=self._loop, args=(g,), name=f"engine-health-{g}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 1)
        self._threads = []

    def _loop(self, g: int) -> None:
        while not self._stop.wait(self.interval_s):
            self.check(g)


def _check(name: str, value: Any, allowed: tuple[float, float], *, integer: bool = False) -> None:
    low, high = allowed
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        what = "an integer" if integer else "a number of seconds"
        raise UserError(f"{name}={value!r}: allowed {what} from {low:g} to {high:g}")
