"""The contract between the normalizer Lambda, the stacks' alarms and dashboards, and the lab.

Every metric name, dimension and log field that an alarm, a dashboard widget, a Logs Insights
query, a Contributor Insights rule or the lab's log reader uses is defined here, once, so the four
cannot drift apart. Standard library only: this module runs in the Lambda, in client applications
and at synth time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# CloudWatch namespace of the metrics the normalizer publishes with the Embedded Metric Format.
NAMESPACE: Final = "PrefixRouting"

# The one dimension of every normalizer metric. Its value is the inference component's name.
# Tenants and prefix fingerprints are never dimensions (unbounded cardinality): they go to the log.
DIMENSION_COMPONENT: Final = "InferenceComponent"


@dataclass(frozen=True)
class MetricSpec:
    name: str
    unit: str  # an EMF / CloudWatch unit name
    description: str


# Metrics the normalizer publishes once per request (high resolution, 1 s storage).
TTFT = MetricSpec(
    "TimeToFirstToken", "Milliseconds",
    "time from the request's arrival at the front door to its first bytes handed to the client's socket",
)
END_TO_END = MetricSpec(
    "EndToEndLatency", "Milliseconds", "time from the request's arrival to its last bytes handed to the client's socket"
)
PROMPT_TOKENS = MetricSpec("PromptTokens", "Count", "usage.prompt_tokens reported by the model")
CACHED_TOKENS = MetricSpec(
    "CachedTokens", "Count", "usage.prompt_tokens_details.cached_tokens reported by the model"
)
NORMALIZATION_TIME = MetricSpec("NormalizationTime", "Milliseconds", "time spent normalizing the body")
REQUESTS = MetricSpec("Requests", "Count", "requests the normalizer accepted and sent on")
CLIENT_ERRORS = MetricSpec("ClientErrors", "Count", "requests rejected with a 4xx (bad body, too large)")
REKEYED_REQUESTS = MetricSpec(
    "RekeyedRequests", "Count",
    "requests whose raw body's first PrefixLength bytes differ from the normalized body's (the client's bytes "
    "would have scattered them)",
)
REFUSED_DIRECT_INVOCATIONS = MetricSpec(
    "RefusedDirectInvocations", "Count",
    "direct invocations refused with 403: only the Function URL identifies its caller (normalizer.allow_direct_invoke)",
)
UPSTREAM_ERRORS = MetricSpec(
    "UpstreamErrors", "Count", "requests that failed at the endpoint (5xx, stream error, timeout, truncation)"
)

#: Copy counts as ``DescribeInferenceComponent`` reports them (SageMaker publishes no such metric),
#: read by the front door at most once a minute per execution environment: read them with Maximum.
DESIRED_COPIES = MetricSpec("DesiredCopies", "Count", "RuntimeConfig.DesiredCopyCount of the inference component")
CURRENT_COPIES = MetricSpec("CurrentCopies", "Count", "RuntimeConfig.CurrentCopyCount of the inference component")

ALL_METRICS: Final = (
    TTFT,
    END_TO_END,
    PROMPT_TOKENS,
    CACHED_TOKENS,
    NORMALIZATION_TIME,
    REQUESTS,
    CLIENT_ERRORS,
    UPSTREAM_ERRORS,
    REKEYED_REQUESTS,
    REFUSED_DIRECT_INVOCATIONS,
    DESIRED_COPIES,
    CURRENT_COPIES,
)

#: Hot-prefix replication (``normalizer.replication``, :mod:`prefix_routing.rules.replication`): in
#: every EMF document while it is enabled, in none while it is off (so they are not in ALL_METRICS,
#: the metrics of a request without replication). ``HotPrefixes`` is a gauge of one execution
#: environment's tracker: read it with Maximum.
REPLICATED_REQUESTS = MetricSpec(
    "ReplicatedRequests", "Count", "requests sent to a replica j > 0 of a hot prefix (PrefixAwareId <id>-r<j>)"
)
HOT_PREFIXES = MetricSpec("HotPrefixes", "Count", "prefixes the front door's tracker gives more than one replica")
REPLICATION_METRICS: Final = (REPLICATED_REQUESTS, HOT_PREFIXES)

#: Replica steering (``normalizer.replication.steering`` with the front door's table,
#: :mod:`prefix_routing.rules.steering`): in every EMF document while it is active, in none otherwise.
REPLICA_COLLISIONS = MetricSpec(
    "ReplicaCollisions", "Count",
    "answers that revealed a replica collision (a replica's first answer found >= 90 % of the key cached)",
)
STEERING_FALLBACKS = MetricSpec(
    "SteeringFallbacks", "Count",
    "hot-prefix requests sent to a replica in turn because the steering store failed or timed out",
)
STEERING_STORE_ERRORS = MetricSpec(
    "SteeringStoreErrors", "Count", "requests whose steering store calls failed (at the send or at the answer's end)"
)
STEERING_TIME = MetricSpec(
    "SteeringTime", "Milliseconds", "time the steering store took before the endpoint call (hot prefixes only)"
)
STEERING_METRICS: Final = (REPLICA_COLLISIONS, STEERING_FALLBACKS, STEERING_STORE_ERRORS, STEERING_TIME)
#: ``SteeringLogField.STEERING``'s values: chosen by load from the shared state, in turn by design
#: (steering off, or no table), in turn because the store failed; null: not hot, not steered.
STEERING_LEAST_LOADED: Final = "least_loaded"
STEERING_TURNS: Final = "turns"
STEERING_FALLBACK: Final = "turns_store_unavailable"

#: Per-tenant limits (``[limits]``, :mod:`prefix_routing.rules.limits`): in every EMF document while
#: some tenant has a limit, in none otherwise. Tenants are never a dimension: the log line's
#: ``LimitLogField.THROTTLED_BY`` and ``TENANT`` rank them (Contributor Insights).
THROTTLED_REQUESTS = MetricSpec("ThrottledRequests", "Count", "requests refused with 429: the tenant was over a limit")
LIMITER_STORE_ERRORS = MetricSpec(
    "LimiterStoreErrors", "Count", "requests whose limits could not be checked (the store failed or timed out)"
)
LIMITER_TIME = MetricSpec("LimiterTime", "Milliseconds", "time the admission took in the store (before the endpoint call)")
LIMIT_METRICS: Final = (THROTTLED_REQUESTS, LIMITER_STORE_ERRORS, LIMITER_TIME)
#: The names of the limits, as ``LimitLogField.THROTTLED_BY`` gives them (``prefix_routing.rules.limits``).
LIMIT_NAMES: Final = ("requests_per_minute", "tokens_per_minute", "concurrent_streams")
#: The limits table's partition key and TTL attribute: the stack creates it with these, the front door
#: writes them.
LIMITS_TABLE_KEY: Final = "pk"
LIMITS_TABLE_TTL: Final = "expires_at"

#: The routing advisor's figures for one window of the request log (``prefix_routing.lab.advisor``),
#: published once per run under NAMESPACE with the component dimension: the model's prediction
#: beside what production measured, so that drift shows on one chart.
HIT_RATE_BOUND = MetricSpec("HitRateBound", "None", "one infinite shared cache's token hit rate over the window (0-1)")
PREDICTED_HIT_RATE = MetricSpec("PredictedHitRate", "None", "the lab's hit rate for the current routing settings (0-1)")
BEST_PREDICTED_HIT_RATE = MetricSpec("BestPredictedHitRate", "None", "the lab's hit rate at the recommended settings (0-1)")
MEASURED_HIT_RATE = MetricSpec("MeasuredHitRate", "None", "cached / prompt tokens the request log reports for the window (0-1)")
PREFIX_REUSE_SHARE = MetricSpec("PrefixReuseShare", "None", "requests reusing a prefix seen before in the window (0-1)")
RECOMMENDED_PREFIX_LENGTH = MetricSpec("RecommendedPrefixLength", "Bytes", "the advisor's PrefixLength")
RECOMMENDED_CONCURRENCY_THRESHOLD = MetricSpec(
    "RecommendedConcurrencyThreshold", "Count", "the advisor's ConcurrencyThreshold"
)
#: The isolation canary's verdicts (``prefix_routing.canary``), one of each per trust domain per run,
#: under NAMESPACE with the component dimension: 1 when the run found it, else 0.
CANARY_ISOLATION_BREACH = MetricSpec(
    "CanaryIsolationBreach", "Count",
    "the canary's second tenant found the first tenant's prompt cached beyond the chat template's tokens (1)",
)
CANARY_CACHE_COLD = MetricSpec(
    "CanaryCacheCold", "Count", "the canary tenant's own repeat of its prompt was not cached (1): cache or routing off"
)
CANARY_METRICS: Final = (CANARY_ISOLATION_BREACH, CANARY_CACHE_COLD)
ADVISOR_METRICS: Final = (
    HIT_RATE_BOUND, PREDICTED_HIT_RATE, BEST_PREDICTED_HIT_RATE, MEASURED_HIT_RATE, PREFIX_REUSE_SHARE,
    RECOMMENDED_PREFIX_LENGTH, RECOMMENDED_CONCURRENCY_THRESHOLD,
)


class LogField:
    """Fields of the normalizer's one structured log line per request (JSON).

    No prompt text is ever logged: only lengths, hashes and timings.
    """

    MESSAGE: Final = "message"  # constant REQUEST_LOG_MESSAGE on request lines
    TIMESTAMP_MS: Final = "request_ts_ms"  # epoch milliseconds at arrival
    TENANT: Final = "tenant"  # the tenant id (not secret; the key that salts it is)
    # The tenant's PrefixAwareId, the one sent to SageMaker; with replication, replica j > 0 of a hot
    # prefix went out as <id>-r<j> (ReplicaLogField.REPLICA says which j).
    ROUTING_ID: Final = "prefix_aware_id"
    COMPONENT: Final = "inference_component"
    PREFIX_FINGERPRINT: Final = "prefix_fingerprint"  # hash of the first PrefixLength bytes
    PREFIX_LENGTH: Final = "prefix_length"  # bytes the fingerprint covers
    BLOCK_HASHES: Final = "block_hashes"  # chained hashes of fixed-size blocks of the body
    BLOCK_BYTES: Final = "block_bytes"  # size of those blocks
    BODY_BYTES: Final = "body_bytes"  # normalized body length
    PROMPT_TOKENS: Final = "prompt_tokens"
    CACHED_TOKENS: Final = "cached_tokens"
    OUTPUT_TOKENS: Final = "output_tokens"
    TTFT_MS: Final = "ttft_ms"
    TOTAL_MS: Final = "total_ms"
    NORMALIZE_MS: Final = "normalize_ms"
    STATUS: Final = "status"  # HTTP status given to the caller
    ERROR_KIND: Final = "error_kind"  # e.g. invalid_json, throttled, model_error, truncated
    REKEYED: Final = "rekeyed"  # raw and normalized bodies differ in their first PrefixLength bytes
    # The routing key's sample bucket, 0-9999 (rules/sampling.py): a reader's filter keeps the buckets
    # below rate x 10,000. Only on lines with a prefix fingerprint.
    SAMPLE_BUCKET: Final = "sample_bucket"
    SAMPLE_HOT: Final = "sample_hot"  # the replication rule counts the prefix hot: in every sample


class ReplicaLogField:
    """Fields the request log line has only while hot-prefix replication is enabled (and the request
    was sent): the request went out with ``PrefixAwareId = replica_id(<prefix_aware_id>, replica)``."""

    REPLICA: Final = "replica"  # j: 0 = the tenant's own PrefixAwareId, else <id>-r<j>
    REPLICAS: Final = "replicas"  # k: the replicas the prefix had then (1 = not hot)


class SteeringLogField:
    """``STEERING`` is on every request line while replication is enabled (null for a prefix that is
    not hot); the others only while steering is active (the stage's steering and its table)."""

    STEERING: Final = "steering"  # STEERING_LEAST_LOADED | STEERING_TURNS | STEERING_FALLBACK | null
    COLLISION: Final = "replica_collision"  # this answer revealed a collision (its replica got a fresh number)
    STEERING_MS: Final = "steering_ms"  # time the store took before the endpoint call
    STORE_ERROR: Final = "steering_store_error"  # a store call failed (send: fell back to turns; answer: count kept)


class LimitLogField:
    """Fields the request log line has only while some tenant has a limit."""

    RULE: Final = "limit_rule"  # the [limits] rule that applied: "default" or the override's key; null: unlimited
    THROTTLED_BY: Final = "throttled_by"  # the limit that refused the request (429), else null
    LIMITER_MS: Final = "limiter_ms"  # time the admission took in the store
    STORE_ERROR: Final = "limiter_store_error"  # the store failed: served (open) or refused (closed) unchecked


class DomainLogField:
    """Fields the request log line has only while the stage has trust domains (``[domains]``)."""

    DOMAIN: Final = "domain"  # the tenant's trust domain; its component is LogField.COMPONENT


# The value of LogField.MESSAGE on the per-request line, so readers can pick those lines out.
REQUEST_LOG_MESSAGE: Final = "prefix_routing.request"
