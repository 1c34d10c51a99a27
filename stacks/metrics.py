"""Metric factories, one per namespace. Alarms and dashboards take metrics from here and never
spell a metric name themselves (the pattern of cdklabs/cdk-monitoring-constructs).

The normalizer's names come from ``prefix_routing.rules.telemetry``, the module the Lambda imports, so
an alarm cannot watch a metric nobody publishes.
"""

from __future__ import annotations

from aws_cdk import Duration, aws_cloudwatch as cloudwatch

from prefix_routing.rules import telemetry

ONE_MINUTE = Duration.minutes(1)


class NormalizerMetrics:
    """Metrics the normalizer Lambda publishes with EMF (namespace ``telemetry.NAMESPACE``)."""

    def __init__(self, *, component_name: str) -> None:
        self._dimensions = {telemetry.DIMENSION_COMPONENT: component_name}

    def _metric(self, spec: telemetry.MetricSpec, statistic: str, label: str | None = None) -> cloudwatch.Metric:
        return cloudwatch.Metric(
            namespace=telemetry.NAMESPACE,
            metric_name=spec.name,
            dimensions_map=self._dimensions,
            statistic=statistic,
            period=ONE_MINUTE,
            label=label,
        )

    def ttft(self, percentile: str = "p50") -> cloudwatch.Metric:
        return self._metric(telemetry.TTFT, percentile, f"TTFT {percentile} (ms)")

    def end_to_end(self, percentile: str = "p50") -> cloudwatch.Metric:
        return self._metric(telemetry.END_TO_END, percentile, f"end to end {percentile} (ms)")

    def prompt_tokens(self) -> cloudwatch.Metric:
        return self._metric(telemetry.PROMPT_TOKENS, "Sum", "prompt tokens")

    def cached_tokens(self) -> cloudwatch.Metric:
        return self._metric(telemetry.CACHED_TOKENS, "Sum", "cached tokens")

    def requests(self) -> cloudwatch.Metric:
        return self._metric(telemetry.REQUESTS, "Sum", "requests")

    def client_errors(self) -> cloudwatch.Metric:
        return self._metric(telemetry.CLIENT_ERRORS, "Sum", "rejected (4xx)")

    def upstream_errors(self) -> cloudwatch.Metric:
        return self._metric(telemetry.UPSTREAM_ERRORS, "Sum", "failed upstream")

    def throttled_requests(self) -> cloudwatch.Metric:
        """Requests refused with 429 by a tenant's limit (which tenants: the top-throttled-tenants rule)."""
        return self._metric(telemetry.THROTTLED_REQUESTS, "Sum", "throttled (429)")

    def limiter_store_errors(self) -> cloudwatch.Metric:
        return self._metric(telemetry.LIMITER_STORE_ERRORS, "Sum", "limits not checked (store error)")

    def limiter_time(self, percentile: str = "p50") -> cloudwatch.Metric:
        return self._metric(telemetry.LIMITER_TIME, percentile, f"admission {percentile} (ms)")

    def refused_direct_invocations(self) -> cloudwatch.Metric:
        """Direct invocations refused with 403 (they would have named their own tenant)."""
        return self._metric(telemetry.REFUSED_DIRECT_INVOCATIONS, "Sum", "refused direct invocations")

    def rekeyed_requests(self) -> cloudwatch.Metric:
        """Requests whose own first PrefixLength bytes would have keyed routing elsewhere (re-keyed)."""
        return self._metric(telemetry.REKEYED_REQUESTS, "Sum", "re-keyed requests")

    def rekeyed_percent(self) -> cloudwatch.MathExpression:
        """Re-keyed requests as a % of the requests sent on: the misses the front door prevents."""
        return cloudwatch.MathExpression(
            expression="100 * rekeyed / requests",
            using_metrics={"rekeyed": self.rekeyed_requests(), "requests": self.requests()},
            label="re-keyed (% of requests)",
            period=ONE_MINUTE,
        )

    def copies(self) -> list[cloudwatch.Metric]:
        """Desired and current copies, as the front door samples DescribeInferenceComponent once a minute."""
        return [self._metric(telemetry.DESIRED_COPIES, "Maximum", "copies desired"),
                self._metric(telemetry.CURRENT_COPIES, "Maximum", "copies current")]

    def replicated_requests(self) -> cloudwatch.Metric:
        """Requests sent to a replica j > 0 of a hot prefix (published only with normalizer.replication)."""
        return self._metric(telemetry.REPLICATED_REQUESTS, "Sum", "requests sent to a replica")

    def hot_prefixes(self) -> cloudwatch.Metric:
        """Prefixes with more than one replica: a gauge per execution environment, so its Maximum."""
        return self._metric(telemetry.HOT_PREFIXES, "Maximum", "hot prefixes (most in one environment)")

    def steering(self) -> list[cloudwatch.Metric]:
        """Replica steering (published only while it is active): collisions found, and hot-prefix
        requests sent in turn because its store failed."""
        return [self._metric(telemetry.REPLICA_COLLISIONS, "Sum", "replica collisions"),
                self._metric(telemetry.STEERING_FALLBACKS, "Sum", "steering fallbacks (store unavailable)")]

    def normalization_time(self) -> cloudwatch.Metric:
        return self._metric(telemetry.NORMALIZATION_TIME, "p99", "normalization p99 (ms)")

    def hit_rate(self) -> cloudwatch.MathExpression:
        """Token-weighted KV-cache hit rate: cached / prompt tokens, 0..1."""
        return cloudwatch.MathExpression(
            expression="cached / prompt",
            using_metrics={"cached": self.cached_tokens(), "prompt": self.prompt_tokens()},
            label="KV-cache hit rate",
            period=ONE_MINUTE,
        )


