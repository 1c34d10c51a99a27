"""A healthy deployment of the default stage, as AWS would describe it, served by botocore Stubbers.

Every response is checked by Stubber against the installed service models, and every request's
parameters against what verify must ask. Tests change one piece to make one failure.
"""

from __future__ import annotations

import copy
import datetime
import json

import boto3
import pytest
from botocore.stub import ANY, Stubber

from prefix_routing.stage.config import load_stage
from prefix_routing.verify import Clients

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.timezone.utc)
ACCOUNT = "111122223333"
REGION = "us-east-1"
CONFIG = load_stage()
EP, IC = CONFIG.endpoint_name, CONFIG.component_name
IMAGE = f"763104351884.dkr.ecr.{REGION}.amazonaws.com/vllm:server-sagemaker-cuda-v1"
FUNCTION = "PrefixRouting-default-Normali-NormalizerFunction-AbC123"
FUNCTION_URL = "https://abc123.lambda-url.us-east-1.on.aws/"
FUNCTION_ARN = f"arn:aws:lambda:{REGION}:111122223333:function:{FUNCTION}"
LOG_GROUP = "/aws/lambda/prefix-routing-default-normalizer"
PER_INSTANCE = ('SELECT MAX(ConcurrentRequestsPerCopy) FROM SCHEMA("AWS/SageMaker", InferenceComponentName, InstanceId) '
                f"WHERE InferenceComponentName = '{IC}' GROUP BY InstanceId ORDER BY MAX() DESC")
REQUESTS_PER_INSTANCE = ('SELECT SUM(Invocations) FROM SCHEMA("AWS/SageMaker", InferenceComponentName, InstanceId) '
                         f"WHERE InferenceComponentName = '{IC}' GROUP BY InstanceId ORDER BY SUM() DESC")
ENGINE_ALARM = f"{IC}-engine-metrics-missing"  # the PromQL alarm on the engine's metrics' absence
ALARMS = ["default-TtftP50-XYZ", "default-Hotspot-XYZ", ENGINE_ALARM]
ENGINE_ABSENT = ('absent({__name__=~"vllm:prefix_cache_queries(_total)?", "aws.sagemaker.inference_component.name"="'
                 f'{IC}"}})')
#: The ListMetrics calls verify makes, in order (the alarms' metrics, then the dashboard's new ones).
METRIC_CALLS = [
    ("PrefixRouting", "TimeToFirstToken", [{"Name": "InferenceComponent", "Value": IC}], {"InferenceComponent"}),
    ("AWS/SageMaker", "ConcurrentRequestsPerCopy", [{"Name": "InferenceComponentName", "Value": IC}],
     {"InferenceComponentName", "InstanceId"}),
    ("AWS/SageMaker", "Invocations", [{"Name": "InferenceComponentName", "Value": IC}], {"InferenceComponentName"}),
    ("AWS/SageMaker", "Invocations", [{"Name": "InferenceComponentName", "Value": IC}],
     {"InferenceComponentName", "InstanceId"}),
]


def _arn(kind: str, name: str) -> str:
    return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:{kind}/{name}"


