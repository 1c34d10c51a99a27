"""cdk-nag runs in synth: a finding nobody acknowledged fails it."""

import pytest
from aws_cdk import App, Stack, aws_iam as iam

from tests.stacks.conftest import CDK_CONTEXT
from prefix_routing.config import load_stage
from stacks.app_builder import add_security_checks, build_stage


def test_default_stage_has_no_unacknowledged_finding(default_stage):
    stacks, _ = default_stage  # the fixture synthesized with the checks on: reaching here means it passed
    assert stacks.endpoint.node.root is not None


def test_an_injected_wildcard_policy_fails_synth():
    app = App(context=CDK_CONTEXT)
    stacks = build_stage(app, load_stage())
    stacks.normalizer.normalizer.role.add_to_policy(iam.PolicyStatement(actions=["sagemaker:*"], resources=["*"]))
    add_security_checks(app)
    with pytest.raises(RuntimeError, match=r"(?s)ValidationFailed: .*AwsSolutions-IAM5\[Resource::\*\]"):
        app.synth()


def test_an_unrelated_stack_with_a_wildcard_role_fails_too():
    app = App(context=CDK_CONTEXT)
    stack = Stack(app, "Injected")
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=["*"]))
    add_security_checks(app)
    with pytest.raises(RuntimeError, match=r"(?s)ValidationFailed: .*AwsSolutions-IAM5\[Resource::\*\]"):
        app.synth()