class AdvisorMetrics:
    """What the routing advisor publishes once per run (``telemetry.ADVISOR_METRICS``), read per run."""

    def __init__(self, *, component_name: str, schedule_minutes: int) -> None:
        self._dimensions = {telemetry.DIMENSION_COMPONENT: component_name}
        self._period = Duration.minutes(schedule_minutes)

    def _metric(self, spec: telemetry.MetricSpec, label: str) -> cloudwatch.Metric:
        return cloudwatch.Metric(namespace=telemetry.NAMESPACE, metric_name=spec.name, dimensions_map=self._dimensions,
                                 statistic="Maximum", period=self._period, label=label)

    def hit_rates(self) -> list[cloudwatch.Metric]:
        """Measured in production against the lab's prediction now, at the best settings, and the bound."""
        return [
            self._metric(telemetry.MEASURED_HIT_RATE, "measured (request log)"),
            self._metric(telemetry.PREDICTED_HIT_RATE, "predicted, current settings"),
            self._metric(telemetry.BEST_PREDICTED_HIT_RATE, "predicted, best settings"),
            self._metric(telemetry.HIT_RATE_BOUND, "bound (one infinite cache per tenant's namespace)"),
        ]

    def losses(self) -> list[cloudwatch.MathExpression]:
        """Where the hits the bound allows went: to the fleet (routing and capacity: bound - predicted)
        and in the engine (predicted - measured: evictions, restarts, the model's error)."""
        using = {"bound": self._metric(telemetry.HIT_RATE_BOUND, "bound"),
                 "predicted": self._metric(telemetry.PREDICTED_HIT_RATE, "predicted"),
                 "measured": self._metric(telemetry.MEASURED_HIT_RATE, "measured")}
        return [cloudwatch.MathExpression(expression="bound - predicted", using_metrics=using, period=self._period,
                                          label="lost to routing and capacity (bound - predicted)"),
                cloudwatch.MathExpression(expression="predicted - measured", using_metrics=using, period=self._period,
                                          label="lost in the engine (predicted - measured)")]

    def prefix_reuse_share(self) -> cloudwatch.Metric:
        return self._metric(telemetry.PREFIX_REUSE_SHARE, "requests reusing a prefix")

    def recommended(self) -> list[cloudwatch.Metric]:
        return [self._metric(telemetry.RECOMMENDED_PREFIX_LENGTH, "recommended PrefixLength (bytes)"),
                self._metric(telemetry.RECOMMENDED_CONCURRENCY_THRESHOLD, "recommended ConcurrencyThreshold")]


