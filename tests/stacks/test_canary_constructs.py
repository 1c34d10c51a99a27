"""The isolation canary's constructs in a bare stack (no stage synth, no asset): what mutation testing
meets. The function's settings, environment, role and schedule, and the two alarms' every field."""

from __future__ import annotations

from aws_cdk import App, Stack
from aws_cdk import aws_lambda as lambda_, aws_secretsmanager as secretsmanager, aws_sns as sns
from aws_cdk.assertions import Template

from stacks.constructs.canary_alarms import CanaryAlarms
from stacks.constructs.isolation_canary import IsolationCanary
from tests.stacks.conftest import stage_with

ENDPOINT = "arn:aws:sagemaker:us-east-1:111122223333:endpoint/ep"
COMPONENTS = ["arn:aws:sagemaker:us-east-1:111122223333:inference-component/ic-a",
              "arn:aws:sagemaker:us-east-1:111122223333:inference-component/ic-b"]


def _resources(stack) -> dict:
    return Template.from_stack(stack).to_json()["Resources"]


def _only(resources: dict, kind: str) -> tuple[str, dict]:
    (found,) = [(name, r["Properties"]) for name, r in resources.items() if r["Type"] == kind]
    return found


def test_the_canary_function_role_and_schedule():
    stack = Stack(App(), "S")
    secret = secretsmanager.Secret(stack, "Key")
    config = stage_with(canary={"enabled": True, "every_minutes": 15, "prompt_tokens": 512},
                        normalizer={"log_retention_days": 14}, limits={"requests_per_minute": 60})
    canary = IsolationCanary(stack, "C", config=config, tenant_key=secret, endpoint_arn=ENDPOINT,
                             component_arns=COMPONENTS, code=lambda_.Code.from_inline("def handler(e, c): pass"))
    resources = _resources(stack)
    (secret_id,) = [n for n, r in resources.items() if r["Type"] == "AWS::SecretsManager::Secret"]
    _, function = _only(resources, "AWS::Lambda::Function")
    assert (function["Runtime"], function["Architectures"], function["Handler"], function["MemorySize"],
            function["Timeout"], function["ReservedConcurrentExecutions"]) == (
        "python3.14", ["arm64"], "handler.handler", 256, 300, 1)
    env = function["Environment"]["Variables"]
    assert (env["CANARY_PROMPT_TOKENS"], env["CANARY_SALTED"], env["TENANT_KEY_SECRET_ARN"]) == (
        "512", "true", {"Ref": secret_id})
    assert (env["ENDPOINT_NAME"], env["INFERENCE_COMPONENT_NAME"], env["REPLICATION_STEERING"]) == (
        config.endpoint_name, config.component_name, "false")
    assert "LIMITS" not in env
    log_id, log = _only(resources, "AWS::Logs::LogGroup")
    assert log["RetentionInDays"] == 14 and resources[log_id]["DeletionPolicy"] == "Delete"
    _, policy = _only(resources, "AWS::IAM::Policy")
    assert policy["PolicyDocument"]["Statement"] == [
        {"Action": ["logs:CreateLogStream", "logs:PutLogEvents"], "Effect": "Allow",
         "Resource": {"Fn::GetAtt": [log_id, "Arn"]}},
        {"Action": "sagemaker:InvokeEndpoint", "Effect": "Allow", "Resource": [ENDPOINT, *COMPONENTS]},
        {"Action": "secretsmanager:GetSecretValue", "Effect": "Allow", "Resource": {"Ref": secret_id}},
    ]
    _, role = _only(resources, "AWS::IAM::Role")
    assert role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "lambda.amazonaws.com"}
    _, rule = _only(resources, "AWS::Events::Rule")
    assert rule["ScheduleExpression"] == "rate(15 minutes)"
    assert rule["Targets"][0]["RetryPolicy"] == {"MaximumRetryAttempts": 0}
    assert f"stage {config.name}" in rule["Description"]
    assert canary.function and canary.role and canary.log_group and canary.schedule


def test_the_two_alarms_of_a_component():
    stack = Stack(App(), "S")
    topic = sns.Topic(stack, "Topic")
    alarms = CanaryAlarms(stack, "A", component_name="ic-a", every_minutes=20, topic=topic)
    resources = _resources(stack)
    (topic_id,) = [n for n, r in resources.items() if r["Type"] == "AWS::SNS::Topic"]
    found = {r["Properties"]["AlarmName"]: r["Properties"] for r in resources.values()
             if r["Type"] == "AWS::CloudWatch::Alarm"}
    assert set(found) == {"ic-a-canary-isolation-breach", "ic-a-canary-cache-cold"}
    for name, metric, runs in (("ic-a-canary-isolation-breach", "CanaryIsolationBreach", 1),
                               ("ic-a-canary-cache-cold", "CanaryCacheCold", 2)):
        alarm = found[name]
        assert {k: alarm[k] for k in ("MetricName", "Namespace", "Dimensions", "Statistic", "Period", "Threshold",
                                      "ComparisonOperator", "EvaluationPeriods", "DatapointsToAlarm",
                                      "TreatMissingData", "AlarmActions", "OKActions")} == {
            "MetricName": metric, "Namespace": "PrefixRouting",
            "Dimensions": [{"Name": "InferenceComponent", "Value": "ic-a"}], "Statistic": "Maximum",
            "Period": 1200, "Threshold": 1, "ComparisonOperator": "GreaterThanOrEqualToThreshold",
            "EvaluationPeriods": runs, "DatapointsToAlarm": runs, "TreatMissingData": "notBreaching",
            "AlarmActions": [{"Ref": topic_id}], "OKActions": [{"Ref": topic_id}]}, name
        assert "ic-a" in alarm["AlarmDescription"] and "every 20 minutes" in alarm["AlarmDescription"]
    assert "2 canary runs in a row" in found["ic-a-canary-cache-cold"]["AlarmDescription"]
    assert "cache_salt" in found["ic-a-canary-isolation-breach"]["AlarmDescription"]
    assert alarms.all == [alarms.isolation_breach, alarms.cache_cold]
