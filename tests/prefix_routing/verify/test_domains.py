"""verify with trust domains: every domain's component is read, each against its own copy bounds,
and the function's DOMAINS must be the stage's."""

from __future__ import annotations

import copy

import boto3
from botocore.stub import Stubber

from prefix_routing.stage.config import DEFAULT_STAGE_DATA, parse_stage
from prefix_routing.verify import deployment
from prefix_routing.verify.report import FAIL, OK
from prefix_routing.verify.function import check_function
from tests.prefix_routing.verify.conftest import NOW, REGION, _arn, healthy

data = copy.deepcopy(DEFAULT_STAGE_DATA)
data["domains"] = {"default": {"copies_min": 1, "copies_max": 2}, "acme": {"tenants": ["acme"], "copies_min": 1,
                                                                          "copies_max": 1}}
CONFIG = parse_stage(data, source="t")
EP = CONFIG.endpoint_name


def described(name: str, current: int) -> dict:
    return {"InferenceComponentName": name, "InferenceComponentArn": _arn("inference-component", name),
            "EndpointName": EP, "EndpointArn": _arn("endpoint", EP), "CreationTime": NOW, "LastModifiedTime": NOW,
            "InferenceComponentStatus": "InService", "Specification": {"ModelName": "Model-1"},
            "RuntimeConfig": {"DesiredCopyCount": current, "CurrentCopyCount": current}}


def test_each_domains_component_is_checked_against_its_own_bounds():
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    stub = Stubber(sagemaker)
    # default allows 1-2 copies (2 serving: fine); acme allows exactly 1 (2 serving: a failure).
    stub.add_response("describe_inference_component", described("default-default-ic", 2),
                      {"InferenceComponentName": "default-default-ic"})
    stub.add_response("describe_inference_component", described("default-acme-ic", 2),
                      {"InferenceComponentName": "default-acme-ic"})
    stub.activate()
    results = [deployment.check_component(sagemaker, CONFIG, plan)[0] for plan in CONFIG.components()]
    stub.assert_no_pending_responses()
    (default_title, default_copies), (acme_title, acme_copies) = results
    assert default_title.title == "inference component default-default-ic (domain default)" and default_title.status == OK
    assert default_copies.status == OK and "allows 1 to 2" in default_copies.detail
    assert acme_title.title == "inference component default-acme-ic (domain acme)"
    assert acme_copies.status == FAIL and "allows 1 to 1" in acme_copies.detail


def _function_checks(variables):
    responses = healthy()
    env = responses["lambda_"]["get_function_configuration"][0]["Environment"]["Variables"]
    env.update(ENDPOINT_NAME=EP, INFERENCE_COMPONENT_NAME="default-default-ic", **variables)
    for key in [k for k, v in variables.items() if v is None]:
        env.pop(key)
    lam, cfn = boto3.client("lambda", region_name=REGION), boto3.client("cloudformation", region_name=REGION)
    stacks = responses["cloudformation"]["describe_stacks"][0]
    stacks["Stacks"][0]["StackName"] = f"{CONFIG.stack_prefix}-Normalizer"
    with Stubber(lam) as lam_stub, Stubber(cfn) as cfn_stub:
        cfn_stub.add_response("describe_stacks", stacks)
        lam_stub.add_response("get_function_configuration", responses["lambda_"]["get_function_configuration"][0])
        checks, _ = check_function(lam, cfn, CONFIG)
    return checks[0]


def test_the_functions_domains_must_be_the_stages():
    assert _function_checks({"DOMAINS": CONFIG.trust_domains().to_json()}).status == OK
    stale = _function_checks({"DOMAINS": None})
    assert stale.status == FAIL and "trust domains (DOMAINS) are not the stage's" in stale.detail


def test_a_component_not_in_service_names_itself_and_what_to_do():
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    creating = {**described("default-acme-ic", 0), "InferenceComponentStatus": "Creating"}
    with Stubber(sagemaker) as stub:
        stub.add_response("describe_inference_component", creating, {"InferenceComponentName": "default-acme-ic"})
        status, _ = deployment.check_component(sagemaker, CONFIG, CONFIG.components()[1])[0]
    assert (status.status, status.title, status.detail) == (FAIL, "inference component default-acme-ic (domain acme)",
                                                             "status Creating")
    assert status.fix == ("wait while it is Creating/Updating; if Failed, read FailureReason (capacity, image pull, "
                          "model load)")