def healthy() -> dict:
    """Every response of a healthy deployment, by client and operation (lists: one per call)."""
    variant = {
        "VariantName": "AllTraffic", "InstanceType": CONFIG.endpoint.instance_type,
        "InitialInstanceCount": CONFIG.endpoint.instances_min,
        "ManagedInstanceScaling": {"Status": "ENABLED", "MinInstanceCount": CONFIG.endpoint.instances_min,
                                   "MaxInstanceCount": CONFIG.endpoint.instances_max},
        "RoutingConfig": {"RoutingStrategy": "PREFIX_AWARE", "PrefixAwareRoutingConfig": {
            "PrefixLength": CONFIG.routing.prefix_length, "ConcurrencyThreshold": CONFIG.routing.concurrency_threshold}},
    }
    dashboard = {"widgets": [
        {"type": "metric", "properties": {"metrics": [["AWS/SageMaker", "Invocations", "InferenceComponentName", IC,
                                                       {"stat": "Sum"}]]}},
        {"type": "metric", "properties": {"metrics": [[{"expression": REQUESTS_PER_INSTANCE, "id": "e1"}]]}},
    ]}
    ttft = {"AlarmName": ALARMS[0], "StateValue": "OK", "StateReason": "fine", "Namespace": "PrefixRouting",
            "MetricName": "TimeToFirstToken", "Dimensions": [{"Name": "InferenceComponent", "Value": IC}]}
    hotspot = {"AlarmName": ALARMS[1], "StateValue": "OK", "StateReason": "fine",
               "Metrics": [{"Id": "expr_1", "Expression": PER_INSTANCE, "Period": 60}]}
    engine = {"AlarmName": ENGINE_ALARM, "StateValue": "OK", "StateReason": "no contributor breaching",
              "EvaluationCriteria": {"PromQLCriteria": {"Query": ENGINE_ABSENT, "PendingPeriod": 300}},
              "EvaluationInterval": 60}
    return {
        "sagemaker": {
            "describe_endpoint": [{"EndpointName": EP, "EndpointArn": _arn("endpoint", EP),
                                   "EndpointConfigName": "EndpointConfig-1", "EndpointStatus": "InService",
                                   "CreationTime": NOW, "LastModifiedTime": NOW,
                                   "ProductionVariants": [{"VariantName": "AllTraffic", "CurrentInstanceCount": 2,
                                                           "DesiredInstanceCount": 2}]}],
            "describe_endpoint_config": [{"EndpointConfigName": "EndpointConfig-1",
                                          "EndpointConfigArn": _arn("endpoint-config", "endpointconfig-1"),
                                          "ProductionVariants": [variant], "CreationTime": NOW,
                                          "MetricsConfig": {"EnableEnhancedMetrics": True,
                                                            "EnableDetailedObservability": True}}],
            "describe_inference_component": [{
                "InferenceComponentName": IC, "InferenceComponentArn": _arn("inference-component", IC),
                "EndpointName": EP, "EndpointArn": _arn("endpoint", EP), "CreationTime": NOW, "LastModifiedTime": NOW,
                "InferenceComponentStatus": "InService",
                "Specification": {"ModelName": "Model-1", "SchedulingConfig": {
                    "PlacementStrategy": "SPREAD",
                    "AvailabilityZoneBalance": {"EnforcementMode": "PERMISSIVE", "MaxImbalance": 1}}},
                "RuntimeConfig": {"DesiredCopyCount": 2, "CurrentCopyCount": 2, "PlacementStatus": [
                    {"InstanceType": CONFIG.endpoint.instance_type, "CurrentCopyCount": 2}]}}],
            "describe_model": [{"ModelName": "Model-1", "ModelArn": _arn("model", "model-1"), "CreationTime": NOW,
                                "PrimaryContainer": {"Image": IMAGE}}],
        },
        "ecr": {"describe_images": [{"imageDetails": [{"imageDigest": "sha256:" + "a" * 64,
                                                       "imageTags": ["server-sagemaker-cuda-v1"]}]}]},
        "cloudformation": {
            "list_stack_resources": [{"StackResourceSummaries": [
                {"LogicalResourceId": f"Alarm{i}", "PhysicalResourceId": name, "ResourceType": "AWS::CloudWatch::Alarm",
                 "LastUpdatedTimestamp": NOW, "ResourceStatus": "CREATE_COMPLETE"} for i, name in enumerate(ALARMS)]}],
            "describe_stacks": [{"Stacks": [{"StackName": "PrefixRouting-default-Normalizer", "CreationTime": NOW,
                                             "StackStatus": "CREATE_COMPLETE", "Outputs": [
                                                 {"OutputKey": "FunctionName", "OutputValue": FUNCTION},
                                                 {"OutputKey": "FunctionUrl", "OutputValue": FUNCTION_URL}]}]}],
        },
        "cloudwatch": {
            "describe_alarms": [{"MetricAlarms": [ttft, hotspot, engine]}],
            "get_dashboard": [{"DashboardName": CONFIG.dashboard_name, "DashboardBody": json.dumps(dashboard)}],
            "list_metrics": [{"Metrics": [{"Namespace": ns, "MetricName": name, "Dimensions": [
                {"Name": d, "Value": IC if d.startswith("Inference") else "i-0abc"} for d in sorted(dims)]}]}
                for ns, name, _, dims in METRIC_CALLS],
        },
        "lambda_": {"get_function_configuration": [{
            "FunctionName": FUNCTION, "FunctionArn": FUNCTION_ARN, "Runtime": "python3.14", "Architectures": ["arm64"], "Handler": "run.sh",
            "Layers": [{"Arn": f"arn:aws:lambda:{REGION}:753240598075:layer:LambdaAdapterLayerArm64:30"}],
            "LoggingConfig": {"LogGroup": LOG_GROUP},
            "Environment": {"Variables": {"ENDPOINT_NAME": EP, "INFERENCE_COMPONENT_NAME": IC,
                                          "TENANT_KEY_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:1:secret:k",
                                          "AWS_LAMBDA_EXEC_WRAPPER": "/opt/bootstrap",
                                          "AWS_LWA_INVOKE_MODE": "response_stream"}}}]},
        "logs": {},
        "iam": {},
    }