class SageMakerMetrics:
    """SageMaker's own metrics for one endpoint and its inference component.

    Names from the SageMaker developer guide (aws-facts.md). Per-instance series exist only with
    enhanced metrics (``MetricsConfig.EnableEnhancedMetrics``), which the endpoint construct sets.
    Copy counts are not among them: ``DesiredCopyCount`` / ``CurrentCopyCount`` are fields of
    ``DescribeInferenceComponent``, which no AWS metric table lists; the normalizer publishes them
    (``NormalizerMetrics.copies``).
    """

    NAMESPACE = "AWS/SageMaker"
    COMPONENT_UTILIZATION_NAMESPACE = "/aws/sagemaker/InferenceComponents"
    #: The dimension set of the per-instance series that enhanced metrics add. ``SCHEMA(...)`` reads
    #: only series with exactly this set: the component-level series (``InferenceComponentName``
    #: alone), which every ``WHERE InferenceComponentName = ...`` also matches, would otherwise form
    #: an extra null group "Other" under ``GROUP BY InstanceId``, and per-container series
    #: (``..., ContainerId``) would be counted twice. Per instance rather than per container because
    #: the instance is what the dashboard compares and what managed scaling adds or removes; whether
    #: enhanced metrics publish this set is settled on first deploy (``verify`` lists the metrics).
    PER_INSTANCE_DIMENSIONS = ("InferenceComponentName", "InstanceId")
    #: ``ConcurrentRequestsPerCopy`` documents Minimum and Maximum only (no Average).
    CONCURRENCY_STATISTICS = ("Minimum", "Maximum")

    def __init__(self, *, endpoint_name: str, component_name: str) -> None:
        self.endpoint_name = endpoint_name
        self.component_name = component_name

    def _component(self, name: str, statistic: str, label: str, namespace: str = NAMESPACE) -> cloudwatch.Metric:
        return cloudwatch.Metric(
            namespace=namespace,
            metric_name=name,
            dimensions_map={"InferenceComponentName": self.component_name},
            statistic=statistic,
            period=ONE_MINUTE,
            label=label,
        )

    def invocations(self) -> cloudwatch.Metric:
        return self._component("Invocations", "Sum", "invocations")

    def errors_5xx(self) -> cloudwatch.Metric:
        return self._component("Invocation5XXErrors", "Sum", "5XX errors")

    def errors_4xx(self) -> cloudwatch.Metric:
        return self._component("Invocation4XXErrors", "Sum", "4XX errors")

    def model_latency(self, percentile: str = "p50") -> cloudwatch.Metric:
        return self._component("ModelLatency", percentile, f"model latency {percentile} (µs)")

    def no_capacity_failures(self) -> cloudwatch.Metric:
        return self._component("NoCapacityInvocationFailures", "Sum", "no capacity failures")

    def concurrent_requests_per_copy(self, statistic: str = "Maximum") -> cloudwatch.Metric:
        """The component-level series: a mean over copies, so its Maximum is not the busiest copy."""
        if statistic not in self.CONCURRENCY_STATISTICS:
            raise ValueError(f"ConcurrentRequestsPerCopy statistic {statistic!r}: AWS documents only "
                             f"{' and '.join(self.CONCURRENCY_STATISTICS)}")
        return self._component("ConcurrentRequestsPerCopy", statistic, f"concurrent requests per copy ({statistic})")

    def invocations_per_copy(self) -> cloudwatch.Metric:
        return self._component("InvocationsPerCopy", "Sum", "invocations per copy")

    def gpu_utilization(self) -> cloudwatch.Metric:
        return self._component(
            "GPUUtilizationNormalized", "Average", "GPU utilization %", self.COMPONENT_UTILIZATION_NAMESPACE
        )

    def gpu_memory_utilization(self) -> cloudwatch.Metric:
        return self._component(
            "GPUMemoryUtilizationNormalized", "Average", "GPU memory %", self.COMPONENT_UTILIZATION_NAMESPACE
        )

    def error_rate_percent(self) -> cloudwatch.MathExpression:
        return cloudwatch.MathExpression(
            expression="100 * errors / MAX([errors, invocations])",
            using_metrics={"errors": self.errors_5xx(), "invocations": self.invocations()},
            label="5XX error rate %",
            period=ONE_MINUTE,
        )

    # Per-instance series: Metrics Insights queries, because instance ids are unknown at synth.
    def per_instance_query(self, function: str, metric: str) -> str:
        """One series per instance, from the per-instance dimension set only (no "Other" group)."""
        schema = ", ".join((f'"{self.NAMESPACE}"', *self.PER_INSTANCE_DIMENSIONS))
        return (
            f"SELECT {function}({metric}) FROM SCHEMA({schema}) "
            f"WHERE InferenceComponentName = '{self.component_name}' GROUP BY InstanceId ORDER BY {function}() DESC"
        )

    def requests_per_instance(self) -> cloudwatch.MathExpression:
        return cloudwatch.MathExpression(
            expression=self.per_instance_query("SUM", "Invocations"),
            using_metrics={},
            label="requests per instance",
            period=ONE_MINUTE,
        )

    def concurrency_per_instance(self) -> cloudwatch.MathExpression:
        """One series per instance: the highest in-flight requests per copy there in each minute (MAX:
        the metric documents no average)."""
        return cloudwatch.MathExpression(
            expression=self.per_instance_query("MAX", "ConcurrentRequestsPerCopy"),
            using_metrics={},
            label="concurrent requests per copy, per instance",
            period=ONE_MINUTE,
        )


