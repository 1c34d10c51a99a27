from prefix_routing.stage.config import load_stage
from tests.stacks.conftest import stage_with, synth


def test_scalable_target_names_the_component(default_templates):
    config = load_stage()
    default_templates["endpoint"].has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalableTarget",
        {
            "ServiceNamespace": "sagemaker",
            "ResourceId": f"inference-component/{config.component_name}",
            "ScalableDimension": "sagemaker:inference-component:DesiredCopyCount",
            "MinCapacity": config.endpoint.copies_min,
            "MaxCapacity": config.endpoint.copies_max,
        },
    )


def test_target_tracking_on_concurrent_requests_per_copy(default_templates):
    config = load_stage()
    default_templates["endpoint"].has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalingPolicy",
        {
            "PolicyType": "TargetTrackingScaling",
            "TargetTrackingScalingPolicyConfiguration": {
                "PredefinedMetricSpecification": {
                    "PredefinedMetricType": "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"
                },
                "TargetValue": config.scaling.target_concurrent_requests_per_copy,
            },
        },
    )


def test_no_scale_from_zero_when_min_copies_is_positive(default_templates):
    assert not default_templates["endpoint"].find_resources(
        "AWS::ApplicationAutoScaling::ScalingPolicy", {"Properties": {"PolicyType": "StepScaling"}}
    )
    assert not default_templates["endpoint"].find_resources("AWS::CloudWatch::Alarm")


def test_scale_from_zero_policy_and_alarm_when_min_copies_is_zero():
    config = stage_with(endpoint={"copies_min": 0, "instances_min": 0})
    _, templates = synth(config)
    endpoint = templates["endpoint"]
    policies = endpoint.find_resources("AWS::ApplicationAutoScaling::ScalingPolicy", {"Properties": {"PolicyType": "StepScaling"}})
    assert len(policies) == 1
    policy_id, policy = next(iter(policies.items()))
    step = policy["Properties"]["StepScalingPolicyConfiguration"]
    assert step["AdjustmentType"] == "ChangeInCapacity"
    assert step["StepAdjustments"] == [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]
    alarm = next(iter(endpoint.find_resources("AWS::CloudWatch::Alarm").values()))["Properties"]
    (entry,) = alarm["Metrics"]
    metric = entry["MetricStat"]["Metric"]
    assert metric["MetricName"] == "NoCapacityInvocationFailures" and metric["Namespace"] == "AWS/SageMaker"
    assert metric["Dimensions"] == [{"Name": "InferenceComponentName", "Value": config.component_name}]
    assert entry["MetricStat"]["Stat"] == "Sum" and entry["MetricStat"]["Period"] == 60
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold" and alarm["Threshold"] == 1
    assert alarm["AlarmActions"] == [{"Ref": policy_id}]
    variant = next(iter(endpoint.find_resources("AWS::SageMaker::EndpointConfig").values()))["Properties"]["ProductionVariants"][0]
    assert variant["ManagedInstanceScaling"]["MinInstanceCount"] == 0
