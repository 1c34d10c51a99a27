"""Alarm thresholds and wiring, copy autoscaling, the metric factory, the limits' table, the inference
endpoint and the request log's insights, each in one small stack.

The whole-stage synths (test_alarms.py, test_copy_autoscaling.py) take half a minute each; these
build only the construct under test (about 0.2 s once jsii is up), so that ``make mutants`` can run
them for every mutant of the stacks. Expected values come from docs/operations.md ("Alarms and
dashboard") and the stage reference: hotspot = min(hotspot_factor × scaling target, the
ConcurrencyThreshold), every alarm over ``evaluation_periods`` minutes with as many datapoints,
missing data not breaching, ALARM and OK to the topic.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from aws_cdk import App, Stack, aws_logs as logs, aws_sns as sns
from aws_cdk.assertions import Template

from prefix_routing.rules import telemetry
from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LimitLogField, LogField
from prefix_routing.stage.config import (DEFAULT_STAGE_DATA, AlarmSettings, EndpointSettings, RoutingSettings,
                                         ScalingSettings, parse_stage)
from stacks.constructs.alarms import RoutingAlarms
from stacks.constructs.copy_autoscaling import CopyAutoscaling
from stacks.constructs.inference_endpoint import InferenceEndpoint, container_environment
from stacks.constructs.limits_table import TenantLimitsTable
from stacks.constructs.log_insights import RequestLogInsights, top_prefixes_query
from stacks.metrics import EngineMetrics, NormalizerMetrics, SageMakerMetrics

IC, EP = "ic-test", "ep-test"
# Distinct values everywhere, so that one setting read for another shows.
ALARMS = AlarmSettings(ttft_p50_ms=1500.0, hotspot_factor=3.0, minimum_hit_rate=0.35, error_rate_percent=2.5,
                       evaluation_periods=3)
SCALING = ScalingSettings(target_concurrent_requests_per_copy=2.0, scale_out_cooldown_s=45, scale_in_cooldown_s=420)
PREFIX_AWARE = RoutingSettings(strategy="PREFIX_AWARE", prefix_length=4096, concurrency_threshold=10)
ONE_MINUTE = 60
PER_INSTANCE_MAX = ('SELECT MAX(ConcurrentRequestsPerCopy) FROM SCHEMA("AWS/SageMaker", InferenceComponentName, '
                    f"InstanceId) WHERE InferenceComponentName = '{IC}' GROUP BY InstanceId ORDER BY MAX() DESC")


def _alarms(routing=PREFIX_AWARE, *, settings=ALARMS, scaling=SCALING, **flags):
    """(the construct, its stack's template, the topic's logical id); ``flags``: cached_tokens_reported,
    limits_enabled (left out: the construct's defaults)."""
    stack = Stack(App(), "Alarms")
    topic = sns.Topic(stack, "Topic")
    alarms = RoutingAlarms(stack, "A", component_name=IC, normalizer=NormalizerMetrics(component_name=IC),
                           sagemaker=SageMakerMetrics(endpoint_name=EP, component_name=IC), settings=settings,
                           routing=routing, scaling=scaling, topic=topic, **flags)
    template = Template.from_stack(stack)
    return alarms, template, stack.get_logical_id(topic.node.default_child)


def _props(template, stack_alarm) -> dict:
    logical = Stack.of(stack_alarm).get_logical_id(stack_alarm.node.default_child)
    return template.to_json()["Resources"][logical]["Properties"]


def _wired(props, topic, periods=3, *, ok_action=True):
    assert props["EvaluationPeriods"] == periods and props.get("DatapointsToAlarm") == (periods if ok_action else None)
    assert props["TreatMissingData"] == "notBreaching"
    assert props["AlarmActions"] == [{"Ref": topic}]
    assert props.get("OKActions") == ([{"Ref": topic}] if ok_action else None)


def _query(props) -> str:
    (entry,) = props["Metrics"]
    assert entry["ReturnData"] is not False and entry["Period"] == ONE_MINUTE
    return entry["Expression"]


def _single(props) -> tuple:
    """(namespace, name, dimensions, statistic, period) of a one-metric alarm, in CDK's flat form or
    its Metrics form (which it writes for a labelled metric)."""
    if "MetricName" in props:
        return (props["Namespace"], props["MetricName"], props["Dimensions"],
                props.get("ExtendedStatistic") or props["Statistic"], props["Period"])
    (entry,) = props["Metrics"]
    stat = entry["MetricStat"]
    return stat["Metric"]["Namespace"], stat["Metric"]["MetricName"], stat["Metric"]["Dimensions"], stat["Stat"], \
        stat["Period"]


def _stats(props) -> dict:
    """{id: (namespace, name, dimensions, stat, period)} of a math alarm's metrics."""
    return {m["Id"]: (m["MetricStat"]["Metric"]["Namespace"], m["MetricStat"]["Metric"]["MetricName"],
                      m["MetricStat"]["Metric"]["Dimensions"], m["MetricStat"]["Stat"], m["MetricStat"]["Period"])
            for m in props["Metrics"] if "MetricStat" in m}


# Function-scoped on purpose: mutmut links a test to the functions it calls while it runs, and a
# module-scoped fixture would build the construct in the first test only, so that a mutant of the
# construct would be run against that one test (a synth is about 0.2 s).
@pytest.fixture
def prefix_aware():
    return _alarms(cached_tokens_reported=True, limits_enabled=False)


@pytest.fixture
def with_limits():
    return _alarms(cached_tokens_reported=True, limits_enabled=True)


def test_ttft_alarm_is_above_the_p50_threshold_over_the_evaluation_periods(prefix_aware):
    alarms, template, topic = prefix_aware
    props = _props(template, alarms.ttft_p50)
    assert _single(props) == (telemetry.NAMESPACE, telemetry.TTFT.name,
                              [{"Name": telemetry.DIMENSION_COMPONENT, "Value": IC}], "p50", ONE_MINUTE)
    assert props["Metrics"][0]["Label"] == "TTFT p50 (ms)"  # the alarm's graph: the statistic as CloudWatch names it
    assert (props["Threshold"], props["ComparisonOperator"]) == (1500, "GreaterThanThreshold")
    assert "1500 ms" in props["AlarmDescription"]
    _wired(props, topic)


def test_hit_rate_alarm_is_cached_over_prompt_tokens_below_the_minimum(prefix_aware):
    alarms, template, topic = prefix_aware
    props = _props(template, alarms.hit_rate)
    expression = [m for m in props["Metrics"] if "Expression" in m]
    assert [m["Expression"] for m in expression] == ["cached / prompt"]
    assert _stats(props) == {
        "cached": (telemetry.NAMESPACE, telemetry.CACHED_TOKENS.name,
                   [{"Name": telemetry.DIMENSION_COMPONENT, "Value": IC}], "Sum", ONE_MINUTE),
        "prompt": (telemetry.NAMESPACE, telemetry.PROMPT_TOKENS.name,
                   [{"Name": telemetry.DIMENSION_COMPONENT, "Value": IC}], "Sum", ONE_MINUTE)}
    assert (props["Threshold"], props["ComparisonOperator"]) == (0.35, "LessThanThreshold")
    assert "below 0.35" in props["AlarmDescription"]
    _wired(props, topic)


def test_hotspot_is_the_factor_times_the_scaling_target_per_instance(prefix_aware):
    # 3 × 2 = 6 concurrent requests per copy, under the threshold of 10.
    alarms, template, topic = prefix_aware
    props = _props(template, alarms.hotspot)
    assert _query(props) == PER_INSTANCE_MAX
    assert (props["Threshold"], props["ComparisonOperator"]) == (6, "GreaterThanOrEqualToThreshold")
    assert ">= 6 concurrent requests" in props["AlarmDescription"] and "3x its fair share of 2" in props[
        "AlarmDescription"]
    _wired(props, topic)


def test_hotspot_is_capped_at_the_concurrency_threshold():
    # 3 × 2 = 6 is above a threshold of 5: a copy spills at 5, so 5 is the hot level.
    routing = RoutingSettings(strategy="PREFIX_AWARE", prefix_length=4096, concurrency_threshold=5)
    alarms, template, _ = _alarms(routing)
    assert _props(template, alarms.hotspot)["Threshold"] == 5
    pinned = _props(template, alarms.pinned_at_threshold)
    assert pinned["Threshold"] == 5


def test_pinned_at_threshold_is_per_instance_at_the_concurrency_threshold(prefix_aware):
    alarms, template, topic = prefix_aware
    props = _props(template, alarms.pinned_at_threshold)
    assert _query(props) == PER_INSTANCE_MAX
    assert (props["Threshold"], props["ComparisonOperator"]) == (10, "GreaterThanOrEqualToThreshold")
    assert "ConcurrencyThreshold (10)" in props["AlarmDescription"]
    _wired(props, topic)


def test_error_rate_is_5xx_over_invocations_in_percent(prefix_aware):
    alarms, template, topic = prefix_aware
    props = _props(template, alarms.error_rate)
    assert [m["Expression"] for m in props["Metrics"] if "Expression" in m] == [
        "100 * errors / MAX([errors, invocations])"]
    dims = [{"Name": "InferenceComponentName", "Value": IC}]
    assert _stats(props) == {"errors": ("AWS/SageMaker", "Invocation5XXErrors", dims, "Sum", ONE_MINUTE),
                             "invocations": ("AWS/SageMaker", "Invocations", dims, "Sum", ONE_MINUTE)}
    assert (props["Threshold"], props["ComparisonOperator"]) == (2.5, "GreaterThanThreshold")
    assert "above 2.5 %" in props["AlarmDescription"]
    _wired(props, topic)


def test_one_capacity_failure_is_enough(prefix_aware):
    alarms, template, topic = prefix_aware
    props = _props(template, alarms.capacity_failures)
    assert _single(props) == ("AWS/SageMaker", "NoCapacityInvocationFailures",
                              [{"Name": "InferenceComponentName", "Value": IC}], "Sum", ONE_MINUTE)
    assert (props["Threshold"], props["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold")
    _wired(props, topic)


def test_one_refused_direct_invocation_alarms_at_once_and_only_on_alarm(prefix_aware):
    alarms, template, topic = prefix_aware
    props = _props(template, alarms.refused_direct_invocations)
    assert _single(props) == (telemetry.NAMESPACE, telemetry.REFUSED_DIRECT_INVOCATIONS.name,
                              [{"Name": telemetry.DIMENSION_COMPONENT, "Value": IC}], "Sum", ONE_MINUTE)
    assert (props["Threshold"], props["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold")
    _wired(props, topic, periods=1, ok_action=False)


def test_all_lists_every_alarm_once(prefix_aware):
    alarms, template, _ = prefix_aware
    assert len(alarms.all) == 7 == len(template.find_resources("AWS::CloudWatch::Alarm"))
    assert len({id(a) for a in alarms.all}) == 7


def test_without_prefix_aware_routing_there_is_no_pinned_alarm_and_no_cap():
    random = RoutingSettings(strategy="RANDOM", prefix_length=None, concurrency_threshold=None)
    alarms, template, _ = _alarms(random)
    assert alarms.pinned_at_threshold is None
    assert _props(template, alarms.hotspot)["Threshold"] == 6
    assert len(alarms.all) == 6 == len(template.find_resources("AWS::CloudWatch::Alarm"))


def test_a_threshold_without_prefix_aware_still_caps_the_hotspot_but_pins_nothing():
    # LEAST_OUTSTANDING_REQUESTS with a (stray) threshold of 4: copies never spill, nothing is pinned.
    routing = RoutingSettings(strategy="LEAST_OUTSTANDING_REQUESTS", prefix_length=4096, concurrency_threshold=4)
    alarms, template, _ = _alarms(routing)
    assert alarms.pinned_at_threshold is None
    assert _props(template, alarms.hotspot)["Threshold"] == 4


def test_a_container_without_cached_tokens_has_no_hit_rate_alarm():
    alarms, template, _ = _alarms(cached_tokens_reported=False)
    assert alarms.hit_rate is None and alarms.ttft_p50 is not None
    assert len(alarms.all) == 6 == len(template.find_resources("AWS::CloudWatch::Alarm"))


def test_by_default_there_is_a_hit_rate_alarm_and_no_limits_alarm():
    # The construct's defaults: the container reports cached tokens, the stage has no per-tenant limits.
    alarms, template, _ = _alarms()
    assert alarms.hit_rate is not None and alarms.limiter_store_errors is None
    assert len(alarms.all) == 7 == len(template.find_resources("AWS::CloudWatch::Alarm"))


def test_with_limits_one_store_error_alarms_over_the_evaluation_periods(with_limits):
    alarms, template, topic = with_limits
    props = _props(template, alarms.limiter_store_errors)
    assert _single(props) == (telemetry.NAMESPACE, telemetry.LIMITER_STORE_ERRORS.name,
                              [{"Name": telemetry.DIMENSION_COMPONENT, "Value": IC}], "Sum", ONE_MINUTE)
    assert (props["Threshold"], props["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold")
    _wired(props, topic)
    assert len(alarms.all) == 8 == len(template.find_resources("AWS::CloudWatch::Alarm"))
    assert alarms.all[-1] is alarms.limiter_store_errors


# An alarm's logical id is its name in CloudWatch (``<stack>-<logical id>-<suffix>``, what ``verify``
# reports as "alarm default-Hotspot…") unless it has a fixed name (below), and renaming it replaces the
# alarm in a deployed stack (its history and state go with it). Construct "A" + the alarm's id + CDK's
# 8-hex hash of the path.
ALARM_IDS = {"ttft_p50": "TtftP50", "hit_rate": "HitRate", "hotspot": "Hotspot",
             "pinned_at_threshold": "PinnedAtThreshold", "error_rate": "ErrorRate",
             "capacity_failures": "CapacityFailures", "refused_direct_invocations": "RefusedDirectInvocations",
             "limiter_store_errors": "LimiterStoreErrors"}


def test_the_rollback_alarms_have_the_names_the_components_deployment_config_uses(prefix_aware):
    alarms, template, _ = prefix_aware
    assert _props(template, alarms.ttft_p50)["AlarmName"] == "ic-test-ttft-p50"
    assert _props(template, alarms.error_rate)["AlarmName"] == "ic-test-error-rate"
    assert alarms.rollback == [alarms.error_rate, alarms.ttft_p50]
    named = [a for a in template.find_resources("AWS::CloudWatch::Alarm").values() if "AlarmName" in a["Properties"]]
    assert len(named) == 2  # the others are named by CloudFormation
    assert alarms.engine_hit_rate is None and alarms.engine_metrics_missing is None  # no engine: none


#: Either spelling of the counter (vLLM exposes <name>_total; whether CloudWatch keeps the suffix is not documented).
ENGINE_SELECTOR = '{{__name__=~"vllm:prefix_cache_{}(_total)?", "aws.sagemaker.inference_component.name"="ic-test"}}'


def test_the_engines_hit_rate_alarm_is_a_promql_query_below_the_minimum_hit_rate():
    # 60 s publications: the rate window is the 3 evaluation periods (two publications fit in it).
    alarms, template, topic = _alarms(engine=EngineMetrics(component_name=IC, publish_frequency_s=60))
    props = _props(template, alarms.engine_hit_rate)
    hits, queries = ENGINE_SELECTOR.format("hits"), ENGINE_SELECTOR.format("queries")
    assert props["EvaluationCriteria"] == {"PromQLCriteria": {
        "Query": f"(sum(rate({hits}[3m])) / sum(rate({queries}[3m]))) < 0.35",
        "PendingPeriod": 180, "RecoveryPeriod": 180}}
    assert props["EvaluationInterval"] == 60 and props["AlarmName"] == "ic-test-engine-hit-rate"
    assert props["AlarmActions"] == [{"Ref": topic}] and props["OKActions"] == [{"Ref": topic}]
    assert "below 0.35 for 3 minutes" in props["AlarmDescription"]
    assert not {"MetricName", "Metrics", "Threshold"} & set(props)
    assert alarms.engine_hit_rate in alarms.all and alarms.engine_metrics_missing not in alarms.all


def test_the_engines_metrics_missing_alarm_is_absent_over_its_queries_and_notifies_no_one():
    alarms, template, _ = _alarms(engine=EngineMetrics(component_name=IC, publish_frequency_s=10))
    props = _props(template, alarms.engine_metrics_missing)
    assert props["EvaluationCriteria"] == {"PromQLCriteria": {
        "Query": f"absent({ENGINE_SELECTOR.format('queries')})", "PendingPeriod": 180, "RecoveryPeriod": 60}}
    assert props["AlarmName"] == "ic-test-engine-metrics-missing" and props["EvaluationInterval"] == 60
    assert not {"AlarmActions", "OKActions", "InsufficientDataActions"} & set(props)
    assert len(template.find_resources("AWS::CloudWatch::Alarm")) == len(alarms.all) + 1


def test_the_engines_rate_window_holds_two_publications():
    engine = EngineMetrics(component_name=IC, publish_frequency_s=300)  # 2 x 300 s = 10 minutes
    assert "[10m]" in engine.hit_rate(3) and "[10m]" in engine.hit_rate(10) and "[12m]" in engine.hit_rate(12)
    assert "[1m]" in EngineMetrics(component_name=IC, publish_frequency_s=30).hit_rate(1)
    assert "[2m]" in EngineMetrics(component_name=IC, publish_frequency_s=60).hit_rate(1)


def test_every_alarm_keeps_its_logical_id(with_limits):
    alarms, template, _ = with_limits
    found = template.find_resources("AWS::CloudWatch::Alarm")
    for attribute, construct_id in ALARM_IDS.items():
        logical = Stack.of(alarms).get_logical_id(getattr(alarms, attribute).node.default_child)
        assert re.fullmatch(rf"A{construct_id}[0-9A-F]{{8}}", logical), (attribute, logical)
        assert logical in found
    assert len(found) == len(ALARM_IDS)


# What an operator reads in the notification (and what ``verify`` points to for an alarm in ALARM): the
# condition with this stage's numbers, where to look, and the setting or log field to check, names
# spelled as the operator will search for them. ALARMS: ttft 1500 ms, hit rate 0.35, hotspot 3 × 2 = 6
# (under the threshold of 10), 5XX 2.5 %.
DESCRIPTIONS = {
    "ttft_p50": "P50 time to first token above 1500 ms, measured by the normalizer.",
    "hit_rate": "KV-cache hit rate (cached / prompt tokens) below 0.35: prefix routing is not finding warm caches "
                "(PrefixLength too short or too long, clients not normalized, spills).",
    "hotspot": "An instance holds >= 6 concurrent requests per copy (3x its fair share of 2, or the concurrency "
               "threshold): one prefix group is hot. Each instance is a contributor (per-instance enhanced metrics).",
    "pinned_at_threshold": "A copy sits at the ConcurrencyThreshold (10) on some instance (MAX of "
                           "ConcurrentRequestsPerCopy per instance): requests spill to colder copies and the hit "
                           "rate falls.",
    "error_rate": "5XX errors above 2.5 % of invocations.",
    "capacity_failures": "Requests found no copy to serve them (scaled to zero or at max capacity).",
    "refused_direct_invocations": "A direct invocation of the front door was refused (403): its caller may invoke "
                                  "the function without the lambda:InvokedViaFunctionUrl condition. Find it in the "
                                  "request log (error_kind direct_invocation_refused) and CloudTrail's Invoke events.",
    "limiter_store_errors": "The per-tenant limits could not be checked (their DynamoDB table failed or took longer "
                            "than limits.store_timeout_ms): requests were served unchecked (on_store_error open) or "
                            "refused with 503 (closed).",
}


def test_each_notification_says_what_happened_and_where_to_look(with_limits):
    alarms, template, _ = with_limits
    assert {attribute: _props(template, getattr(alarms, attribute))["AlarmDescription"]
            for attribute in DESCRIPTIONS} == DESCRIPTIONS


# ------------------------------------------------------------------------------------ copy autoscaling

def _autoscaling(copies_min: int, copies_max: int = 4):
    stack = Stack(App(), "Scaling")
    endpoint = EndpointSettings(instance_type="ml.g6e.xlarge", instances_min=min(copies_min, 1), instances_max=4,
                                copies_min=copies_min, copies_max=copies_max)
    scaling = CopyAutoscaling(stack, "S", component_name=IC, endpoint=endpoint, scaling=SCALING,
                              no_capacity_failures=SageMakerMetrics(endpoint_name=EP, component_name=IC)
                              .no_capacity_failures())
    return scaling, Template.from_stack(stack)


def test_copies_track_concurrent_requests_per_copy_within_the_stage_bounds():
    scaling, template = _autoscaling(1, 4)
    (target,) = template.find_resources("AWS::ApplicationAutoScaling::ScalableTarget").values()
    assert target["Properties"] == {**target["Properties"], "ServiceNamespace": "sagemaker",
                                    "ResourceId": f"inference-component/{IC}",
                                    "ScalableDimension": "sagemaker:inference-component:DesiredCopyCount",
                                    "MinCapacity": 1, "MaxCapacity": 4}
    (policy,) = template.find_resources("AWS::ApplicationAutoScaling::ScalingPolicy").values()
    tracking = policy["Properties"]["TargetTrackingScalingPolicyConfiguration"]
    assert policy["Properties"]["PolicyType"] == "TargetTrackingScaling"
    assert tracking["PredefinedMetricSpecification"] == {
        "PredefinedMetricType": "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"}
    assert (tracking["TargetValue"], tracking["ScaleOutCooldown"], tracking["ScaleInCooldown"]) == (2, 45, 420)
    assert scaling.scale_from_zero is None and scaling.scale_from_zero_alarm is None
    assert not template.find_resources("AWS::CloudWatch::Alarm")


def test_with_a_minimum_of_zero_one_capacity_failure_adds_one_copy():
    scaling, template = _autoscaling(0, 3)
    (target,) = template.find_resources("AWS::ApplicationAutoScaling::ScalableTarget").values()
    assert (target["Properties"]["MinCapacity"], target["Properties"]["MaxCapacity"]) == (0, 3)
    steps = template.find_resources("AWS::ApplicationAutoScaling::ScalingPolicy",
                                    {"Properties": {"PolicyType": "StepScaling"}})
    ((policy_id, policy),) = steps.items()
    step = policy["Properties"]["StepScalingPolicyConfiguration"]
    assert step["AdjustmentType"] == "ChangeInCapacity" and step["Cooldown"] == 45
    assert step["StepAdjustments"] == [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]
    (alarm,) = template.find_resources("AWS::CloudWatch::Alarm").values()
    props = alarm["Properties"]
    assert _single(props) == ("AWS/SageMaker", "NoCapacityInvocationFailures",
                              [{"Name": "InferenceComponentName", "Value": IC}], "Sum", ONE_MINUTE)
    assert (props["Threshold"], props["ComparisonOperator"], props["EvaluationPeriods"]) == (
        1, "GreaterThanOrEqualToThreshold", 1)
    assert props["TreatMissingData"] == "notBreaching" and props["AlarmActions"] == [{"Ref": policy_id}]
    assert scaling.scale_from_zero is not None and scaling.scale_from_zero_alarm is not None


def test_the_scaling_resources_keep_their_logical_ids():
    # Renaming one replaces it in a deployed stack (a new scalable target starts from the stage's minimum,
    # a new policy's alarms start in INSUFFICIENT_DATA). Construct "S" + the id (+ the policy's under
    # Copies) + CDK's 8-hex hash of the path.
    _, template = _autoscaling(0, 3)
    logical = {kind: sorted(template.find_resources(f"AWS::{kind}"))
               for kind in ("ApplicationAutoScaling::ScalableTarget", "ApplicationAutoScaling::ScalingPolicy",
                            "CloudWatch::Alarm")}
    hex8 = "[0-9A-F]{8}"
    (target,) = logical["ApplicationAutoScaling::ScalableTarget"]
    assert re.fullmatch(f"SCopies{hex8}", target)
    tracking, step = sorted(logical["ApplicationAutoScaling::ScalingPolicy"], key=lambda name: "ScaleFromZero" in name)
    assert re.fullmatch(f"SCopiesConcurrentRequestsPerCopy{hex8}", tracking)
    assert re.fullmatch(f"SScaleFromZero{hex8}", step)
    (alarm,) = logical["CloudWatch::Alarm"]
    assert re.fullmatch(f"SNoCapacityAlarm{hex8}", alarm)


def test_the_scale_from_zero_alarm_says_what_it_does():
    scaling, template = _autoscaling(0, 3)
    (alarm,) = template.find_resources("AWS::CloudWatch::Alarm").values()
    assert alarm["Properties"]["AlarmDescription"] == "A request found no copy: add one (scale from zero)."


# ------------------------------------------------------------------------------------ the metric factory

def test_normalizer_metrics_are_per_component_one_minute_in_our_namespace():
    metrics = NormalizerMetrics(component_name=IC)
    ttft = metrics.ttft("p90")
    assert (ttft.namespace, ttft.metric_name, ttft.statistic, ttft.period.to_seconds(), ttft.label) == (
        telemetry.NAMESPACE, telemetry.TTFT.name, "p90", 60, "TTFT p90 (ms)")
    assert ttft.dimensions == {telemetry.DIMENSION_COMPONENT: IC}
    hit = metrics.hit_rate()
    assert hit.expression == "cached / prompt" and hit.period.to_seconds() == 60
    assert {k: (m.metric_name, m.statistic) for k, m in hit.using_metrics.items()} == {
        "cached": (telemetry.CACHED_TOKENS.name, "Sum"), "prompt": (telemetry.PROMPT_TOKENS.name, "Sum")}
    assert hit.label == "KV-cache hit rate"


def test_sagemaker_metrics_are_per_component_one_minute():
    metrics = SageMakerMetrics(endpoint_name=EP, component_name=IC)
    failures = metrics.no_capacity_failures()
    assert (failures.namespace, failures.metric_name, failures.statistic, failures.period.to_seconds()) == (
        "AWS/SageMaker", "NoCapacityInvocationFailures", "Sum", 60)
    assert failures.dimensions == {"InferenceComponentName": IC} and failures.label == "no capacity failures"
    per_copy = metrics.concurrent_requests_per_copy("Minimum")
    assert (per_copy.metric_name, per_copy.statistic) == ("ConcurrentRequestsPerCopy", "Minimum")
    assert per_copy.dimensions == {"InferenceComponentName": IC} and per_copy.period.to_seconds() == 60
    assert per_copy.label == "concurrent requests per copy (Minimum)"  # two series on one graph: which is which
    assert metrics.concurrent_requests_per_copy().statistic == "Maximum"  # the busiest reading by default
    # The metric documents Minimum and Maximum only: an average is refused, saying which are documented.
    with pytest.raises(ValueError, match=r"'Average': AWS documents only Minimum and Maximum$"):
        metrics.concurrent_requests_per_copy("Average")
    errors = metrics.error_rate_percent()
    assert errors.expression == "100 * errors / MAX([errors, invocations])" and errors.period.to_seconds() == 60
    assert errors.label == "5XX error rate %"
    assert {k: (m.metric_name, m.statistic) for k, m in errors.using_metrics.items()} == {
        "errors": ("Invocation5XXErrors", "Sum"), "invocations": ("Invocations", "Sum")}


def test_concurrency_per_instance_is_the_max_query_over_the_per_instance_set():
    metrics = SageMakerMetrics(endpoint_name=EP, component_name=IC)
    per_instance = metrics.concurrency_per_instance()
    assert per_instance.expression == PER_INSTANCE_MAX and per_instance.period.to_seconds() == 60
    assert dict(per_instance.using_metrics) == {}
    assert per_instance.label == "concurrent requests per copy, per instance"
    assert metrics.per_instance_query("SUM", "Invocations") == (
        'SELECT SUM(Invocations) FROM SCHEMA("AWS/SageMaker", InferenceComponentName, InstanceId) '
        f"WHERE InferenceComponentName = '{IC}' GROUP BY InstanceId ORDER BY SUM() DESC")


# ------------------------------------------------------------------------------------ the limits' table

def _limits_table():
    stack = Stack(App(), "Limits")
    limits = TenantLimitsTable(stack, "L")
    return limits, Template.from_stack(stack)


def test_the_limits_table_is_keyed_on_demand_expiring_encrypted_and_not_backed_up():
    # docs: one item per tenant keyed by telemetry.LIMITS_TABLE_KEY, items expire by DynamoDB's TTL on
    # LIMITS_TABLE_TTL, on demand, the AWS managed key; counts that expire within minutes are not backed up
    # and go with the stack.
    limits, template = _limits_table()
    ((logical, table),) = template.find_resources("AWS::DynamoDB::Table").items()
    assert re.fullmatch("LTable[0-9A-F]{8}", logical)  # a new logical id would replace the table
    assert Stack.of(limits).get_logical_id(limits.cfn_table) == logical
    assert table["Properties"] == {
        "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "BillingMode": "PAY_PER_REQUEST",
        "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
        "SSESpecification": {"SSEEnabled": True},
        "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": False},
    }
    assert (table["DeletionPolicy"], table["UpdateReplacePolicy"]) == ("Delete", "Delete")


def test_the_limits_table_acknowledges_only_cdk_nags_backup_rule_with_its_reason():
    limits, _ = _limits_table()
    acknowledged = {key: reason for entry in limits.table.node.metadata if entry.type == "aws:cdk:acknowledged-rules"
                    for key, reason in entry.data.items()}
    assert acknowledged == {"Annotation::AwsSolutions-DDB3": (
        "The table holds only counts that expire within minutes (stream leases, per-minute request and token "
        "counts, hot prefixes' in-flight counts); a restore would bring back stale counts, never data worth "
        "keeping.")}


# ------------------------------------------------------------------------------------ the inference endpoint

def _text(value):
    """A template value as text: Fn::Join joined, ${Ref} for a Ref, ${DLC} for the regional DLC account
    (an Fn::FindInMap on the region), ${Logical.Attribute} for an Fn::GetAtt; lists and dicts walked."""
    if isinstance(value, list):
        return [_text(v) for v in value]
    if isinstance(value, dict):
        if "Fn::Join" in value:
            separator, parts = value["Fn::Join"]
            return separator.join(_text(p) for p in parts)
        if "Ref" in value:
            return "${%s}" % value["Ref"]
        if "Fn::FindInMap" in value:
            assert value["Fn::FindInMap"][1:] == [{"Ref": "AWS::Region"}, "value"], value
            return "${DLC}"
        if "Fn::GetAtt" in value:
            return "${%s}" % ".".join(value["Fn::GetAtt"])
        return {k: _text(v) for k, v in value.items()}
    return value


# Distinct values everywhere (docs/configuration.md's [model], [endpoint], [routing], [metrics]).
HF_MODEL = {"framework": "vllm", "image_repository": "vllm", "image_tag": "server-sagemaker-cuda-v2",
            "model_id": "meta-llama/Llama-3.1-8B-Instruct", "tensor_parallel_degree": 4, "accelerators_per_copy": 4,
            "memory_per_copy_mb": 40960, "startup_health_check_timeout_s": 1200,
            "environment": {"SM_VLLM_MAX_MODEL_LEN": "8192", "SM_VLLM_ENABLE_PREFIX_CACHING": "false"}}
HF_ENDPOINT = {"instance_type": "ml.g6e.12xlarge", "instances_min": 1, "instances_max": 3, "copies_min": 2,
               "copies_max": 3, "scale_in_strategy": "CONSOLIDATION", "scale_in_cooldown_minutes": 20,
               "placement": "BINPACK", "az_max_imbalance": 3, "data_cache": False}
HF_DEPLOYMENT = {"batch_type": "CAPACITY_PERCENT", "batch_size": 25, "wait_interval_s": 420, "timeout_s": 7200}
S3_MODEL = {"framework": "djl-lmi", "image_repository": "djl-inference", "image_tag": "0.33.0-lmi15.0.0-cu128",
            "model_id": None, "model_s3_uri": "s3://my-weights/llama/8b/"}
S3_ENDPOINT = {"instance_type": "ml.g6e.xlarge", "instances_min": 0, "instances_max": 2, "copies_min": 0,
               "copies_max": 2}


ROLLBACK = ["ic-test-errors", "ic-test-ttft"]  # any names: the construct writes what it is given


def _endpoint(model, endpoint, routing, metrics=None, deployment=None):
    """(the construct, {logical id: resource}) of an InferenceEndpoint in a stack of its own."""
    sections = {"model": model, "endpoint": endpoint, "routing": routing}
    if metrics:
        sections["metrics"] = metrics
    if deployment:
        sections["deployment"] = deployment
    config = parse_stage({**{k: v for k, v in DEFAULT_STAGE_DATA.items() if k not in sections}, **sections},
                         source="test")
    stack = Stack(App(), "Endpoint")
    (plan,) = config.components()  # one component, named as the tests expect
    built = InferenceEndpoint(stack, "I", endpoint_name=EP, components=[dataclasses.replace(plan, name=IC)],
                              model=config.model, endpoint=config.endpoint, routing=config.routing,
                              metrics=config.metrics, deployment=config.deployment, rollback_alarms={IC: ROLLBACK})
    return built, Template.from_stack(stack).to_json()["Resources"]


def _by_type(resources) -> dict:
    """{type without AWS::: (logical id, resource)}, one resource per type."""
    found = {}
    for logical, resource in resources.items():
        kind = resource["Type"].removeprefix("AWS::")
        assert kind not in found, kind
        found[kind] = (logical, resource)
    return found


def test_an_hf_model_serves_prefix_aware_from_the_regional_dlc_image():
    built, resources = _endpoint(HF_MODEL, HF_ENDPOINT,
                                 {"strategy": "PREFIX_AWARE", "prefix_length": 8192, "concurrency_threshold": 12},
                                 {"publish_frequency_s": 30, "detailed_observability": True}, HF_DEPLOYMENT)
    kinds = _by_type(resources)
    assert sorted(kinds) == ["IAM::Policy", "IAM::Role", "KMS::Key", "SageMaker::Endpoint",
                             "SageMaker::EndpointConfig", "SageMaker::InferenceComponent", "SageMaker::Model"]
    # A new logical id replaces the resource: the endpoint and the component have fixed names, so a
    # replacement would fail on the name.
    ids = {kind: logical for kind, (logical, _) in kinds.items()}
    for kind, name in {"KMS::Key": "VolumeKey", "IAM::Role": "ExecutionRole", "IAM::Policy": "ExecutionRoleDefaultPolicy",
                       "SageMaker::Model": "Model", "SageMaker::EndpointConfig": "Config",
                       "SageMaker::Endpoint": "Endpoint", "SageMaker::InferenceComponent": "Component"}.items():
        assert re.fullmatch(f"I{name}[0-9A-F]{{8}}", ids[kind]), (kind, ids[kind])
    role, policy, key = ids["IAM::Role"], ids["IAM::Policy"], ids["KMS::Key"]

    model = kinds["SageMaker::Model"][1]
    assert model["DependsOn"] == [policy]  # SageMaker checks the role's permissions on create
    assert _text(model["Properties"]) == {
        "ExecutionRoleArn": f"${{{role}.Arn}}",
        "PrimaryContainer": {
            "Image": "${DLC}.dkr.ecr.${AWS::Region}.${AWS::URLSuffix}/vllm:server-sagemaker-cuda-v2",
            # The vLLM DLC turns SM_VLLM_<FLAG> into --<flag>; the stage's own environment wins.
            "Environment": {"SM_VLLM_MODEL": "meta-llama/Llama-3.1-8B-Instruct", "SM_VLLM_TENSOR_PARALLEL_SIZE": "4",
                            "SM_VLLM_ENABLE_PREFIX_CACHING": "false", "SM_VLLM_ENABLE_PROMPT_TOKENS_DETAILS": "true",
                            "SM_VLLM_MAX_MODEL_LEN": "8192"}}}

    endpoint_config = kinds["SageMaker::EndpointConfig"][1]
    assert endpoint_config["DependsOn"] == [policy]
    assert _text(endpoint_config["Properties"]) == {
        "ExecutionRoleArn": f"${{{role}.Arn}}",
        "KmsKeyId": f"${{{key}.Arn}}",
        "MetricsConfig": {"EnableEnhancedMetrics": True, "MetricPublishFrequencyInSeconds": 30,
                          "EnableDetailedObservability": True},
        "ProductionVariants": [{
            "VariantName": "AllTraffic", "InstanceType": "ml.g6e.12xlarge", "InitialInstanceCount": 1,
            "ContainerStartupHealthCheckTimeoutInSeconds": 1200, "ModelDataDownloadTimeoutInSeconds": 1200,
            "InferenceAmiVersion": "al2-ami-sagemaker-inference-gpu-3-1",  # the vLLM container's (stage/ami.py)
            "ManagedInstanceScaling": {"Status": "ENABLED", "MinInstanceCount": 1, "MaxInstanceCount": 3,
                                       "ScaleInPolicy": {"Strategy": "CONSOLIDATION", "CooldownInMinutes": 20}},
            "RoutingConfig": {"RoutingStrategy": "PREFIX_AWARE",
                              "PrefixAwareRoutingConfig": {"PrefixLength": 8192, "ConcurrencyThreshold": 12}},
        }]}

    config_id, endpoint_id, model_id = ids["SageMaker::EndpointConfig"], ids["SageMaker::Endpoint"], ids["SageMaker::Model"]
    assert _text(kinds["SageMaker::Endpoint"][1]["Properties"]) == {
        "EndpointName": EP, "EndpointConfigName": f"${{{config_id}.EndpointConfigName}}"}
    assert _text(kinds["SageMaker::InferenceComponent"][1]["Properties"]) == {
        "InferenceComponentName": IC, "EndpointName": f"${{{endpoint_id}.EndpointName}}", "VariantName": "AllTraffic",
        "Specification": {
            "ModelName": f"${{{model_id}.ModelName}}",
            "ComputeResourceRequirements": {"NumberOfAcceleratorDevicesRequired": 4, "MinMemoryRequiredInMb": 40960},
            "StartupParameters": {"ContainerStartupHealthCheckTimeoutInSeconds": 1200,
                                  "ModelDataDownloadTimeoutInSeconds": 1200},
            "SchedulingConfig": {"PlacementStrategy": "BINPACK",
                                 "AvailabilityZoneBalance": {"EnforcementMode": "PERMISSIVE", "MaxImbalance": 3}},
            "DataCacheConfig": {"EnableCaching": False}},
        "RuntimeConfig": {"CopyCount": 2},
        "DeploymentConfig": {
            "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "CAPACITY_PERCENT", "Value": 25},
                                    "WaitIntervalInSeconds": 420, "MaximumExecutionTimeoutInSeconds": 7200},
            "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "ic-test-errors"}, {"AlarmName": "ic-test-ttft"}]}}}

    key_props = kinds["KMS::Key"][1]["Properties"]
    assert key_props["EnableKeyRotation"] is True and key_props["Description"] == f"Storage volumes of endpoint {EP}"

    # What the front door and verify address: the endpoint's and the component's ARNs and log groups.
    stack = Stack.of(built)
    arn = "arn:${AWS::Partition}:sagemaker:${AWS::Region}:${AWS::AccountId}"
    assert _text(stack.resolve(built.endpoint_arn)) == f"{arn}:endpoint/{EP}"
    assert _text(stack.resolve(built.component_arn)) == f"{arn}:inference-component/{IC}"
    assert (built.endpoint_name, built.component_name) == (EP, IC)
    assert built.log_group_names == (f"/aws/sagemaker/Endpoints/{EP}", f"/aws/sagemaker/InferenceComponents/{IC}")
    assert stack.get_logical_id(built.cfn_inference_component) == ids["SageMaker::InferenceComponent"]
    assert stack.get_logical_id(built.role.node.default_child) == role


def _statements(resources) -> list:
    (policy,) = [r for r in resources.values() if r["Type"] == "AWS::IAM::Policy"]
    return _text(policy["Properties"]["PolicyDocument"]["Statement"])


def _logs(groups) -> list[str]:
    arn = "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}:log-group:"
    return [f"{arn}{group}{suffix}" for group in groups for suffix in ("", ":*")]


def test_the_execution_role_pulls_its_image_writes_its_logs_and_metrics_and_uses_its_key():
    _, resources = _endpoint(HF_MODEL, HF_ENDPOINT,
                             {"strategy": "PREFIX_AWARE", "prefix_length": 8192, "concurrency_threshold": 12})
    (key,) = [logical for logical, r in resources.items() if r["Type"] == "AWS::KMS::Key"]
    (role,) = [r for r in resources.values() if r["Type"] == "AWS::IAM::Role"]
    assert role["Properties"]["AssumeRolePolicyDocument"]["Statement"] == [
        {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}}]
    assert _statements(resources) == [
        {"Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
         "Effect": "Allow", "Resource": "arn:${AWS::Partition}:ecr:${AWS::Region}:${DLC}:repository/vllm"},
        {"Action": "ecr:GetAuthorizationToken", "Effect": "Allow", "Resource": "*"},  # no resource-level permissions
        {"Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
         "Effect": "Allow",
         "Resource": _logs([f"/aws/sagemaker/Endpoints/{EP}", f"/aws/sagemaker/InferenceComponents/{IC}"])},
        {"Action": "cloudwatch:PutMetricData", "Effect": "Allow", "Resource": "*",
         "Condition": {"StringLike": {"cloudwatch:namespace": ["/aws/sagemaker/*"]}}},
        # Explicit actions: no ReEncrypt* or GenerateDataKey* wildcards.
        {"Action": ["kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey", "kms:GenerateDataKeyWithoutPlaintext",
                    "kms:CreateGrant", "kms:DescribeKey"], "Effect": "Allow", "Resource": f"${{{key}.Arn}}"},
    ]


def test_weights_in_s3_are_read_from_their_prefix_only_and_lmi_serves_them_random():
    # Scale to zero: the endpoint still starts with one instance and one copy (CloudFormation needs them).
    _, resources = _endpoint(S3_MODEL, S3_ENDPOINT, {"strategy": "RANDOM", "prefix_length": None,
                                                     "concurrency_threshold": None})
    kinds = _by_type(resources)
    assert _text(kinds["SageMaker::Model"][1]["Properties"]["PrimaryContainer"]) == {
        "Image": "${DLC}.dkr.ecr.${AWS::Region}.${AWS::URLSuffix}/djl-inference:0.33.0-lmi15.0.0-cu128",
        # LMI: no prompt-token details (a frontend flag it does not forward).
        "Environment": {"HF_MODEL_ID": "/opt/ml/model", "OPTION_TENSOR_PARALLEL_DEGREE": "1",
                        "OPTION_ENABLE_PREFIX_CACHING": "true"},
        "ModelDataSource": {"S3DataSource": {"S3Uri": "s3://my-weights/llama/8b/", "S3DataType": "S3Prefix",
                                             "CompressionType": "None"}}}
    (variant,) = kinds["SageMaker::EndpointConfig"][1]["Properties"]["ProductionVariants"]
    assert variant["RoutingConfig"] == {"RoutingStrategy": "RANDOM"}
    assert variant["InitialInstanceCount"] == 1 and variant["ManagedInstanceScaling"]["MinInstanceCount"] == 0
    assert variant["ManagedInstanceScaling"]["ScaleInPolicy"] == {"Strategy": "IDLE_RELEASE", "CooldownInMinutes": 15}
    component = kinds["SageMaker::InferenceComponent"][1]["Properties"]
    assert component["RuntimeConfig"] == {"CopyCount": 1}
    # The defaults (docs/configuration.md): copies spread over instances, zones within one copy of each
    # other, artifacts cached; a rolling update one copy at a time, 600 s bakes, 8 hours at most; an
    # LMI stage leaves detailed observability off (its engine's counters are vLLM's only).
    assert component["Specification"]["SchedulingConfig"] == {
        "PlacementStrategy": "SPREAD", "AvailabilityZoneBalance": {"EnforcementMode": "PERMISSIVE", "MaxImbalance": 1}}
    assert component["Specification"]["DataCacheConfig"] == {"EnableCaching": True}
    assert component["DeploymentConfig"] == {
        "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "COPY_COUNT", "Value": 1}, "WaitIntervalInSeconds": 600,
                                "MaximumExecutionTimeoutInSeconds": 28800},
        "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": name} for name in ROLLBACK]}}
    assert kinds["SageMaker::EndpointConfig"][1]["Properties"]["MetricsConfig"]["EnableDetailedObservability"] is False
    statements = _statements(resources)
    assert statements[0]["Resource"] == "arn:${AWS::Partition}:ecr:${AWS::Region}:${DLC}:repository/djl-inference"
    assert statements[2:4] == [
        {"Action": "s3:GetObject", "Effect": "Allow", "Resource": "arn:${AWS::Partition}:s3:::my-weights/llama/8b/*"},
        {"Action": "s3:ListBucket", "Effect": "Allow", "Resource": "arn:${AWS::Partition}:s3:::my-weights",
         "Condition": {"StringLike": {"s3:prefix": ["llama/8b/*"]}}},
    ]
    assert len(statements) == 7  # and otherwise those of an HF model's role


