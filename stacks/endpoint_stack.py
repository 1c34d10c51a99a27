"""The GPU endpoint with PREFIX_AWARE routing and copy autoscaling: one inference component per
trust domain (else one), each with copy autoscaling of its own."""

from __future__ import annotations

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from prefix_routing.stage.config import StageConfig
from stacks.constructs.benchmark_role import BenchmarkRole
from stacks.constructs.copy_autoscaling import CopyAutoscaling
from stacks.constructs.inference_endpoint import InferenceEndpoint
from stacks.metrics import SageMakerMetrics
from stacks.nag import acknowledge


class EndpointStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: StageConfig, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.endpoint = InferenceEndpoint(
            self,
            "Inference",
            endpoint_name=config.endpoint_name,
            components=config.components(),
            model=config.model,
            endpoint=config.endpoint,
            routing=config.routing,
            metrics=config.metrics,
            deployment=config.deployment,
            # By name: the alarms are the observability stack's, which deploys first (app_builder).
            rollback_alarms={plan.name: config.rollback_alarm_names(plan.name) for plan in config.components()},
        )
        self.autoscalings: dict[str, CopyAutoscaling] = {}
        for index, plan in enumerate(config.components()):
            metrics = SageMakerMetrics(endpoint_name=config.endpoint_name, component_name=plan.name)
            scaling = CopyAutoscaling(
                self,
                "Autoscaling" if index == 0 else f"Autoscaling-{plan.domain}",
                component_name=plan.name,
                endpoint=config.endpoint.model_copy(update={"copies_min": plan.copies_min,
                                                            "copies_max": plan.copies_max}),
                scaling=config.scaling.model_copy(
                    update={"target_concurrent_requests_per_copy": plan.target_concurrent_requests_per_copy}),
                no_capacity_failures=metrics.no_capacity_failures(),
            )
            # The scalable target names the component, which must exist first.
            scaling.node.add_dependency(self.endpoint.cfn_inference_components[plan.name])
            self.autoscalings[plan.name] = scaling
        self.autoscaling = self.autoscalings[config.component_name]

        role = self.endpoint.role.node.find_child("DefaultPolicy").node.default_child
        acknowledge(
            role,
            "IAM5",
            "ecr:GetAuthorizationToken supports no resource-level permissions, and cloudwatch:PutMetricData's "
            "only resource type (dataset) does not scope by namespace: it is held to SageMaker's /aws/sagemaker/* "
            "namespaces by a condition.",
            "Resource::*",
        )
        acknowledge(
            role,
            "IAM5",
            "SageMaker creates the log streams at run time inside this endpoint's and component's own log groups.",
            *(f"Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:{group}:*"
              for group in self.endpoint.log_group_names),
        )
        if config.model.model_s3_uri:
            acknowledge(
                role,
                "IAM5",
                ("The model's weights are every object under its configured S3 prefix, and nothing else."
                 if config.model.s3_prefix else
                 "The stage names a whole bucket as the model's weights (model_s3_uri = s3://<bucket>/): every object "
                 "in it is readable by the endpoint; give the weights a folder of their own to narrow the grant."),
                f"Resource::arn:<AWS::Partition>:s3:::{config.model.s3_bucket}/{config.model.s3_prefix}*",
            )
        if config.benchmark.enabled and not config.benchmark.role_arn:  # `python -m prefix_routing benchmark`
            def arn(kind: str, name: str) -> str:
                return self.format_arn(service="sagemaker", resource=kind, resource_name=name)

            self.benchmark = BenchmarkRole(
                self, "Benchmark", settings=config.benchmark, endpoint_arn=arn("endpoint", config.endpoint_name),
                component_arns=[arn("inference-component", plan.name) for plan in config.components()],
            )
            CfnOutput(self, "BenchmarkRoleArn", value=self.benchmark.role.role_arn)
        CfnOutput(self, "EndpointName", value=config.endpoint_name)
        CfnOutput(self, "InferenceComponentName", value=config.component_name)
        if config.domains:
            CfnOutput(self, "TrustDomainComponents",
                      value=",".join(f"{plan.domain}={plan.name}" for plan in config.components()))
