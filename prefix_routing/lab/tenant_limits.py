"""Per-tenant limits in the fleet model: the front door's rule, in simulated time.

The rule is :mod:`prefix_routing.rules.limits` (which limits a tenant has, what one admission
decides); this module keeps what the front door keeps in its table, for one run of the model:

- a tenant's **stream leases**, taken when a request is admitted and given back when its answer
  ends (its last token, or the invocation timeout); the front door renews a lease while its answer
  streams, so here a lease is held until then (no environment dies in the model);
- a tenant's **minute** (calendar minutes of ``origin_s + now``: a request log's epoch seconds, or
  the trace's own clock): requests counted on admission, tokens charged by the up-front
  :func:`~prefix_routing.rules.limits.admission_charge` (the prompt estimated from the body's
  bytes, here prompt tokens × ``bytes_per_token``, plus the output asked for: a trace does not say
  what a request asked, so the output it got) and, when the answer ends, corrected to its prompt +
  output tokens (a failed answer reports no usage: the charge stays);
- a refusal's **Retry-After**: 1 s for streams (no one knows when a stream ends), the seconds to the
  next minute for the windows; a request whose charge alone exceeds ``tokens_per_minute`` is
  refused for good.

A request refused by one limit takes nothing from the other (the front door gives back what the
other write took); when both refuse, the minute's limit is the one named, as the front door names it.
No clock, no I/O: every call takes ``now``, and calls come in time order.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from heapq import heappop, heappush
from pathlib import Path
from typing import TYPE_CHECKING

from prefix_routing.rules.errors import UserError
from prefix_routing.rules.limits import (
    admission_refusal,
    STREAM_RETRY_AFTER_S,
    CONCURRENT_STREAMS,
    TOKENS_PER_MINUTE,
    LimitSettings,
    TenantLimits,
    admission_charge,
    window_of,
    window_reset_s,
)

if TYPE_CHECKING:  # pydantic is imported only by whoever loaded the stage
    from prefix_routing.stage.config import StageConfig



@dataclass(frozen=True, slots=True)
class Refusal:
    """A 429: the limit that refused the request and when the client may try again."""

    limit: str
    retry_after_s: float
    final: bool = False  # the request alone exceeds tokens_per_minute: no retry admits it


@dataclass(frozen=True, slots=True)
class Ticket:
    """What an admitted request holds until its answer ends: its lease and its minute."""

    tenant: str
    lease: int | None
    window: int | None
    charge: int  # the tokens charged up front (replaced by the answer's usage at its end)
    charges_tokens: bool


#: The ticket of a tenant without limits (the front door never calls the store for it).
UNLIMITED = Ticket("", None, None, 0, False)


class LimitModel:
    """The front door's per-tenant counts over one run of the model."""

    def __init__(self, settings: LimitSettings, *, origin_s: float = 0.0, bytes_per_token: float = 4.0) -> None:
        self.settings = settings
        self.origin_s = origin_s
        self.bytes_per_token = bytes_per_token
        self._rules: dict[str, TenantLimits] = {}
        self._leases: dict[str, dict[int, float]] = {}  # tenant → lease → expiry
        self._minute: dict[str, list[int]] = {}  # tenant → [minute, requests, tokens] (its latest minute)
        self._ends: list = []  # heap of (answer's end, order, ticket, tokens used or None)
        self._order = 0

    def limits_of(self, tenant: str) -> TenantLimits:
        limits = self._rules.get(tenant)
        if limits is None:
            limits = self._rules[tenant] = self.settings.for_tenant(tenant)[1]
        return limits

    def admit(self, tenant: str, now: float, prompt_tokens: float, output_tokens: float = 0) -> Ticket | Refusal:
        """Admit a request of ``tenant`` at ``now`` that asks for ``output_tokens`` (a ticket to
        :meth:`end`), or refuse it."""
        limits = self.limits_of(tenant)
        if limits.unlimited:
            return UNLIMITED
        self.settle(now)
        clock = self.origin_s + now
        windowed = limits.requests_per_minute is not None or limits.tokens_per_minute is not None
        minute = charge = None
        if windowed:
            charge = admission_charge(int(prompt_tokens * self.bytes_per_token), int(output_tokens),
                                        self.settings.default_max_tokens)
            if limits.tokens_per_minute is not None and charge > limits.tokens_per_minute:
                return Refusal(TOKENS_PER_MINUTE, window_reset_s(clock), final=True)
            minute = window_of(clock)
            counts = self._minute.get(tenant)
            if counts is None or counts[0] != minute:
                counts = self._minute[tenant] = [minute, 0, 0]
        leases = self._leases.setdefault(tenant, {}) if limits.concurrent_streams is not None else {}
        held = sum(1 for expires in leases.values() if expires > now)
        # The front door's own decision (rules.limits.admission_refusal): the same limit refuses here.
        refused = admission_refusal(limits, held, counts[1] if windowed else 0, counts[2] if windowed else 0,
                                    charge or 0)
        if refused == CONCURRENT_STREAMS:
            return Refusal(CONCURRENT_STREAMS, STREAM_RETRY_AFTER_S)
        if refused is not None:
            return Refusal(refused, window_reset_s(clock))
        lease = None
        if limits.concurrent_streams is not None:
            lease = self._order
            self._order += 1
            leases[lease] = math.inf  # renewed while its answer streams: held until end() gives it back
        if windowed:
            counts[1] += 1
            counts[2] += charge
        return Ticket(tenant, lease, minute, charge or 0, limits.tokens_per_minute is not None)

    def end(self, ticket: Ticket, end_s: float, tokens_used: float | None) -> None:
        """The answer of an admitted request ends at ``end_s`` (its lease is given back then, and its
        minute's charge replaced by ``tokens_used``; None: no usage reported)."""
        if ticket is UNLIMITED:
            return
        heappush(self._ends, (end_s, self._order, ticket, tokens_used))
        self._order += 1

    def settle(self, now: float) -> None:
        """Apply the ends of the answers that ended by ``now``."""
        ends = self._ends
        while ends and ends[0][0] <= now:
            _, _, ticket, used = heappop(ends)
            if ticket.lease is not None:
                self._leases[ticket.tenant].pop(ticket.lease, None)
            if ticket.charges_tokens and used is not None:
                counts = self._minute.get(ticket.tenant)
                if counts is not None and counts[0] == ticket.window:  # an earlier minute no longer decides
                    counts[2] += int(used) - ticket.charge

    def in_flight(self, tenant: str, now: float) -> int:
        """The tenant's unexpired stream leases at ``now`` (after the answers ended by then)."""
        self.settle(now)
        return sum(1 for expires in self._leases.get(tenant, {}).values() if expires > now)