class EngineMetrics:
    """The engine's own prefix-cache counters for one inference component, as detailed observability
    publishes them: OpenTelemetry metrics in CloudWatch, read with PromQL, not classic metrics (no
    ``cloudwatch.Metric``, Metrics Insights query or graph widget reads them; a PromQL alarm does).

    vLLM V1 counts prefix-cache lookups in tokens: ``vllm:prefix_cache_queries`` and
    ``vllm:prefix_cache_hits``, which a vLLM engine exposes with a ``_total`` suffix (measured on a
    real engine: tests/test_vllm_engines.py). Whether CloudWatch keeps the suffix once detailed
    observability publishes them through OpenTelemetry is not documented (recent collectors no longer
    strip it), so every query selects the counter by a regular expression on ``__name__`` that
    matches both spellings; at most one of them exists for a component. SageMaker labels each series
    with its component. verify's ``engine prefix-cache metrics`` line is ✔ once the alarm on their
    absence is OK, and Query Studio lists what is published.
    """

    QUERIES = "vllm:prefix_cache_queries"
    HITS = "vllm:prefix_cache_hits"
    #: The Prometheus counter suffix, kept or dropped by the exporter: the selectors accept both.
    COUNTER_SUFFIX = "_total"
    COMPONENT_LABEL = "aws.sagemaker.inference_component.name"

    def __init__(self, *, component_name: str, publish_frequency_s: int) -> None:
        self.component_name = component_name
        # rate() needs two samples in its window: at least two publications (MetricPublishFrequencyInSeconds).
        self.min_window_minutes = -(-2 * publish_frequency_s // 60)

    @classmethod
    def name_pattern(cls, metric: str) -> str:
        """The regular expression (RE2, anchored as PromQL anchors it) on ``__name__`` that selects
        ``metric`` with or without the counter suffix."""
        return f"{metric}({cls.COUNTER_SUFFIX})?"

    def selector(self, metric: str) -> str:
        """The component's series of ``metric`` under either spelling (the label's name quoted: it holds ``.``)."""
        return f'{{__name__=~"{self.name_pattern(metric)}", "{self.COMPONENT_LABEL}"="{self.component_name}"}}'

    def hit_rate(self, window_minutes: int) -> str:
        """Tokens the engine found in its prefix cache ÷ tokens it looked up, over the window (0..1; the
        window is stretched to two publications of the endpoint's metrics)."""
        window = f"[{max(window_minutes, self.min_window_minutes)}m]"
        return (f"sum(rate({self.selector(self.HITS)}{window})) / "
                f"sum(rate({self.selector(self.QUERIES)}{window}))")

    def hit_rate_below(self, threshold: float, window_minutes: int) -> str:
        """One series (breaching) while the hit rate is below ``threshold``; none without lookups (0 ÷ 0)."""
        return f"({self.hit_rate(window_minutes)}) < {threshold:g}"

    def absent(self) -> str:
        """One series (breaching) while the component publishes no prefix-cache lookups at all."""
        return f"absent({self.selector(self.QUERIES)})"