def test_without_a_rolling_update_the_component_has_no_deployment_config():
    _, resources = _endpoint(HF_MODEL, HF_ENDPOINT, {"strategy": "RANDOM", "prefix_length": None,
                                                     "concurrency_threshold": None},
                             deployment={"rolling_update": False})
    (component,) = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::SageMaker::InferenceComponent"]
    assert "DeploymentConfig" not in component and component["Specification"]["DataCacheConfig"] == {
        "EnableCaching": False}


def test_a_rolling_update_without_alarms_has_no_auto_rollback():
    stack = Stack(App(), "Endpoint")
    config = parse_stage(DEFAULT_STAGE_DATA, source="test")
    (plan,) = config.components()
    InferenceEndpoint(stack, "I", endpoint_name=EP, components=[plan], model=config.model, endpoint=config.endpoint,
                      routing=config.routing, metrics=config.metrics, deployment=config.deployment,
                      rollback_alarms={plan.name: []})
    (component,) = Template.from_stack(stack).find_resources("AWS::SageMaker::InferenceComponent").values()
    assert component["Properties"]["DeploymentConfig"] == {"RollingUpdatePolicy": {
        "MaximumBatchSize": {"Type": "COPY_COUNT", "Value": 1}, "WaitIntervalInSeconds": 600,
        "MaximumExecutionTimeoutInSeconds": 28800}}
    # The default vLLM stage turns detailed observability on (the engine's hit rate).
    (endpoint_config,) = Template.from_stack(stack).find_resources("AWS::SageMaker::EndpointConfig").values()
    assert endpoint_config["Properties"]["MetricsConfig"]["EnableDetailedObservability"] is True


