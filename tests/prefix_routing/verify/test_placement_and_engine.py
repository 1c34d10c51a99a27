"""verify's copy placement and the engine's prefix-cache metrics: ✔, ✘ and ?, against stubbed AWS
answers (botocore Stubbers checking every request and response against the service models), and the
placement rule case by case.

What a line must say (docs/operations.md, "After deploy: verify"): with PREFIX_AWARE routing, copies
on fewer than two instances while more than one is in service is ✘; no PlacementStatus is ?. The
engine's metrics are seen when the PromQL alarm on their absence is OK; until then ?, with how to
settle the names; an alarm missing from the stack is ✘.
"""

from __future__ import annotations

import pytest

import tests.prefix_routing.verify.conftest as fixtures
from prefix_routing.stage.config import load_stage
from prefix_routing.verify import exit_status, render_text, verify_stage
from prefix_routing.verify.deployment import check_placement, instances_in_service
from prefix_routing.verify.monitoring import check_engine_metrics
from prefix_routing.verify.report import FAIL, OK, UNKNOWN
from tests.prefix_routing.verify.conftest import CONFIG, ENGINE_ALARM, IC, Deployment, by_title, healthy


def run(responses):
    deployment = Deployment(responses)
    checks = verify_stage(CONFIG, deployment.clients())
    for stub in deployment.stubbers:
        stub.assert_no_pending_responses()
    return checks


def _component(responses) -> dict:
    return responses["sagemaker"]["describe_inference_component"][0]


# ----------------------------------------------------------------------------- placement, stubbed


def test_two_copies_on_two_instances_are_a_tick():
    check = by_title(run(healthy()), "copy placement")
    assert check.status == OK
    assert check.detail == ("2 copies (2 on ml.g6e.xlarge), 2 instances in service, placement SPREAD: on 2 instances "
                            "at least")


def test_one_copy_while_two_instances_serve_is_a_failure():
    responses = healthy()
    _component(responses)["RuntimeConfig"] = {"DesiredCopyCount": 1, "CurrentCopyCount": 1, "PlacementStatus": [
        {"InstanceType": "ml.g6e.xlarge", "CurrentCopyCount": 1}]}
    checks = run(responses)
    check = by_title(checks, "copy placement")
    assert check.status == FAIL and exit_status(checks) == 1
    assert check.detail == ("1 copy (1 on ml.g6e.xlarge), 2 instances in service, placement SPREAD: every request "
                            "goes to one instance, routing by prefix has no choice")
    assert check.fix == ("keep two copies or more at rest (endpoint.copies_min = 2) so that PREFIX_AWARE routing has "
                         "instances to choose among")
    assert "\n    fix: keep two copies" in render_text(checks)


def test_no_placement_status_is_a_question():
    responses = healthy()
    del _component(responses)["RuntimeConfig"]["PlacementStatus"]
    check = by_title(run(responses), "copy placement")
    assert check.status == UNKNOWN and check.detail == "DescribeInferenceComponent reports no PlacementStatus"
    assert "InService" in check.fix


def test_one_instance_in_service_has_nothing_to_spread_over():
    responses = healthy()
    responses["sagemaker"]["describe_endpoint"][0]["ProductionVariants"][0]["CurrentInstanceCount"] = 1
    _component(responses)["RuntimeConfig"]["PlacementStatus"][0]["CurrentCopyCount"] = 1
    check = by_title(run(responses), "copy placement")
    assert check.status == OK and "1 instances in service" in check.detail


# ----------------------------------------------------------------------------- placement, the rule

G6E_12 = load_stage("llama8b-g6e")  # ml.g6e.12xlarge: 4 single-GPU copies fit on one instance
PLAN = G6E_12.components()[0]


