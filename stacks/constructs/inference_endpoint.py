"""The SageMaker inference-component endpoint with PREFIX_AWARE routing: SageMaker has only L1
resources, so this construct wraps them once.

Model -> endpoint config (no fixed name, so a change replaces it cleanly and the endpoint updates in
place) -> endpoint -> inference component (explicit name: Ref gives only its ARN).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Aws, Stack, aws_iam as iam, aws_kms as kms, aws_sagemaker as sagemaker
from aws_cdk.region_info import FactName
from constructs import Construct

from collections.abc import Mapping, Sequence
from typing import Any

from prefix_routing.stage.config import (DeploymentSettings, EndpointSettings, MetricsSettings, ModelSettings,
                                         RoutingSettings)
from prefix_routing.stage.ami import ami_for
from prefix_routing.stage.domain_checks import ComponentPlan
from prefix_routing.stage.observability_sections import rolls

VARIANT_NAME = "AllTraffic"
MODEL_DIR = "/opt/ml/model"  # where SageMaker puts ModelDataSource content


def container_environment(model: ModelSettings) -> dict[str, str]:
    """Environment that turns on prefix caching and prompt-token details for the framework.

    Prompt-token details make vLLM report ``usage.prompt_tokens_details.cached_tokens``, from which
    the normalizer measures the KV-cache hit rate (the vLLM DLC only: see ``reports_cached_tokens``).
    The stage's own ``environment`` wins.
    """
    source = model.model_id or MODEL_DIR
    if model.framework == "vllm":
        # The SageMaker vLLM DLC turns each SM_VLLM_<FLAG> into --<flag>.
        env = {
            "SM_VLLM_MODEL": source,
            "SM_VLLM_TENSOR_PARALLEL_SIZE": str(model.tensor_parallel_degree),
            "SM_VLLM_ENABLE_PREFIX_CACHING": "true",
            "SM_VLLM_ENABLE_PROMPT_TOKENS_DETAILS": "true",
        }
    else:  # djl-lmi
        env = {
            "HF_MODEL_ID": source,
            "OPTION_TENSOR_PARALLEL_DEGREE": str(model.tensor_parallel_degree),
            "OPTION_ENABLE_PREFIX_CACHING": "true",
            # No prompt-token details: LMI forwards only OPTION_* that name vLLM *engine* arguments, and
            # enable_prompt_tokens_details is a frontend flag, so LMI reports no cached tokens.
        }
    return {**env, **model.environment}


def log_group_names(endpoint_name: str, component_names: Sequence[str]) -> tuple[str, ...]:
    """The log groups SageMaker writes an endpoint's and its components' container logs to."""
    return (f"/aws/sagemaker/Endpoints/{endpoint_name}",
            *(f"/aws/sagemaker/InferenceComponents/{name}" for name in component_names))


class InferenceEndpoint(Construct):
    """Model, execution role, KMS key, endpoint config, endpoint and inference component.

    One inference component per entry of ``components`` (one per trust domain: copies of their own,
    KV caches of their own), all of the same model on the endpoint's instances; the first is the
    stage's primary component. Every component gets the endpoint's placement (``SchedulingConfig``)
    and data cache, and, with ``deployment.rolling_update``, a rolling ``DeploymentConfig`` that
    rolls back on the alarms ``rollback_alarms`` names for it (alarm names, not references: the
    alarms live in the observability stack); a component that never has two copies gets none (a
    batch is documented as 5-50 % of the copies; synth says so). Its endpoint config sets the
    instances' AMI (``InferenceAmiVersion``), the stage's or its serving container's.

    Attributes: ``role``, ``volume_key``, ``cfn_model``, ``cfn_endpoint_config``, ``cfn_endpoint``,
    ``cfn_inference_components`` (component name → resource), ``cfn_inference_component`` (the
    first's), ``endpoint_name``, ``component_name`` (the first's), ``endpoint_arn``, ``component_arn``,
    ``log_group_names`` (the container log groups the role may write).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        endpoint_name: str,
        components: Sequence[ComponentPlan],
        model: ModelSettings,
        endpoint: EndpointSettings,
        routing: RoutingSettings,
        metrics: MetricsSettings,
        deployment: DeploymentSettings,
        rollback_alarms: Mapping[str, Sequence[str]],
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        if not components:
            raise ValueError("InferenceEndpoint: at least one component")
        unnamed = [plan.name for plan in components if plan.name not in rollback_alarms]
        if unnamed:
            raise ValueError(f"InferenceEndpoint: rollback_alarms names no alarms list for {', '.join(unnamed)}")
        component_name = components[0].name
        self.endpoint_name = endpoint_name
        self.component_name = component_name
        self.endpoint_arn = stack.format_arn(service="sagemaker", resource="endpoint", resource_name=endpoint_name)
        self.component_arn = stack.format_arn(
            service="sagemaker", resource="inference-component", resource_name=component_name
        )

        self.volume_key = kms.Key(
            self, "VolumeKey", enable_key_rotation=True, description=f"Storage volumes of endpoint {endpoint_name}"
        )
        self.log_group_names = log_group_names(endpoint_name, [plan.name for plan in components])
        self.role = execution_role(self, model=model, log_group_names=self.log_group_names)
        # Explicit actions: grant_encrypt_decrypt would add ReEncrypt* and GenerateDataKey* wildcards.
        self.volume_key.grant(
            self.role,
            "kms:Encrypt",
            "kms:Decrypt",
            "kms:GenerateDataKey",
            "kms:GenerateDataKeyWithoutPlaintext",
            "kms:CreateGrant",
            "kms:DescribeKey",
        )

        # The image comes from the regional Deep Learning Containers account: a fact CDK knows per
        # region, so synth needs no network and an env-agnostic stack still resolves it.
        registry_account = stack.regional_fact(FactName.DLC_REPOSITORY_ACCOUNT)
        image = f"{registry_account}.dkr.ecr.{Aws.REGION}.{Aws.URL_SUFFIX}/{model.image_repository}:{model.image_tag}"
        data_source = (
            sagemaker.CfnModel.ModelDataSourceProperty(
                s3_data_source=sagemaker.CfnModel.S3DataSourceProperty(
                    s3_uri=model.model_s3_uri, s3_data_type="S3Prefix", compression_type="None"
                )
            )
            if model.model_s3_uri
            else None
        )
        self.cfn_model = sagemaker.CfnModel(
            self,
            "Model",
            execution_role_arn=self.role.role_arn,
            primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
                image=image, environment=container_environment(model), model_data_source=data_source
            ),
        )
        # SageMaker checks the role's permissions when it creates these: the policy must exist first.
        policy = self.role.node.find_child("DefaultPolicy")
        self.cfn_model.node.add_dependency(policy)

        routing_config = sagemaker.CfnEndpointConfig.RoutingConfigProperty(
            routing_strategy=routing.strategy,
            prefix_aware_routing_config=(
                sagemaker.CfnEndpointConfig.PrefixAwareRoutingConfigProperty(
                    prefix_length=routing.prefix_length, concurrency_threshold=routing.concurrency_threshold
                )
                if routing.strategy == "PREFIX_AWARE"
                else None
            ),
        )
        # No endpoint_config_name: every variant property requires replacement, and replacing a
        # named resource fails. CloudFormation names it; the endpoint then updates blue/green.
        self.cfn_endpoint_config = sagemaker.CfnEndpointConfig(
            self,
            "Config",
            execution_role_arn=self.role.role_arn,
            kms_key_id=self.volume_key.key_arn,
            production_variants=[
                sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                    variant_name=VARIANT_NAME,
                    instance_type=endpoint.instance_type,
                    initial_instance_count=max(1, endpoint.instances_min),
                    # The AMI sets the NVIDIA driver; SageMaker's default (535) cannot run an image built
                    # for a newer CUDA (prefix_routing/stage/ami.py, with its sources).
                    inference_ami_version=ami_for(model.framework, endpoint.inference_ami_version),
                    container_startup_health_check_timeout_in_seconds=model.startup_health_check_timeout_s,
                    model_data_download_timeout_in_seconds=model.startup_health_check_timeout_s,
                    managed_instance_scaling=sagemaker.CfnEndpointConfig.ManagedInstanceScalingProperty(
                        status="ENABLED",
                        min_instance_count=endpoint.instances_min,
                        max_instance_count=endpoint.instances_max,
                        scale_in_policy=sagemaker.CfnEndpointConfig.ScaleInPolicyProperty(
                            strategy=endpoint.scale_in_strategy,
                            cooldown_in_minutes=endpoint.scale_in_cooldown_minutes,
                        ),
                    ),
                    routing_config=routing_config,
                )
            ],
            metrics_config=sagemaker.CfnEndpointConfig.MetricsConfigProperty(
                enable_enhanced_metrics=True,  # adds InstanceId: the hotspot alarm and dashboard need it
                metric_publish_frequency_in_seconds=metrics.publish_frequency_s,
                # Set either way: AWS turns it on for new endpoint configs, and it is billed per GB.
                enable_detailed_observability=metrics.detailed_observability_for(model.framework),
            ),
        )
        self.cfn_endpoint_config.node.add_dependency(policy)

        self.cfn_endpoint = sagemaker.CfnEndpoint(
            self,
            "Endpoint",
            endpoint_name=endpoint_name,
            endpoint_config_name=self.cfn_endpoint_config.attr_endpoint_config_name,
        )

        self.cfn_inference_components = {
            plan.name: self._component("Component" if index == 0 else f"Component-{plan.domain}", plan, model,
                                       endpoint=endpoint, deployment=deployment,
                                       rollback_alarms=rollback_alarms[plan.name])
            for index, plan in enumerate(components)
        }
        self.cfn_inference_component = self.cfn_inference_components[component_name]

    def _component(self, construct_id: str, plan: ComponentPlan, model: ModelSettings, *, endpoint: EndpointSettings,
                   deployment: DeploymentSettings, rollback_alarms: Sequence[str]) -> sagemaker.CfnInferenceComponent:
        Cfn = sagemaker.CfnInferenceComponent
        return sagemaker.CfnInferenceComponent(
            self,
            construct_id,
            inference_component_name=plan.name,
            endpoint_name=self.cfn_endpoint.attr_endpoint_name,
            variant_name=VARIANT_NAME,
            specification=sagemaker.CfnInferenceComponent.InferenceComponentSpecificationProperty(
                model_name=self.cfn_model.attr_model_name,
                compute_resource_requirements=sagemaker.CfnInferenceComponent.InferenceComponentComputeResourceRequirementsProperty(
                    number_of_accelerator_devices_required=model.accelerators_per_copy,
                    min_memory_required_in_mb=model.memory_per_copy_mb,
                ),
                startup_parameters=sagemaker.CfnInferenceComponent.InferenceComponentStartupParametersProperty(
                    container_startup_health_check_timeout_in_seconds=model.startup_health_check_timeout_s,
                    model_data_download_timeout_in_seconds=model.startup_health_check_timeout_s,
                ),
                # CloudFormation requires both fields (the API only the strategy); PERMISSIVE is the only mode.
                scheduling_config=Cfn.InferenceComponentSchedulingConfigProperty(
                    placement_strategy=endpoint.placement,
                    availability_zone_balance=Cfn.InferenceComponentAvailabilityZoneBalanceProperty(
                        enforcement_mode="PERMISSIVE", max_imbalance=endpoint.az_max_imbalance
                    ),
                ),
                data_cache_config=Cfn.InferenceComponentDataCacheConfigProperty(enable_caching=endpoint.data_cache),
            ),
            runtime_config=sagemaker.CfnInferenceComponent.InferenceComponentRuntimeConfigProperty(
                copy_count=max(1, plan.copies_min)
            ),
            deployment_config=deployment_config(deployment, rollback_alarms) if rolls(plan) else None,
        )


