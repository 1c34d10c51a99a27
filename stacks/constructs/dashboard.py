"""One dashboard that answers: does prefix routing pay (TTFT, hit rate) or hurt (imbalance)?"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

from stacks.constructs.log_insights import tenant_usage_query
from stacks.metrics import AdvisorMetrics, EngineMetrics, NormalizerMetrics, SageMakerMetrics

ADVISOR_TEXT = """**Routing advisor** (every run, over the window of the request log since the last)

* **measured** is what production cached; **predicted, current settings** is the lab's figure for
  the same window at the deployed PrefixLength and ConcurrencyThreshold: a gap between them is the
  model's drift, not a routing problem.
* **predicted, best settings** above the current line by 5 points or more, run after run, is when
  the advisor notifies the alarm topic with the `[routing]` snippet to apply (a change restarts
  every copy with a cold cache).
* **bound** is what one infinite cache shared by all copies would hold: no routing does better.
* **prefix reuse share** is the share of requests whose first block was seen before. The rule of
  thumb says prefix-aware routing pays above 50 %; it is only a proxy (on the public Mooncake trace
  44.6 % of requests reuse a prefix, yet PREFIX_AWARE caches 59 % of the tokens against RANDOM's
  13 %), so the advisor's verdict comes from the simulated gain, not from it."""

WIDTH = 24  # the dashboard grid is 24 columns wide
GRAPH_HEIGHT = 6  # CDK's default height of a graph widget


def engine_hit_rate_text(engine: EngineMetrics, window_minutes: int) -> str:
    """The engine hit rate's widget text: its PromQL query, which no classic dashboard widget that CDK or
    CloudFormation document can chart, to run in Query Studio (and add to the dashboard from there)."""
    return (
        "**Engine prefix-cache hit rate** (vLLM's own counters, detailed observability): a PromQL query. Run it in "
        "CloudWatch *Query Studio* (PromQL), where *Add to dashboard* can chart it here:\n\n"
        f"`{engine.hit_rate(window_minutes)}`\n\n"
        "Close to the front door's hit rate on the left when every request goes through the front door; "
        "the alarms above are its threshold and whether its metrics are published."
    )


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
        advisor: AdvisorMetrics | None = None,
        limits_enabled: bool = False,
        engine: EngineMetrics | None = None,
        engine_alarms: Sequence[cloudwatch.IAlarm] = (),
        engine_window_minutes: int = 5,
        request_log_group_name: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        third = WIDTH // 3
        quarter = WIDTH // 4
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=dashboard_name)
        self.dashboard.add_widgets(
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=alarms, width=WIDTH, height=3),
        )
        # With the engine's hit rate (vLLM under detailed observability), it sits beside the front door's.
        width = quarter if engine is not None else third
        engine_column = [] if engine is None else [cloudwatch.Column(
            cloudwatch.AlarmStatusWidget(title="Engine prefix-cache hit rate: alarms", alarms=list(engine_alarms),
                                         width=quarter, height=2),
            cloudwatch.TextWidget(markdown=engine_hit_rate_text(engine, engine_window_minutes), width=quarter,
                                  height=GRAPH_HEIGHT - 2),
        )]
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Time to first token (normalizer, ms)",
                left=[normalizer.ttft("p50"), normalizer.ttft("p90")],
                width=width,
            ),
            cloudwatch.GraphWidget(
                title="KV-cache hit rate (cached / prompt tokens)",
                left=[normalizer.hit_rate()],
                left_y_axis=cloudwatch.YAxisProps(min=0, max=1),
                width=width,
            ),
            *engine_column,
            cloudwatch.GraphWidget(
                title="Requests per instance (one line each: spread = imbalance)",
                left=[sagemaker.requests_per_instance()],
                width=width,
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Concurrent requests per copy, per instance",
                left=[sagemaker.concurrency_per_instance()],
                width=quarter,
            ),
            # The front door's relief for a hotspot: a hot prefix's requests spread over replicas
            # (PrefixAwareId <id>-r<j>). Empty unless normalizer.replication.enabled; collisions and
            # fallbacks only with its steering.
            cloudwatch.GraphWidget(
                title="Hot-prefix replication: requests sent to a replica, collisions, fallbacks; hot prefixes",
                left=[normalizer.replicated_requests(), *normalizer.steering()],
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
                left=[sagemaker.errors_5xx(), sagemaker.errors_4xx(), normalizer.upstream_errors(), normalizer.client_errors(),
                      normalizer.refused_direct_invocations()],
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
        if limits_enabled:
            self.dashboard.add_widgets(
                cloudwatch.GraphWidget(
                    title="Per-tenant limits: throttled requests (429), limits not checked (which tenants: the "
                          "top-throttled-tenants Contributor Insights rule)",
                    left=[normalizer.throttled_requests(), normalizer.limiter_store_errors()],
                    width=WIDTH // 2,
                ),
                cloudwatch.GraphWidget(
                    title="Per-tenant limits: admission time in the table (ms)",
                    left=[normalizer.limiter_time("p50"), normalizer.limiter_time("p99")],
                    width=WIDTH // 2,
                ),
            )
        if advisor is not None:  # advisor.enabled: its row
            self.dashboard.add_widgets(
                cloudwatch.GraphWidget(
                    title="Hit rate: measured vs the advisor's prediction, best and bound; where the rest was lost",
                    left=advisor.hit_rates(),
                    right=advisor.losses(),
                    right_y_axis=cloudwatch.YAxisProps(min=0, max=1),
                    left_y_axis=cloudwatch.YAxisProps(min=0, max=1),
                    width=third,
                ),
                cloudwatch.GraphWidget(
                    title="Prefix reuse share (50 % rule of thumb) and the recommended settings",
                    left=[advisor.prefix_reuse_share()],
                    left_y_axis=cloudwatch.YAxisProps(min=0, max=1),
                    left_annotations=[
                        cloudwatch.HorizontalAnnotation(value=0.5, label="50 % (rule of thumb: routing pays above)")],
                    right=advisor.recommended(),
                    width=third,
                ),
                cloudwatch.TextWidget(markdown=ADVISOR_TEXT, width=third, height=6),
            )
        if request_log_group_name is not None:  # who used what, from the request log's own fields
            self.dashboard.add_widgets(cloudwatch.LogQueryWidget(
                title="Top tenants by prompt tokens (requests, cached share; `python -m prefix_routing usage` for chargeback)",
                log_group_names=[request_log_group_name],
                query_string=tenant_usage_query(10).to_string(),
                view=cloudwatch.LogQueryVisualizationType.TABLE,
                width=WIDTH, height=6,
            ))
