"""What verify expects is what the stacks synthesize: the function's environment and layer, the log
fields the saved queries read, and the metrics it finds in the alarms and the dashboard."""

import json
import re

from prefix_routing.verify.function import ADAPTER_LAYER, QUERIED_FIELDS, REQUIRED_ENVIRONMENT
from prefix_routing.verify.monitoring import alarm_needs, dashboard_needs
from stacks.constructs import log_insights
from tests.stacks.conftest import ROOT


def _resolved(value):
    """A template value with its intrinsic functions replaced by placeholders (strings only)."""
    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join(p if isinstance(p, str) else "TOKEN" for p in parts)
    if isinstance(value, dict):
        return {k: _resolved(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolved(v) for v in value]
    return value


def test_the_function_has_what_verify_checks(default_templates):
    (function,) = default_templates["normalizer"].find_resources("AWS::Lambda::Function").values()
    properties = function["Properties"]
    assert set(REQUIRED_ENVIRONMENT) <= set(properties["Environment"]["Variables"])
    (layer,) = properties["Layers"]
    assert ADAPTER_LAYER in _resolved(layer)
    assert properties["Architectures"] == ["arm64"] and properties["Runtime"].startswith("python3")


def test_verify_reads_every_log_field_the_saved_queries_and_rules_use():
    source = (ROOT / "stacks" / "constructs" / "log_insights.py").read_text()
    used = {getattr(log_insights.F, name) for name in re.findall(r"\bF\.([A-Z_]+)\b", source)}
    assert used <= set(QUERIED_FIELDS), used - set(QUERIED_FIELDS)


def test_verify_finds_the_metrics_of_the_synthesized_alarms_and_dashboard(default_templates):
    template = default_templates["observability"]
    needs = set()
    for alarm in template.find_resources("AWS::CloudWatch::Alarm").values():
        needs |= set(alarm_needs(_resolved(alarm["Properties"])))
    (dashboard,) = template.find_resources("AWS::CloudWatch::Dashboard").values()
    needs |= set(dashboard_needs(_resolved(dashboard["Properties"]["DashboardBody"])))
    labels = {n.label() for n in needs}
    # by hand, from stacks/metrics.py: the per-instance queries, a component metric, an EMF metric
    assert "AWS/SageMaker ConcurrentRequestsPerCopy {InferenceComponentName, InstanceId}" in labels
    assert "AWS/SageMaker Invocations {InferenceComponentName, InstanceId}" in labels
    assert "AWS/SageMaker Invocation5XXErrors {InferenceComponentName}" in labels
    assert "PrefixRouting TimeToFirstToken {InferenceComponent}" in labels
    per_instance = [n for n in needs if n.schema]
    assert per_instance and all(dict(n.values).get("InferenceComponentName") for n in per_instance)
    assert len(labels) >= 12, sorted(labels)


def test_verify_finds_the_engine_metrics_alarm_by_its_name_and_it_watches_their_absence(default_templates):
    from prefix_routing.stage.config import ENGINE_METRICS_ALARM, alarm_name, load_stage

    config = load_stage()
    alarms = {a["Properties"].get("AlarmName"): a["Properties"]
              for a in default_templates["observability"].find_resources("AWS::CloudWatch::Alarm").values()}
    for plan in config.components():
        engine = alarms[alarm_name(plan.name, ENGINE_METRICS_ALARM)]
        assert engine["EvaluationCriteria"]["PromQLCriteria"]["Query"].startswith("absent(")
        assert plan.name in engine["EvaluationCriteria"]["PromQLCriteria"]["Query"]
        for rollback in config.rollback_alarm_names(plan.name):
            assert rollback in alarms  # what the component's DeploymentConfig names
