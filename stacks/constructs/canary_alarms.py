"""The isolation canary's alarms, per inference component: an isolation breach (one run is enough) and
a cold cache (two runs in a row), both sending to the stage's alarm topic.

The canary (``stacks/constructs/isolation_canary.py``, in the normalizer stack) publishes one datapoint
of each metric per domain and run, 1 or 0, through its log; a period is one run's interval, so a
missing run is missing data, which does not alarm.
"""

from __future__ import annotations

from aws_cdk import Duration, aws_cloudwatch as cloudwatch, aws_cloudwatch_actions as cw_actions, aws_sns as sns
from constructs import Construct

from prefix_routing.rules import telemetry

#: How many runs in a row must find the cache cold: one cold run can be a copy replaced (a new copy
#: starts with an empty cache) between the canary's two requests.
COLD_RUNS = 2


def canary_alarm_specs(component_name: str, every_minutes: int) -> list[dict]:
    """The component's two alarms: construct id, alarm name, metric spec, runs (evaluation periods and
    datapoints to alarm) and the description operators read."""
    period = f"every {every_minutes} minutes"
    return [
        dict(construct_id="IsolationBreach", alarm_name=f"{component_name}-canary-isolation-breach",
             spec=telemetry.CANARY_ISOLATION_BREACH, runs=1,
             description=f"Tenants are not kept apart in the KV cache of {component_name}: the isolation canary's "
                         "second synthetic tenant found the first tenant's prompt cached beyond the chat template's "
                         "first tokens. Another tenant's requests can read this cache (and time it). Check the "
                         "engine honours cache_salt after an image update, and the stage's domains. The canary runs "
                         f"{period}; its log has each request's cached tokens."),
        dict(construct_id="CacheCold", alarm_name=f"{component_name}-canary-cache-cold",
             spec=telemetry.CANARY_CACHE_COLD, runs=COLD_RUNS,
             description=f"The KV cache of {component_name} did not serve a repeated prompt in {COLD_RUNS} canary runs "
                         "in a row: the isolation canary's tenant sent the same prompt twice and the second found "
                         "less than half of it cached. Prefix caching or prefix-aware routing is off (engine "
                         f"settings, routing strategy), so every request pays full prefill. The canary runs {period}."),
    ]


class CanaryAlarms(Construct):
    """Attributes: ``isolation_breach``, ``cache_cold`` (each a ``cloudwatch.Alarm``), ``all``."""

    def __init__(self, scope: Construct, construct_id: str, *, component_name: str, every_minutes: int,
                 topic: sns.ITopic) -> None:
        super().__init__(scope, construct_id)
        self.all: list[cloudwatch.Alarm] = []
        for spec in canary_alarm_specs(component_name, every_minutes):
            metric = cloudwatch.Metric(namespace=telemetry.NAMESPACE, metric_name=spec["spec"].name,
                                       dimensions_map={telemetry.DIMENSION_COMPONENT: component_name},
                                       statistic="Maximum", period=Duration.minutes(every_minutes))
            alarm = cloudwatch.Alarm(
                self, spec["construct_id"], alarm_name=spec["alarm_name"], metric=metric, threshold=1,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                evaluation_periods=spec["runs"], datapoints_to_alarm=spec["runs"],
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING, alarm_description=spec["description"],
            )
            alarm.add_alarm_action(cw_actions.SnsAction(topic))
            alarm.add_ok_action(cw_actions.SnsAction(topic))
            self.all.append(alarm)
        self.isolation_breach, self.cache_cold = self.all
