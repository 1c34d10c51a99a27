"""cdk-nag runs in synth: a finding nobody acknowledged fails it, and every acknowledgement is
scoped to the exact finding on the exact resource it excuses, with a reason."""

import re

import pytest
from aws_cdk import App, CfnResource, Stack, Stage, aws_iam as iam
from aws_cdk.assertions import Annotations, Match

from prefix_routing.stage.config import load_stage
from stacks.app_builder import add_security_checks, build_stage
from tests.stacks.conftest import CDK_CONTEXT, findings, nag_report

ACKNOWLEDGED = "aws:cdk:acknowledged-rules"  # aws_cdk.Validations.ACKNOWLEDGED_RULES_METADATA_KEY
ENDPOINT = "PrefixRouting-default-Endpoint"
EXECUTION_POLICY = f"{ENDPOINT}/Inference/ExecutionRole/DefaultPolicy/Resource"
TENANT_KEY = "PrefixRouting-default-Normalizer/Normalizer/TenantKey"
LOGS = "Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:"
# What the default stage acknowledges, and where: the execution role's policy (wildcards that AWS
# allows no narrower) and the tenant key (rotated by hand).
ADVISOR_POLICY = "PrefixRouting-default-Observability/Advisor/Role/DefaultPolicy/Resource"
EXPECTED_SUPPRESSED_IAM5 = {
    ("AwsSolutions-IAM5[Resource::*]", EXECUTION_POLICY),
    # The advisor: PutMetricData has no resource type (a namespace condition scopes it); KMS data
    # keys of the encrypted alarm topic it publishes to.
    ("AwsSolutions-IAM5[Resource::*]", ADVISOR_POLICY),
    ("AwsSolutions-IAM5[Action::kms:GenerateDataKey*]", ADVISOR_POLICY),
    (f"AwsSolutions-IAM5[{LOGS}/aws/sagemaker/Endpoints/default-prefix-llm:*]", EXECUTION_POLICY),
    (f"AwsSolutions-IAM5[{LOGS}/aws/sagemaker/InferenceComponents/default-prefix-llm-ic:*]", EXECUTION_POLICY),
}
EXPECTED_ACKNOWLEDGEMENTS = EXPECTED_SUPPRESSED_IAM5 | {("AwsSolutions-SMG4", TENANT_KEY)}


def _acknowledgements(root):
    """[(construct, rule id without its namespace, reason)] of every acknowledgement in the tree."""
    found = []
    for construct in root.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == ACKNOWLEDGED:
                for qualified_id, reason in entry.data.items():
                    # CDK stores "AwsSolutions::AwsSolutions-IAM5[...]" or "Annotation::AwsSolutions-SMG4".
                    found.append((construct, re.sub(r"^[A-Za-z-]+::", "", qualified_id), reason))
    return found


def test_default_stage_has_no_unacknowledged_finding(default_stage):
    stacks, _ = default_stage
    report = nag_report(stacks)
    assert report["conclusion"] == "success"
    assert report["violations"] == []  # no error and no warning left unacknowledged
    # The checks really ran: what they found is exactly what the stage acknowledges, each
    # acknowledged on the policy it was found in (not on its role, stack or app).
    suppressed = report["suppressedViolations"]
    assert findings(suppressed) == EXPECTED_SUPPRESSED_IAM5
    assert {entry["acknowledgedAt"] for entry in suppressed} == {EXECUTION_POLICY, ADVISOR_POLICY}
    assert all(entry["reason"].strip() for entry in suppressed)
    for stack in (stacks.endpoint, stacks.normalizer, stacks.observability):
        annotations = Annotations.from_stack(stack)
        assert annotations.find_error("*", Match.any_value()) == []
        assert annotations.find_warning("*", Match.any_value()) == []


