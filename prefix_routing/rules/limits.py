"""Per-tenant limits: which limits apply to a tenant, and what one admission decides.

The front door enforces them in a store shared by every execution environment
(:mod:`prefix_routing.frontdoor.limiter`); the lab models the same rule. This module is the rule
itself, standard library only, with no clock of its own (callers pass ``now``):

- **Which limits.** A stage's ``[limits]`` gives defaults per tenant and named overrides
  (``[limits.tenants."<id or pattern>"]``): a tenant's own id first, else the first pattern (in the
  order written; ``*`` and ``?`` as in shell patterns) that matches it, else the defaults. An
  override sets some limits; the others are the defaults'. Unset means unlimited.
- **Requests and tokens per minute** are counted per calendar minute (UTC, from the epoch): a
  request is admitted while the minute's count is below ``requests_per_minute``, and while the
  minute's tokens plus the request's charge stay within ``tokens_per_minute``. The charge is the
  most the request can use: its prompt (estimated from the body's size) plus the output it asks
  for (``max_completion_tokens``, ``max_tokens`` or ``parameters.max_new_tokens``, times ``n`` or
  ``best_of`` answers; the stage's ``default_max_tokens`` when it names none). When the answer ends
  its own usage (prompt + completion) replaces the charge, so a minute never holds more than its
  limit of what answers can use. A fixed window: across a minute's boundary a tenant can send up
  to twice a limit in a short span (the price of one atomic write per admission).
- **Concurrent streams**: a request holds a lease from admission to the end of its answer. A lease
  is short (``lease_s``, at most :data:`MAX_LEASE_S`) and renewed while the answer streams (every
  third of it), so a lease that nothing renews (an execution environment that died mid-stream, a
  release lost, an admission that timed out but was written) frees its slot within one lease,
  whatever the function's timeout.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Final, Mapping

from prefix_routing.rules.errors import describe_value
from prefix_routing.rules.telemetry import LIMIT_NAMES
from prefix_routing.rules.tenant_match import first_match

#: The names of the three limits (a stage's fields, the JSON error's ``limit``, the log line's): the
#: telemetry module's, which the stacks' Contributor Insights rule reads too.
REQUESTS_PER_MINUTE, TOKENS_PER_MINUTE, CONCURRENT_STREAMS = LIMIT_NAMES
STORE_ERROR_MODES: Final = ("open", "closed")
#: The most a limit may be (beyond it a limit is no limit) and the most overrides a stage names (the
#: settings travel in the function's environment, 4 KB in all).
MAX_LIMIT: Final = 10**9
MAX_OVERRIDES: Final = 32
MAX_PATTERN: Final = 256
#: Bytes of a request body per prompt token in the up-front estimate (English text and JSON: about 4).
BYTES_PER_TOKEN_ESTIMATE: Final = 4
WINDOW_S: Final = 60
#: A stream's lease: how long a slot outlives the last renewal of its lease (seconds), at most and by
#: default. A stream renews its lease every third of it (:func:`renewal_interval_s`).
MAX_LEASE_S: Final = 60
LEASE_S: Final = 30
MIN_LEASE_S: Final = 10
#: The output tokens charged up front for a request that names no limit of its own (the stage's
#: ``limits.default_max_tokens``): such an answer is bounded only by the model's context.
DEFAULT_MAX_TOKENS: Final = 1024
#: The body fields that bound an answer's length, in vLLM's order of precedence
#: (``max_completion_tokens or max_tokens``), then the LMI/TGI ``parameters.max_new_tokens``.
OUTPUT_LIMIT_FIELDS: Final = ("max_completion_tokens", "max_tokens", "parameters.max_new_tokens")
#: The body fields that ask for several answers to one prompt, each up to the limit (OpenAI, vLLM).
CHOICE_FIELDS: Final = ("n", "best_of")
#: Seconds a request refused by ``concurrent_streams`` is told to wait (no one knows when a stream ends).
STREAM_RETRY_AFTER_S: Final = 1
#: The bound on giving a stream back (ms). Longer than an admission's: it is off the first token's
#: path, and a release lost to a short timeout would hold the tenant's slot until its lease expires.
RELEASE_TIMEOUT_MS: Final = 1000


@dataclass(frozen=True)
class TenantLimits:
    """The limits of one tenant (None: unlimited)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent_streams: int | None = None

    def __post_init__(self) -> None:
        for name in LIMIT_NAMES:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not 1 <= value <= MAX_LIMIT):
                raise ValueError(f"limits.{name}: got {describe_value(value)}; allowed: a whole number from 1 to {MAX_LIMIT}")

    @property
    def unlimited(self) -> bool:
        return all(getattr(self, name) is None for name in LIMIT_NAMES)

    def over(self, defaults: TenantLimits) -> TenantLimits:
        """These limits where set, the defaults' elsewhere."""
        return TenantLimits(**{name: getattr(self, name) if getattr(self, name) is not None else getattr(defaults, name)
                               for name in LIMIT_NAMES})

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in LIMIT_NAMES if getattr(self, name) is not None}