def _one_endpoint(config):
    stack = Stack(App(), "Endpoint")
    plans = config.components()
    InferenceEndpoint(stack, "I", endpoint_name=EP, components=plans, model=config.model, endpoint=config.endpoint,
                      routing=config.routing, metrics=config.metrics, deployment=config.deployment,
                      rollback_alarms={plan.name: [] for plan in plans})
    return Template.from_stack(stack)


def test_a_component_that_never_has_two_copies_gets_no_rolling_update_and_synth_says_so():
    data = json.loads(json.dumps(DEFAULT_STAGE_DATA))
    data["endpoint"].update(copies_min=1, copies_max=1, instances_min=1, instances_max=1)
    config = parse_stage(data, source="test")
    (component,) = _one_endpoint(config).find_resources("AWS::SageMaker::InferenceComponent").values()
    assert "DeploymentConfig" not in component["Properties"]
    assert any("has at most 1 copy: it gets no rolling update" in line for line in config.warnings)
    two = parse_stage(DEFAULT_STAGE_DATA, source="test")  # two copies or more: a rolling policy, no such line
    assert not any("no rolling update" in line for line in two.warnings)


@pytest.mark.parametrize(("chosen", "expected"), [
    (None, "al2-ami-sagemaker-inference-gpu-3-1"),  # the vLLM container's own: AWS's deployment page for it
    ("al2023-ami-sagemaker-inference-gpu-4-1", "al2023-ami-sagemaker-inference-gpu-4-1"),
])
def test_the_endpoint_config_sets_the_instances_ami(chosen, expected):
    data = json.loads(json.dumps(DEFAULT_STAGE_DATA))
    if chosen:
        data["endpoint"]["inference_ami_version"] = chosen
    (config,) = _one_endpoint(parse_stage(data, source="test")).find_resources("AWS::SageMaker::EndpointConfig").values()
    assert config["Properties"]["ProductionVariants"][0]["InferenceAmiVersion"] == expected


