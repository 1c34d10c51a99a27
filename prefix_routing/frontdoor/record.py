"""The request record, its log line and its EMF document (names from :mod:`prefix_routing.rules.telemetry`)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from prefix_routing.frontdoor.config import InvokeConfig
from prefix_routing.frontdoor.copies import CopyCounts
from prefix_routing.frontdoor.tenancy import DIRECT_INVOCATION_REFUSED
from prefix_routing.rules import telemetry

#: Extra fields of the request log line (informational; no alarm, query or reader depends on them).
LOG_REQUEST_ID: Final = "request_id"
LOG_APPLICATION: Final = "application"
LOG_BODY_KIND: Final = "body_kind"
LOG_ATTEMPTS: Final = "attempts"
LOG_ERROR_FIELD: Final = "error_field"
LOG_WALL_MS: Final = "wall_ms"  # arrival to the end of the answer, retries and normalization included
LOG_UPSTREAM_TTFT_MS: Final = "upstream_ttft_ms"  # the endpoint's own: the attempt's start to its first PayloadPart
LOG_BLOCK_HASHES_TRUNCATED: Final = "block_hashes_truncated"  # present (true) only when the list was cut

#: The most block hashes one log line carries. CloudWatch Logs drops an event over 256 KB; a hash costs
#: 19 bytes in the line (16 hex digits, 2 quotes, 1 comma), so 12,288 of them (a 6 MiB body in blocks
#: of 512 bytes, the smallest the stage allows) take 233,473 bytes and leave room for the rest. A
#: smaller BLOCK_BYTES set some other way only loses the tail of the list, never the line.
MAX_LOGGED_BLOCK_HASHES: Final = 12_288


@dataclass(slots=True)
class RequestRecord:
    """Everything measured about one request; becomes one EMF document and one log line.

    ``sent``: the request went to the endpoint. ``origin``: ``"client"`` (rejected here, 4xx),
    ``"upstream"`` (the endpoint failed it), ``"internal"``, or None. Everything but ``arrival_ms`` is
    optional (None, or ``()``/``False``/``0`` for ``block_hashes``/``sent``/``attempts``).
    With hot-prefix replication enabled: ``replica`` / ``replicas`` (j and k of a request that was
    sent; it went out as ``replica_id(routing_id, replica)``) and ``hot_prefixes`` (the tracker's
    count at the end of every request: with it the EMF document has the replication metrics).
    """

    arrival_ms: int
    request_id: str | None = None
    tenant: str | None = None
    domain: str | None = None  # with trust domains: the tenant's, and the component that served it
    component: str | None = None
    application: str | None = None
    routing_id: str | None = None
    body_kind: str | None = None
    fingerprint: str | None = None
    block_hashes: tuple[str, ...] = ()
    body_bytes: int | None = None
    normalize_ms: float | None = None
    sent: bool = False
    attempts: int = 0
    ttft_ms: float | None = None  # arrival to the first bytes handed to the client's socket
    total_ms: float | None = None  # arrival to the last bytes handed to the client's socket
    upstream_ttft_ms: float | None = None
    wall_ms: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    status: int | None = None
    error_kind: str | None = None
    error_field: str | None = None
    origin: str | None = None
    desired_copies: int | None = None  # sampled once a minute (frontdoor.copies), else None
    current_copies: int | None = None
    rekeyed: bool = False  # the raw body's routing bytes differed from the normalized body's
    sample_bucket: int | None = None  # the routing key's (rules/sampling.py); None without a fingerprint
    sample_hot: bool = False  # the replication rule counted the prefix hot: in every sample
    replica: int | None = None  # hot-prefix replication (frontdoor.replicas), else None
    replicas: int | None = None
    hot_prefixes: int | None = None
    # Replica steering (frontdoor.replicas with a steering store): how the replica was chosen (with
    # replication: telemetry.STEERING_* or None), and while steering is active the rest.
    steering: str | None = None
    steering_active: bool = False
    steering_ms: float | None = None
    steering_store_error: bool = False
    replica_collision: bool | None = None
    steer_ticket: Any = None  # what the answer gives back (frontdoor.steering_store.Ticket); never logged
    limits_enabled: bool = False  # some tenant has a limit: the EMF document and log line carry the limit fields
    limit_rule: str | None = None
    throttled_by: str | None = None
    limiter_ms: float | None = None
    limiter_store_error: bool = False


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


_SAFE_FIELD_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.[]-")


def _loggable_field(field_path: str | None) -> str | None:
    """A field path for the log only if it is made of plain names and indexes: object keys are the
    client's data (a key could be anything, even prompt text), and no client text goes to the log."""
    if field_path is None:
        return None
    if len(field_path) <= 80 and all(c in _SAFE_FIELD_CHARS for c in field_path):
        return field_path
    return "(redacted)"


