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


class SageMakerMetrics:
    """SageMaker's own metrics for one endpoint and its inference component.

    Names from the SageMaker developer guide (aws-facts.md). Per-instance series exist only with
    enhanced metrics (``MetricsConfig.EnableEnhancedMetrics``), which the endpoint construct sets.
    """

    NAMESPACE = "AWS/SageMaker"
    COMPONENT_UTILIZATION_NAMESPACE = "/aws/sagemaker/InferenceComponents"

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
        return self._component("ConcurrentRequestsPerCopy", statistic, f"concurrent requests per copy ({statistic})")

    def gpu_utilization(self) -> cloudwatch.Metric:
        return self._component(
            "GPUUtilizationNormalized", "Average", "GPU utilization %", self.COMPONENT_UTILIZATION_NAMESPACE
        )

    def gpu_memory_utilization(self) -> cloudwatch.Metric:
        return self._component(
            "GPUMemoryUtilizationNormalized", "Average", "GPU memory %", self.COMPONENT_UTILIZATION_NAMESPACE
        )

    def copy_counts(self) -> list[cloudwatch.Metric]:
        # (unconfirmed) metric names: no AWS page we could check lists the copy-count metrics.
        return [
            self._component("DesiredCopyCount", "Average", "copies desired"),
            self._component("CurrentCopyCount", "Average", "copies current"),
        ]

    def error_rate_percent(self) -> cloudwatch.MathExpression:
        return cloudwatch.MathExpression(
            expression="100 * errors / MAX([errors, invocations])",
            using_metrics={"errors": self.errors_5xx(), "invocations": self.invocations()},
            label="5XX error rate %",
            period=ONE_MINUTE,
        )

    # Per-instance series: Metrics Insights queries, because instance ids are unknown at synth.
    def _per_instance_query(self, function: str, metric: str) -> str:
        return (
            f'SELECT {function}({metric}) FROM "{self.NAMESPACE}" '
            f"WHERE InferenceComponentName = '{self.component_name}' GROUP BY InstanceId ORDER BY {function}() DESC"
        )

    def requests_per_instance(self) -> cloudwatch.MathExpression:
        return cloudwatch.MathExpression(
            expression=self._per_instance_query("SUM", "Invocations"),
            using_metrics={},
            label="requests per instance",
            period=ONE_MINUTE,
        )

    def concurrency_per_instance(self) -> cloudwatch.MathExpression:
        """One series per instance: the mean in-flight requests per copy there."""
        return cloudwatch.MathExpression(
            expression=self._per_instance_query("AVG", "ConcurrentRequestsPerCopy"),
            using_metrics={},
            label="concurrent requests per copy, per instance",
            period=ONE_MINUTE,
        )