def stage_limits(stage: "StageConfig") -> LimitSettings:
    """The stage's ``[limits]`` as its front door enforces them."""
    return stage.limits.to_rules()


def load_limits(path: str | Path) -> LimitSettings:
    """A file's limits: TOML or JSON in the stage's ``[limits]`` shape (the table itself, or a file
    with a ``[limits]`` table), or the front door's ``LIMITS`` value (``{"default": ...}``)."""
    import tomllib

    from prefix_routing.stage.config import LimitsSettings

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise UserError(f"--limits {path}: {error.strerror or error}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" or text.lstrip().startswith("{") else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as error:
        raise UserError(f"--limits {path}: neither TOML nor JSON: {error}") from None
    if isinstance(data, dict) and isinstance(data.get("limits"), dict):
        data = data["limits"]
    if not isinstance(data, dict):
        raise UserError(f"--limits {path}: expected a [limits] table")
    if "default" in data:
        try:
            return LimitSettings.from_mapping(data)
        except (ValueError, TypeError) as error:
            raise UserError(f"--limits {path}: {error}") from None
    try:
        return LimitsSettings.model_validate(data).to_rules()
    except ValueError as error:  # pydantic's ValidationError (the lab does not import pydantic itself)
        details = error.errors() if hasattr(error, "errors") else [{"loc": (), "msg": str(error)}]
        problems = "; ".join(f"limits.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in details)
        raise UserError(f"--limits {path}: {problems}") from None


def describe_limits(settings: LimitSettings) -> str:
    """One line: the defaults per tenant and the overrides."""
    def text(limits: TenantLimits) -> str:
        return ", ".join(f"{name} {value:,}" for name, value in limits.as_dict().items()) or "unlimited"

    overrides = "; ".join(f"{pattern}: {text(limits.over(settings.default))}" for pattern, limits in settings.tenants)
    return f"per tenant {text(settings.default)}" + (f"; {overrides}" if overrides else "")
