"""verify's checks one at a time, with plain fakes for the AWS clients (prefix_routing/verify): the
bounds (copies within the stage's, the routing settings, managed scaling), the statuses, the image
URI, the metrics' dimension sets, alarm states after traffic, the function and the log line.

What a line must say comes from docs/operations.md ("After deploy: verify"): ✔ as the stage says,
✘ with a fix, ? with how to settle it; a call verify may not make is a ?, never a ✘.
"""

from __future__ import annotations

import json

import pytest

from prefix_routing.stage.config import load_stage
from prefix_routing.verify import deployment, function, monitoring
from prefix_routing.verify.monitoring import MetricNeed
from prefix_routing.verify.report import FAIL, OK, UNKNOWN, Check, exit_status, fail, ok, unknown

CONFIG = load_stage()  # default: PREFIX_AWARE 4096/10, instances 2 to 3, copies 2 to 3
EP, IC = CONFIG.endpoint_name, CONFIG.component_name
DEPLOY = "deploy the stage: npx cdk deploy --all -c stage=default"


class AwsError(Exception):
    def __init__(self, code: str):
        super().__init__(code)
        self.response = {"Error": {"Code": code, "Message": code}}


class Client:
    """Answers each named call from a list (an exception is raised), recording the parameters."""

    def __init__(self, **answers):
        self.answers = {name: list(a) if isinstance(a, list) else [a] for name, a in answers.items()}
        self.calls = []

    def __getattr__(self, name):
        if name not in self.answers:
            raise AttributeError(name)

        def call(**kwargs):
            self.calls.append((name, kwargs))
            answers = self.answers[name]
            answer = answers.pop(0) if len(answers) > 1 else answers[0]
            if isinstance(answer, Exception):
                raise answer
            return answer
        return call


def test_an_error_code_is_the_services_else_the_exceptions_name():
    assert deployment.error_code(AwsError("ThrottlingException")) == "ThrottlingException"
    assert deployment.error_code(TimeoutError("slow")) == "TimeoutError"


# ----------------------------------------------------------------------------- the endpoint


@pytest.mark.parametrize("code", ["AccessDenied", "AccessDeniedException", "UnauthorizedOperation"])
def test_an_endpoint_verify_may_not_read_is_a_question(code):
    checks, endpoint_config, _ = deployment.check_endpoint(Client(describe_endpoint=AwsError(code)), CONFIG)
    assert checks == [unknown(f"endpoint {EP}", f"not allowed to read it ({code})", "grant sagemaker:DescribeEndpoint")]
    assert endpoint_config is None


def test_a_missing_endpoint_is_a_failure_with_the_deploy_command():
    checks, endpoint_config, _ = deployment.check_endpoint(Client(describe_endpoint=AwsError("ValidationException")),
                                                        CONFIG)
    assert checks == [fail(f"endpoint {EP}", "not found (ValidationException)", DEPLOY)] and endpoint_config is None


@pytest.mark.parametrize("answer, detail", [
    ({"EndpointStatus": "Creating"}, "status Creating"),
    ({"EndpointStatus": "Failed", "FailureReason": "image pull denied"}, "status Failed: image pull denied"),
])
def test_an_endpoint_not_in_service_is_a_failure_and_its_config_is_still_read(answer, detail):
    sagemaker = Client(describe_endpoint={"EndpointConfigName": "ec-1", **answer},
                       describe_endpoint_config={"EndpointConfigName": "ec-1"})
    checks, endpoint_config, _ = deployment.check_endpoint(sagemaker, CONFIG)
    (check,) = checks
    assert (check.status, check.title, check.detail) == (FAIL, f"endpoint {EP}", detail)
    assert f"/aws/sagemaker/Endpoints/{EP}" in check.fix and "FailureReason" in check.fix
    assert endpoint_config == {"EndpointConfigName": "ec-1"}
    assert sagemaker.calls == [("describe_endpoint", {"EndpointName": EP}),
                               ("describe_endpoint_config", {"EndpointConfigName": "ec-1"})]


def test_an_endpoint_config_verify_cannot_read_is_a_question():
    sagemaker = Client(describe_endpoint={"EndpointConfigName": "ec-1", "EndpointStatus": "InService"},
                       describe_endpoint_config=AwsError("AccessDeniedException"))
    checks, endpoint_config, _ = deployment.check_endpoint(sagemaker, CONFIG)
    assert checks == [ok(f"endpoint {EP}", "InService"),
                      unknown("endpoint config", "cannot read it (AccessDeniedException)",
                              "grant sagemaker:DescribeEndpointConfig")]
    assert endpoint_config is None


# ----------------------------------------------------------------------------- the endpoint config