def test_every_acknowledgement_is_the_expected_one_with_a_reason(default_stage):
    stacks, _ = default_stage
    acknowledgements = _acknowledgements(stacks.endpoint.node.root)
    assert {(rule, construct.node.path) for construct, rule, _ in acknowledgements} == EXPECTED_ACKNOWLEDGEMENTS
    for construct, rule, reason in acknowledgements:
        assert reason and reason.strip(), (construct.node.path, rule)
        assert len(reason.split()) >= 5, (construct.node.path, rule, reason)  # a reason, not a placeholder
        # Never on a whole stack or app: that would excuse the same finding on every resource in it.
        assert not Stack.is_stack(construct) and not Stage.is_stage(construct), (construct.node.path, rule)


def test_iam5_acknowledgements_name_exact_findings_on_one_policy(default_stage):
    stacks, _ = default_stage
    iam5 = [(c, rule) for c, rule, _ in _acknowledgements(stacks.endpoint.node.root) if "IAM5" in rule]
    assert iam5
    for construct, rule in iam5:
        assert re.fullmatch(r"AwsSolutions-IAM5\[(Resource|Action)::.+\]", rule), rule  # a finding, not the rule
        assert CfnResource.is_cfn_resource(construct), construct.node.path
        assert construct.cfn_resource_type == "AWS::IAM::Policy", construct.node.path


def _synth_failing(app):
    add_security_checks(app)
    with pytest.raises(RuntimeError, match=r"ValidationFailed"):
        app.synth()
    report = nag_report(app)
    assert report["conclusion"] == "failure"
    return report


def test_an_injected_wildcard_policy_fails_synth():
    app = App(context=CDK_CONTEXT)
    stacks = build_stage(app, load_stage())
    stacks.normalizer.normalizer.role.add_to_policy(iam.PolicyStatement(actions=["sagemaker:*"], resources=["*"]))
    report = _synth_failing(app)
    policy = "PrefixRouting-default-Normalizer/Normalizer/Role/DefaultPolicy/Resource"
    assert findings(report["violations"]) == {
        ("AwsSolutions-IAM5[Resource::*]", policy), ("AwsSolutions-IAM5[Action::sagemaker:*]", policy)
    }


def test_a_wildcard_in_a_new_role_of_the_endpoint_stack_fails_synth():
    # The execution role's Resource::* is acknowledged; the same finding on another role of the same
    # stack must not be (it would be, were the acknowledgement on the stack instead of the policy).
    app = App(context=CDK_CONTEXT)
    stacks = build_stage(app, load_stage())
    role = iam.Role(stacks.endpoint, "InjectedRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    role.add_to_policy(iam.PolicyStatement(actions=["cloudwatch:PutMetricData"], resources=["*"]))
    report = _synth_failing(app)
    assert findings(report["violations"]) == {
        ("AwsSolutions-IAM5[Resource::*]", f"{ENDPOINT}/InjectedRole/DefaultPolicy/Resource")
    }
    assert findings(report["suppressedViolations"]) == EXPECTED_SUPPRESSED_IAM5  # the execution role's stay excused


def test_a_new_wildcard_in_the_acknowledged_policy_still_fails_synth():
    app = App(context=CDK_CONTEXT)
    stacks = build_stage(app, load_stage())
    stacks.endpoint.endpoint.role.add_to_policy(
        iam.PolicyStatement(actions=["s3:GetObject"], resources=["arn:aws:s3:::someone-elses-bucket/*"])
    )
    report = _synth_failing(app)
    assert findings(report["violations"]) == {
        ("AwsSolutions-IAM5[Resource::arn:aws:s3:::someone-elses-bucket/*]", EXECUTION_POLICY)
    }


def test_an_unrelated_stack_with_a_wildcard_role_fails_too():
    app = App(context=CDK_CONTEXT)
    stack = Stack(app, "Injected")
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=["*"]))
    report = _synth_failing(app)
    assert findings(report["violations"]) == {
        ("AwsSolutions-IAM5[Resource::*]", "Injected/Role/DefaultPolicy/Resource")
    }
