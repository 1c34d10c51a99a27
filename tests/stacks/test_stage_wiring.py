"""Stage -> template wiring: one stage whose every value differs from the default stage.

The other stack tests compare against the default stage, so a value hard-coded to its default in
the stack code (``prefix_length=4096``) passes them. Here each value of a non-default stage must
appear, literally, exactly where it belongs in the synthesized templates. Expected values are the
literals of ``WIRING`` below (or a hand computation from them, shown), never read back from the
stack code or the config model.
"""

import pytest
from aws_cdk import Stack
from aws_cdk.assertions import Match

from prefix_routing.frontdoor.config import InvokeConfig
from tests.stacks.conftest import findings, nag_report, stage_with, synth

# Default stage, for contrast: prefix_length 4096, concurrency_threshold 10, target 4.0, block_bytes
# 2048, tenancy iam, tenant header x-tenant-id, 512 MB, 120 s, concurrency 50, 30 days, replication
# off / 4 replicas / factor 2.0 / half-life 60 s, alarms 2000 ms / hotspot x2.0 / hit rate 0.3 /
# 1.0 % / 5 periods, 10 s metrics, 1-2 instances and copies, SPREAD / zones within 1 / cache on, rolling
# updates of 1 copy / 600 s bakes / 28800 s.
WIRING = {
    "name": "wiring",
    "endpoint": {"instances_min": 2, "instances_max": 4, "copies_min": 2, "copies_max": 4,
                 "scale_in_strategy": "CONSOLIDATION", "scale_in_cooldown_minutes": 30,
                 "placement": "BINPACK", "az_max_imbalance": 0, "data_cache": False},
    "deployment": {"batch_size": 2, "wait_interval_s": 240, "timeout_s": 3600},
    "routing": {"strategy": "PREFIX_AWARE", "prefix_length": 8192, "concurrency_threshold": 24},
    "metrics": {"publish_frequency_s": 30, "detailed_observability": True},
    "scaling": {"target_concurrent_requests_per_copy": 6.0, "scale_out_cooldown_s": 120, "scale_in_cooldown_s": 600},
    "alarms": {"ttft_p50_ms": 1500.0, "hotspot_factor": 3.0, "minimum_hit_rate": 0.45,
               "error_rate_percent": 2.5, "evaluation_periods": 3},
    "normalizer": {"tenancy": "header", "tenant_header": "x-org-id", "reserved_concurrency": 20,
                   "memory_mb": 1024, "timeout_s": 60, "log_retention_days": 14, "block_bytes": 512,
                   "replication": {"enabled": True, "max_replicas": 6, "target_share_factor": 1.5,
                                   "half_life_s": 45},
                   "allow_direct_invoke": True,
                   "invoke_principals": ["111122223333", "arn:aws:iam::444455556666:role/ChatApp"]},
}
ENDPOINT_NAME = "wiring-prefix-llm"  # "<name>-prefix-llm"
COMPONENT_NAME = "wiring-prefix-llm-ic"


@pytest.fixture(scope="module")
def wiring():
    """(stacks, templates) of the WIRING stage, synthesized once, cdk-nag on."""
    return synth(stage_with(**WIRING))


@pytest.fixture(scope="module")
def templates(wiring):
    return wiring[1]


def _only(template, resource_type):
    resources = template.find_resources(resource_type)
    assert len(resources) == 1, resources
    return next(iter(resources.values()))["Properties"]


# ---------------------------------------------------------------- endpoint config (routing, metrics)


def test_endpoint_config_routing_is_the_stages(templates):
    variants = _only(templates["endpoint"], "AWS::SageMaker::EndpointConfig")["ProductionVariants"]
    assert len(variants) == 1
    assert variants[0]["RoutingConfig"] == {
        "RoutingStrategy": "PREFIX_AWARE",
        "PrefixAwareRoutingConfig": {"PrefixLength": 8192, "ConcurrencyThreshold": 24},
    }
    # Exactly one PrefixAwareRoutingConfig in the stack, and only with the stage's values.
    templates["endpoint"].resource_properties_count_is(
        "AWS::SageMaker::EndpointConfig",
        {"ProductionVariants": [Match.object_like({"RoutingConfig": {
            "RoutingStrategy": "PREFIX_AWARE",
            "PrefixAwareRoutingConfig": Match.object_equals({"PrefixLength": 8192, "ConcurrencyThreshold": 24}),
        }})]},
        1,
    )


