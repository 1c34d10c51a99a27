"""The tenants' way in, as IAM enforces it: each role or user the stage names, put to IAM's policy
simulator (verify/function.py ``check_invoke_principals``), with botocore's Stubber for IAM."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from prefix_routing.verify.function import check_invoke_principals
from tests.prefix_routing.verify.conftest import FUNCTION_ARN, REGION

ROLE = "arn:aws:iam::111122223333:role/tenant-acme"
USER = "arn:aws:iam::111122223333:user/batch"
DIRECT = [{"ContextKeyName": "lambda:InvokedViaFunctionUrl", "ContextKeyValues": ["false"], "ContextKeyType": "boolean"}]


def asked(principal: str) -> dict:
    """The one question put for a principal: may it invoke the function with InvokedViaFunctionUrl false?"""
    return {"PolicySourceArn": principal, "ActionNames": ["lambda:InvokeFunction"], "ResourceArns": [FUNCTION_ARN],
            "ContextEntries": DIRECT}


def decision(value: str) -> dict:
    return {"EvaluationResults": [{"EvalActionName": "lambda:InvokeFunction", "EvalResourceName": FUNCTION_ARN,
                                   "EvalDecision": value}]}


@pytest.fixture
def iam():
    client = boto3.client("iam", region_name=REGION)
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


def test_a_principal_held_to_the_url_passes_and_one_that_may_invoke_directly_is_named(iam):
    client, stub = iam
    stub.add_response("simulate_principal_policy", decision("implicitDeny"), asked(ROLE))
    stub.add_response("simulate_principal_policy", decision("allowed"), asked(USER))
    held, open_ = check_invoke_principals(client, [ROLE, USER], FUNCTION_ARN)
    assert (held.status, held.title) == ("ok", f"tenant principal {ROLE}")
    assert "through its Function URL only" in held.detail
    assert (open_.status, open_.title) == ("fail", f"tenant principal {USER}")
    assert "directly" in open_.detail and "TenantInvokePolicy" in open_.fix
    assert "lambda:InvokedViaFunctionUrl = true" in open_.fix


def test_an_explicit_deny_holds_too(iam):
    client, stub = iam
    stub.add_response("simulate_principal_policy", decision("explicitDeny"), asked(ROLE))
    (check,) = check_invoke_principals(client, [ROLE], FUNCTION_ARN)
    assert check.status == "ok"


def test_a_simulator_that_cannot_be_called_and_an_account_are_unknown(iam):
    client, stub = iam
    stub.add_client_error("simulate_principal_policy", service_error_code="AccessDenied",
                          service_message="not allowed", expected_params=asked(ROLE))
    denied, account = check_invoke_principals(client, [ROLE, "444455556666"], FUNCTION_ARN)
    assert denied.status == "unknown" and "AccessDenied" in denied.detail
    assert "iam:SimulatePrincipalPolicy" in denied.fix
    assert account.status == "unknown" and account.title == "tenant principal 444455556666"
    assert "an account" in account.detail and "lambda:InvokedViaFunctionUrl" in account.fix


def test_without_the_functions_arn_nothing_is_asked(iam):
    client, _ = iam
    (check,) = check_invoke_principals(client, [ROLE], None)
    assert check.status == "unknown" and "ARN is unknown" in check.detail
    assert check_invoke_principals(client, [], FUNCTION_ARN) == []


def test_verify_asks_for_every_principal_of_the_stage_with_the_deployed_functions_arn():
    import copy

    from prefix_routing.stage.config import DEFAULT_STAGE_DATA, parse_stage
    from prefix_routing.verify import verify_stage
    from tests.prefix_routing.verify.conftest import Deployment, by_title, healthy

    data = copy.deepcopy(DEFAULT_STAGE_DATA)
    data["normalizer"] = {**data.get("normalizer", {}), "invoke_principals": [ROLE]}
    config = parse_stage(data, source="t")
    responses = healthy()
    responses["iam"]["simulate_principal_policy"] = [decision("allowed")]
    deployment = Deployment(responses)
    checks = verify_stage(config, deployment.clients())
    for stub in deployment.stubbers:
        stub.assert_no_pending_responses()
    assert by_title(checks, f"tenant principal {ROLE}").status == "fail"
