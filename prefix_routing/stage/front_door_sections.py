"""The sections of a stage that describe the front door: the normalizer function ([normalizer]),
its hot-prefix replication ([normalizer.replication]) and the per-tenant limits it enforces
([limits]). Trust domains and tenancy are :mod:`prefix_routing.stage.domain_checks`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from prefix_routing.rules.constants import FINGERPRINT_HEX_DIGITS, MAX_BODY_BYTES_LIMIT
from prefix_routing.rules.limits import (DEFAULT_MAX_TOKENS, DEFAULT_RULE, LIMIT_NAMES, MAX_LIMIT, MAX_OVERRIDES, MAX_PATTERN,
                                         LimitSettings, TenantLimits)
from prefix_routing.rules.tenant_match import shadowed
from prefix_routing.stage.section import Section, allowed
from prefix_routing.stage.value_checks import LOG_RETENTION_DAYS

# The request log line (prefix_routing/frontdoor/record.py log_record, compact JSON) lists one block
# hash per full block_bytes block of the normalized body (prefix_routing/rules/identity.py
# block_hashes): FINGERPRINT_HEX_DIGITS = 16 hex digits each, as JSON strings separated by commas:
#   16 digits + 2 quotes + 1 comma = 19 bytes per hash (ASCII), and 19 n + 1 bytes for n hashes
#   (n - 1 commas, "[" and "]").
# The largest body is MAX_BODY_BYTES_LIMIT = 6 MiB = 6,291,456 bytes (larger ones are refused).
# CloudWatch Logs takes log events up to 256 KB = 262,144 bytes (26 bytes more count per event in
# PutLogEvents; events over the limit are dropped or truncated). The line's other fields are bounded
# and small (routing id <= 64, application <= 64, tenant header <= 128 or an IAM ARN, error field
# <= 80 characters; about 1 KB in all): 16 KiB = 16,384 bytes are kept for them, which leaves
# 262,144 - 16,384 = 245,760 bytes for the hashes: 19 n + 1 <= 245,760 gives n <= 12,934 hashes, so
# block_bytes >= 6,291,456 / 12,935 = 486.4, rounded up to a power of two:
#   block_bytes = 512: n = 6,291,456 / 512 = 12,288 hashes, 19 x 12,288 + 1 = 233,473 bytes,
#                      leaving 28,671 bytes for the rest of the line;
#   block_bytes = 256: n = 24,576, 466,945 bytes (too long); the former minimum, 64: 98,304 hashes,
#                      1,867,777 bytes (1.78 MiB).
_LOG_EVENT_LIMIT_BYTES = 256 * 1024
_LOG_LINE_OTHER_FIELDS_BYTES = 16 * 1024
_LOG_BYTES_PER_BLOCK_HASH = FINGERPRINT_HEX_DIGITS + 3  # "…",
BLOCK_BYTES_MIN = 512
assert _LOG_BYTES_PER_BLOCK_HASH * (MAX_BODY_BYTES_LIMIT // BLOCK_BYTES_MIN) + 1 <= (
    _LOG_EVENT_LIMIT_BYTES - _LOG_LINE_OTHER_FIELDS_BYTES
), "BLOCK_BYTES_MIN no longer keeps the largest request log line under 256 KB"


class ReplicationStageSettings(Section):
    """The [normalizer.replication] section: hot-prefix replication by the front door
    (``prefix_routing.rules.replication``; the function reads it from ``REPLICATION_*``).

    Replication sizes a prefix's replicas by the inference component's current copy count, which the
    front door reads once a minute (``DescribeInferenceComponent``); until its first reading it assumes
    ``endpoint.copies_min`` (the conservative bound: fewer and later replicas), and it never assumes
    more than ``endpoint.copies_max``. Each execution environment of the function counts its own
    requests."""

    enabled: bool = Field(
        False,
        description="hot-prefix replication: the front door sends replica j of a hot prefix with `PrefixAwareId "
        "<id>-r<j>`, so it gets more than one warm copy",
    )
    max_replicas: int = Field(
        32, ge=1, le=64, description="the most replicas (PrefixAwareIds) one prefix (tenant and prefix fingerprint) gets"
    )
    target_share_factor: float = Field(
        0.05, ge=0.01, le=1000,
        description="a prefix is replicated once it takes more than this many fair shares, 1/copies, of recent "
        "requests; each replica then carries at most that many (small pieces even out the router's random "
        "placement; replicas on one copy share its cache)",
    )
    half_life_s: float = Field(
        300.0, ge=1, le=86400, description="seconds after which a request counts half in the recent-request shares"
    )
    min_requests: float = Field(
        12.0, ge=1, le=10000,
        description="recent (decayed) requests of a prefix before it may be replicated, so that chance does not "
        "split cold prefixes",
    )
    steering: bool = Field(
        True,
        description="true: a hot prefix's replicas are chosen by load (fewest in flight) and a replica whose first "
        "answer finds the prefix already cached (it landed on a copy that held it) gets a fresh id, with the "
        "state in the front door's shared table; false: each execution environment uses the replicas in turn",
    )


#: An account id, or the ARN of an IAM role or user (what a Lambda resource policy names as principal).
_PRINCIPAL = r"^(\d{12}|arn:aws[a-z-]*:iam::\d{12}:(role|user)/[A-Za-z0-9_+=,.@/-]+)$"


class NormalizerFunctionSettings(Section):
    """The [normalizer] section: how the front-door Lambda is deployed (its normalization rules are
    ``prefix_routing.rules``)."""

    tenancy: Literal["iam", "header", "none"] = Field(
        "iam", description="who the tenant is: `iam` (the caller's IAM identity), `header` (trusted callers), `none`"
    )
    tenant_header: str = Field("x-tenant-id", pattern=r"^[a-z0-9-]+$", description="header read when tenancy is `header`")
    allow_direct_invoke: bool = Field(
        False,
        description="true: answer direct invocations (`lambda:InvokeFunction`), trusting every direct caller with "
        "the tenant its event names; false: refused with 403, the Function URL is the one way in",
    )
    invoke_principals: list[Annotated[str, Field(pattern=_PRINCIPAL, max_length=2048)]] = Field(
        default_factory=list,
        description="accounts (12 digits) or IAM role/user ARNs the function's resource policy lets call its URL "
        "(`lambda:InvokeFunctionUrl`, and `lambda:InvokeFunction` only via the URL)",
    )
    reserved_concurrency: int = Field(
        50, ge=1, le=1000, description="the function's reserved concurrency: the client-level throughput limit"
    )
    memory_mb: int = Field(512, ge=128, le=10240, description="the function's memory (MB)")
    timeout_s: int = Field(120, ge=5, le=900, description="the function's timeout (s)")
    log_retention_days: LOG_RETENTION_DAYS = Field(
        30, description="retention of the function's log group (a CloudWatch Logs value)"
    )
    block_bytes: int = Field(
        2048, ge=BLOCK_BYTES_MIN, le=65536,
        description="block size of the chained hashes in the request log line; from 512 so that the line of the "
        "largest body (6 MiB) stays under CloudWatch Logs' 256 KB event limit",
    )
    replication: ReplicationStageSettings = Field(
        ReplicationStageSettings(), description="hot-prefix replication by the front door"
    )


class TenantLimitSettings(Section):
    """The limits of one tenant (or class of tenants): unset is unlimited."""

    requests_per_minute: int | None = Field(
        None, ge=1, le=MAX_LIMIT,
        description="requests a tenant may send per calendar minute (429 beyond); unset: unlimited",
    )
    tokens_per_minute: int | None = Field(
        None, ge=1, le=MAX_LIMIT,
        description="tokens (prompt + completion) a tenant may use per calendar minute; a request is admitted while "
        "the minute has room for the most it can use (its prompt, estimated from the body's size, plus the output "
        "it asks for: `max_tokens`, `max_completion_tokens` or `default_max_tokens`), and its answer's own usage "
        "then replaces that charge; unset: unlimited",
    )
    concurrent_streams: int | None = Field(
        None, ge=1, le=100_000, description="answers a tenant may have in flight at once; unset: unlimited"
    )


class LimitsSettings(TenantLimitSettings):
    """The [limits] section: per-tenant limits, enforced by the front door in a DynamoDB table that every
    execution environment shares (``prefix_routing.rules.limits``, ``prefix_routing.frontdoor.limiter``)."""

    tenants: dict[str, TenantLimitSettings] = Field(
        default_factory=dict,
        description="overrides: `[limits.tenants.\"<tenant id or pattern>\"]` (`*`, `?` as in shell patterns; a "
        "tenant's own id first, then the first pattern that matches, in file order) with any of the three limits; "
        "the others are the defaults'",
        json_schema_extra=allowed(f"at most {MAX_OVERRIDES} tenant ids or patterns"),
    )
    on_store_error: Literal["open", "closed"] = Field(
        "open",
        description="when the table cannot be reached in time: `open` serves the request and counts it "
        "(`LimiterStoreErrors`), `closed` refuses it with 503",
    )
    store_timeout_ms: int = Field(
        50, ge=5, le=5000, description="the most one call to the table may take before it counts as a store error"
    )
    default_max_tokens: int = Field(
        DEFAULT_MAX_TOKENS, ge=1, le=MAX_LIMIT,
        description="the output tokens `tokens_per_minute` charges up front for a request that sets none of "
        "`max_completion_tokens`, `max_tokens` or `parameters.max_new_tokens` (its answer's usage then replaces "
        "the charge)",
    )

    @field_validator("tenants")
    @classmethod
    def _few_enough(cls, value: dict) -> dict:
        if len(value) > MAX_OVERRIDES:
            raise ValueError(f"{len(value)} overrides; allowed: at most {MAX_OVERRIDES}")
        for key in value:
            if not 1 <= len(key) <= MAX_PATTERN or not all("!" <= c <= "~" for c in key):
                raise ValueError(f"key {key[:60]!r}: allowed: a tenant id or pattern of 1-{MAX_PATTERN} printable "
                                 "ASCII characters without spaces")
        dead = shadowed(list(value))
        if dead:
            raise ValueError("; ".join(f"{key!r} never applies: the earlier pattern {by!r} takes every tenant it "
                                       "matches" for key, by in dead)
                             + "; allowed: a pattern before the more general ones that would take its tenants, or none")
        return value

    @model_validator(mode="after")
    def _default_output_fits(self) -> LimitsSettings:
        # A request without max_tokens is charged default_max_tokens: above a tokens_per_minute, every
        # such request of those tenants would be refused for good.
        small = [("the defaults" if key == DEFAULT_RULE else repr(key), value)
                 for key, value in self.to_rules().below_default_output()]
        if small:
            named = ", ".join(f"{key} {value:,}" for key, value in small)
            raise ValueError(f"default_max_tokens: got {self.default_max_tokens:,}, above tokens_per_minute ({named}): "
                             "a request without max_tokens could never be admitted; allowed: at most "
                             f"{min(value for _, value in small):,}")
        return self

    @property
    def enabled(self) -> bool:
        return self.to_rules().enabled

    def to_rules(self) -> LimitSettings:
        """The front door's settings (a stream's lease: ``rules.limits.LEASE_S``, renewed while it streams)."""
        def rule(section: TenantLimitSettings) -> TenantLimits:
            return TenantLimits(**{name: getattr(section, name) for name in LIMIT_NAMES})

        return LimitSettings(default=rule(self), tenants=tuple((key, rule(value)) for key, value in self.tenants.items()),
                             on_store_error=self.on_store_error, store_timeout_ms=self.store_timeout_ms,
                             default_max_tokens=self.default_max_tokens)
