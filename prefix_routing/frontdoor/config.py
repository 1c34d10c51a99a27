"""The front door's configuration (from the function's environment) and the tenant key."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from prefix_routing.rules.domains import TrustDomains
from prefix_routing.rules.limits import LimitSettings
from prefix_routing.rules.replication import ReplicationSettings
from prefix_routing.rules.settings import NormalizerSettings

#: The tenant of every request when the tenancy mode is ``none``.
SHARED_TENANT: Final = "shared"
TENANCY_MODES: Final = ("iam", "header", "none")

JSON_HEADERS: Final = {"content-type": "application/json"}


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


class ConfigurationError(ValueError):
    """A deployment setting (an environment variable) is missing or invalid; the message names it."""


@dataclass(frozen=True, slots=True)
class InvokeConfig:
    """Everything the front door needs besides the client and the tenant key (read-only).

    Build it from the Lambda's environment with :meth:`from_env` (the variables are those the stack
    sets, see ``stacks/constructs/normalizer_function.py``). Fields: ``endpoint_name`` (required),
    ``component_name``, ``tenancy`` (iam|header|none), ``tenant_header``, ``application_header``,
    ``settings`` (:class:`~prefix_routing.rules.NormalizerSettings`), ``max_attempts`` (total
    attempts of the upstream call, 1 = no retry), ``backoff_base_s``, ``backoff_max_s``,
    ``request_timeout_s`` (wall-clock budget of one request from its arrival; past it: 504),
    ``stream_usage`` (add ``stream_options.include_usage`` to streaming chat/completion bodies),
    ``replication`` (hot-prefix replication, :class:`~prefix_routing.rules.replication.ReplicationSettings`),
    ``copies_min`` / ``copies_max`` (the stage's copy bounds: the copy count replication assumes
    before the first ``DescribeInferenceComponent`` reading, and the most it believes),
    ``allow_direct_invoke`` (answer direct invocations, which name their own tenant, under the
    ``iam`` and ``header`` tenancies: off by default, so that the Function URL is the one way in),
    ``limits`` (per-tenant limits, :class:`~prefix_routing.rules.limits.LimitSettings`) and
    ``limits_table`` (the DynamoDB table that holds their counts).
    """

    endpoint_name: str
    component_name: str | None = None
    #: Trust domains (``DOMAINS``): which component serves which tenant; None: ``component_name`` for all.
    domains: TrustDomains | None = None
    tenancy: str = "iam"
    tenant_header: str = "x-tenant-id"
    application_header: str = "x-application-id"
    settings: NormalizerSettings = field(default_factory=NormalizerSettings)
    max_attempts: int = 3
    backoff_base_s: float = 0.1
    backoff_max_s: float = 2.0
    request_timeout_s: float = 110.0
    stream_usage: bool = True
    replication: ReplicationSettings = field(default_factory=ReplicationSettings)
    copies_min: int = 1
    copies_max: int | None = None
    allow_direct_invoke: bool = False
    limits: LimitSettings = field(default_factory=LimitSettings)
    limits_table: str | None = None
    #: The table of replica steering's shared state (``STEERING_TABLE``; the stack names the same
    #: table as ``LIMITS_TABLE``). None: a hot prefix's replicas are used in turn, even with steering on.
    steering_table: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.endpoint_name, str) or not self.endpoint_name:
            raise ConfigurationError("ENDPOINT_NAME: missing; the SageMaker endpoint to invoke")
        if self.tenancy not in TENANCY_MODES:
            raise ConfigurationError(f"TENANCY: {self.tenancy!r} is not one of {', '.join(TENANCY_MODES)}")
        if self.tenancy == "header" and not self.tenant_header:
            raise ConfigurationError("TENANT_HEADER: missing; required with TENANCY=header")
        if not 1 <= self.max_attempts <= 10:
            raise ConfigurationError(f"UPSTREAM_MAX_ATTEMPTS: {self.max_attempts} is not in 1..10")
        if not (0 <= self.backoff_base_s <= self.backoff_max_s <= 30):
            raise ConfigurationError("backoff: need 0 <= base <= max <= 30 seconds")
        if not 0 < self.request_timeout_s <= 900:
            raise ConfigurationError(f"REQUEST_TIMEOUT_S: {self.request_timeout_s} is not in (0, 900]")
        if not isinstance(self.replication, ReplicationSettings):
            raise ConfigurationError("replication: not a ReplicationSettings")
        if not 0 <= self.copies_min <= 1000:
            raise ConfigurationError(f"COPIES_MIN: {self.copies_min} is not in 0..1000")
        if self.copies_max is not None and not max(1, self.copies_min) <= self.copies_max <= 1000:
            raise ConfigurationError(f"COPIES_MAX: {self.copies_max} is not in max(1, COPIES_MIN)..1000")
        if not isinstance(self.limits, LimitSettings):
            raise ConfigurationError("limits: not a LimitSettings")
        if self.limits.enabled and not self.limits_table:
            raise ConfigurationError("LIMITS_TABLE: missing; the DynamoDB table that holds the tenants' counts "
                                     "(required when LIMITS sets a limit)")
        object.__setattr__(self, "tenant_header", self.tenant_header.lower())
        object.__setattr__(self, "application_header", (self.application_header or "").lower())

    @property
    def metric_component(self) -> str:
        """The value of the ``InferenceComponent`` dimension."""
        return self.component_name or self.endpoint_name

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> InvokeConfig:
        """Read the configuration from environment variables; raises :class:`ConfigurationError`.

        ``ENDPOINT_NAME`` (required), ``INFERENCE_COMPONENT_NAME``, ``TENANCY`` (iam|header|none),
        ``TENANT_HEADER``, ``APPLICATION_HEADER``, ``PREFIX_LENGTH`` (0 or absent: the normalizer's
        default), ``BLOCK_BYTES``, ``NORMALIZER_SETTINGS`` (a JSON object of
        :class:`~prefix_routing.rules.NormalizerSettings` fields, e.g. freeze rules),
        ``UPSTREAM_MAX_ATTEMPTS``, ``REQUEST_TIMEOUT_S``, ``STREAM_USAGE`` (true|false),
        ``REPLICATION_ENABLED`` (true|false, default false), ``REPLICATION_MAX_REPLICAS``,
        ``REPLICATION_TARGET_SHARE_FACTOR``, ``REPLICATION_HALF_LIFE_S`` (absent: the defaults of
        :class:`~prefix_routing.rules.replication.ReplicationSettings`), ``COPIES_MIN``, ``COPIES_MAX``,
        ``ALLOW_DIRECT_INVOKE`` (true|false, default false), ``DOMAINS`` (the JSON of
        :meth:`~prefix_routing.rules.domains.TrustDomains.to_json`; absent: one component), ``LIMITS`` (the JSON of
        :meth:`~prefix_routing.rules.limits.LimitSettings.to_json`; absent: no limits), ``LIMITS_TABLE``,
        ``STEERING_TABLE`` (replica steering's shared state; absent: replicas in turn).
        """
        env = os.environ if environ is None else environ
        data: dict[str, Any] = {}
        raw_settings = env.get("NORMALIZER_SETTINGS", "").strip()
        if raw_settings:
            try:
                data = json.loads(raw_settings)
            except ValueError as error:
                raise ConfigurationError(f"NORMALIZER_SETTINGS: not valid JSON ({error})") from None
            if not isinstance(data, dict):
                raise ConfigurationError("NORMALIZER_SETTINGS: not a JSON object")
        prefix_length = _number(env, "PREFIX_LENGTH", 0, int)
        if prefix_length:
            data["prefix_length"] = prefix_length
        block_bytes = _number(env, "BLOCK_BYTES", 0, int)
        if block_bytes:
            data["block_bytes"] = block_bytes
        try:
            settings = NormalizerSettings.from_mapping(data, source="environment")
        except ValueError as error:
            raise ConfigurationError(str(error)) from None
        return cls(
            endpoint_name=env.get("ENDPOINT_NAME", "").strip(),
            component_name=env.get("INFERENCE_COMPONENT_NAME", "").strip() or None,
            domains=_domains(env),
            tenancy=env.get("TENANCY", "iam").strip().lower(),
            tenant_header=env.get("TENANT_HEADER", "x-tenant-id").strip(),
            application_header=env.get("APPLICATION_HEADER", "x-application-id").strip(),
            settings=settings,
            max_attempts=_number(env, "UPSTREAM_MAX_ATTEMPTS", 3, int),
            request_timeout_s=_number(env, "REQUEST_TIMEOUT_S", 110.0),
            stream_usage=_flag(env, "STREAM_USAGE", True),
            replication=_replication(env),
            copies_min=_number(env, "COPIES_MIN", 1, int),
            copies_max=_number(env, "COPIES_MAX", 0, int) or None,
            allow_direct_invoke=_flag(env, "ALLOW_DIRECT_INVOKE", False),
            limits=_limits(env),
            limits_table=env.get("LIMITS_TABLE", "").strip() or None,
            steering_table=env.get("STEERING_TABLE", "").strip() or None,
        )


def _number(env: Mapping[str, str], name: str, default: Any, kind: Callable[[str], Any] = float) -> Any:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ConfigurationError(f"{name}: {raw!r} is not a number") from None


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name, "true" if default else "false").strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ConfigurationError(f"{name}: {value!r} is not true or false")
    return value in ("true", "1", "yes")


#: The environment variable of each ``normalizer.replication`` field (the stack sets them all).
REPLICATION_VARIABLES: Final = {
    "enabled": "REPLICATION_ENABLED",
    "max_replicas": "REPLICATION_MAX_REPLICAS",
    "target_share_factor": "REPLICATION_TARGET_SHARE_FACTOR",
    "half_life_s": "REPLICATION_HALF_LIFE_S",
    "min_requests": "REPLICATION_MIN_REQUESTS",
    "steering": "REPLICATION_STEERING",
}


def _replication(env: Mapping[str, str]) -> ReplicationSettings:
    """The replication settings; an absent variable is the field's default."""
    defaults = ReplicationSettings()
    V = REPLICATION_VARIABLES
    values = {
        "enabled": _flag(env, V["enabled"], defaults.enabled),
        "max_replicas": _number(env, V["max_replicas"], defaults.max_replicas, int),
        "target_share_factor": _number(env, V["target_share_factor"], defaults.target_share_factor),
        "half_life_s": _number(env, V["half_life_s"], defaults.half_life_s),
        "min_requests": _number(env, V["min_requests"], defaults.min_requests),
        "steering": _flag(env, V["steering"], defaults.steering),
    }
    try:
        return ReplicationSettings(**values)
    except ValueError as error:  # "replication.<field>: got ...; allowed: ...": name the variable too
        message = str(error)
        field_name = message.removeprefix("replication.").split(":", 1)[0]
        raise ConfigurationError(f"{V.get(field_name, 'REPLICATION')}: {message}") from None


def _limits(env: Mapping[str, str]) -> LimitSettings:
    raw = env.get("LIMITS", "").strip()
    if not raw:
        return LimitSettings()
    try:
        return LimitSettings.from_mapping(json.loads(raw))
    except ValueError as error:  # JSONDecodeError is a ValueError
        raise ConfigurationError(f"LIMITS: {error}") from None


def load_tenant_key(client: Any, secret_id: str) -> bytes:
    """The tenant HMAC key from Secrets Manager (``GetSecretValue``), as bytes.

    The secret's string (or binary) value is the key material; it must be at least 16 bytes.
    Raises :class:`ConfigurationError` (never with the value in the message).
    """
    if not secret_id:
        raise ConfigurationError("TENANT_KEY_SECRET_ARN: missing; the secret that holds the tenant key")
    answer = client.get_secret_value(SecretId=secret_id)
    if answer.get("SecretString") is not None:
        key = answer["SecretString"].encode("utf-8")
    else:
        key = bytes(answer.get("SecretBinary") or b"")
    if len(key) < 16:
        raise ConfigurationError(f"{secret_id}: the tenant key must be at least 16 bytes")
    return key


def _domains(env: Mapping[str, str]) -> TrustDomains | None:
    raw = env.get("DOMAINS", "").strip()
    if not raw:
        return None
    try:
        return TrustDomains.from_json(raw)
    except ValueError as error:
        raise ConfigurationError(str(error)) from None
