import json

import pytest

from prefix_routing.stage.config import ENVIRONMENT_MAX_ENTRIES, STACK_ENVIRONMENT_ENTRIES, load_stage
from stacks.constructs.inference_endpoint import container_environment
from tests.stacks.conftest import stage_with, synth


def _only(template, resource_type):
    resources = template.find_resources(resource_type)
    assert len(resources) == 1, resources
    return next(iter(resources.values()))["Properties"]


def test_prefix_aware_routing_with_configured_length_and_threshold(default_templates):
    config = load_stage()
    variant = _only(default_templates["endpoint"], "AWS::SageMaker::EndpointConfig")["ProductionVariants"][0]
    assert variant["RoutingConfig"] == {
        "RoutingStrategy": "PREFIX_AWARE",
        "PrefixAwareRoutingConfig": {
            "PrefixLength": config.routing.prefix_length,
            "ConcurrencyThreshold": config.routing.concurrency_threshold,
        },
    }
    assert "ModelName" not in variant  # inference components name the model


def test_endpoint_config_has_no_fixed_name_and_uses_enhanced_metrics_and_kms(default_templates):
    props = _only(default_templates["endpoint"], "AWS::SageMaker::EndpointConfig")
    assert "EndpointConfigName" not in props
    assert props["MetricsConfig"] == {
        "EnableEnhancedMetrics": True,
        "MetricPublishFrequencyInSeconds": 10,
        "EnableDetailedObservability": True,  # a vLLM stage: the engine's own hit rate
    }
    key_id, attribute = props["KmsKeyId"]["Fn::GetAtt"]
    assert attribute == "Arn"
    keys = default_templates["endpoint"].find_resources("AWS::KMS::Key")
    assert keys[key_id]["Properties"]["EnableKeyRotation"] is True
    assert "ExecutionRoleArn" in props


def test_managed_instance_scaling_follows_config(default_templates):
    config = load_stage()
    variant = _only(default_templates["endpoint"], "AWS::SageMaker::EndpointConfig")["ProductionVariants"][0]
    scaling = variant["ManagedInstanceScaling"]
    assert scaling["Status"] == "ENABLED"
    assert scaling["MinInstanceCount"] == config.endpoint.instances_min
    assert scaling["MaxInstanceCount"] == config.endpoint.instances_max
    assert scaling["ScaleInPolicy"]["Strategy"] == config.endpoint.scale_in_strategy


def test_component_has_explicit_name_and_compute_requirements(default_templates):
    config = load_stage()
    props = _only(default_templates["endpoint"], "AWS::SageMaker::InferenceComponent")
    assert props["InferenceComponentName"] == config.component_name
    requirements = props["Specification"]["ComputeResourceRequirements"]
    assert requirements == {
        "NumberOfAcceleratorDevicesRequired": config.model.accelerators_per_copy,
        "MinMemoryRequiredInMb": config.model.memory_per_copy_mb,
    }
    assert props["RuntimeConfig"]["CopyCount"] == max(1, config.endpoint.copies_min)


def test_endpoint_name_is_fixed_and_config_is_referenced(default_templates):
    props = _only(default_templates["endpoint"], "AWS::SageMaker::Endpoint")
    assert props["EndpointName"] == load_stage().endpoint_name
    assert "Fn::GetAtt" in props["EndpointConfigName"]


def test_image_comes_from_the_regional_dlc_account_fact(default_templates):
    container = _only(default_templates["endpoint"], "AWS::SageMaker::Model")["PrimaryContainer"]
    image = container["Image"]["Fn::Join"][1]
    assert any(isinstance(part, dict) and "Fn::FindInMap" in part for part in image), image
    assert image[-1].endswith("/vllm:server-sagemaker-cuda-v1")
    assert container["Environment"]["SM_VLLM_ENABLE_PREFIX_CACHING"] == "true"
    assert container["Environment"]["SM_VLLM_ENABLE_PROMPT_TOKENS_DETAILS"] == "true"


@pytest.mark.parametrize(
    "framework, expected",
    [
        ("vllm", {"SM_VLLM_TENSOR_PARALLEL_SIZE": "8", "SM_VLLM_ENABLE_PREFIX_CACHING": "true"}),
        ("djl-lmi", {"OPTION_TENSOR_PARALLEL_DEGREE": "8", "OPTION_ENABLE_PREFIX_CACHING": "true"}),
    ],
)
def test_container_environment_per_framework(framework, expected):
    config = stage_with(model={"framework": framework, "tensor_parallel_degree": 8, "accelerators_per_copy": 8,
                               "environment": {"EXTRA": "1"}}, endpoint={"instance_type": "ml.p5.48xlarge"})
    env = container_environment(config.model)
    assert expected.items() <= env.items()
    assert env["EXTRA"] == "1"
    # LMI drops vLLM's frontend flag: asking for it would only suggest cached tokens that never come.
    assert ("OPTION_ENABLE_PROMPT_TOKENS_DETAILS" in env) is False
    assert config.model.reports_cached_tokens is (framework == "vllm")


