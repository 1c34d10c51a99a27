"""verify against a stubbed healthy deployment, and one failure at a time: each ✘ says what to do."""

from __future__ import annotations

import json

import pytest

from prefix_routing.verify import exit_status, render_json, render_text, verify_stage
from tests.prefix_routing.verify.conftest import (
    CONFIG,
    IC,
    METRIC_CALLS,
    Deployment,
    by_title,
    changed,
    healthy,
)


def run(responses, errors=None):
    deployment = Deployment(responses, errors)
    checks = verify_stage(CONFIG, deployment.clients())
    return checks, deployment


def test_a_healthy_deployment_is_all_ticks_and_every_call_was_made():
    checks, deployment = run(healthy())
    assert [c for c in checks if c.status != "ok"] == []
    for stub in deployment.stubbers:
        stub.assert_no_pending_responses()
    text = render_text(checks)
    assert text.splitlines()[-1] == f"{len(checks)} ✔, 0 ✘, 0 ?"
    assert "✔ routing strategy: PREFIX_AWARE, PrefixLength 4096, ConcurrencyThreshold 10" in text
    assert exit_status(checks) == 0
    assert json.loads(render_json(checks))["failed"] == 0
    # 5 from SageMaker/ECR (endpoint, component, copies, placement, image), routing + metrics + detailed
    # observability + scaling, dashboard, 4 metrics, the engine's metrics, 2 alarms, the function
    assert len(checks) == 18
    assert "✔ copy placement: 2 copies (2 on ml.g6e.xlarge), 2 instances in service, placement SPREAD" in text
    assert f"✔ engine prefix-cache metrics {IC}: published" in text


def _failure(checks, prefix, *, detail, fix):
    check = by_title(checks, prefix)
    assert check.status == "fail", check
    assert detail in check.detail and fix in check.fix, check
    assert f"\n    fix: {check.fix}" in check.line()
    assert exit_status(checks) == 1
    return check


def test_endpoint_failed():
    responses = changed(healthy(), "sagemaker", "describe_endpoint",
                        lambda r: r.update(EndpointStatus="Failed", FailureReason="image pull denied"))
    checks, _ = run(responses)
    _failure(checks, "endpoint default-prefix-llm", detail="status Failed: image pull denied", fix="FailureReason")


def test_endpoint_missing():
    responses = healthy()
    for op in ("describe_endpoint", "describe_endpoint_config"):
        del responses["sagemaker"][op]
    checks, _ = run(responses, {("sagemaker", "describe_endpoint"): "ValidationException"})
    _failure(checks, "endpoint default-prefix-llm", detail="not found", fix="npx cdk deploy --all -c stage=default")


def test_routing_strategy_differs():
    responses = changed(healthy(), "sagemaker", "describe_endpoint_config",
                        lambda r: r["ProductionVariants"][0].update(RoutingConfig={"RoutingStrategy": "RANDOM"}))
    checks, _ = run(responses)
    _failure(checks, "routing strategy", detail="RANDOM, the stage says PREFIX_AWARE", fix="replaces the endpoint config")


def test_prefix_length_differs():
    def edit(r):
        r["ProductionVariants"][0]["RoutingConfig"]["PrefixAwareRoutingConfig"]["PrefixLength"] = 2048
    checks, _ = run(changed(healthy(), "sagemaker", "describe_endpoint_config", edit))
    _failure(checks, "routing strategy", detail="PrefixLength 2048 and ConcurrencyThreshold 10; the stage says 4096",
             fix="redeploy")


def test_enhanced_metrics_off():
    checks, _ = run(changed(healthy(), "sagemaker", "describe_endpoint_config", lambda r: r.pop("MetricsConfig")))
    _failure(checks, "enhanced metrics", detail="per-instance widgets and hotspot alarms have no series", fix="redeploy")


def test_managed_scaling_differs():
    def edit(r):
        r["ProductionVariants"][0]["ManagedInstanceScaling"]["MinInstanceCount"] = 1
    checks, _ = run(changed(healthy(), "sagemaker", "describe_endpoint_config", edit))
    _failure(checks, "managed instance scaling", detail="ENABLED with 1 to 3 instances; the stage says ENABLED with 2 to 3",
             fix="redeploy")


def test_copies_below_the_stage_minimum():
    def edit(r):
        r["RuntimeConfig"] = {"DesiredCopyCount": 1, "CurrentCopyCount": 1}
    checks, _ = run(changed(healthy(), "sagemaker", "describe_inference_component", edit))
    _failure(checks, "copies", detail="1 serving (desired 1); the stage allows 2 to 3",
             fix=f"inference-component/{IC}")


