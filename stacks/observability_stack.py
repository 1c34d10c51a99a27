"""Alarms, dashboards (one per inference component), saved queries and contributor insights for one stage."""

from __future__ import annotations

from aws_cdk import CfnOutput, Stack, aws_logs as logs
from constructs import Construct

from prefix_routing.stage.config import StageConfig
from stacks.constructs.alarms import AlertTopic, RoutingAlarms
from stacks.constructs.canary_alarms import CanaryAlarms
from stacks.constructs.dashboard import RoutingDashboard
from stacks.constructs.log_insights import RequestLogInsights
from stacks.constructs.routing_advisor import RoutingAdvisor
from stacks.metrics import AdvisorMetrics, EngineMetrics, NormalizerMetrics, SageMakerMetrics


class ObservabilityStack(Stack):
    def __init__(
        self, scope: Construct, construct_id: str, *, config: StageConfig, request_log: logs.ILogGroup, **kwargs
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.alert_topic = AlertTopic(self, "Alerts", emails=config.alarms.emails)
        # Per inference component (one per trust domain): its alarms and its dashboard; the primary
        # component's keep the construct ids and names a stage without domains has.
        self.alarms_by_component: dict[str, RoutingAlarms] = {}
        self.dashboards: dict[str, RoutingDashboard] = {}
        self.canary_alarms: dict[str, CanaryAlarms] = {}  # with [canary] enabled
        for index, plan in enumerate(config.components()):
            suffix = "" if index == 0 else f"-{plan.domain}"
            normalizer = NormalizerMetrics(component_name=plan.name)
            sagemaker = SageMakerMetrics(endpoint_name=config.endpoint_name, component_name=plan.name)
            engine = (EngineMetrics(component_name=plan.name, publish_frequency_s=config.metrics.publish_frequency_s)
                      if config.engine_hit_rate_published else None)
            alarms = RoutingAlarms(
                self,
                "Alarms" + suffix,
                component_name=plan.name,
                engine=engine,
                normalizer=normalizer,
                sagemaker=sagemaker,
                settings=config.alarms,
                routing=config.routing,
                scaling=config.scaling.model_copy(
                    update={"target_concurrent_requests_per_copy": plan.target_concurrent_requests_per_copy}),
                topic=self.alert_topic.topic,
                cached_tokens_reported=config.model.reports_cached_tokens,
                limits_enabled=config.limits.enabled,
            )
            canary = None
            if config.canary.enabled:
                canary = self.canary_alarms[plan.name] = CanaryAlarms(
                    self, "CanaryAlarms" + suffix, component_name=plan.name, every_minutes=config.canary.every_minutes,
                    topic=self.alert_topic.topic)
            self.dashboards[plan.name] = RoutingDashboard(
                self,
                "Dashboard" + suffix,
                dashboard_name=config.dashboard_name + suffix,
                normalizer=normalizer,
                sagemaker=sagemaker,
                alarms=alarms.all + (canary.all if canary is not None else []),
                advisor=AdvisorMetrics(component_name=plan.name, schedule_minutes=config.advisor.schedule_minutes)
                if config.advisor.enabled and index == 0 else None,
                limits_enabled=config.limits.enabled,
                engine=engine,
                engine_alarms=[a for a in (alarms.engine_hit_rate, alarms.engine_metrics_missing) if a is not None],
                engine_window_minutes=config.alarms.evaluation_periods,
                request_log_group_name=request_log.log_group_name if index == 0 else None,
            )
            self.alarms_by_component[plan.name] = alarms
        self.alarms = self.alarms_by_component[config.component_name]
        self.dashboard = self.dashboards[config.component_name]
        self.log_insights = RequestLogInsights(
            self, "RequestLog", log_group=request_log, name_prefix=config.endpoint_name,
            limits_enabled=config.limits.enabled,
        )
        self.advisor = None
        if config.advisor.enabled:
            self.advisor = RoutingAdvisor(self, "Advisor", config=config, request_log=request_log,
                                          topic=self.alert_topic.topic)
        CfnOutput(self, "AlarmTopicArn", value=self.alert_topic.topic.topic_arn)
        CfnOutput(self, "DashboardName", value=f"{config.endpoint_name}-routing")