def deployment_config(deployment: DeploymentSettings, rollback_alarms: Sequence[str]) -> Any:
    """A rolling update, batch by batch, rolled back on ``rollback_alarms`` (an
    ``InferenceComponentDeploymentConfigProperty``; None: SageMaker's default update)."""
    if not deployment.rolling_update:
        return None
    Cfn = sagemaker.CfnInferenceComponent
    return Cfn.InferenceComponentDeploymentConfigProperty(
        rolling_update_policy=Cfn.InferenceComponentRollingUpdatePolicyProperty(
            maximum_batch_size=Cfn.InferenceComponentCapacitySizeProperty(
                type=deployment.batch_type, value=deployment.batch_size
            ),
            wait_interval_in_seconds=deployment.wait_interval_s,
            maximum_execution_timeout_in_seconds=deployment.timeout_s,
        ),
        auto_rollback_configuration=Cfn.AutoRollbackConfigurationProperty(
            alarms=[Cfn.AlarmProperty(alarm_name=name) for name in rollback_alarms]
        ) if rollback_alarms else None,
    )


def execution_role(scope: Construct, *, model: ModelSettings, log_group_names: Sequence[str]) -> iam.Role:
    """The endpoint's execution role, ``ExecutionRole`` under ``scope``: pull of this one image, read of
    this model's S3 prefix, logs (to ``log_group_names``) and metrics of this endpoint."""
    stack = Stack.of(scope)
    role = iam.Role(scope, "ExecutionRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    registry_account = stack.regional_fact(FactName.DLC_REPOSITORY_ACCOUNT)
    role.add_to_policy(
        iam.PolicyStatement(
            actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
            resources=[
                f"arn:{Aws.PARTITION}:ecr:{Aws.REGION}:{registry_account}:repository/{model.image_repository}"
            ],
        )
    )
    # GetAuthorizationToken has no resource-level permissions: "*" is the only valid resource.
    role.add_to_policy(iam.PolicyStatement(actions=["ecr:GetAuthorizationToken"], resources=["*"]))
    if model.model_s3_uri:
        bucket_arn = f"arn:{Aws.PARTITION}:s3:::{model.s3_bucket}"
        role.add_to_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"{bucket_arn}/{model.s3_prefix}*"])
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{model.s3_prefix}*"]}},
            )
        )
    role.add_to_policy(
        iam.PolicyStatement(
            actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            resources=[
                stack.format_arn(
                    service="logs", resource="log-group", resource_name=group + suffix, arn_format=ArnFormat.COLON_RESOURCE_NAME
                )
                for group in log_group_names
                for suffix in ("", ":*")
            ],
        )
    )
    # PutMetricData's one resource type (dataset) does not scope by namespace, so the resource stays
    # "*" and a condition keeps it to SageMaker's container namespaces. Namespaces beginning with
    # "AWS/" are reserved for AWS services: no role can write there, so none is listed.
    role.add_to_policy(
        iam.PolicyStatement(
            actions=["cloudwatch:PutMetricData"],
            resources=["*"],
            conditions={"StringLike": {"cloudwatch:namespace": ["/aws/sagemaker/*"]}},
        )
    )
    return role