def test_image_tag_missing_from_the_registry():
    responses = healthy()
    checks, _ = run(responses, {("ecr", "describe_images"): "ImageNotFoundException"})
    _failure(checks, "model image", detail="ImageNotFoundException", fix="model.image_tag")


def test_image_listing_refused_is_a_question_not_a_failure():
    checks, _ = run(healthy(), {("ecr", "describe_images"): "AccessDeniedException"})
    check = by_title(checks, "model image")
    assert check.status == "unknown" and "InService" in check.fix
    assert exit_status(checks) == 0


def test_per_instance_metrics_published_with_another_dimension_set():
    """The fact only a live account settles: enhanced metrics publish {..., ContainerId}, not InstanceId."""
    responses = healthy()
    for call, (ns, name, _, dims) in zip(responses["cloudwatch"]["list_metrics"], METRIC_CALLS):
        if "InstanceId" in dims:
            call["Metrics"][0]["Dimensions"] = [{"Name": "InferenceComponentName", "Value": IC},
                                                {"Name": "ContainerId", "Value": "c-1"}]
    checks, _ = run(responses)
    check = _failure(checks, "metric AWS/SageMaker ConcurrentRequestsPerCopy {InferenceComponentName, InstanceId}",
                     detail="published only with {ContainerId, InferenceComponentName}",
                     fix="PER_INSTANCE_DIMENSIONS")
    assert check
    hotspot = by_title(checks, "alarm default-Hotspot")
    assert hotspot.status == "ok"  # its state is OK in the fixture; the metric line carries the finding


def test_no_metrics_yet_is_a_question_with_how_to_settle_it():
    responses = healthy()
    for call in responses["cloudwatch"]["list_metrics"]:
        call["Metrics"] = []
    for alarm in responses["cloudwatch"]["describe_alarms"][0]["MetricAlarms"]:
        alarm["StateValue"] = "INSUFFICIENT_DATA"
    checks, _ = run(responses)
    assert exit_status(checks) == 0
    metric = by_title(checks, "metric PrefixRouting TimeToFirstToken")
    assert metric.status == "unknown" and "only once requests arrive" in metric.detail and "--invoke" in metric.fix
    assert by_title(checks, "alarm default-TtftP50").status == "unknown"


def test_insufficient_data_after_traffic_is_a_failure():
    responses = healthy()
    responses["cloudwatch"]["describe_alarms"][0]["MetricAlarms"][0]["StateValue"] = "INSUFFICIENT_DATA"
    checks, _ = run(responses)
    _failure(checks, "alarm default-TtftP50", detail="INSUFFICIENT_DATA after traffic", fix="metric lines")


def test_alarm_in_the_stack_but_not_in_cloudwatch():
    responses = healthy()
    responses["cloudwatch"]["describe_alarms"][0]["MetricAlarms"].pop(0)
    responses["cloudwatch"]["list_metrics"].pop(0)
    import tests.prefix_routing.verify.conftest as fixtures
    expected = fixtures.EXPECTED_PARAMS[("cloudwatch", "list_metrics")]
    fixtures.EXPECTED_PARAMS[("cloudwatch", "list_metrics")] = expected[1:]
    try:
        checks, _ = run(responses)
    finally:
        fixtures.EXPECTED_PARAMS[("cloudwatch", "list_metrics")] = expected
    _failure(checks, "alarm default-TtftP50", detail="in the stack but not in CloudWatch", fix="redeploy the observability")


def test_observability_stack_missing():
    responses = healthy()
    responses["cloudwatch"] = {}
    checks, _ = run(responses, {("cloudformation", "list_stack_resources"): "ValidationError"})
    _failure(checks, "stack PrefixRouting-default-Observability", detail="cannot list its resources",
             fix="npx cdk deploy --all -c stage=default")


@pytest.mark.parametrize(
    ("edit", "detail"),
    [
        (lambda f: f.update(Architectures=["x86_64"]), "architectures ['x86_64'], not ['arm64']"),
        (lambda f: f.update(Layers=[]), "no Lambda Web Adapter layer"),
        (lambda f: f["Environment"]["Variables"].pop("TENANT_KEY_SECRET_ARN"), "environment lacks TENANT_KEY_SECRET_ARN"),
        (lambda f: f["Environment"]["Variables"].update(ENDPOINT_NAME="other"), "calls other / default-prefix-llm-ic"),
    ],
)
def test_function_configuration_differs(edit, detail):
    checks, _ = run(changed(healthy(), "lambda_", "get_function_configuration", edit))
    _failure(checks, "function PrefixRouting-default", detail=detail, fix="npx cdk deploy PrefixRouting-default-Normalizer")