def endpoint_config(*, routing=None, metrics=True, detailed=True, scaling=("ENABLED", 2, 3)) -> dict:
    variant = {"ManagedInstanceScaling": {"Status": scaling[0], "MinInstanceCount": scaling[1],
                                          "MaxInstanceCount": scaling[2]}}
    if routing is not None:
        variant["RoutingConfig"] = routing
    config = {"ProductionVariants": [variant]}
    if metrics is not None:
        config["MetricsConfig"] = {"EnableEnhancedMetrics": metrics, "EnableDetailedObservability": detailed}
    return config


PREFIX_AWARE = {"RoutingStrategy": "PREFIX_AWARE",
                "PrefixAwareRoutingConfig": {"PrefixLength": 4096, "ConcurrencyThreshold": 10}}


def by_title(checks, title):
    (check,) = [c for c in checks if c.title == title]
    return check


def test_an_endpoint_config_as_the_stage_says_is_four_ticks():
    assert deployment.check_endpoint_config(endpoint_config(routing=PREFIX_AWARE), CONFIG) == [
        ok("routing strategy", "PREFIX_AWARE, PrefixLength 4096, ConcurrencyThreshold 10"),
        ok("enhanced metrics", "on (per-instance series for the hotspot alarms)"),
        ok("detailed observability", "on (the engine's own metrics, billed per GB ingested)"),
        ok("managed instance scaling", "2 to 3 instances"),
    ]


METRICS_FIX = "redeploy the stage (npx cdk deploy -c stage=default): a metrics change replaces the endpoint config"


@pytest.mark.parametrize("detailed", [False, None])
def test_detailed_observability_off_where_the_stage_wants_it_is_a_failure(detailed):
    config = endpoint_config(routing=PREFIX_AWARE, detailed=detailed)
    if detailed is None:
        del config["MetricsConfig"]["EnableDetailedObservability"]
    check = by_title(deployment.check_endpoint_config(config, CONFIG), "detailed observability")
    assert check == fail("detailed observability",
                         "off: the engine's prefix-cache hit rate (its widget and alarms) has no data", METRICS_FIX)


def test_detailed_observability_on_where_the_stage_turns_it_off_is_a_failure_it_costs():
    off = CONFIG.model_copy(update={"metrics": CONFIG.metrics.model_copy(update={"detailed_observability": False})})
    checks = deployment.check_endpoint_config(endpoint_config(routing=PREFIX_AWARE), off)
    assert by_title(checks, "detailed observability") == fail(
        "detailed observability", "on, the stage says off: OpenTelemetry metrics are billed per GB ingested",
        METRICS_FIX)
    checks = deployment.check_endpoint_config(endpoint_config(routing=PREFIX_AWARE, detailed=False), off)
    assert by_title(checks, "detailed observability") == ok("detailed observability", "off, as the stage says")