DEFAULT_RULE: Final = "default"


@dataclass(frozen=True)
class LimitSettings:
    """A stage's ``[limits]``: ``default`` per tenant, ``tenants`` (pattern → override, in order),
    ``on_store_error`` (``open``: serve and count; ``closed``: refuse with 503), ``store_timeout_ms``
    (the most one store call may take), ``lease_s`` (how long a stream's slot outlives the last
    renewal of its lease), ``default_max_tokens`` (the output charged for a request that asks no limit)."""

    default: TenantLimits = field(default_factory=TenantLimits)
    tenants: tuple[tuple[str, TenantLimits], ...] = ()
    on_store_error: str = "open"
    store_timeout_ms: int = 50
    lease_s: int = LEASE_S
    default_max_tokens: int = DEFAULT_MAX_TOKENS

    def __post_init__(self) -> None:
        if self.on_store_error not in STORE_ERROR_MODES:
            raise ValueError(f"limits.on_store_error: got {describe_value(self.on_store_error)}; allowed: open or closed")
        if not isinstance(self.store_timeout_ms, int) or not 5 <= self.store_timeout_ms <= 5000:
            raise ValueError(f"limits.store_timeout_ms: got {describe_value(self.store_timeout_ms)}; allowed: 5 to 5000")
        if not isinstance(self.lease_s, int) or not MIN_LEASE_S <= self.lease_s <= MAX_LEASE_S:
            raise ValueError(f"limits.lease_s: got {describe_value(self.lease_s)}; allowed: {MIN_LEASE_S} to {MAX_LEASE_S}")
        if (not isinstance(self.default_max_tokens, int) or isinstance(self.default_max_tokens, bool)
                or not 1 <= self.default_max_tokens <= MAX_LIMIT):
            raise ValueError(f"limits.default_max_tokens: got {describe_value(self.default_max_tokens)}; "
                             f"allowed: a whole number from 1 to {MAX_LIMIT}")
        if len(self.tenants) > MAX_OVERRIDES:
            raise ValueError(f"limits.tenants: {len(self.tenants)} overrides; allowed: at most {MAX_OVERRIDES}")
        for pattern, _ in self.tenants:
            if not isinstance(pattern, str) or not 1 <= len(pattern) <= MAX_PATTERN or not pattern.isprintable():
                raise ValueError(f"limits.tenants: key {describe_value(pattern)}; allowed: a tenant id or pattern of "
                                 f"1-{MAX_PATTERN} printable characters")

    @property
    def enabled(self) -> bool:
        """Whether any tenant has a limit (else the front door never calls the store)."""
        return not self.default.unlimited or any(not limits.unlimited for _, limits in self.tenants)

    def for_tenant(self, tenant: str) -> tuple[str, TenantLimits]:
        """(the rule that applies: the override's key or ``default``, the tenant's limits)."""
        index = first_match(tenant, [pattern for pattern, _ in self.tenants])
        if index is None:
            return DEFAULT_RULE, self.default
        pattern, limits = self.tenants[index]
        return pattern, limits.over(self.default)

    def below_default_output(self) -> list[tuple[str, int]]:
        """The rules (``default`` or an override's key) whose ``tokens_per_minute`` is below
        ``default_max_tokens``, with that limit: there a request without ``max_tokens`` could never be admitted."""
        rules = [(DEFAULT_RULE, self.default), *((key, limits.over(self.default)) for key, limits in self.tenants)]
        return [(key, limits.tokens_per_minute) for key, limits in rules
                if limits.tokens_per_minute is not None and limits.tokens_per_minute < self.default_max_tokens]

    def to_json(self) -> str:
        """The compact form the stack puts in the function's environment (``LIMITS``)."""
        data: dict[str, Any] = {"default": self.default.as_dict(), "on_store_error": self.on_store_error,
                                "store_timeout_ms": self.store_timeout_ms, "lease_s": self.lease_s,
                                "default_max_tokens": self.default_max_tokens}
        if self.tenants:
            data["tenants"] = [[pattern, limits.as_dict()] for pattern, limits in self.tenants]
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> LimitSettings:
        """From :meth:`to_json`'s object (ValueError names what is wrong)."""
        if not isinstance(data, Mapping):
            raise ValueError("limits: not an object")
        unknown = set(data) - {"default", "tenants", "on_store_error", "store_timeout_ms", "lease_s",
                               "default_max_tokens"}
        if unknown:
            raise ValueError(f"limits: unknown keys {sorted(unknown)}")
        tenants = data.get("tenants") or []
        if not isinstance(tenants, list) or not all(isinstance(t, list) and len(t) == 2 for t in tenants):
            raise ValueError("limits.tenants: not a list of [pattern, limits]")
        return cls(default=_limits(data.get("default") or {}),
                   tenants=tuple((pattern, _limits(limits)) for pattern, limits in tenants),
                   on_store_error=data.get("on_store_error", "open"),
                   store_timeout_ms=data.get("store_timeout_ms", 50), lease_s=data.get("lease_s", LEASE_S),
                   default_max_tokens=data.get("default_max_tokens", DEFAULT_MAX_TOKENS))