def test_endpoint_config_instances_and_metrics_are_the_stages(templates):
    props = _only(templates["endpoint"], "AWS::SageMaker::EndpointConfig")
    (variant,) = props["ProductionVariants"]
    assert variant["InitialInstanceCount"] == 2  # max(1, instances_min=2)
    assert variant["ManagedInstanceScaling"] == {
        "Status": "ENABLED",
        "MinInstanceCount": 2,
        "MaxInstanceCount": 4,
        "ScaleInPolicy": {"Strategy": "CONSOLIDATION", "CooldownInMinutes": 30},
    }
    assert props["MetricsConfig"] == {
        "EnableEnhancedMetrics": True,
        "MetricPublishFrequencyInSeconds": 30,
        "EnableDetailedObservability": True,
    }


def test_component_and_copy_autoscaling_are_the_stages(templates):
    template = templates["endpoint"]
    component = _only(template, "AWS::SageMaker::InferenceComponent")
    assert component["InferenceComponentName"] == COMPONENT_NAME
    assert component["RuntimeConfig"] == {"CopyCount": 2}  # max(1, copies_min=2)
    template.has_resource_properties(
        "AWS::SageMaker::Endpoint", {"EndpointName": ENDPOINT_NAME}
    )
    target = _only(template, "AWS::ApplicationAutoScaling::ScalableTarget")
    assert (target["ResourceId"], target["MinCapacity"], target["MaxCapacity"]) == (
        f"inference-component/{COMPONENT_NAME}", 2, 4
    )
    policy = _only(template, "AWS::ApplicationAutoScaling::ScalingPolicy")["TargetTrackingScalingPolicyConfiguration"]
    assert (policy["TargetValue"], policy["ScaleOutCooldown"], policy["ScaleInCooldown"]) == (6.0, 120, 600)


# ---------------------------------------------------------------- the normalizer Lambda


def _function(templates):
    return _only(templates["normalizer"], "AWS::Lambda::Function")


def test_lambda_environment_carries_the_stages_settings(templates):
    env = _function(templates)["Environment"]["Variables"]
    assert {name: env[name] for name in (
        "ENDPOINT_NAME", "INFERENCE_COMPONENT_NAME", "ROUTING_STRATEGY", "PREFIX_LENGTH", "BLOCK_BYTES",
        "TENANCY", "TENANT_HEADER", "REQUEST_TIMEOUT_S", "UPSTREAM_READ_TIMEOUT_S",
    )} == {
        "ENDPOINT_NAME": ENDPOINT_NAME,
        "INFERENCE_COMPONENT_NAME": COMPONENT_NAME,
        "ROUTING_STRATEGY": "PREFIX_AWARE",
        "PREFIX_LENGTH": "8192",
        "BLOCK_BYTES": "512",
        "TENANCY": "header",
        "TENANT_HEADER": "x-org-id",
        # timeout_s 60 minus the 5 s kept to answer 504 and log; the read waits min(65, 55).
        "REQUEST_TIMEOUT_S": "55",
        "UPSTREAM_READ_TIMEOUT_S": "55",
    }


def test_the_handler_reads_the_stages_settings_back(templates):
    env = _function(templates)["Environment"]["Variables"]
    config = InvokeConfig.from_env({k: v if isinstance(v, str) else "token" for k, v in env.items()})
    assert (config.endpoint_name, config.component_name) == (ENDPOINT_NAME, COMPONENT_NAME)
    assert (config.settings.prefix_length, config.settings.block_bytes) == (8192, 512)
    assert (config.tenancy, config.tenant_header) == ("header", "x-org-id")
    assert config.request_timeout_s == 55