def described(copies: int, strategy: str | None = "SPREAD", types=("ml.g6e.12xlarge",)) -> dict:
    spec = {"ModelName": "m"}
    if strategy:
        spec["SchedulingConfig"] = {"PlacementStrategy": strategy}
    return {"Specification": spec, "RuntimeConfig": {"CurrentCopyCount": copies, "PlacementStatus": [
        {"InstanceType": t, "CurrentCopyCount": copies // len(types)} for t in types]}}


@pytest.mark.parametrize("copies, strategy, instances, status, words", [
    (2, "SPREAD", 2, OK, "SPREAD puts them on distinct instances"),
    (2, "BINPACK", 2, FAIL, "BINPACK packs them onto as few instances as it can, and one holds 4"),
    (5, "BINPACK", 2, OK, "on 2 instances at least"),  # 5 copies cannot fit on one 4-GPU instance
    (8, "BINPACK", 3, OK, "on 2 instances at least"),
    (2, None, 2, UNKNOWN, "the placement strategy is not reported"),
    (1, "SPREAD", 2, FAIL, "every request goes to one instance"),
    (0, "SPREAD", 2, FAIL, "every request goes to one instance"),
    (1, "SPREAD", None, UNKNOWN, "? instances in service"),
    (2, "BINPACK", 1, OK, "1 instances in service"),  # one instance: nothing to spread over
    (2, "BINPACK", None, UNKNOWN, "? instances in service"),  # whether more than one serves is unknown
])
def test_placement_with_prefix_aware_routing(copies, strategy, instances, status, words):
    check = check_placement(G6E_12, PLAN, described(copies, strategy), instances)
    assert check.status == status and words in check.detail, check
    assert check.title == "copy placement"


def test_a_binpacked_components_fix_is_spread():
    check = check_placement(G6E_12, PLAN, described(3, "BINPACK"), 2)
    assert check.fix == ('set endpoint.placement = "SPREAD" and redeploy (copies move as they are added or removed)')


def test_without_prefix_aware_routing_any_placement_is_a_tick():
    random = G6E_12.model_copy(update={"routing": G6E_12.routing.model_copy(update={"strategy": "RANDOM"})})
    assert check_placement(random, PLAN, described(1, "BINPACK"), 3).status == OK
    assert check_placement(random, PLAN, {"RuntimeConfig": {}}, 3).status == UNKNOWN  # still: nothing reported


def test_copies_on_several_instance_types_are_listed_and_summed():
    check = check_placement(G6E_12, PLAN, described(4, "SPREAD", ("ml.g6e.12xlarge", "ml.g6e.24xlarge")), 2)
    assert check.detail.startswith("4 copies (2 on ml.g6e.12xlarge, 2 on ml.g6e.24xlarge), 2 instances in service")


def test_a_domains_fix_names_the_domains_bound():
    domains = load_stage("trust-domains")
    acme = [p for p in domains.components() if p.domain == "acme"][0]
    check = check_placement(domains, acme, described(1), 2)
    assert check.title == "copy placement (domain acme)" and "(domains.acme.copies_min = 2)" in check.fix


def test_instances_in_service_come_from_the_endpoints_variant():
    assert instances_in_service({"ProductionVariants": [{"VariantName": "AllTraffic", "CurrentInstanceCount": 3}]}) == 3
    assert instances_in_service({"ProductionVariants": [{"VariantName": "AllTraffic"}]}) is None
    assert instances_in_service({}) is None and instances_in_service(None) is None


# ----------------------------------------------------------------------------- the engine's metrics, stubbed


def _engine_alarm(responses) -> dict:
    (alarm,) = [a for a in responses["cloudwatch"]["describe_alarms"][0]["MetricAlarms"]
                if a["AlarmName"] == ENGINE_ALARM]
    return alarm


def test_the_engines_metrics_seen_are_a_tick():
    check = by_title(run(healthy()), f"engine prefix-cache metrics {IC}")
    assert check.status == OK and check.detail.startswith("published")


@pytest.mark.parametrize("state, words", [("ALARM", "not seen (absent for 5 minutes)"),
                                          ("INSUFFICIENT_DATA", "not evaluated yet (INSUFFICIENT_DATA)")])
def test_the_engines_metrics_not_seen_yet_are_a_question_that_says_how_to_settle_the_names(state, words):
    responses = healthy()
    _engine_alarm(responses).update(StateValue=state, StateReason="absent for 5 minutes")
    checks = run(responses)
    check = by_title(checks, f"engine prefix-cache metrics {IC}")
    assert check.status == UNKNOWN and check.detail == words
    assert "settle on first deploy" in check.fix and "Query Studio" in check.fix and "EngineMetrics" in check.fix
    assert exit_status(checks) == 0
    assert not [c for c in checks if c.title == f"alarm {ENGINE_ALARM}"]  # one line for it, not two


def test_the_engines_alarm_missing_from_the_stack_is_a_failure():
    responses = healthy()
    responses["cloudformation"]["list_stack_resources"][0]["StackResourceSummaries"].pop()
    responses["cloudwatch"]["describe_alarms"][0]["MetricAlarms"].pop()
    expected = fixtures.EXPECTED_PARAMS[("cloudwatch", "describe_alarms")]
    fixtures.EXPECTED_PARAMS[("cloudwatch", "describe_alarms")] = [{"AlarmNames": fixtures.ALARMS[:-1]}]
    try:
        checks = run(responses)
    finally:
        fixtures.EXPECTED_PARAMS[("cloudwatch", "describe_alarms")] = expected
    check = by_title(checks, f"engine prefix-cache metrics {IC}")
    assert check.status == FAIL and exit_status(checks) == 1
    assert check.detail == (f"alarm {ENGINE_ALARM} is not in the stack PrefixRouting-default-Observability: nothing "
                            "watches the engine's hit rate")
    assert check.fix == ("redeploy the observability stack: npx cdk deploy PrefixRouting-default-Observability "
                         "-c stage=default")


def test_the_engines_alarm_in_the_stack_but_not_in_cloudwatch_is_a_failure():
    check = check_engine_metrics(ENGINE_ALARM, IC, True, None, CONFIG)
    assert check.status == FAIL and check.detail.startswith(f"alarm {ENGINE_ALARM} is not in CloudWatch")


def test_a_stage_without_the_engines_metrics_has_no_such_line():
    lmi = load_stage("trust-domains")
    assert not lmi.engine_hit_rate_published
    from prefix_routing.verify import monitoring

    class Client:
        def __init__(self, **answers):
            self.answers = answers

        def __getattr__(self, name):
            return lambda **_: self.answers[name]

    checks = monitoring.check_monitoring(Client(list_stack_resources={"StackResourceSummaries": []}),
                                         Client(get_dashboard={"DashboardBody": '{"widgets": []}'}), lmi)
    assert [c.title for c in checks] == [f"dashboard {lmi.dashboard_name}"]


def test_a_promql_alarm_without_data_after_traffic_is_a_question_not_a_failure():
    # No classic metric to blame: the engine hit-rate alarm reads OpenTelemetry metrics.
    responses = healthy()
    name = f"{IC}-engine-hit-rate"
    responses["cloudformation"]["list_stack_resources"][0]["StackResourceSummaries"].append(
        {**responses["cloudformation"]["list_stack_resources"][0]["StackResourceSummaries"][0],
         "LogicalResourceId": "AlarmEngine", "PhysicalResourceId": name})
    responses["cloudwatch"]["describe_alarms"][0]["MetricAlarms"].append(
        {**_engine_alarm(responses), "AlarmName": name, "StateValue": "INSUFFICIENT_DATA"})
    expected = fixtures.EXPECTED_PARAMS[("cloudwatch", "describe_alarms")]
    fixtures.EXPECTED_PARAMS[("cloudwatch", "describe_alarms")] = [{"AlarmNames": [*fixtures.ALARMS, name]}]
    try:
        checks = run(responses)
    finally:
        fixtures.EXPECTED_PARAMS[("cloudwatch", "describe_alarms")] = expected
    assert by_title(checks, f"alarm {name}").status == UNKNOWN and exit_status(checks) == 0