def _limits(data: Any) -> TenantLimits:
    if not isinstance(data, Mapping) or set(data) - set(LIMIT_NAMES):
        raise ValueError(f"limits: {describe_value(data)}; allowed: an object of {', '.join(LIMIT_NAMES)}")
    return TenantLimits(**dict(data))


def window_of(now_s: float) -> int:
    """The calendar minute (from the epoch) a request at ``now_s`` is counted in."""
    return int(now_s // WINDOW_S)


def window_reset_s(now_s: float) -> int:
    """Whole seconds until the current minute's counts start again (at least 1)."""
    return max(1, math.ceil((window_of(now_s) + 1) * WINDOW_S - now_s))


def token_estimate(body_bytes: int) -> int:
    """The prompt tokens charged up front: the body's bytes ÷ 4, at least 1."""
    return max(1, body_bytes // BYTES_PER_TOKEN_ESTIMATE)


def renewal_interval_s(lease_s: float) -> float:
    """How often a stream renews its lease: every third of it (two renewals may fail before it expires)."""
    return lease_s / 3


def output_limit_values(data: Mapping[str, Any]) -> dict[str, Any]:
    """The values a body gives :data:`OUTPUT_LIMIT_FIELDS` (None where absent), as written."""
    parameters = data.get("parameters")
    return {"max_completion_tokens": data.get("max_completion_tokens"), "max_tokens": data.get("max_tokens"),
            "parameters.max_new_tokens": parameters.get("max_new_tokens") if isinstance(parameters, Mapping) else None}


def _count(value: Any) -> int | None:
    """A count as an engine's request model takes it (an integer, or a float with no fraction), at
    least 1 and bounded; None otherwise."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return min(value, MAX_LIMIT + 1)


def requested_output_tokens(data: Any) -> int | None:
    """The most output tokens a request body asks for: its first limit field (in
    :data:`OUTPUT_LIMIT_FIELDS` order) that holds a count, times the answers it asks for (the larger
    of ``n`` and ``best_of``); None when it names no limit (or no valid one: the engine refuses it)."""
    if not isinstance(data, Mapping):
        return None
    values = output_limit_values(data)
    limit = next((count for count in map(_count, (values[name] for name in OUTPUT_LIMIT_FIELDS)) if count), None)
    if limit is None:
        return None
    answers = max(_count(data.get(name)) or 1 for name in CHOICE_FIELDS)
    return min(limit * answers, MAX_LIMIT + 1)


def admission_charge(body_bytes: int, output_tokens: int | None, default_max_tokens: int) -> int:
    """The tokens an admission charges a tenant's minute: the prompt estimated from the body's size,
    plus the output asked for (``default_max_tokens`` when the request names none)."""
    return token_estimate(body_bytes) + (output_tokens if output_tokens is not None else default_max_tokens)


def window_admits(limits: TenantLimits, requests: int, tokens: int, estimate: int) -> str | None:
    """None if a request with ``estimate`` tokens fits a minute that holds ``requests`` and
    ``tokens`` so far, else the name of the limit it would exceed (requests first)."""
    if limits.requests_per_minute is not None and requests >= limits.requests_per_minute:
        return REQUESTS_PER_MINUTE
    if limits.tokens_per_minute is not None and tokens + estimate > limits.tokens_per_minute:
        return TOKENS_PER_MINUTE
    return None


def admission_refusal(limits: TenantLimits, streams_held: int, requests: int, tokens: int, estimate: int) -> str | None:
    """None if a request fits all its tenant's limits, else the one that refuses it: the minute's
    limits first (their Retry-After is the longer), then ``concurrent_streams`` against the
    ``streams_held`` (unexpired) leases. The front door and the lab both decide with it."""
    refused = window_admits(limits, requests, tokens, estimate)
    if refused is not None:
        return refused
    if limits.concurrent_streams is not None and streams_held >= limits.concurrent_streams:
        return CONCURRENT_STREAMS
    return None

