"""Hot-prefix replication at the front door: which replica of its prefix a request is sent to.

With ``normalizer.replication.enabled`` the invoker asks :meth:`Replicas.assign` for every request
it sends: the tracker (:class:`prefix_routing.rules.replication.HotPrefixes`) counts the request
under its fingerprint, the tenant's ``PrefixAwareId`` plus the prefix fingerprint of the canonical
body, and answers (j, k); the request goes out with ``PrefixAwareId = replica_id(<id>, j)``. The
tracker lives as long as the invoker, that is the execution environment (the handler builds one
invoker per environment); each environment estimates shares from the requests it serves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prefix_routing.frontdoor.config import InvokeConfig
from prefix_routing.frontdoor.copies import CopyCounts
from prefix_routing.frontdoor.record import RequestRecord
from prefix_routing.rules.replication import HotPrefixes, replica_id


class Replicas:
    """The environment's hot-prefix tracker and the copy count it sizes replicas by.

    ``copies``: the telemetry's :class:`CopyCounts` (its latest ``CurrentCopyCount`` reading), or
    None (no inference component to describe). ``clock`` gives the tracker's ``now`` (seconds;
    tests pass a fixed one). A lock serializes the tracker: the web app serves requests on threads.
    """

    def __init__(self, config: InvokeConfig, *, copies: CopyCounts | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = config.replication
        self._tracker = HotPrefixes(config.replication)
        self._copies = copies
        self._copies_min = config.copies_min
        self._copies_max = config.copies_max
        self._clock = clock
        self._lock = threading.Lock()

    def copies(self) -> int:
        """The copy count the rule assumes: the latest reading, at most the stage's ``copies_max``."""
        current = self._copies.current if self._copies is not None else None
        if current is None:
            # No reading yet (an environment's first request: copies are read after an answer has
            # streamed), or none to come: the stage's copies_min, the conservative bound. Fewer
            # copies mean a higher share before a prefix is hot and fewer replicas, so a cold
            # start under-replicates (as without replication) rather than spreading a prefix over
            # copies that may not exist, each replica a cold prefill.
            return self._copies_min
        return min(current, self._copies_max) if self._copies_max else current

    def assign(self, routing_id: str, fingerprint: str) -> tuple[int, int]:
        """(replica j, replicas k) of one request of the tenant ``routing_id`` with that prefix."""
        copies = self.copies()
        with self._lock:
            return self._tracker.assign((routing_id, fingerprint), self._clock(), copies)

    def route(self, routing_id: str, record: RequestRecord) -> str:
        """The ``PrefixAwareId`` to send a request of the tenant ``routing_id`` with, its replica
        (j, k) recorded in ``record`` (whose ``fingerprint`` is the request's prefix fingerprint)."""
        record.replica, record.replicas = self.assign(routing_id, record.fingerprint)
        return replica_id(routing_id, record.replica)

    def hot(self) -> int:
        """How many tracked prefixes have more than one replica now (the ``HotPrefixes`` gauge)."""
        copies = self.copies()
        with self._lock:
            return self._tracker.hot(copies)
