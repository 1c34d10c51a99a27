"""The benchmark job's role: made only when the stage sets [benchmark] s3_uri and names no role, allowed to
read the workloads' prefix, write the results' prefix and invoke this endpoint, and nothing else; cdk-nag
clean with its two S3 wildcards acknowledged, with a reason, on its own policy."""

from __future__ import annotations

import json

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Template

from prefix_routing.stage.benchmark import BenchmarkSettings
from stacks.app_builder import add_security_checks
from stacks.constructs.benchmark_role import BenchmarkRole
from stacks.endpoint_stack import EndpointStack
from tests.stacks.conftest import CDK_CONTEXT, findings, nag_report, stage_with

BUCKET = "acme-bench"
ENDPOINT = "arn:aws:sagemaker:us-east-1:111122223333:endpoint/ep-test"
COMPONENT = "arn:aws:sagemaker:us-east-1:111122223333:inference-component/ic-test"
SECRET = "arn:aws:secretsmanager:us-east-1:111122223333:secret:hf-token-AbCdEf"
ROLE = "arn:aws:iam::111122223333:role/my-benchmark-role"


def _plain(value):
    """A template value with the partition's Fn::Join written out as ``${AWS::Partition}``."""
    if isinstance(value, dict) and set(value) == {"Fn::Join"}:
        sep, parts = value["Fn::Join"]
        return sep.join("${AWS::Partition}" if part == {"Ref": "AWS::Partition"} else part for part in parts)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _role(**settings):
    stack = Stack(App(), "Bench")
    construct = BenchmarkRole(stack, "B", settings=BenchmarkSettings(**settings), endpoint_arn=ENDPOINT,
                              component_arns=[COMPONENT])
    resources = Template.from_stack(stack).to_json()["Resources"]
    (role,) = [r for r in resources.values() if r["Type"] == "AWS::IAM::Role"]
    (policy,) = [r for r in resources.values() if r["Type"] == "AWS::IAM::Policy"]
    return construct, role["Properties"], _plain(policy["Properties"]["PolicyDocument"]["Statement"])


READ_WORKLOADS = {"Action": "s3:GetObject", "Effect": "Allow",
                  "Resource": f"arn:${{AWS::Partition}}:s3:::{BUCKET}/runs/workloads/*"}
LIST_WORKLOADS = {"Action": "s3:ListBucket", "Effect": "Allow", "Resource": f"arn:${{AWS::Partition}}:s3:::{BUCKET}",
                  "Condition": {"StringLike": {"s3:prefix": ["runs/workloads/*"]}}}
WRITE_RESULTS = {"Action": ["s3:AbortMultipartUpload", "s3:PutObject"], "Effect": "Allow",
                 "Resource": f"arn:${{AWS::Partition}}:s3:::{BUCKET}/runs/results/*"}
INVOKE = {"Action": ["sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream"], "Effect": "Allow",
          "Resource": [ENDPOINT, COMPONENT]}


#: SageMaker's OpenAI-compatible path authorizes a bearer token with this action, which takes no resource type.
BEARER_TOKEN = {"Action": "sagemaker:CallWithBearerToken", "Effect": "Allow", "Resource": "*"}


def test_the_role_reads_the_workloads_writes_the_results_and_invokes_the_endpoint_only():
    _, role, statements = _role(s3_uri=f"s3://{BUCKET}/runs/")
    assert role["AssumeRolePolicyDocument"]["Statement"] == [
        {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}}]
    assert "ManagedPolicyArns" not in role and "Policies" not in role
    assert statements == [READ_WORKLOADS, LIST_WORKLOADS, WRITE_RESULTS, INVOKE, BEARER_TOKEN]


def test_a_gated_tokenizers_secret_is_the_one_secret_it_may_read():
    _, _, statements = _role(s3_uri=f"s3://{BUCKET}/runs/", hf_token_secret_arn=SECRET)
    assert statements == [READ_WORKLOADS, LIST_WORKLOADS, WRITE_RESULTS, INVOKE, BEARER_TOKEN,
                          {"Action": "secretsmanager:GetSecretValue", "Effect": "Allow", "Resource": SECRET}]


def test_at_the_buckets_root_the_folders_are_at_the_root():
    _, _, statements = _role(s3_uri=f"s3://{BUCKET}/")
    assert [s["Resource"] for s in statements[:3]] == [f"arn:${{AWS::Partition}}:s3:::{BUCKET}/workloads/*",
                                                       f"arn:${{AWS::Partition}}:s3:::{BUCKET}",
                                                       f"arn:${{AWS::Partition}}:s3:::{BUCKET}/results/*"]
    assert statements[1]["Condition"] == {"StringLike": {"s3:prefix": ["workloads/*"]}}


def test_no_s3_uri_no_role():
    with pytest.raises(ValueError, match=r"BenchmarkRole needs \[benchmark\] s3_uri"):
        _role()


def _endpoint_stack(**benchmark):
    """The Endpoint stack alone (no Lambda bundling), with the app's security checks."""
    app = App(context=CDK_CONTEXT)
    stack = EndpointStack(app, "PrefixRouting-default-Endpoint", config=stage_with(benchmark=benchmark))
    add_security_checks(app)
    app.synth()
    return stack, Template.from_stack(stack).to_json()


def test_a_stage_with_benchmark_gets_the_role_its_output_and_no_unacknowledged_finding():
    stack, template = _endpoint_stack(s3_uri=f"s3://{BUCKET}/runs/")
    roles = [k for k, r in template["Resources"].items() if r["Type"] == "AWS::IAM::Role" and k.startswith("Benchmark")]
    assert len(roles) == 1
    assert template["Outputs"]["BenchmarkRoleArn"]["Value"] == {"Fn::GetAtt": [roles[0], "Arn"]}
    report = nag_report(stack)
    assert report["conclusion"] == "success" and report["violations"] == []
    policy = "PrefixRouting-default-Endpoint/Benchmark/Role/DefaultPolicy/Resource"
    ours = {f for f in findings(report["suppressedViolations"]) if f[1] == policy}
    assert ours == {
        (f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{BUCKET}/runs/workloads/*]", policy),
        (f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{BUCKET}/runs/results/*]", policy),
        ("AwsSolutions-IAM5[Resource::*]", policy),  # CallWithBearerToken, which takes no resource type
    }
    reasons = {e["reason"] for e in report["suppressedViolations"]
               if any(c["constructPath"] == policy for c in e["violatingConstructs"])}
    assert len(reasons) == 2 and all(len(reason.split()) >= 5 for reason in reasons)


@pytest.mark.parametrize("benchmark", [{}, {"s3_uri": f"s3://{BUCKET}/runs/", "role_arn": ROLE}],
                         ids=["no [benchmark]", "a role of its own"])
def test_no_role_without_s3_uri_or_with_a_role_of_the_stages_own(benchmark):
    _, template = _endpoint_stack(**benchmark)
    assert not [k for k in template["Resources"] if k.startswith("Benchmark")]
    assert "BenchmarkRoleArn" not in template["Outputs"]
    assert ROLE not in json.dumps(template)  # the stage's own role is the command's to use, not the stack's