def test_every_component_needs_its_rollback_alarms_named():
    config = parse_stage(DEFAULT_STAGE_DATA, source="test")
    with pytest.raises(ValueError, match="rollback_alarms names no alarms list for default-prefix-llm-ic"):
        InferenceEndpoint(Stack(App(), "Endpoint"), "I", endpoint_name=EP, components=config.components(),
                          model=config.model, endpoint=config.endpoint, routing=config.routing, metrics=config.metrics,
                          deployment=config.deployment, rollback_alarms={})


def test_container_environment_turns_on_prefix_caching_per_framework():
    # Pure function: the model id when there is one, else where SageMaker puts ModelDataSource content.
    vllm = parse_stage({**DEFAULT_STAGE_DATA, "model": {**DEFAULT_STAGE_DATA["model"], "tensor_parallel_degree": 1}},
                       source="test").model
    assert container_environment(vllm) == {
        "SM_VLLM_MODEL": DEFAULT_STAGE_DATA["model"]["model_id"], "SM_VLLM_TENSOR_PARALLEL_SIZE": "1",
        "SM_VLLM_ENABLE_PREFIX_CACHING": "true", "SM_VLLM_ENABLE_PROMPT_TOKENS_DETAILS": "true"}


# ------------------------------------------------------------------------------------ the request log's insights

