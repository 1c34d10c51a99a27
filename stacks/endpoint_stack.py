"""The GPU endpoint with PREFIX_AWARE routing and copy autoscaling."""

from __future__ import annotations

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from prefix_routing.stage.config import StageConfig
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
            component_name=config.component_name,
            model=config.model,
            endpoint=config.endpoint,
            routing=config.routing,
            metrics=config.metrics,
        )
        metrics = SageMakerMetrics(endpoint_name=config.endpoint_name, component_name=config.component_name)
        self.autoscaling = CopyAutoscaling(
            self,
            "Autoscaling",
            component_name=config.component_name,
            endpoint=config.endpoint,
            scaling=config.scaling,
            no_capacity_failures=metrics.no_capacity_failures(),
        )
        # The scalable target names the component, which must exist first.
        self.autoscaling.node.add_dependency(self.endpoint.cfn_inference_component)

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
        CfnOutput(self, "EndpointName", value=config.endpoint_name)
        CfnOutput(self, "InferenceComponentName", value=config.component_name)