def test_lambda_environment_carries_the_stages_replication_and_copy_bounds(templates):
    env = _function(templates)["Environment"]["Variables"]
    assert {name: env[name] for name in (
        "REPLICATION_ENABLED", "REPLICATION_MAX_REPLICAS", "REPLICATION_TARGET_SHARE_FACTOR",
        "REPLICATION_HALF_LIFE_S", "COPIES_MIN", "COPIES_MAX",
    )} == {
        "REPLICATION_ENABLED": "true",
        "REPLICATION_MAX_REPLICAS": "6",
        "REPLICATION_TARGET_SHARE_FACTOR": "1.5",
        "REPLICATION_HALF_LIFE_S": "45.0",  # the TOML integer 45, written as a number of seconds
        "COPIES_MIN": "2",
        "COPIES_MAX": "4",
    }
    config = InvokeConfig.from_env({k: v if isinstance(v, str) else "token" for k, v in env.items()})
    replication = config.replication
    assert (replication.enabled, replication.max_replicas, replication.target_share_factor,
            replication.half_life_s) == (True, 6, 1.5, 45.0)
    assert (config.copies_min, config.copies_max) == (2, 4)


def test_lambda_sizing_and_log_retention_are_the_stages(templates):
    function = _function(templates)
    assert (function["MemorySize"], function["Timeout"], function["ReservedConcurrentExecutions"]) == (1024, 60, 20)
    assert _only(templates["normalizer"], "AWS::Logs::LogGroup")["RetentionInDays"] == 14


# ---------------------------------------------------------------- alarms


def _alarm(wiring, attribute):
    stacks, templates = wiring
    construct = getattr(stacks.observability.alarms, attribute)
    assert construct is not None, attribute
    logical_id = Stack.of(construct).resolve(construct.node.default_child.logical_id)
    return templates["observability"].to_json()["Resources"][logical_id]["Properties"]


@pytest.mark.parametrize(
    "attribute, threshold",
    [
        ("ttft_p50", 1500),
        ("hit_rate", 0.45),
        # fair share = target_concurrent_requests_per_copy 6.0; 6.0 x hotspot_factor 3.0 = 18.0, below
        # the concurrency_threshold cap of 24, so 18.
        ("hotspot", 18),
        ("pinned_at_threshold", 24),  # routing.concurrency_threshold
        ("error_rate", 2.5),
        ("capacity_failures", 1),  # fixed: the first request that found no copy
    ],
)
def test_alarm_threshold_is_the_stages(wiring, attribute, threshold):
    alarm = _alarm(wiring, attribute)
    assert alarm["Threshold"] == threshold
    assert (alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (3, 3)


def test_exactly_these_alarm_thresholds(templates):
    alarms = templates["observability"].find_resources("AWS::CloudWatch::Alarm").values()
    classic = [a for a in alarms if "EvaluationCriteria" not in a["Properties"]]
    # the stage's five, the capacity failures' 1, and the refused direct invocations' 1 (any one)
    assert sorted(a["Properties"]["Threshold"] for a in classic) == sorted([1500, 0.45, 18, 24, 2.5, 1, 1])


def test_the_engines_promql_alarms_read_the_stages_hit_rate_and_periods(templates):
    alarms = templates["observability"].find_resources("AWS::CloudWatch::Alarm").values()
    promql = {a["Properties"]["AlarmName"]: a["Properties"]["EvaluationCriteria"]["PromQLCriteria"]
              for a in alarms if "EvaluationCriteria" in a["Properties"]}
    assert set(promql) == {f"{COMPONENT_NAME}-engine-hit-rate", f"{COMPONENT_NAME}-engine-metrics-missing"}
    hit_rate = promql[f"{COMPONENT_NAME}-engine-hit-rate"]
    # minimum_hit_rate 0.45 over evaluation_periods 3 minutes (30 s publications fit twice in 1 minute)
    assert hit_rate["Query"].endswith("[3m]))) < 0.45") and hit_rate["PendingPeriod"] == 180
    assert f'"aws.sagemaker.inference_component.name"="{COMPONENT_NAME}"' in hit_rate["Query"]


def test_the_components_update_is_the_stages_rolling_update(templates):
    (component,) = templates["endpoint"].find_resources("AWS::SageMaker::InferenceComponent").values()
    assert component["Properties"]["DeploymentConfig"] == {
        "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "COPY_COUNT", "Value": 2}, "WaitIntervalInSeconds": 240,
                                "MaximumExecutionTimeoutInSeconds": 3600},
        "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": f"{COMPONENT_NAME}-error-rate"},
                                                 {"AlarmName": f"{COMPONENT_NAME}-ttft-p50"}]}}
    specification = component["Properties"]["Specification"]
    assert specification["SchedulingConfig"] == {
        "PlacementStrategy": "BINPACK", "AvailabilityZoneBalance": {"EnforcementMode": "PERMISSIVE", "MaxImbalance": 0}}
    assert specification["DataCacheConfig"] == {"EnableCaching": False}