@pytest.mark.parametrize("framework", ["vllm", "djl-lmi"])
def test_the_most_variables_a_stage_may_add_fit_sagemakers_environment_map(framework):
    """CreateModel takes at most 100 environment variables (botocore's EnvironmentMap): the stage's own
    bound leaves room for the ones the stack sets."""
    most = ENVIRONMENT_MAX_ENTRIES - STACK_ENVIRONMENT_ENTRIES
    config = stage_with(model={"framework": framework, "environment": {f"EXTRA_{i}": "1" for i in range(most)}})
    env = container_environment(config.model)
    assert ENVIRONMENT_MAX_ENTRIES == 100 and len(env) <= 100
    assert len(env) - most <= STACK_ENVIRONMENT_ENTRIES


def test_put_metric_data_only_to_sagemaker_container_namespaces(default_templates):
    statements = [
        s
        for policy in default_templates["endpoint"].find_resources("AWS::IAM::Policy").values()
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
        if s["Action"] == "cloudwatch:PutMetricData"
    ]
    (statement,) = statements
    # "AWS/..." namespaces are reserved for AWS services: listing one would be dead weight.
    assert statement["Condition"] == {"StringLike": {"cloudwatch:namespace": ["/aws/sagemaker/*"]}}


def test_execution_role_reads_only_the_model_prefix_and_pulls_only_its_image():
    config = stage_with(model={"model_id": None, "model_s3_uri": "s3://my-weights/llama/8b/"})
    _, templates = synth(config)
    statements = [
        s
        for policy in templates["endpoint"].find_resources("AWS::IAM::Policy").values()
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    by_action = {}
    for statement in statements:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        for action in actions:
            by_action[action] = statement["Resource"]
    assert by_action["s3:GetObject"] == {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":s3:::my-weights/llama/8b/*"]]}
    assert "s3:PutObject" not in by_action
    ecr = by_action["ecr:BatchGetImage"]
    assert "repository/vllm" in str(ecr)
    assert by_action["ecr:GetAuthorizationToken"] == "*"  # no resource-level permissions exist
    model = next(iter(templates["endpoint"].find_resources("AWS::SageMaker::Model").values()))["Properties"]
    assert model["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]["S3Uri"] == "s3://my-weights/llama/8b/"
    assert model["PrimaryContainer"]["Environment"]["SM_VLLM_MODEL"] == "/opt/ml/model"


def test_random_strategy_has_no_prefix_settings():
    _, templates = synth(stage_with(routing={"strategy": "RANDOM", "prefix_length": None, "concurrency_threshold": None}))
    variant = _only(templates["endpoint"], "AWS::SageMaker::EndpointConfig")["ProductionVariants"][0]
    assert variant["RoutingConfig"] == {"RoutingStrategy": "RANDOM"}


def test_the_default_stage_serves_with_two_copies_at_rest(default_templates):
    """PREFIX_AWARE needs two or more instances or copies: the default has both from the start."""
    (config,) = default_templates["endpoint"].find_resources("AWS::SageMaker::EndpointConfig").values()
    (variant,) = config["Properties"]["ProductionVariants"]
    assert variant["InitialInstanceCount"] >= 2
    assert variant["ManagedInstanceScaling"]["MinInstanceCount"] >= 2
    (component,) = default_templates["endpoint"].find_resources("AWS::SageMaker::InferenceComponent").values()
    assert component["Properties"]["RuntimeConfig"]["CopyCount"] >= 2


def test_a_whole_bucket_of_weights_is_acknowledged_as_such():
    """s3://<bucket>/ grants every object of the bucket: the acknowledgement must say so, not "its prefix"."""
    from tests.stacks.conftest import nag_report

    stacks, templates = synth(stage_with(model={"model_id": None, "model_s3_uri": "s3://my-weights/"}))
    statements = [s for p in templates["endpoint"].find_resources("AWS::IAM::Policy").values()
                  for s in p["Properties"]["PolicyDocument"]["Statement"] if s["Action"] == "s3:GetObject"]
    assert statements[0]["Resource"] == {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":s3:::my-weights/*"]]}
    reasons = {entry.get("suppressionReason") or entry.get("reason") or json.dumps(entry)
               for entry in nag_report(stacks)["suppressedViolations"] if "s3:::my-weights" in json.dumps(entry)}
    assert reasons and all("whole bucket" in reason for reason in reasons), reasons