def log_record(record: RequestRecord, config: InvokeConfig) -> dict[str, Any]:
    """The request log line (a JSON object with the :class:`telemetry.LogField` fields)."""
    F = telemetry.LogField
    settings = config.settings
    line = {
        F.MESSAGE: telemetry.REQUEST_LOG_MESSAGE,
        F.TIMESTAMP_MS: record.arrival_ms,
        LOG_REQUEST_ID: record.request_id,
        F.TENANT: record.tenant,
        LOG_APPLICATION: record.application,
        F.ROUTING_ID: record.routing_id,
        F.COMPONENT: record.component or config.metric_component,
        LOG_BODY_KIND: record.body_kind,
        F.PREFIX_FINGERPRINT: record.fingerprint,
        F.PREFIX_LENGTH: settings.prefix_length,
        F.BLOCK_HASHES: list(record.block_hashes[:MAX_LOGGED_BLOCK_HASHES]),
        F.BLOCK_BYTES: settings.block_bytes,
        F.BODY_BYTES: record.body_bytes,
        F.PROMPT_TOKENS: record.prompt_tokens,
        F.CACHED_TOKENS: record.cached_tokens,
        F.OUTPUT_TOKENS: record.output_tokens,
        F.TTFT_MS: _ms(record.ttft_ms),
        F.TOTAL_MS: _ms(record.total_ms),
        F.NORMALIZE_MS: _ms(record.normalize_ms),
        LOG_WALL_MS: _ms(record.wall_ms),
        LOG_UPSTREAM_TTFT_MS: _ms(record.upstream_ttft_ms),
        LOG_ATTEMPTS: record.attempts,
        F.STATUS: record.status,
        F.ERROR_KIND: record.error_kind,
        LOG_ERROR_FIELD: _loggable_field(record.error_field),
        F.REKEYED: record.rekeyed,
        F.SAMPLE_BUCKET: record.sample_bucket,
        F.SAMPLE_HOT: record.sample_hot,
    }
    if len(record.block_hashes) > MAX_LOGGED_BLOCK_HASHES:
        line[LOG_BLOCK_HASHES_TRUNCATED] = True
    if record.limits_enabled:
        L = telemetry.LimitLogField
        line.update({L.RULE: record.limit_rule, L.THROTTLED_BY: record.throttled_by,
                     L.LIMITER_MS: _ms(record.limiter_ms), L.STORE_ERROR: record.limiter_store_error})
    if config.domains is not None:
        line[telemetry.DomainLogField.DOMAIN] = record.domain
    if record.replicas is not None:  # replication enabled (absent otherwise: the line stays as it was)
        line[telemetry.ReplicaLogField.REPLICA] = record.replica
        line[telemetry.ReplicaLogField.REPLICAS] = record.replicas
        line[telemetry.SteeringLogField.STEERING] = record.steering
    if record.steering_active:
        S = telemetry.SteeringLogField
        line.update({S.COLLISION: record.replica_collision, S.STEERING_MS: _ms(record.steering_ms),
                     S.STORE_ERROR: record.steering_store_error})
    return line