EXPECTED_PARAMS = {
    ("sagemaker", "describe_endpoint"): [{"EndpointName": EP}],
    ("sagemaker", "describe_endpoint_config"): [{"EndpointConfigName": "EndpointConfig-1"}],
    ("sagemaker", "describe_inference_component"): [{"InferenceComponentName": IC}],
    ("sagemaker", "describe_model"): [{"ModelName": "Model-1"}],
    ("ecr", "describe_images"): [{"registryId": "763104351884", "repositoryName": "vllm",
                                  "imageIds": [{"imageTag": "server-sagemaker-cuda-v1"}]}],
    ("cloudformation", "list_stack_resources"): [{"StackName": "PrefixRouting-default-Observability"}],
    ("cloudformation", "describe_stacks"): [{"StackName": "PrefixRouting-default-Normalizer"}],
    ("cloudwatch", "describe_alarms"): [{"AlarmNames": ALARMS}],
    ("cloudwatch", "get_dashboard"): [{"DashboardName": CONFIG.dashboard_name}],
    ("cloudwatch", "list_metrics"): [{"Namespace": ns, "MetricName": name, "Dimensions": filters}
                                     for ns, name, filters, _ in METRIC_CALLS],
    ("lambda_", "get_function_configuration"): [{"FunctionName": FUNCTION}],
}

_SERVICES = {"sagemaker": "sagemaker", "cloudwatch": "cloudwatch", "cloudformation": "cloudformation",
             "lambda_": "lambda", "logs": "logs", "ecr": "ecr", "iam": "iam"}


class Deployment:
    """Stubbed clients answering ``responses``; ``errors[(client, operation)] = code`` fails that call."""

    def __init__(self, responses: dict, errors: dict | None = None, logs: list | None = None):
        self.responses, self.errors, self.log_responses = responses, errors or {}, logs or []
        self.stubbers = []

    def clients(self) -> Clients:
        made = {}
        for attr, service in _SERVICES.items():
            client = boto3.client(service, region_name=REGION)
            stub = Stubber(client)
            for operation, answers in self.responses[attr].items():
                expected = EXPECTED_PARAMS.get((attr, operation), [None] * len(answers))
                for answer, params in zip(answers, expected):
                    code = self.errors.get((attr, operation))
                    if code:
                        stub.add_client_error(operation, service_error_code=code, service_message=f"stubbed {code}",
                                              expected_params=params)
                        break
                    stub.add_response(operation, answer, params)
            if attr == "logs":
                for answer in self.log_responses:
                    stub.add_response("filter_log_events", answer, {"logGroupName": LOG_GROUP, "filterPattern": ANY,
                                                                     "startTime": ANY})
            stub.activate()
            self.stubbers.append(stub)
            made[attr] = client
        return Clients(**made)


@pytest.fixture
def deployment():
    return healthy()


def by_title(checks, prefix: str):
    found = [c for c in checks if c.title.startswith(prefix)]
    assert len(found) == 1, (prefix, [c.title for c in checks])
    return found[0]


def changed(responses: dict, client: str, operation: str, edit) -> dict:
    out = copy.deepcopy(responses)
    edit(out[client][operation][0])
    return out