def _insights(**flags):
    """({kind: {logical id: properties}}, the log group's logical id) of RequestLogInsights in a stack."""
    stack = Stack(App(), "Insights")
    group = logs.LogGroup(stack, "G")
    built = RequestLogInsights(stack, "R", log_group=group, name_prefix=EP, **flags)
    found = {}
    for logical, resource in Template.from_stack(stack).to_json()["Resources"].items():
        found.setdefault(resource["Type"].removeprefix("AWS::"), {})[logical] = resource["Properties"]
    return built, found, stack.get_logical_id(group.node.default_child)


# docs/operations.md: saved queries <endpoint>/prefix-reuse-share and <endpoint>/top-prefixes, Contributor
# Insights rules <endpoint>-top-prefixes and -top-tenants (and, with limits, -top-throttled-tenants), over
# the request lines only (message = REQUEST_LOG_MESSAGE), with telemetry's field names.
REQUEST_LINES = f"filter {LogField.MESSAGE} = '{REQUEST_LOG_MESSAGE}'"


def test_the_saved_queries_measure_prefix_reuse_and_rank_the_top_prefixes():
    _, found, group = _insights()
    by_name = {props["Name"]: (logical, props) for logical, props in found["Logs::QueryDefinition"].items()}
    assert sorted(by_name) == [f"{EP}/prefix-reuse-share", f"{EP}/tenant-usage", f"{EP}/top-prefixes"]
    reuse_id, reuse = by_name[f"{EP}/prefix-reuse-share"]
    top_id, top = by_name[f"{EP}/top-prefixes"]
    assert re.fullmatch("RPrefixReuse[0-9A-F]{8}", reuse_id) and re.fullmatch("RTopPrefixes[0-9A-F]{8}", top_id)
    assert reuse["LogGroupNames"] == top["LogGroupNames"] == [{"Ref": group}]
    fingerprint = LogField.PREFIX_FINGERPRINT
    # Every request beyond a fingerprint's first reuses it: fingerprints A, A, A, B give (4 - 2) × 100 / 4 = 50 %.
    assert reuse["QueryString"].split("\n| ") == [
        REQUEST_LINES, f"filter ispresent({fingerprint})", f"stats count(*) as requests by {fingerprint}",
        "stats sum(requests) as total, count(*) as prefixes, (sum(requests) - count(*)) * 100 / sum(requests) "
        "as reuse_percent"]
    assert top["QueryString"].split("\n| ") == [
        REQUEST_LINES,
        f"stats count(*) as requests, avg({LogField.TTFT_MS}) as ttft_ms, sum({LogField.CACHED_TOKENS}) / "
        f"sum({LogField.PROMPT_TOKENS}) as hit_rate by {fingerprint}",
        "sort requests desc", "limit 20"]
    assert top_prefixes_query(5).to_string().endswith("\n| limit 5")
    # Who used what: the same sums as the usage command, most prompt tokens first.
    _, usage = by_name[f"{EP}/tenant-usage"]
    assert usage["QueryString"].split("\n| ") == [
        REQUEST_LINES,
        f"stats count(*) as requests, sum({LogField.PROMPT_TOKENS}) as prompt_tokens, sum({LogField.CACHED_TOKENS}) "
        f"as cached_tokens, sum({LogField.OUTPUT_TOKENS}) as completion_tokens, sum({LogField.CACHED_TOKENS}) / "
        f"sum({LogField.PROMPT_TOKENS}) as cached_share by {LogField.TENANT}",
        "sort prompt_tokens desc", "limit 20"]