def test_alarm_descriptions_name_the_stages_thresholds(wiring):
    assert "above 1500 ms" in _alarm(wiring, "ttft_p50")["AlarmDescription"]
    assert "below 0.45" in _alarm(wiring, "hit_rate")["AlarmDescription"]
    assert ">= 18 concurrent" in _alarm(wiring, "hotspot")["AlarmDescription"]
    assert "3x its fair share of 6" in _alarm(wiring, "hotspot")["AlarmDescription"]
    assert "ConcurrencyThreshold (24)" in _alarm(wiring, "pinned_at_threshold")["AlarmDescription"]
    assert "above 2.5 %" in _alarm(wiring, "error_rate")["AlarmDescription"]


def test_alarms_watch_the_stages_component(templates):
    for alarm in templates["observability"].find_resources("AWS::CloudWatch::Alarm").values():
        text = str(alarm["Properties"])
        assert COMPONENT_NAME in text, alarm
        assert "default-prefix-llm" not in text


# ---------------------------------------------------------------- acknowledgements follow the stage


def test_log_group_acknowledgements_name_the_stages_groups(wiring):
    stacks, _ = wiring
    report = nag_report(stacks)
    assert report["violations"] == []
    policy = "PrefixRouting-wiring-Endpoint/Inference/ExecutionRole/DefaultPolicy/Resource"
    logs = "Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:"
    assert findings(report["suppressedViolations"]) == {
        ("AwsSolutions-IAM5[Resource::*]", policy),
        (f"AwsSolutions-IAM5[{logs}/aws/sagemaker/Endpoints/wiring-prefix-llm:*]", policy),
        (f"AwsSolutions-IAM5[{logs}/aws/sagemaker/InferenceComponents/wiring-prefix-llm-ic:*]", policy),
        ("AwsSolutions-IAM5[Resource::*]", "PrefixRouting-wiring-Observability/Advisor/Role/DefaultPolicy/Resource"),
        ("AwsSolutions-IAM5[Action::kms:GenerateDataKey*]",
         "PrefixRouting-wiring-Observability/Advisor/Role/DefaultPolicy/Resource"),
    }


# ---------------------------------------------------------------- who may call the front door


def test_direct_invocations_are_allowed_as_the_stage_says(templates):
    (function,) = [f["Properties"] for f in templates["normalizer"].find_resources("AWS::Lambda::Function").values()
                   if f["Properties"]["Handler"] == "run.sh"]
    assert function["Environment"]["Variables"]["ALLOW_DIRECT_INVOKE"] == "true"


def test_each_invoke_principal_may_call_the_url_and_invoke_only_through_it(templates):
    permissions = [p["Properties"] for p in templates["normalizer"].find_resources("AWS::Lambda::Permission").values()]
    by_principal = {}
    for permission in permissions:
        by_principal.setdefault(permission["Principal"], []).append(permission)
    assert set(by_principal) == {"111122223333", "arn:aws:iam::444455556666:role/ChatApp"}
    for granted in by_principal.values():
        url, via_url = sorted(granted, key=lambda p: p["Action"])  # InvokeFunction < InvokeFunctionUrl
        assert (via_url["Action"], via_url["FunctionUrlAuthType"]) == ("lambda:InvokeFunctionUrl", "AWS_IAM")
        assert (url["Action"], url["InvokedViaFunctionUrl"]) == ("lambda:InvokeFunction", True)
