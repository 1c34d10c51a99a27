"""Alarms on whether prefix routing pays (TTFT, hit rate) or hurts (hotspots), plus errors and
capacity, all sending to one KMS-encrypted SNS topic. Thresholds come from the stage config."""

from __future__ import annotations

from aws_cdk import Duration, aws_cloudwatch as cloudwatch, aws_cloudwatch_actions as cw_actions, aws_iam as iam
from aws_cdk import aws_kms as kms, aws_sns as sns, aws_sns_subscriptions as subscriptions
from constructs import Construct

from prefix_routing.stage.config import (ENGINE_HIT_RATE_ALARM, ENGINE_METRICS_ALARM, ERROR_RATE_ALARM,
                                         TTFT_P50_ALARM, AlarmSettings, RoutingSettings, ScalingSettings,
                                         alarm_name)
from stacks.metrics import EngineMetrics, NormalizerMetrics, SageMakerMetrics

Op = cloudwatch.ComparisonOperator


class AlertTopic(Construct):
    """An SNS topic encrypted with its own key, TLS enforced, with optional e-mail subscriptions.

    Attributes: ``topic``, ``key``.
    """

    def __init__(self, scope: Construct, construct_id: str, *, emails: list[str]) -> None:
        super().__init__(scope, construct_id)
        self.key = kms.Key(self, "Key", enable_key_rotation=True, description="Encrypts the alarm topic")
        # CloudWatch publishes alarm notifications to the topic, so it must use the key.
        self.key.grant(iam.ServicePrincipal("cloudwatch.amazonaws.com"), "kms:Decrypt", "kms:GenerateDataKey*")
        self.topic = sns.Topic(self, "Topic", master_key=self.key, enforce_ssl=True)
        for email in emails:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))