def _metric_values(record: RequestRecord) -> list[tuple[telemetry.MetricSpec, float]]:
    values: list[tuple[telemetry.MetricSpec, float]] = [
        (telemetry.REQUESTS, 1.0 if record.sent else 0.0),
        (telemetry.CLIENT_ERRORS, 1.0 if record.origin == "client" else 0.0),
        (telemetry.UPSTREAM_ERRORS, 1.0 if record.origin == "upstream" else 0.0),
        (telemetry.REKEYED_REQUESTS, 1.0 if record.sent and record.rekeyed else 0.0),
        (telemetry.REFUSED_DIRECT_INVOCATIONS, 1.0 if record.error_kind == DIRECT_INVOCATION_REFUSED else 0.0),
    ]
    optional = (
        (telemetry.TTFT, record.ttft_ms),
        (telemetry.END_TO_END, record.total_ms),
        (telemetry.NORMALIZATION_TIME, record.normalize_ms),
        (telemetry.PROMPT_TOKENS, record.prompt_tokens),
        (telemetry.CACHED_TOKENS, record.cached_tokens),
        (telemetry.DESIRED_COPIES, record.desired_copies),
        (telemetry.CURRENT_COPIES, record.current_copies),
    )
    values.extend((spec, float(value)) for spec, value in optional if value is not None)
    if record.limits_enabled:  # some tenant has a limit: in every document, else in none
        values.append((telemetry.THROTTLED_REQUESTS, 1.0 if record.throttled_by else 0.0))
        values.append((telemetry.LIMITER_STORE_ERRORS, 1.0 if record.limiter_store_error else 0.0))
        if record.limiter_ms is not None:
            values.append((telemetry.LIMITER_TIME, float(record.limiter_ms)))
    if record.hot_prefixes is not None:  # replication enabled: in every document, else in none
        values.append((telemetry.REPLICATED_REQUESTS, 1.0 if record.replica else 0.0))
        values.append((telemetry.HOT_PREFIXES, float(record.hot_prefixes)))
    if record.steering_active:  # steering with its store: in every document, else in none
        values.append((telemetry.REPLICA_COLLISIONS, 1.0 if record.replica_collision else 0.0))
        values.append((telemetry.STEERING_FALLBACKS, 1.0 if record.steering == telemetry.STEERING_FALLBACK else 0.0))
        values.append((telemetry.STEERING_STORE_ERRORS, 1.0 if record.steering_store_error else 0.0))
        if record.steering_ms is not None:
            values.append((telemetry.STEERING_TIME, float(record.steering_ms)))
    return values


def emf_document(record: RequestRecord, config: InvokeConfig, timestamp_ms: int | None = None) -> dict[str, Any]:
    """The request's metrics as one CloudWatch Embedded Metric Format document, serialized by
    Powertools' EMF provider (what ``Metrics`` flushes), written through our own emitter.

    Namespace :data:`telemetry.NAMESPACE`, exactly one dimension set ``[["InferenceComponent"]]``: the
    stacks' alarms and dashboards use exactly this one, so ``POWERTOOLS_SERVICE_NAME`` must stay
    unset (Powertools would add a ``service`` dimension; the normalizer stack never sets it). Every
    metric is high resolution (``StorageResolution: 1``) with its unit from :mod:`telemetry`.
    A fresh provider per request: Powertools' ``Metrics`` keeps shared state across instances.

    Powertools is imported here, at the first request's end, not with the module: the document is
    written after the answer has streamed, so its import (about a quarter of boto3's) stays off the
    cold start's path to the first token (``bench/bench_handler_import.py``).
    """
    from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider

    provider = AmazonCloudWatchEMFProvider(namespace=telemetry.NAMESPACE)
    provider.add_dimension(name=telemetry.DIMENSION_COMPONENT, value=record.component or config.metric_component)
    for spec, value in _metric_values(record):
        provider.add_metric(name=spec.name, unit=spec.unit, value=value, resolution=HIGH_RESOLUTION)
    if timestamp_ms is not None:
        provider.set_timestamp(timestamp_ms)
    return provider.serialize_metric_set()


HIGH_RESOLUTION: Final = 1  # seconds: MetricResolution.High

_OUTPUT_LOCK: Final = threading.Lock()


def _stdout_line(line: str) -> None:
    with _OUTPUT_LOCK:  # one write per line: concurrent requests never interleave within a line
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Telemetry:
    """Writes each request's EMF document and log line (standard output → CloudWatch Logs in Lambda)."""

    def __init__(self, config: InvokeConfig, emit: Callable[[str], None] | None = None,
                 copies: CopyCounts | None = None) -> None:
        self.config = config
        self.emit = emit or _stdout_line
        self.copies = copies

    def publish(self, record: RequestRecord) -> None:
        sampled = self.copies.sample() if self.copies is not None else None
        if sampled is not None:
            record.desired_copies, record.current_copies = sampled
        compact = {"separators": (",", ":"), "ensure_ascii": False}
        self.emit(json.dumps(emf_document(record, self.config), **compact))
        self.emit(json.dumps(log_record(record, self.config), **compact))
