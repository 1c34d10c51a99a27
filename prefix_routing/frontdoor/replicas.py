"""Hot-prefix replication at the front door: which replica of its prefix a request is sent to.

With ``normalizer.replication.enabled`` the invoker asks :meth:`Replicas.assign` for every request
it sends: the tracker (:class:`prefix_routing.rules.replication.HotPrefixes`) counts the request
under its fingerprint, the tenant's ``PrefixAwareId`` plus the prefix fingerprint of the canonical
body, and answers (j, k); the request goes out with ``PrefixAwareId = replica_id(<id>, j)``. The
tracker lives as long as the invoker, that is the execution environment (the handler builds one
invoker per environment); each environment estimates shares from the requests it serves.

With ``replication.steering`` and a :class:`~prefix_routing.frontdoor.steering_store.Steering` (the
stage's table), a prefix this tracker calls hot (k > 1), or whose state this environment has written
before, is steered instead: its state in the shared store says which replica has the fewest requests
in flight (:meth:`HotPrefixState.choose`), and the answer's end gives the count back and may reveal a
collision (:meth:`answered`). A prefix that is not hot touches no store. When the store fails or
times out, the request goes to the replica in turn (the tracker's j, as without steering), and the
record says so; the request itself never fails for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prefix_routing.frontdoor.config import InvokeConfig
from prefix_routing.frontdoor.copies import CopyCounts
from prefix_routing.frontdoor.record import RequestRecord
from prefix_routing.frontdoor.steering_store import Steering, item_key
from prefix_routing.rules.replication import HotPrefixes, replica_id
from prefix_routing.rules.steering import key_tokens
from prefix_routing.rules.telemetry import STEERING_FALLBACK, STEERING_LEAST_LOADED, STEERING_TURNS


class Replicas:
    """The environment's hot-prefix tracker and the copy count it sizes replicas by.

    ``copies``: the telemetry's :class:`CopyCounts` (its latest ``CurrentCopyCount`` reading), or
    None (no inference component to describe). ``clock`` gives the tracker's ``now`` (seconds;
    tests pass a fixed one). A lock serializes the tracker: the web app serves requests on threads.
    ``steering``: the shared store's rule (:class:`Steering`), used when the stage's
    ``replication.steering`` is on; None: replicas in turn.
    """

    def __init__(self, config: InvokeConfig, *, copies: CopyCounts | None = None,
                 clock: Callable[[], float] = time.monotonic, steering: Steering | None = None) -> None:
        self.settings = config.replication
        self._tracker = HotPrefixes(config.replication)
        self.steering = steering if config.replication.steering else None
        self._prefix_length = config.settings.prefix_length
        self._known: dict[tuple[str, str], None] = {}  # prefixes whose state this environment wrote (bounded)
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

    def assign(self, routing_id: str, fingerprint: str, copies: int | None = None) -> tuple[int, int]:
        """(replica j, replicas k) of one request of the tenant ``routing_id`` with that prefix."""
        copies = self.copies() if copies is None else copies
        with self._lock:
            return self._tracker.assign((routing_id, fingerprint), self._clock(), copies)

    def route(self, routing_id: str, record: RequestRecord) -> str:
        """The ``PrefixAwareId`` to send a request of the tenant ``routing_id`` with, its replica
        (j, k) recorded in ``record`` (whose ``fingerprint`` is the request's prefix fingerprint);
        with steering, j is the replica number the shared state chose (``record.steering`` says how)."""
        copies = self.copies()
        record.replica, record.replicas = self.assign(routing_id, record.fingerprint, copies)
        prefix = (routing_id, record.fingerprint)
        if self.steering is None:
            record.steering = STEERING_TURNS if record.replicas > 1 else None
            return replica_id(routing_id, record.replica)
        with self._lock:
            known = prefix in self._known
        if record.replicas == 1 and not known:
            return replica_id(routing_id, 0)  # not hot: no store call
        started = time.perf_counter()
        try:
            ticket = self.steering.choose(item_key(*prefix), record.replicas, copies)
        except Exception:  # noqa: BLE001 - the store failed (timeout, connection, throttling, a lost race)
            record.steering, record.steering_store_error = STEERING_FALLBACK, True
            return replica_id(routing_id, record.replica)  # the tracker's turn, as without steering
        finally:
            record.steering_ms = (time.perf_counter() - started) * 1000.0
        self._remember(prefix, known)
        record.steering, record.steer_ticket, record.replica = STEERING_LEAST_LOADED, ticket, ticket.number
        record.replicas = min(record.replicas, copies)  # steering uses at most one replica per copy
        return replica_id(routing_id, ticket.number)

    def _remember(self, prefix: tuple[str, str], known: bool) -> None:
        if known:
            return
        with self._lock:
            if len(self._known) >= self.settings.capacity:  # bounded: the oldest is forgotten first
                del self._known[next(iter(self._known))]
            self._known[prefix] = None

    def answered(self, record: RequestRecord) -> None:
        """The answer of a steered request ended (or failed): its in-flight count goes back, and its
        cached tokens may reveal a collision (``record.replica_collision``). Never raises: a store
        failure leaves the count in the state (``record.steering_store_error``)."""
        ticket, record.steer_ticket = record.steer_ticket, None
        if ticket is None or self.steering is None:
            return
        cached = record.cached_tokens if record.status == 200 else None
        key = key_tokens(record.prompt_tokens, record.body_bytes, self._prefix_length)
        try:
            record.replica_collision = self.steering.answered(ticket, cached, key)
        except Exception:  # noqa: BLE001 - the count stays until the item expires
            record.steering_store_error = True

    def hot(self) -> int:
        """How many tracked prefixes have more than one replica now (the ``HotPrefixes`` gauge)."""
        copies = self.copies()
        with self._lock:
            return self._tracker.hot(copies)