@pytest.mark.parametrize("routing, detail", [
    (None, "RANDOM, the stage says PREFIX_AWARE"),  # no RoutingConfig: SageMaker's default
    ({"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}, "LEAST_OUTSTANDING_REQUESTS, the stage says PREFIX_AWARE"),
    ({"RoutingStrategy": "PREFIX_AWARE", "PrefixAwareRoutingConfig": {"PrefixLength": 4096, "ConcurrencyThreshold": 11}},
     "PREFIX_AWARE with PrefixLength 4096 and ConcurrencyThreshold 11; the stage says 4096 and 10"),
    ({"RoutingStrategy": "PREFIX_AWARE", "PrefixAwareRoutingConfig": {"PrefixLength": 8192, "ConcurrencyThreshold": 10}},
     "PREFIX_AWARE with PrefixLength 8192 and ConcurrencyThreshold 10; the stage says 4096 and 10"),
    ({"RoutingStrategy": "PREFIX_AWARE"}, "PREFIX_AWARE with PrefixLength None and ConcurrencyThreshold None"),
])
def test_routing_other_than_the_stages_is_a_failure_that_says_a_redeploy_replaces_the_config(routing, detail):
    check = by_title(deployment.check_endpoint_config(endpoint_config(routing=routing), CONFIG), "routing strategy")
    assert check.status == FAIL and check.detail.startswith(detail)
    assert check.fix == ("redeploy the stage (npx cdk deploy -c stage=default): a routing change replaces the "
                         "endpoint config")


def test_a_stage_without_prefix_aware_routing_checks_the_strategy_alone():
    random = CONFIG.model_copy(update={"routing": CONFIG.routing.model_copy(update={"strategy": "RANDOM"})})
    checks = deployment.check_endpoint_config(endpoint_config(routing={"RoutingStrategy": "RANDOM"}), random)
    assert by_title(checks, "routing strategy") == ok("routing strategy", "RANDOM")


@pytest.mark.parametrize("metrics", [False, None, "true"])
def test_enhanced_metrics_not_exactly_on_is_a_failure(metrics):
    check = by_title(deployment.check_endpoint_config(endpoint_config(routing=PREFIX_AWARE, metrics=metrics), CONFIG),
                     "enhanced metrics")
    assert check == fail("enhanced metrics", "off: the per-instance widgets and hotspot alarms have no series",
                         "redeploy the stage (npx cdk deploy -c stage=default): a metrics change replaces the "
                         "endpoint config")


@pytest.mark.parametrize("scaling", [("DISABLED", 2, 3), ("ENABLED", 1, 3), ("ENABLED", 2, 4), ("ENABLED", 3, 3)])
def test_managed_scaling_must_be_on_with_the_stages_instance_bounds(scaling):
    check = by_title(deployment.check_endpoint_config(endpoint_config(routing=PREFIX_AWARE, scaling=scaling), CONFIG),
                     "managed instance scaling")
    assert check == fail("managed instance scaling", f"{scaling[0]} with {scaling[1]} to {scaling[2]} instances; the "
                         "stage says ENABLED with 2 to 3",
                         "redeploy the stage (npx cdk deploy -c stage=default): a change replaces the endpoint config")


def test_an_endpoint_config_without_variants_reads_as_defaults():
    checks = deployment.check_endpoint_config({}, CONFIG)
    assert [c.status for c in checks] == [FAIL, FAIL, FAIL, FAIL]
    assert by_title(checks, "managed instance scaling").detail.startswith("None with None to None instances")


# ----------------------------------------------------------------------------- the component and its copies


def component(current, desired=2, status="InService", **extra) -> dict:
    return {"InferenceComponentStatus": status, "RuntimeConfig": {"CurrentCopyCount": current,
                                                                  "DesiredCopyCount": desired}, **extra}


@pytest.mark.parametrize("current", [2, 3])
def test_copies_within_the_stages_bounds_are_a_tick(current):
    checks, described = deployment.check_component(Client(describe_inference_component=component(current, 3)), CONFIG)
    assert checks == [ok(f"inference component {IC}", "InService"),
                      ok("copies", f"{current} serving (desired 3; the stage allows 2 to 3)")]
    assert described == component(current, 3)


@pytest.mark.parametrize("current", [1, 4, 0, None, "2"])
def test_copies_outside_the_stages_bounds_are_a_failure(current):
    checks, _ = deployment.check_component(Client(describe_inference_component=component(current)), CONFIG)
    check = by_title(checks, "copies")
    assert check == fail("copies", f"{current} serving (desired 2); the stage allows 2 to 3",
                         "check the copy autoscaling target (Application Auto Scaling, inference-component/"
                         f"{IC}) and the instance quota")


def test_a_component_not_in_service_says_its_status_and_reason():
    checks, _ = deployment.check_component(Client(describe_inference_component=component(
        2, status="Failed", FailureReason="capacity")), CONFIG)
    assert (checks[0].status, checks[0].detail) == (FAIL, "status Failed: capacity")
    assert "capacity, image pull, model load" in checks[0].fix
    checks, _ = deployment.check_component(Client(describe_inference_component=component(2, status="Creating")), CONFIG)
    assert checks[0].detail == "status Creating"


def test_a_component_verify_may_not_read_is_a_question_and_a_missing_one_a_failure():
    sagemaker = Client(describe_inference_component=AwsError("AccessDeniedException"))
    assert deployment.check_component(sagemaker, CONFIG) == (
        [unknown(f"inference component {IC}", "not allowed to read it (AccessDeniedException)",
                 "grant sagemaker:DescribeInferenceComponent")], None)
    assert sagemaker.calls == [("describe_inference_component", {"InferenceComponentName": IC})]
    sagemaker = Client(describe_inference_component=AwsError("ValidationException"))
    assert deployment.check_component(sagemaker, CONFIG) == (
        [fail(f"inference component {IC}", "not found (ValidationException)", DEPLOY)], None)


# ----------------------------------------------------------------------------- the image


IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:server-sagemaker-cuda-v1"


def image_check(image, ecr, spec=None):
    sagemaker = Client(describe_model={"PrimaryContainer": {"Image": image}})
    spec = {"ModelName": "m-1"} if spec is None else spec
    return deployment.check_image(sagemaker, ecr, {"Specification": spec}), sagemaker


def test_an_image_tag_in_the_registry_is_a_tick_with_its_digest():
    ecr = Client(describe_images={"imageDetails": [{"imageDigest": "sha256:abc"}]})
    checks, sagemaker = image_check(IMAGE, ecr)
    assert checks == [ok("model image", f"{IMAGE} (sha256:abc)")]
    assert sagemaker.calls == [("describe_model", {"ModelName": "m-1"})]
    assert ecr.calls == [("describe_images", {"registryId": "763104351884", "repositoryName": "vllm",
                                              "imageIds": [{"imageTag": "server-sagemaker-cuda-v1"}]})]


def test_a_china_registry_and_a_repository_path_are_read_too():
    ecr = Client(describe_images={"imageDetails": []})
    image = "727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn/djl/inference:0.33.0-lmi"
    checks, _ = image_check(image, ecr)
    assert checks == [ok("model image", f"{image} (digest unknown)")]
    assert ecr.calls[0][1] == {"registryId": "727897471807", "repositoryName": "djl/inference",
                               "imageIds": [{"imageTag": "0.33.0-lmi"}]}


@pytest.mark.parametrize("code", ["ImageNotFoundException", "RepositoryNotFoundException"])
def test_a_tag_the_registry_lacks_is_a_failure(code):
    checks, _ = image_check(IMAGE, Client(describe_images=AwsError(code)))
    assert checks[0].status == FAIL and checks[0].detail == f"{IMAGE}: {code}" and "model.image_tag" in checks[0].fix


def test_a_registry_that_refuses_the_listing_is_a_question():
    checks, _ = image_check(IMAGE, Client(describe_images=AwsError("AccessDeniedException")))
    assert checks[0].status == UNKNOWN and checks[0].detail.startswith(f"{IMAGE}: cannot list it (AccessDeniedException)")
    assert "InService" in checks[0].fix


@pytest.mark.parametrize("image", ["vllm:latest", "763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm",
                                   "763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm@sha256:abc",
                                   "76310435188.dkr.ecr.us-east-1.amazonaws.com/vllm:x"])
def test_an_image_that_is_no_tagged_ecr_uri_is_a_question(image):
    ecr = Client(describe_images={})
    checks, _ = image_check(image, ecr)
    assert checks == [unknown("model image", f"{image} is not an ECR image URI with a tag")] and ecr.calls == []


def test_without_a_model_name_or_a_readable_model_the_image_is_a_question():
    assert deployment.check_image(Client(), Client(), None) == [
        unknown("model image", "the component names no model to read the image from")]
    assert deployment.check_image(Client(), Client(), {"Specification": {}})[0].status == UNKNOWN
    sagemaker = Client(describe_model=AwsError("AccessDeniedException"))
    assert deployment.check_image(sagemaker, Client(), {"Specification": {"ModelName": "m-1"}}) == [
        unknown("model image", "cannot read model m-1 (AccessDeniedException)", "grant sagemaker:DescribeModel")]


# ----------------------------------------------------------------------------- the metrics an alarm or widget reads


QUERY = ('SELECT MAX(ConcurrentRequestsPerCopy) FROM SCHEMA("AWS/SageMaker", InferenceComponentName, InstanceId) '
         f"WHERE InferenceComponentName = '{IC}' AND Other = 'x' GROUP BY InstanceId ORDER BY MAX() DESC")
PER_INSTANCE = MetricNeed("AWS/SageMaker", "ConcurrentRequestsPerCopy", frozenset({"InferenceComponentName", "InstanceId"}),
                          (("InferenceComponentName", IC),), True)
TTFT = MetricNeed("PrefixRouting", "TimeToFirstToken", frozenset({"InferenceComponent"}),
                  (("InferenceComponent", IC),), False)


def test_a_schema_query_needs_its_exact_dimension_set_filtered_by_its_where():
    assert monitoring._from_query(QUERY) == PER_INSTANCE
    assert monitoring._from_query('select sum(Invocations) from schema("AWS/SageMaker")') == MetricNeed(
        "AWS/SageMaker", "Invocations", frozenset(), (), True)
    assert monitoring._from_query("m1 / m2") is None


def test_an_alarm_needs_its_metric_its_math_metrics_or_its_query():
    flat = {"Namespace": "PrefixRouting", "MetricName": "TimeToFirstToken",
            "Dimensions": [{"Name": "InferenceComponent", "Value": IC}]}
    assert monitoring.alarm_needs(flat) == [TTFT]
    math = {"Metrics": [{"Id": "e", "Expression": "cached / prompt"},
                        {"Id": "cached", "MetricStat": {"Metric": {"Namespace": "PrefixRouting",
                                                                   "MetricName": "CachedTokens"}}},
                        {"Id": "q", "Expression": QUERY}]}
    assert monitoring.alarm_needs(math) == [
        MetricNeed("PrefixRouting", "CachedTokens", frozenset(), (), False), PER_INSTANCE]
    assert monitoring.alarm_needs({"Metrics": [{"Id": "x", "Expression": ""}]}) == []


def test_a_dashboard_needs_each_series_of_each_widget():
    body = json.dumps({"widgets": [
        {"type": "text", "properties": {"markdown": "hello"}},
        {"type": "alarm"},
        {"type": "metric", "properties": {"metrics": [
            ["PrefixRouting", "TimeToFirstToken", "InferenceComponent", IC, {"stat": "p50"}],
            [{"expression": QUERY, "id": "q"}],
            [{"expression": "m1 * 100", "id": "pct"}],
            ["AWS/SageMaker", "Invocations"],
            ["Lonely"],
            [],
        ]}},
    ]})
    assert monitoring.dashboard_needs(body) == [
        TTFT, PER_INSTANCE, MetricNeed("AWS/SageMaker", "Invocations", frozenset(), (), False)]


def test_a_metric_published_with_its_exact_dimension_set_is_a_tick_counting_its_series():
    cloudwatch = Client(list_metrics={"Metrics": [
        {"Dimensions": [{"Name": "InferenceComponentName", "Value": IC}, {"Name": "InstanceId", "Value": "i-1"}]},
        {"Dimensions": [{"Name": "InferenceComponentName", "Value": IC}, {"Name": "InstanceId", "Value": "i-2"}]},
        {"Dimensions": [{"Name": "InferenceComponentName", "Value": IC}]},
    ]})
    check = monitoring.check_metric(cloudwatch, PER_INSTANCE)
    assert check == ok("metric AWS/SageMaker ConcurrentRequestsPerCopy {InferenceComponentName, InstanceId}",
                       "2 series")
    assert cloudwatch.calls == [("list_metrics", {"Namespace": "AWS/SageMaker", "MetricName": "ConcurrentRequestsPerCopy",
                                                  "Dimensions": [{"Name": "InferenceComponentName", "Value": IC}]})]


def test_a_metric_published_only_with_other_dimensions_is_a_failure_naming_them():
    cloudwatch = Client(list_metrics={"Metrics": [
        {"Dimensions": [{"Name": "InferenceComponentName", "Value": IC}, {"Name": "ContainerId", "Value": "c"}]},
        {"Dimensions": [{"Name": "InferenceComponentName", "Value": IC}]},
    ]})
    check = monitoring.check_metric(cloudwatch, PER_INSTANCE)
    assert check.status == FAIL
    assert check.detail == "published only with {ContainerId, InferenceComponentName}; {InferenceComponentName}"
    assert "PER_INSTANCE_DIMENSIONS" in check.fix  # a query's set: the per-instance dimensions
    plain = monitoring.check_metric(Client(list_metrics={"Metrics": [{"Dimensions": []}]}), TTFT)
    assert plain.status == FAIL and plain.detail == "published only with {}"
    assert "fix the metric factory" in plain.fix


def test_a_metric_not_yet_published_or_not_listable_is_a_question():
    not_yet = monitoring.check_metric(Client(list_metrics={"Metrics": []}), TTFT)
    assert not_yet.status == UNKNOWN and "only once requests arrive" in not_yet.detail and "--invoke" in not_yet.fix
    denied = monitoring.check_metric(Client(list_metrics=AwsError("AccessDenied")), TTFT)
    assert denied == unknown(f"metric {TTFT.label()}", "cannot list metrics (AccessDenied)",
                             "grant cloudwatch:ListMetrics")


def test_the_stacks_alarms_are_listed_page_by_page():
    cloudformation = Client(list_stack_resources=[
        {"StackResourceSummaries": [{"ResourceType": "AWS::CloudWatch::Alarm", "PhysicalResourceId": "a1"},
                                    {"ResourceType": "AWS::SNS::Topic", "PhysicalResourceId": "t"}],
         "NextToken": "p2"},
        {"StackResourceSummaries": [{"ResourceType": "AWS::CloudWatch::Alarm", "PhysicalResourceId": "a2"}]}])
    assert monitoring.stack_resources(cloudformation, "S", "AWS::CloudWatch::Alarm") == ["a1", "a2"]
    assert cloudformation.calls == [("list_stack_resources", {"StackName": "S"}),
                                    ("list_stack_resources", {"StackName": "S", "NextToken": "p2"})]


# ----------------------------------------------------------------------------- alarm states


INVOCATIONS = {"Namespace": "AWS/SageMaker", "MetricName": "Invocations",
               "Dimensions": [{"Name": "InferenceComponentName", "Value": IC}]}


def monitoring_checks(alarms, published, names=None):
    """check_monitoring with the stack's alarms ``names`` (default: those described) and a list_metrics
    that answers ``published`` ({metric name: dimension name sets})."""
    names = [a["AlarmName"] for a in alarms] if names is None else names
    cloudformation = Client(list_stack_resources={"StackResourceSummaries": [
        {"ResourceType": "AWS::CloudWatch::Alarm", "PhysicalResourceId": n} for n in names]})

    class CloudWatch(Client):
        def list_metrics(self, **kwargs):
            self.calls.append(("list_metrics", kwargs))
            return {"Metrics": [{"Dimensions": [{"Name": d, "Value": "v"} for d in dims]}
                                for dims in published.get(kwargs["MetricName"], [])]}

    cloudwatch = CloudWatch(describe_alarms={"MetricAlarms": alarms},
                            get_dashboard={"DashboardBody": json.dumps({"widgets": []})})
    return monitoring.check_monitoring(cloudformation, cloudwatch, CONFIG), cloudwatch


def alarm(name, state, metric=INVOCATIONS, reason="r"):
    return {"AlarmName": name, "StateValue": state, "StateReason": reason, **metric}


TTFT_METRIC = {"Namespace": "PrefixRouting", "MetricName": "TimeToFirstToken",
               "Dimensions": [{"Name": "InferenceComponent", "Value": IC}]}
INVOKED = {"Invocations": [["InferenceComponentName"]]}


def test_alarm_states_ok_alarm_and_insufficient_data_before_traffic():
    checks, cloudwatch = monitoring_checks(
        [alarm("a-ok", "OK"), alarm("a-alarm", "ALARM", reason="Threshold crossed"),
         alarm("a-quiet", "INSUFFICIENT_DATA", TTFT_METRIC)], {})
    assert by_title(checks, "alarm a-ok") == ok("alarm a-ok", "OK")
    assert by_title(checks, "alarm a-alarm").status == UNKNOWN
    assert by_title(checks, "alarm a-alarm").detail == "ALARM: Threshold crossed"
    quiet = by_title(checks, "alarm a-quiet")
    assert quiet.status == UNKNOWN and quiet.detail.startswith("INSUFFICIENT_DATA: no series yet")
    assert by_title(checks, f"dashboard {CONFIG.dashboard_name}") == ok(f"dashboard {CONFIG.dashboard_name}")
    assert ("describe_alarms", {"AlarmNames": ["a-ok", "a-alarm", "a-quiet"]}) in cloudwatch.calls
    assert ("get_dashboard", {"DashboardName": CONFIG.dashboard_name}) in cloudwatch.calls


def test_insufficient_data_after_traffic_is_a_failure_when_its_metrics_are_all_there_or_one_is_wrong():
    # Invocations is published: there was traffic. TTFT published as it is read: still no data is wrong.
    checks, _ = monitoring_checks([alarm("inv", "OK"), alarm("ttft", "INSUFFICIENT_DATA", TTFT_METRIC)],
                                  {**INVOKED, "TimeToFirstToken": [["InferenceComponent"]]})
    assert by_title(checks, "alarm ttft").status == FAIL
    assert by_title(checks, "alarm ttft").detail == "INSUFFICIENT_DATA after traffic: r"
    # TTFT published with another set: the metric line carries the finding, and the alarm fails too.
    checks, _ = monitoring_checks([alarm("inv", "OK"), alarm("ttft", "INSUFFICIENT_DATA", TTFT_METRIC)],
                                  {**INVOKED, "TimeToFirstToken": [["Other"]]})
    assert by_title(checks, "alarm ttft").status == FAIL


def test_insufficient_data_of_a_metric_not_yet_published_after_traffic_is_a_question():
    checks, _ = monitoring_checks([alarm("inv", "OK"), alarm("ttft", "INSUFFICIENT_DATA", TTFT_METRIC)], INVOKED)
    assert by_title(checks, "alarm ttft").status == UNKNOWN


def test_without_traffic_insufficient_data_is_a_question_even_with_the_metric_there():
    checks, _ = monitoring_checks([alarm("ttft", "INSUFFICIENT_DATA", TTFT_METRIC)],
                                  {"TimeToFirstToken": [["InferenceComponent"]]})
    assert by_title(checks, "alarm ttft").status == UNKNOWN


def test_an_alarm_of_the_stack_missing_from_cloudwatch_is_a_failure():
    checks, _ = monitoring_checks([alarm("inv", "OK")], INVOKED, names=["inv", "gone"])
    gone = by_title(checks, "alarm gone")
    assert gone.status == FAIL and gone.detail == "in the stack but not in CloudWatch"
    assert gone.fix == "redeploy the observability stack: npx cdk deploy PrefixRouting-default-Observability -c stage=default"


def test_a_stack_with_no_alarms_asks_cloudwatch_for_none_and_a_missing_dashboard_fails():
    cloudformation = Client(list_stack_resources={"StackResourceSummaries": []})
    cloudwatch = Client(get_dashboard=AwsError("ResourceNotFound"))
    checks = monitoring.check_monitoring(cloudformation, cloudwatch, CONFIG)
    redeploy = "npx cdk deploy PrefixRouting-default-Observability -c stage=default"
    assert checks == [fail(f"dashboard {CONFIG.dashboard_name}", "not found (ResourceNotFound)",
                           f"deploy the observability stack: {redeploy}"),
                      fail(f"engine prefix-cache metrics {IC}", f"alarm {IC}-engine-metrics-missing is not in the "
                           "stack PrefixRouting-default-Observability: nothing watches the engine's hit rate",
                           f"redeploy the observability stack: {redeploy}")]
    assert [name for name, _ in cloudwatch.calls] == ["get_dashboard"]


def test_an_observability_stack_verify_cannot_list_is_a_failure():
    checks = monitoring.check_monitoring(Client(list_stack_resources=AwsError("ValidationError")), Client(), CONFIG)
    assert checks == [fail("stack PrefixRouting-default-Observability", "cannot list its resources (ValidationError)",
                           "deploy it: npx cdk deploy --all -c stage=default")]


# ----------------------------------------------------------------------------- the function


FUNCTION = {"FunctionName": "fn", "Runtime": "python3.13", "Architectures": ["arm64"],
            "Layers": [{"Arn": "arn:aws:lambda:us-east-1:753240598075:layer:LambdaAdapterLayerArm64:25"}],
            "Environment": {"Variables": {"ENDPOINT_NAME": EP, "INFERENCE_COMPONENT_NAME": IC, "TENANT_KEY_SECRET_ARN": "s",
                                          "AWS_LAMBDA_EXEC_WRAPPER": "/opt/bootstrap",
                                          "AWS_LWA_INVOKE_MODE": "response_stream"}}}
OUTPUTS = {"Stacks": [{"Outputs": [{"OutputKey": "FunctionName", "OutputValue": "fn"},
                                   {"OutputKey": "FunctionUrl", "OutputValue": "https://u/"}]}]}


def function_checks(configuration, outputs=OUTPUTS):
    lam = Client(get_function_configuration=configuration)
    cloudformation = Client(describe_stacks=outputs)
    checks, found = function.check_function(lam, cloudformation, CONFIG)
    return checks, found, lam, cloudformation


def test_a_function_as_deployed_is_a_tick_and_gives_its_url_and_log_group():
    checks, found, lam, cloudformation = function_checks(FUNCTION)
    assert checks == [ok("function fn", "python3.13, arm64, web adapter layer, environment complete")]
    assert found == {"url": "https://u/", "log_group": "/aws/lambda/fn", "arn": None}  # this fake gives none
    assert lam.calls == [("get_function_configuration", {"FunctionName": "fn"})]
    assert cloudformation.calls == [("describe_stacks", {"StackName": "PrefixRouting-default-Normalizer"})]
    _, found, _, _ = function_checks({**FUNCTION, "LoggingConfig": {"LogGroup": "/custom/group"}})
    assert found["log_group"] == "/custom/group"


@pytest.mark.parametrize("change, problem", [
    ({"Runtime": "nodejs22.x"}, "runtime nodejs22.x, not Python 3"),
    ({"Runtime": None}, "runtime None, not Python 3"),
    ({"Architectures": ["x86_64"]}, "architectures ['x86_64'], not ['arm64']"),
    ({"Layers": [{"Arn": "arn:aws:lambda:us-east-1:1:layer:Other:1"}]}, "no Lambda Web Adapter layer (LambdaAdapterLayerArm64)"),
    ({"Environment": {"Variables": {"ENDPOINT_NAME": EP}}},
     "environment lacks INFERENCE_COMPONENT_NAME, TENANT_KEY_SECRET_ARN, AWS_LAMBDA_EXEC_WRAPPER, AWS_LWA_INVOKE_MODE"),
    ({"Environment": {"Variables": {**FUNCTION["Environment"]["Variables"], "INFERENCE_COMPONENT_NAME": "other-ic"}}},
     f"calls {EP} / other-ic, the stage is {EP} / {IC}"),
])
def test_each_way_the_function_differs_is_named(change, problem):
    checks, _, _, _ = function_checks({**FUNCTION, **change})
    assert checks == [fail("function fn", problem, "redeploy the normalizer stack: npx cdk deploy "
                                                   "PrefixRouting-default-Normalizer -c stage=default")]


def test_two_problems_are_one_line_and_a_missing_stack_or_configuration_say_so():
    checks, _, _, _ = function_checks({**FUNCTION, "Runtime": "java21", "Architectures": None})
    assert checks[0].detail == "runtime java21, not Python 3; architectures None, not ['arm64']"
    checks, found, _, _ = function_checks(FUNCTION, outputs={"Stacks": [{"Outputs": []}]})
    assert checks == [fail("stack PrefixRouting-default-Normalizer", "no FunctionName output (KeyError)",
                           "deploy it: npx cdk deploy PrefixRouting-default-Normalizer -c stage=default")]
    assert found == {}
    checks, found, _, _ = function_checks(AwsError("AccessDeniedException"))
    assert checks == [unknown("function fn", "cannot read its configuration (AccessDeniedException)",
                              "grant lambda:GetFunctionConfiguration")] and found == {}


# ----------------------------------------------------------------------------- the round trip and its log line


class Attempt:
    def __init__(self, ok=True, output_tokens=2, cached_tokens=100, prompt_tokens=120, request_id="req-1",
                 kind=None, detail=None, status=200):
        self.ok, self.output_tokens, self.cached_tokens, self.prompt_tokens = ok, output_tokens, cached_tokens, prompt_tokens
        self.request_id, self.kind, self.detail, self.status = request_id, kind, detail, status


LINE = {"message": "prefix_routing.request", "tenant": "t", "prefix_fingerprint": "f", "prompt_tokens": 120,
        "cached_tokens": 100, "output_tokens": 2, "ttft_ms": 12.5}


def invocation(first, second, events=None, **kwargs):
    sent = []

    def send(body):
        sent.append(body)
        return (first, second)[len(sent) - 1]

    logs = Client(filter_log_events=events if events is not None else {"events": [{"message": json.dumps(LINE)}]})
    checks = function.check_invocation(send, logs, "/aws/lambda/fn", log_wait_s=0, sleep=lambda s: None, **kwargs)
    return checks, sent, logs


def test_two_requests_stream_the_second_is_cached_and_its_log_line_has_the_queried_fields():
    checks, sent, logs = invocation(Attempt(cached_tokens=0), Attempt())
    assert sent == [function.VERIFY_BODY] * 2
    assert [c.status for c in checks] == [OK, OK, OK]
    assert checks[0] == ok("invocation: streaming", "2 tokens streamed")
    assert checks[1].detail.startswith("second request: 100 of 120 prompt tokens cached")
    assert checks[2].title == "request log line in /aws/lambda/fn" and "req-1" in checks[2].detail
    ((_, params),) = logs.calls
    assert params["logGroupName"] == "/aws/lambda/fn"
    assert params["filterPattern"] == '{ $.message = "prefix_routing.request" && $.request_id = "req-1" }'


def test_a_failed_request_is_the_only_line():
    checks, _, logs = invocation(Attempt(ok=False, kind="http_403", detail="Forbidden", status=403), Attempt())
    assert checks == [fail("invocation: first request", "http_403: Forbidden (status 403)",
                           "read the function's log group and the endpoint's; a 403 means the caller lacks "
                           "lambda:InvokeFunctionUrl")]
    assert logs.calls == []
    checks, _, _ = invocation(Attempt(ok=False, kind="timeout", detail="t", status=None),
                              Attempt(ok=False, kind="timeout", detail="t", status=None))
    assert [c.title for c in checks] == ["invocation: first request", "invocation: second request"]


def test_no_tokens_no_cached_field_or_nothing_cached_are_failures():
    checks, _, _ = invocation(Attempt(output_tokens=0), Attempt(cached_tokens=None))
    assert checks[0] == fail("invocation: streaming", "no tokens came back", "read the function's log group")
    assert checks[1].status == FAIL and checks[1].detail == "the final usage has no cached_tokens"
    assert "SM_VLLM_ENABLE_PROMPT_TOKENS_DETAILS" in checks[1].fix
    checks, _, _ = invocation(Attempt(), Attempt(cached_tokens=0))
    assert checks[1].status == FAIL and checks[1].detail == "the second, identical request had 0 cached tokens"


def test_a_log_line_without_a_queried_field_is_a_failure_naming_it():
    line = {k: v for k, v in LINE.items() if k not in ("tenant", "ttft_ms")}
    checks, _, _ = invocation(Attempt(), Attempt(), {"events": [{"message": json.dumps(LINE)},
                                                                {"message": json.dumps(line)}]})
    assert checks[-1].status == FAIL and checks[-1].detail == "lacks tenant, ttft_ms"  # the latest line


def test_no_request_id_no_permission_or_no_line_yet_are_questions():
    checks, _, logs = invocation(Attempt(), Attempt(request_id=None))
    assert checks[-1] == unknown("request log line in /aws/lambda/fn", "the answer carried no request id to look it up")
    assert logs.calls == []
    checks, _, _ = invocation(Attempt(), Attempt(), AwsError("AccessDeniedException"))
    assert checks[-1] == unknown("request log line in /aws/lambda/fn", "cannot read it (AccessDeniedException)",
                                 "grant logs:FilterLogEvents on the log group")
    checks, _, _ = invocation(Attempt(), Attempt(), {"events": []})
    assert checks[-1] == unknown("request log line in /aws/lambda/fn", "no line for request req-1 yet",
                                 "logs arrive within a minute: run verify again")


def test_the_log_line_is_waited_for_every_five_seconds_until_it_comes():
    naps = []
    logs = Client(filter_log_events=[{"events": []}, {"events": []}, {"events": [{"message": json.dumps(LINE)}]}])
    check = function._check_log_line(logs, "/g", "req-1", 60.0, naps.append)
    assert check.status == OK and naps == [5.0, 5.0] and len(logs.calls) == 3


# ----------------------------------------------------------------------------- the report


def test_a_line_has_its_symbol_its_detail_and_what_to_do():
    assert ok("a", "b").line() == "✔ a: b"
    assert ok("a").line() == "✔ a"
    assert fail("a", "b", "c").line() == "✘ a: b\n    fix: c"
    assert unknown("a", "b", "c").line() == "? a: b\n    to settle: c"
    assert unknown("a", "b").line() == "? a: b"
    assert Check(FAIL, "a", "b", "").line() == "✘ a: b"


def test_only_a_failure_fails_the_run():
    assert exit_status([ok("a"), unknown("b", "c")]) == 0
    assert exit_status([ok("a"), fail("b", "c", "d")]) == 1
    assert exit_status([]) == 0