class RoutingAlarms(Construct):
    """Attributes: ``ttft_p50``, ``hit_rate``, ``hotspot``, ``pinned_at_threshold``, ``error_rate``,
    ``capacity_failures``, ``refused_direct_invocations``, ``limiter_store_errors`` (None without limits) (each a ``cloudwatch.Alarm``; ``hit_rate`` None when the container reports no
    cached tokens, ``pinned_at_threshold`` None without PREFIX_AWARE), ``engine_hit_rate`` and
    ``engine_metrics_missing`` (``cloudwatch.PromQLAlarm``, None without ``engine``), ``all`` (every
    alarm that notifies) and ``rollback`` (the error-rate and TTFT alarms a rolling update watches).

    The TTFT, error-rate and engine alarms have fixed names, ``<component_name>-<suffix>``
    (``prefix_routing.stage.observability_sections.alarm_name``): the component's DeploymentConfig in the endpoint
    stack names the first two, verify the engine-metrics alarm.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        component_name: str,
        normalizer: NormalizerMetrics,
        sagemaker: SageMakerMetrics,
        settings: AlarmSettings,
        routing: RoutingSettings,
        scaling: ScalingSettings,
        topic: sns.ITopic,
        cached_tokens_reported: bool = True,
        limits_enabled: bool = False,
        engine: EngineMetrics | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        periods = settings.evaluation_periods
        missing_ok = cloudwatch.TreatMissingData.NOT_BREACHING

        def alarm(construct_id: str, metric: cloudwatch.IMetric, *, threshold: float, operator: Op, description: str):
            created = cloudwatch.Alarm(
                self,
                construct_id,
                metric=metric,
                threshold=threshold,
                comparison_operator=operator,
                evaluation_periods=periods,
                datapoints_to_alarm=periods,
                treat_missing_data=missing_ok,
                alarm_description=description,
            )
            created.add_alarm_action(cw_actions.SnsAction(topic))
            created.add_ok_action(cw_actions.SnsAction(topic))
            return created

        self.ttft_p50 = alarm(
            "TtftP50",
            normalizer.ttft("p50"),
            threshold=settings.ttft_p50_ms,
            operator=Op.GREATER_THAN_THRESHOLD,
            description=f"P50 time to first token above {settings.ttft_p50_ms:g} ms, measured by the normalizer.",
        )
        # Only containers that report cached tokens have a hit rate (ModelSettings.reports_cached_tokens).
        self.hit_rate = None if not cached_tokens_reported else alarm(
            "HitRate",
            normalizer.hit_rate(),
            threshold=settings.minimum_hit_rate,
            operator=Op.LESS_THAN_THRESHOLD,
            description=(
                f"KV-cache hit rate (cached / prompt tokens) below {settings.minimum_hit_rate:g}: prefix routing "
                "is not finding warm caches (PrefixLength too short or too long, clients not normalized, spills)."
            ),
        )
        # Fair share per instance is the scaling target: target tracking holds the mean there.
        fair_share = scaling.target_concurrent_requests_per_copy
        hotspot_threshold = fair_share * settings.hotspot_factor
        if routing.concurrency_threshold is not None:
            hotspot_threshold = min(hotspot_threshold, float(routing.concurrency_threshold))
        self.hotspot = alarm(
            "Hotspot",
            sagemaker.concurrency_per_instance(),
            threshold=hotspot_threshold,
            operator=Op.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            description=(
                f"An instance holds >= {hotspot_threshold:g} concurrent requests per copy ({settings.hotspot_factor:g}x "
                f"its fair share of {fair_share:g}, or the concurrency threshold): one prefix group is hot. "
                "Each instance is a contributor (per-instance enhanced metrics)."
            ),
        )
        self.pinned_at_threshold = None
        if routing.strategy == "PREFIX_AWARE" and routing.concurrency_threshold is not None:
            # Per instance, not the component-level series: that one is a mean over copies, so one
            # copy pinned at the threshold hardly moves it. Each instance is a contributor.
            self.pinned_at_threshold = alarm(
                "PinnedAtThreshold",
                sagemaker.concurrency_per_instance(),
                threshold=routing.concurrency_threshold,
                operator=Op.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                description=(
                    f"A copy sits at the ConcurrencyThreshold ({routing.concurrency_threshold}) on some instance "
                    "(MAX of ConcurrentRequestsPerCopy per instance): requests spill to colder copies and the "
                    "hit rate falls."
                ),
            )
        self.error_rate = alarm(
            "ErrorRate",
            sagemaker.error_rate_percent(),
            threshold=settings.error_rate_percent,
            operator=Op.GREATER_THAN_THRESHOLD,
            description=f"5XX errors above {settings.error_rate_percent:g} % of invocations.",
        )
        self.capacity_failures = alarm(
            "CapacityFailures",
            sagemaker.no_capacity_failures(),
            threshold=1,
            operator=Op.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            description="Requests found no copy to serve them (scaled to zero or at max capacity).",
        )
        # One is enough: a caller holds lambda:InvokeFunction without the URL condition and tried to name a
        # tenant itself (a misconfigured client, or one trying another tenant's identity).
        self.refused_direct_invocations = cloudwatch.Alarm(
            self,
            "RefusedDirectInvocations",
            metric=normalizer.refused_direct_invocations(),
            threshold=1,
            comparison_operator=Op.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=missing_ok,
            alarm_description=(
                "A direct invocation of the front door was refused (403): its caller may invoke the function "
                "without the lambda:InvokedViaFunctionUrl condition. Find it in the request log "
                "(error_kind direct_invocation_refused) and CloudTrail's Invoke events."
            ),
        )
        self.refused_direct_invocations.add_alarm_action(cw_actions.SnsAction(topic))
        # With per-tenant limits: their table failed or was slow (served unchecked, or refused with 503 under
        # limits.on_store_error = "closed").
        self.limiter_store_errors = None if not limits_enabled else alarm(
            "LimiterStoreErrors",
            normalizer.limiter_store_errors(),
            threshold=1,
            operator=Op.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            description="The per-tenant limits could not be checked (their DynamoDB table failed or took longer than "
            "limits.store_timeout_ms): requests were served unchecked (on_store_error open) or refused with 503 "
            "(closed).",
        )
        # Added last, so that the mutation pass's notes on the alarms above keep their numbers.
        self._fix_name(self.ttft_p50, component_name, TTFT_P50_ALARM)
        self._fix_name(self.error_rate, component_name, ERROR_RATE_ALARM)
        self.engine_hit_rate, self.engine_metrics_missing = (
            engine_alarms(self, engine, component_name, settings, topic) if engine is not None else (None, None))
        self.rollback = [self.error_rate, self.ttft_p50]
        self.all = [
            a
            for a in (
                self.ttft_p50,
                self.hit_rate,
                self.engine_hit_rate,
                self.hotspot,
                self.pinned_at_threshold,
                self.error_rate,
                self.capacity_failures,
                self.refused_direct_invocations,
                self.limiter_store_errors,
            )
            if a is not None
        ]

    @staticmethod
    def _fix_name(created: cloudwatch.Alarm, component_name: str, alarm: str) -> None:
        """Give an alarm its fixed name, ``<component>-<alarm>`` (another stack or verify names it)."""
        created.node.default_child.alarm_name = alarm_name(component_name, alarm)


def engine_alarms(scope: Construct, engine: EngineMetrics, component_name: str, settings: AlarmSettings,
                  topic: sns.ITopic) -> tuple[cloudwatch.PromQLAlarm, cloudwatch.PromQLAlarm]:
    """``EngineHitRate`` and ``EngineMetricsMissing`` under ``scope``. The engine's own hit rate (vLLM
    under detailed observability): PromQL alarms, because its counters are OpenTelemetry metrics. Every series a query returns breaches; the pending period
    plays evaluation_periods' part."""
    periods = settings.evaluation_periods
    hold = Duration.minutes(periods)
    hit_rate = cloudwatch.PromQLAlarm(
        scope,
        "EngineHitRate",
        alarm_name=alarm_name(component_name, ENGINE_HIT_RATE_ALARM),
        query=engine.hit_rate_below(settings.minimum_hit_rate, periods),
        evaluation_interval=Duration.minutes(1),
        pending_period=hold,
        recovery_period=hold,
        alarm_description=(
            f"The engine's own prefix-cache hit rate (vLLM's prefix-cache hits / queries, tokens) below "
            f"{settings.minimum_hit_rate:g} for {periods} minutes: the copies find little of the prompts in "
            "their KV caches (beside the front door's hit rate: a gap is traffic that bypasses it)."
        ),
    )
    hit_rate.add_alarm_action(cw_actions.SnsAction(topic))
    hit_rate.add_ok_action(cw_actions.SnsAction(topic))
    # No actions: a wiring check (verify reads it). It is also in ALARM while the component has no
    # copy (scaled to zero, or starting).
    missing = cloudwatch.PromQLAlarm(
        scope,
        "EngineMetricsMissing",
        alarm_name=alarm_name(component_name, ENGINE_METRICS_ALARM),
        query=engine.absent(),
        evaluation_interval=Duration.minutes(1),
        pending_period=hold,
        recovery_period=Duration.minutes(1),
        alarm_description=(
            f"No {EngineMetrics.QUERIES} series (with or without {EngineMetrics.COUNTER_SUFFIX}) labelled with "
            "this component: the engine hit-rate alarm "
            "and widget have nothing to read (no copy serving, detailed observability off, or the metric is "
            "published under another name: look it up in CloudWatch Query Studio and set EngineMetrics in "
            "stacks/metrics.py). Notifies no one."
        ),
    )
    return hit_rate, missing