def _rule(props, group) -> dict:
    body = _text(props["RuleBody"]).replace("${%s}" % group, "<group>")
    assert " " not in body  # compact JSON: a rule's definition may hold at most 8192 characters
    return {"Name": props["RuleName"], "State": props["RuleState"], "Body": json.loads(body)}


def _contributors(key, *extra) -> dict:
    return {"Schema": {"Name": "CloudWatchLogRule", "Version": 1}, "LogGroupNames": ["<group>"], "LogFormat": "JSON",
            "Contribution": {"Keys": [f"$.{key}"],
                             "Filters": [{"Match": f"$.{LogField.MESSAGE}", "In": [REQUEST_LOG_MESSAGE]}, *extra]},
            "AggregateOn": "Count"}


def test_contributor_insights_rank_fingerprints_and_tenants_and_with_limits_the_throttled_ones():
    built, found, group = _insights(limits_enabled=True)
    rules = {logical: _rule(props, group) for logical, props in found["CloudWatch::InsightRule"].items()}
    by_id = {re.fullmatch("R(\\w+Rule)[0-9A-F]{8}", logical).group(1): rule for logical, rule in rules.items()}
    throttled = {"Match": f"$.{LimitLogField.THROTTLED_BY}",
                 "In": ["requests_per_minute", "tokens_per_minute", "concurrent_streams"]}
    assert by_id == {
        "TopPrefixesRule": {"Name": f"{EP}-top-prefixes", "State": "ENABLED",
                            "Body": _contributors(LogField.PREFIX_FINGERPRINT)},
        "TopTenantsRule": {"Name": f"{EP}-top-tenants", "State": "ENABLED", "Body": _contributors(LogField.TENANT)},
        "TopThrottledTenantsRule": {"Name": f"{EP}-top-throttled-tenants", "State": "ENABLED",
                                    "Body": _contributors(LogField.TENANT, throttled)},
    }
    stack = Stack.of(built)
    assert {stack.get_logical_id(rule) for rule in (built.cfn_top_prefixes_rule, built.cfn_top_tenants_rule,
                                                     built.cfn_top_throttled_tenants_rule)} == set(rules)
    assert {stack.get_logical_id(q.node.default_child)
            for q in (built.reuse_query, built.top_prefixes_query, built.tenant_usage_query)} == set(
        found["Logs::QueryDefinition"])


def test_without_limits_there_is_no_throttled_tenants_rule():
    built, found, group = _insights()
    assert built.cfn_top_throttled_tenants_rule is None
    assert sorted(_rule(p, group)["Name"] for p in found["CloudWatch::InsightRule"].values()) == [
        f"{EP}-top-prefixes", f"{EP}-top-tenants"]
