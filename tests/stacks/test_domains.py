"""Two trust domains on one endpoint: a component each (its own copies and autoscaling target), an
alarm set and a dashboard each, and a front door allowed to invoke exactly those components.

Expected values are the literals of DOMAINS below or hand computations from them.
"""

import json

import pytest
from aws_cdk.assertions import Match

from tests.stacks.conftest import nag_report, stage_with, synth

ACME = "arn:aws:iam::111122223333:role/acme"
# The default stage: ml.g6e.xlarge (one copy per instance), 2-3 instances; target 4.0 per copy.
DOMAINS = {"shared": {"copies_min": 1, "copies_max": 2},
           "acme": {"tenants": [ACME], "copies_min": 1, "copies_max": 1, "target_concurrent_requests_per_copy": 2.0}}
SHARED, ACME_IC = "default-shared-ic", "default-acme-ic"  # "<stage>-<domain>-ic"


@pytest.fixture(scope="module")
def stage():
    return stage_with(domains=DOMAINS, tenancy={"default_domain": "shared"})


@pytest.fixture(scope="module")
def synthesized(stage):
    return synth(stage)


def test_one_component_per_domain_with_its_own_initial_copies(synthesized):
    endpoint = synthesized[1]["endpoint"]
    components = endpoint.find_resources("AWS::SageMaker::InferenceComponent")
    by_name = {c["Properties"]["InferenceComponentName"]: c["Properties"] for c in components.values()}
    assert set(by_name) == {SHARED, ACME_IC}
    assert by_name[SHARED]["RuntimeConfig"]["CopyCount"] == 1 and by_name[ACME_IC]["RuntimeConfig"]["CopyCount"] == 1
    endpoint.resource_count_is("AWS::SageMaker::Endpoint", 1)  # one endpoint, shared instances


def test_each_component_scales_within_its_own_bounds_and_target(synthesized):
    endpoint = synthesized[1]["endpoint"]
    targets = endpoint.find_resources("AWS::ApplicationAutoScaling::ScalableTarget")
    bounds = {t["Properties"]["ResourceId"]: (t["Properties"]["MinCapacity"], t["Properties"]["MaxCapacity"])
              for t in targets.values()}
    assert bounds == {f"inference-component/{SHARED}": (1, 2), f"inference-component/{ACME_IC}": (1, 1)}
    policies = endpoint.find_resources("AWS::ApplicationAutoScaling::ScalingPolicy")
    values = sorted(p["Properties"]["TargetTrackingScalingPolicyConfiguration"]["TargetValue"]
                    for p in policies.values() if "TargetTrackingScalingPolicyConfiguration" in p["Properties"])
    assert values == [2.0, 4.0]  # acme's own target, the stage's for shared


def test_the_front_door_may_invoke_exactly_the_two_components_and_knows_whom_each_serves(synthesized, stage):
    normalizer = synthesized[1]["normalizer"]
    policies = normalizer.find_resources("AWS::IAM::Policy")
    invoke = [s for p in policies.values() for s in p["Properties"]["PolicyDocument"]["Statement"]
              if "sagemaker:InvokeEndpoint" in s["Action"]]
    (statement,) = invoke
    text = json.dumps(statement["Resource"])
    assert text.count("inference-component/") == 2
    assert f"inference-component/{SHARED}" in text and f"inference-component/{ACME_IC}" in text
    functions = normalizer.find_resources("AWS::Lambda::Function", {"Properties": {"Environment": Match.any_value()}})
    (env,) = [f["Properties"]["Environment"]["Variables"] for f in functions.values()
              if "DOMAINS" in f["Properties"]["Environment"]["Variables"]]
    assert env["INFERENCE_COMPONENT_NAME"] == SHARED  # the default domain's: callers not yet known
    assert json.loads(env["DOMAINS"]) == {"components": [["shared", SHARED], ["acme", ACME_IC]],
                                          "tenants": [[ACME, "acme"]], "default": "shared"}


def test_an_alarm_set_and_a_dashboard_per_component(synthesized):
    observability = synthesized[1]["observability"]
    dashboards = observability.find_resources("AWS::CloudWatch::Dashboard")
    names = sorted(d["Properties"]["DashboardName"] for d in dashboards.values())
    assert names == ["default-prefix-llm-routing", "default-prefix-llm-routing-acme"]
    alarms = observability.find_resources("AWS::CloudWatch::Alarm")
    text = json.dumps(alarms)
    assert SHARED in text and ACME_IC in text
    per_component = {name: sum(name in json.dumps(a) for a in alarms.values()) for name in (SHARED, ACME_IC)}
    assert per_component[SHARED] == per_component[ACME_IC] > 0


def test_cdk_nag_is_clean_with_two_domains(synthesized):
    assert nag_report(synthesized[0])["violations"] == []


def test_every_component_rolls_back_on_its_own_alarms_which_the_observability_stack_names(synthesized):
    endpoint, observability = synthesized[1]["endpoint"], synthesized[1]["observability"]
    components = endpoint.find_resources("AWS::SageMaker::InferenceComponent")
    names = {a["Properties"].get("AlarmName") for a in observability.find_resources("AWS::CloudWatch::Alarm").values()}
    for component in components.values():
        props = component["Properties"]
        ic = props["InferenceComponentName"]
        if ic == ACME_IC:  # at most one copy: no rolling update (a batch is 5-50 % of the copies)
            assert "DeploymentConfig" not in props
        else:
            rollback = [a["AlarmName"] for a in props["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]]
            assert rollback == [f"{ic}-error-rate", f"{ic}-ttft-p50"]  # "<component>-<alarm>"
            assert set(rollback) <= names
        # The same placement and cache for every component (the endpoint's).
        assert props["Specification"]["SchedulingConfig"]["PlacementStrategy"] == "SPREAD"
        assert props["Specification"]["DataCacheConfig"] == {"EnableCaching": True}
    # Names, not references: no import from the observability stack, which deploys first.
    assert "Fn::ImportValue" not in json.dumps(endpoint.to_json())
    stacks = synthesized[0]
    assert stacks.observability in stacks.endpoint.dependencies
    assert stacks.endpoint not in stacks.observability.dependencies
