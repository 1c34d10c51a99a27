"""The inference component's copy counts, sampled once a minute and published with the request metrics.

SageMaker publishes no copy-count metric (``DesiredCopyCount`` / ``CurrentCopyCount`` are fields of
``DescribeInferenceComponent``, and no AWS metric table lists them), so the front door reads them
itself: at most once per ``interval_s`` per execution environment, after an answer has streamed
(never on the path to the first token), and the next request's EMF document carries them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class CopyCounts:
    """``sample()`` gives ``(desired, current)`` when a new reading is due, else None.

    ``current`` is the latest ``CurrentCopyCount`` read (None before the first): hot-prefix
    replication sizes its replicas by it between readings.

    ``client_factory`` makes the ``sagemaker`` (control-plane) client on first use, so the cold
    start does not pay for it. A failed read (no permission, throttling) is tried again an interval
    later; requests never fail because of it.
    """

    def __init__(self, client_factory: Callable[[], Any], component_name: str, *, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._factory = client_factory
        self._client: Any = None
        self.component_name = component_name
        self.interval_s = interval_s
        self._clock = clock
        self._next = -float("inf")
        self._lock = threading.Lock()
        self.last_error: str | None = None
        self.current: int | None = None

    def sample(self) -> tuple[int | None, int | None] | None:
        with self._lock:
            now = self._clock()
            if now < self._next:
                return None
            self._next = now + self.interval_s
            try:
                if self._client is None:
                    self._client = self._factory()
                runtime = self._client.describe_inference_component(
                    InferenceComponentName=self.component_name).get("RuntimeConfig") or {}
            except Exception as error:  # noqa: BLE001 - telemetry must never fail a request
                self.last_error = type(error).__name__
                return None
            self.last_error = None
            desired, current = runtime.get("DesiredCopyCount"), runtime.get("CurrentCopyCount")
            if isinstance(current, int) and not isinstance(current, bool):
                self.current = current
            return desired, current
