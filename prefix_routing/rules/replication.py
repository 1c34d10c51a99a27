"""Bounded-load replication of hot prefixes: which prefixes get more than one warm copy, and which one.

SageMaker's PREFIX_AWARE router sends every request of a prefix (and ``PrefixAwareId``) to one
copy; its only relief for a hot prefix is the ConcurrencyThreshold, which spills the overflow to a
random cold copy. The front door chooses the ``PrefixAwareId``, so it can give a hot prefix k warm
copies instead: requests of replica j > 0 carry ``<id>-r<j>``, which the router hashes elsewhere.
The front door, the emulator's clients and the lab all use this module (standard library only,
deterministic: no clock or randomness of its own; the caller passes ``now``).

The share estimate (:class:`HotPrefixes`): each request adds weight ``2^(now / half_life_s)`` to
its fingerprint's count and to the total, so that old requests count half every half-life (the
shares are ratios, so the growing scale cancels; it is renormalized before it overflows), and
against at least 32 recent requests' worth of weight, so that a quiet endpoint's next request is
not "hot". Memory
is bounded by ``capacity`` fingerprints with the space-saving rule (Metwally et al., 2005): a new
fingerprint takes the place of the smallest count and inherits it, so a count can overestimate but
never miss a prefix whose share is above 1/capacity. Shares are judged on the count less what it
inherited (what the prefix surely had): with more prefixes than slots every slot's count is about
1/capacity of the traffic, which on a fleet of more than ``target_share_factor`` × capacity copies
would make every prefix that churns through look hot. A prefix is split only once it surely has at
least ``min_requests`` recent requests (decayed the same way): evidence, not chance.

The replica count of a fingerprint with share s on ``copies`` copies::

    k = min(max_replicas, max(1, ceil(s × copies ÷ target_share_factor)))

``s × copies`` is the share in units of the fair share 1/copies; a prefix is replicated once it
takes more than ``target_share_factor`` fair shares, and each of its k replicas then carries at
most that many. Replicas are used in turn (a per-fingerprint counter), so they get equal shares;
replica 0 keeps the original id, so the copy that is already warm keeps its traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable

from prefix_routing.rules.errors import describe_value

MAX_ROUTING_ID = 64  # PrefixAwareId: 1-64 characters (SageMaker's pattern \A\S[\p{Print}]*\z)
_RESCALE_AT = 2.0**500  # weights are renormalized before floats lose range (2^1024)
# Shares are counted against at least this many recent requests: after a quiet spell the first
# request would otherwise hold 100 % of the (decayed) traffic and get every replica.
MIN_EVIDENCE_REQUESTS = 32


@dataclass(frozen=True)
class ReplicationSettings:
    """``normalizer.replication`` of a stage. Validated on creation (ValueError names the field)."""

    enabled: bool = False
    max_replicas: int = 32
    target_share_factor: float = 0.05  # in fair shares (1/copies)
    half_life_s: float = 300.0
    # Evidence before a prefix is split: at least this many recent (decayed) requests of it, so that
    # the low share threshold of a small factor does not split cold prefixes by chance.
    min_requests: float = 12.0
    capacity: int = 256  # fingerprints tracked
    # Replicas chosen by load and retired on collision (rules/steering.py, state shared by every
    # execution environment), or used in turn by each environment (False).
    steering: bool = True

    def __post_init__(self) -> None:
        checks = (
            ("enabled", isinstance(self.enabled, bool), "true or false"),
            ("steering", isinstance(self.steering, bool), "true or false"),
            ("max_replicas", _int_in(self.max_replicas, 1, 64), "an integer from 1 to 64"),
            ("target_share_factor", _number_in(self.target_share_factor, 0.01, 1000.0), "a number from 0.01 to 1000"),
            ("half_life_s", _number_in(self.half_life_s, 1.0, 86_400.0), "seconds from 1 to 86400"),
            ("min_requests", _number_in(self.min_requests, 1.0, 10_000.0), "a number from 1 to 10000"),
            ("capacity", _int_in(self.capacity, 1, 1_000_000), "an integer from 1 to 1000000"),
        )
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"replication.{name}: got {describe_value(getattr(self, name))}; allowed: {allowed}")


def replica_count(share: float, copies: int, settings: ReplicationSettings) -> int:
    """k for a prefix with ``share`` of recent requests on ``copies`` copies (see the module docstring)."""
    if copies <= 1 or share <= 0:
        return 1
    wanted = math.ceil(share * copies / settings.target_share_factor - 1e-12)
    return max(1, min(settings.max_replicas, wanted))


def replica_id(routing_id: str | None, replica: int) -> str | None:
    """The ``PrefixAwareId`` of replica ``replica``: unchanged for 0, else ``<id>-r<j>`` (``r<j>``
    without an id), cut at the end of the id so that it stays within 64 characters."""
    if replica == 0:
        return routing_id
    suffix = f"-r{replica}" if routing_id else f"r{replica}"
    return (routing_id or "")[: MAX_ROUTING_ID - len(suffix)] + suffix


class HotPrefixes:
    """Decayed shares of recent requests per fingerprint, in bounded memory, and the replica to use."""

    __slots__ = ("settings", "_counts", "_errors", "_turns", "_total", "_floor", "_origin")

    def __init__(self, settings: ReplicationSettings | None = None) -> None:
        self.settings = settings or ReplicationSettings()
        self._counts: dict[Hashable, float] = {}  # weighted counts (space-saving: may overestimate)
        # What each count inherited when it took a slot (space-saving's error bound): count - error is
        # a count the fingerprint surely had. Hot is judged on that, else with more fingerprints than
        # slots every slot holds about 1/capacity of the traffic and every prefix looks hot on a fleet
        # of more than target_share_factor x capacity copies.
        self._errors: dict[Hashable, float] = {}
        self._turns: dict[Hashable, int] = {}  # requests assigned per fingerprint (replicas in turn)
        self._total = 0.0
        self._floor = 0.0
        self._origin: float | None = None  # weights are 2^((now - origin) / half-life)

    def __len__(self) -> int:
        return len(self._counts)

    def _weight(self, now: float) -> float:
        if self._origin is None:
            self._origin = now
        weight = 2.0 ** ((now - self._origin) / self.settings.half_life_s)
        if weight > _RESCALE_AT:  # move the origin to now: every count shrinks by the same factor
            for key in self._counts:
                self._counts[key] /= weight
            for key in self._errors:
                self._errors[key] /= weight
            self._total /= weight
            self._floor /= weight
            self._origin, weight = now, 1.0
        return weight

    def observe(self, fingerprint: Hashable, now: float) -> float:
        """Count one request of ``fingerprint`` at ``now``; returns its share of recent requests (the
        share it surely had: its count less what it inherited with its slot)."""
        weight = self._weight(now)
        counts = self._counts
        count = counts.get(fingerprint)
        if count is None:
            if len(counts) >= self.settings.capacity:  # space-saving: replace the smallest
                smallest = min(counts, key=counts.__getitem__)
                count = counts.pop(smallest)
                self._turns.pop(smallest, None)
                self._errors.pop(smallest, None)
                self._errors[fingerprint] = count
            else:
                count = 0.0
        counts[fingerprint] = count + weight
        self._total += weight
        self._floor = MIN_EVIDENCE_REQUESTS * weight
        return self._sure(fingerprint) / max(self._total, self._floor)

    def _sure(self, fingerprint: Hashable) -> float:
        return self._counts[fingerprint] - self._errors.get(fingerprint, 0.0)

    def share(self, fingerprint: Hashable) -> float:
        """The fingerprint's share at the last request (0 when it is not tracked)."""
        total = max(self._total, self._floor)
        return self._sure(fingerprint) / total if total and fingerprint in self._counts else 0.0

    def assign(self, fingerprint: Hashable, now: float, copies: int) -> tuple[int, int]:
        """(replica index j, replica count k) for one request: counted, then replicas in turn."""
        share = self.observe(fingerprint, now)
        if self._sure(fingerprint) < self.settings.min_requests * self._weight(now):
            return 0, 1  # too few recent requests of it to call it hot
        k = replica_count(share, copies, self.settings)
        if k == 1:
            return 0, 1
        turn = self._turns.get(fingerprint, 0)
        self._turns[fingerprint] = turn + 1
        return turn % k, k

    def hot(self, copies: int) -> int:
        """How many tracked fingerprints have more than one replica now."""
        total = max(self._total, self._floor)
        if not total:
            return 0
        least = self.settings.min_requests * self._floor / MIN_EVIDENCE_REQUESTS  # in the last request's weight
        sure = (self._sure(key) for key in self._counts)
        return sum(c >= least and replica_count(c / total, copies, self.settings) > 1 for c in sure)


def _int_in(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _number_in(value, low: float, high: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and low <= value <= high
