from prefix_routing.rules import telemetry
from prefix_routing.stage.config import load_stage
from tests.stacks.conftest import stage_with, synth


def _alarms(template):
    return {key: value["Properties"] for key, value in template.find_resources("AWS::CloudWatch::Alarm").items()}


def _by_description(alarms, words):
    matches = [a for a in alarms.values() if words in a["AlarmDescription"]]
    assert len(matches) == 1, (words, [a["AlarmDescription"] for a in alarms.values()])
    return matches[0]


def _single_metric(alarm):
    """(namespace, name, dimensions, statistic) whether CDK wrote the flat or the Metrics form."""
    if "MetricName" in alarm:
        return alarm["Namespace"], alarm["MetricName"], alarm["Dimensions"], alarm.get("ExtendedStatistic") or alarm["Statistic"]
    (entry,) = alarm["Metrics"]
    stat = entry["MetricStat"]
    metric = stat["Metric"]
    return metric["Namespace"], metric["MetricName"], metric["Dimensions"], stat["Stat"]


def _topic_ref(template):
    (topic_id,) = template.find_resources("AWS::SNS::Topic").keys()
    return {"Ref": topic_id}


def test_topic_is_kms_encrypted_and_tls_only(default_templates):
    template = default_templates["observability"]
    (topic,) = template.find_resources("AWS::SNS::Topic").values()
    key_id = topic["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    assert template.find_resources("AWS::KMS::Key")[key_id]["Properties"]["EnableKeyRotation"] is True
    template.has_resource_properties(
        "AWS::SNS::TopicPolicy",
        {"PolicyDocument": {"Statement": [{"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}},
    )


def test_ttft_p50_alarm(default_templates):
    config = load_stage()
    template = default_templates["observability"]
    alarm = _by_description(_alarms(template), "P50 time to first token")
    assert _single_metric(alarm) == (
        telemetry.NAMESPACE,
        telemetry.TTFT.name,
        [{"Name": telemetry.DIMENSION_COMPONENT, "Value": config.component_name}],
        "p50",
    )
    assert alarm["Threshold"] == config.alarms.ttft_p50_ms
    assert alarm["ComparisonOperator"] == "GreaterThanThreshold"
    assert alarm["AlarmActions"] == [_topic_ref(template)]


def test_hit_rate_alarm_divides_cached_by_prompt_tokens(default_templates):
    config = load_stage()
    template = default_templates["observability"]
    alarm = _by_description(_alarms(template), "KV-cache hit rate")
    metrics = {m["Id"]: m for m in alarm["Metrics"]}
    expression = next(m for m in metrics.values() if "Expression" in m)
    assert expression["Expression"] == "cached / prompt"
    assert metrics["cached"]["MetricStat"]["Metric"]["MetricName"] == telemetry.CACHED_TOKENS.name
    assert metrics["prompt"]["MetricStat"]["Metric"]["MetricName"] == telemetry.PROMPT_TOKENS.name
    assert metrics["cached"]["MetricStat"]["Stat"] == "Sum"
    assert alarm["Threshold"] == config.alarms.minimum_hit_rate
    assert alarm["ComparisonOperator"] == "LessThanThreshold"
    assert alarm["AlarmActions"] == [_topic_ref(template)]


def _per_instance_max_concurrency(component: str) -> str:
    # Written out by hand from the Metrics Insights grammar: MAX (the metric documents no average),
    # the per-instance dimension set only, one series per instance.
    return ('SELECT MAX(ConcurrentRequestsPerCopy) FROM SCHEMA("AWS/SageMaker", InferenceComponentName, InstanceId) '
            f"WHERE InferenceComponentName = '{component}' GROUP BY InstanceId ORDER BY MAX() DESC")


def test_hotspot_alarm_watches_each_instance(default_templates):
    config = load_stage()
    template = default_templates["observability"]
    alarm = _by_description(_alarms(template), "fair share")
    (query,) = [m["Expression"] for m in alarm["Metrics"]]
    assert query == _per_instance_max_concurrency(config.component_name)
    expected = min(config.scaling.target_concurrent_requests_per_copy * config.alarms.hotspot_factor,
                   config.routing.concurrency_threshold)
    assert alarm["Threshold"] == expected
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert alarm["EvaluationPeriods"] == config.alarms.evaluation_periods


def test_pinned_at_threshold_alarm_is_per_instance_not_the_component_mean(default_templates):
    config = load_stage()
    alarm = _by_description(_alarms(default_templates["observability"]), "sits at the ConcurrencyThreshold")
    assert "MetricName" not in alarm  # not the component-level series, a mean over copies
    (query,) = [m["Expression"] for m in alarm["Metrics"]]
    assert query == _per_instance_max_concurrency(config.component_name)
    assert alarm["Threshold"] == config.routing.concurrency_threshold
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


def test_error_rate_and_capacity_alarms(default_templates):
    config = load_stage()
    template = default_templates["observability"]
    alarms = _alarms(template)
    errors = _by_description(alarms, "5XX errors above")
    expression = next(m for m in errors["Metrics"] if "Expression" in m)["Expression"]
    assert expression == "100 * errors / MAX([errors, invocations])"
    names = {m["MetricStat"]["Metric"]["MetricName"] for m in errors["Metrics"] if "MetricStat" in m}
    assert names == {"Invocation5XXErrors", "Invocations"}
    assert errors["Threshold"] == config.alarms.error_rate_percent
    capacity = _by_description(alarms, "found no copy")
    assert _single_metric(capacity)[1:] == (
        "NoCapacityInvocationFailures", [{"Name": "InferenceComponentName", "Value": config.component_name}], "Sum"
    )
    assert capacity["ComparisonOperator"] == "GreaterThanOrEqualToThreshold" and capacity["Threshold"] == 1
    for alarm in alarms.values():
        if alarm.get("AlarmName", "").endswith("-engine-metrics-missing"):  # a wiring check for verify
            assert "AlarmActions" not in alarm
            continue
        assert alarm["AlarmActions"] == [_topic_ref(template)]


def test_email_subscriptions_from_config():
    from tests.stacks.conftest import stage_with, synth

    _, templates = synth(stage_with(alarms={"emails": ["oncall@example.com"]}))
    templates["observability"].has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "oncall@example.com"}
    )


def test_no_hit_rate_alarm_for_a_container_that_reports_no_cached_tokens():
    config = stage_with(model={"framework": "djl-lmi", "image_repository": "djl-inference",
                               "image_tag": "0.33.0-lmi15.0.0-cu128"})
    assert any("reports no cached tokens" in w for w in config.warnings)
    _, templates = synth(config)
    descriptions = [a["AlarmDescription"] for a in _alarms(templates["observability"]).values()]
    assert not any("KV-cache hit rate" in d for d in descriptions)
    assert any("P50 time to first token" in d for d in descriptions)  # the rest stay


def test_one_refused_direct_invocation_raises_an_alarm(default_templates):
    alarms = default_templates["observability"].find_resources("AWS::CloudWatch::Alarm").values()
    def stat(alarm):
        metrics = alarm.get("Metrics") or [{}]
        return metrics[0].get("MetricStat", {})

    (alarm,) = [a["Properties"] for a in alarms if stat(a["Properties"]).get("Metric", {}).get("MetricName")
                == "RefusedDirectInvocations"]
    assert (alarm["Threshold"], alarm["EvaluationPeriods"], stat(alarm)["Stat"]) == (1, 1, "Sum")
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert stat(alarm)["Metric"]["Namespace"] == "PrefixRouting"
    assert alarm["TreatMissingData"] == "notBreaching" and alarm["AlarmActions"]
