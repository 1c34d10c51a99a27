"""One dashboard that answers: does prefix routing pay (TTFT, hit rate) or hurt (imbalance)?"""

from __future__ import annotations

from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

from stacks.metrics import NormalizerMetrics, SageMakerMetrics

WIDTH = 24  # the dashboard grid is 24 columns wide


class RoutingDashboard(Construct):
    """Attributes: ``dashboard``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        dashboard_name: str,
        normalizer: NormalizerMetrics,
        sagemaker: SageMakerMetrics,
        alarms: list[cloudwatch.Alarm],
    ) -> None:
        super().__init__(scope, construct_id)
        third = WIDTH // 3
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=dashboard_name)
        self.dashboard.add_widgets(
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=alarms, width=WIDTH, height=3),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Time to first token (normalizer, ms)",
                left=[normalizer.ttft("p50"), normalizer.ttft("p90")],
                width=third,
            ),
            cloudwatch.GraphWidget(
                title="KV-cache hit rate (cached / prompt tokens)",
                left=[normalizer.hit_rate()],
                left_y_axis=cloudwatch.YAxisProps(min=0, max=1),
                width=third,
            ),
            cloudwatch.GraphWidget(
                title="Requests per instance (one line each: spread = imbalance)",
                left=[sagemaker.requests_per_instance()],
                width=third,
            ),
        )
        quarter = WIDTH // 4
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Concurrent requests per copy, per instance",
                left=[sagemaker.concurrency_per_instance()],
                width=quarter,
            ),
            # The front door's relief for a hotspot: a hot prefix's requests spread over replicas
            # (PrefixAwareId <id>-r<j>). Empty unless normalizer.replication.enabled.
            cloudwatch.GraphWidget(
                title="Hot-prefix replication: requests sent to a replica, hot prefixes",
                left=[normalizer.replicated_requests()],
                right=[normalizer.hot_prefixes()],
                width=quarter,
            ),
            # SageMaker publishes no copy counts: the normalizer samples DescribeInferenceComponent.
            cloudwatch.GraphWidget(
                title="Copies: desired vs current (sampled by the normalizer), invocations per copy",
                left=normalizer.copies(),
                right=[sagemaker.invocations_per_copy()],
                width=quarter,
            ),
            cloudwatch.GraphWidget(
                title="GPU utilization and memory (%)",
                left=[sagemaker.gpu_utilization(), sagemaker.gpu_memory_utilization()],
                width=quarter,
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Model latency (µs)", left=[sagemaker.model_latency("p50"), sagemaker.model_latency("p90")],
                width=quarter,
            ),
            cloudwatch.GraphWidget(
                title="Errors",
                left=[sagemaker.errors_5xx(), sagemaker.errors_4xx(), normalizer.upstream_errors(), normalizer.client_errors()],
                right=[sagemaker.error_rate_percent()],
                width=quarter,
            ),
            cloudwatch.GraphWidget(
                title="Traffic and capacity",
                left=[sagemaker.invocations(), normalizer.requests()],
                right=[sagemaker.no_capacity_failures()],
                width=quarter,
            ),
            # Misses the front door prevents: bodies whose own first PrefixLength bytes differ from
            # their normalized form (key order, CRLF, parameters first) would have keyed elsewhere.
            cloudwatch.GraphWidget(
                title="Re-keyed requests: the client's bytes would have scattered them",
                left=[normalizer.rekeyed_requests()],
                right=[normalizer.rekeyed_percent()],
                right_y_axis=cloudwatch.YAxisProps(min=0, max=100),
                width=quarter,
            ),
        )
