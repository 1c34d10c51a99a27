"""Renewal of the stream leases an execution environment holds, while their answers stream.

A tenant's stream slot is a lease in the limits' table that expires ``lease_s`` after it was last
written (:mod:`prefix_routing.rules.limits`). While an answer streams, this environment writes it
again every third of the lease (:func:`~prefix_routing.rules.limits.renewal_interval_s`), so a
live stream keeps its slot however long it lasts, and a lease nobody renews (its environment died,
its release was lost, its admission timed out but was written) frees the slot within one lease.

One daemon thread per environment renews every lease held here, off the answer's path: a read of
the endpoint's stream can block for longer than a lease (a long prefill), so renewal cannot wait
for the next chunk. The thread runs only while leases are held. Nothing here imports boto3.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

from prefix_routing.rules.limits import renewal_interval_s

#: A renewal: (tenant, lease, new expiry in epoch seconds) → whether the lease was still there.
Renew = Callable[[str, str, float], bool]
#: The most leases one environment renews (a Lambda environment holds one; the local front door a
#: few hundred at most): beyond it a lease is left to expire rather than memory to grow.
MAX_HELD: Final = 10_000


class LeaseRenewer:
    """Keeps the leases of the streams in flight here alive until :meth:`drop`.

    ``renew`` writes one lease's new expiry; ``clock`` gives epoch seconds. With ``background``
    a daemon thread calls :meth:`renew_due` when the next renewal is due; without it (tests, a
    caller with its own loop) nothing is renewed unless :meth:`renew_due` is called.
    """

    def __init__(self, renew: Renew, lease_s: float, *, clock: Callable[[], float] = time.time,
                 background: bool = True) -> None:
        self._renew = renew
        self.lease_s = lease_s
        self.interval_s = renewal_interval_s(lease_s)
        self._clock = clock
        self._background = background
        self._due: dict[str, tuple[str, float]] = {}  # lease → (tenant, when its next renewal is due)
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self.renewed = self.failed = 0

    def hold(self, tenant: str, lease: str) -> None:
        """Renew ``lease`` of ``tenant`` (just written) from a third of a lease from now."""
        with self._changed:
            if len(self._due) >= MAX_HELD:
                return
            self._due[lease] = (tenant, self._clock() + self.interval_s)
            if self._background and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, name="lease-renewal", daemon=True)
                self._thread.start()
            self._changed.notify()

    def drop(self, lease: str) -> None:
        """Stop renewing ``lease`` (its stream ended, or is about to be given back)."""
        with self._changed:
            self._due.pop(lease, None)

    @property
    def held(self) -> int:
        return len(self._due)

    def renew_due(self) -> int:
        """Renew every lease whose renewal is due now; how many were due. A lease the table no longer
        holds (it expired and was cleaned) is dropped; a renewal that fails is tried again a third of
        a lease later, before the lease runs out."""
        now = self._clock()
        with self._changed:
            due = [(lease, tenant) for lease, (tenant, at) in self._due.items() if at <= now]
            for lease, tenant in due:
                self._due[lease] = (tenant, now + self.interval_s)
        for lease, tenant in due:
            try:
                kept = self._renew(tenant, lease, now + self.lease_s)
            except Exception:  # noqa: BLE001 - the store failed: the next try comes before the lease ends
                self.failed += 1
                continue
            self.renewed += 1
            if not kept:
                self.drop(lease)
        return len(due)

    def _run(self) -> None:
        while True:
            self.renew_due()
            with self._changed:
                if not self._due:
                    self._thread = None
                    return  # nothing held: the next hold() starts a thread again
                wait = min(at for _, at in self._due.values()) - self._clock()
                if wait > 0:  # a hold() wakes the thread early; it works out the next due time again
                    self._changed.wait(timeout=wait)
