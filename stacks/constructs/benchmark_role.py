"""The role a SageMaker AI benchmark job runs as (``python -m prefix_routing benchmark``), made when the
stage sets ``[benchmark] s3_uri`` and names no role of its own.

SageMaker assumes it for the job. It may read the workloads the command uploads
(``<s3_uri>workloads/``), write the job's results (``<s3_uri>results/``) and invoke this endpoint and
its components; with ``hf_token_secret_arn``, read that one secret (a gated tokenizer's token).
Nothing else: no other prefix, bucket, endpoint or SageMaker action.

Benchmark jobs target an OpenAI-compatible chat completions API, and SageMaker's OpenAI-compatible
path (``/endpoints/<name>/openai/v1/chat/completions``) authorizes its bearer token with
``sagemaker:CallWithBearerToken`` besides ``sagemaker:InvokeEndpoint``
(https://docs.aws.amazon.com/sagemaker/latest/dg/realtime-endpoints-openai-compatible.html). The
action takes no resource type (the Service Authorization Reference lists none for it), so it is
granted on ``*``: the token it allows can still invoke only what the invoke actions name. Whether a
benchmark job calls through that path is not documented: granted so that it can.
"""

from __future__ import annotations

from typing import Sequence

from aws_cdk import Aws, aws_iam as iam
from constructs import Construct

from prefix_routing.stage.benchmark import BenchmarkSettings
from stacks.nag import acknowledge

#: The two ways to call an endpoint (botocore's sagemaker-runtime operations); nothing of SageMaker's control plane.
INVOKE_ACTIONS = ("sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream")
#: What SageMaker's OpenAI-compatible path asks of a bearer token's principal besides the invoke actions.
BEARER_TOKEN_ACTION = "sagemaker:CallWithBearerToken"


class BenchmarkRole(Construct):
    """Attributes: ``role``."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: BenchmarkSettings, endpoint_arn: str,
                 component_arns: Sequence[str]) -> None:
        super().__init__(scope, construct_id)
        if not settings.enabled:
            raise ValueError("BenchmarkRole needs [benchmark] s3_uri")
        bucket = f"arn:{Aws.PARTITION}:s3:::{settings.bucket}"
        workloads = f"{bucket}/{settings.workloads_prefix}*"
        results = f"{bucket}/{settings.results_prefix}*"
        self.role = iam.Role(
            self, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description=f"SageMaker AI benchmark jobs: read s3://{settings.bucket}/{settings.workloads_prefix}, "
                        f"write s3://{settings.bucket}/{settings.results_prefix}, invoke the stage's endpoint",
        )
        self.role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=[workloads]))
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["s3:ListBucket"], resources=[bucket],
            conditions={"StringLike": {"s3:prefix": [f"{settings.workloads_prefix}*"]}},
        ))
        self.role.add_to_policy(iam.PolicyStatement(actions=["s3:AbortMultipartUpload", "s3:PutObject"],
                                                    resources=[results]))
        self.role.add_to_policy(iam.PolicyStatement(actions=list(INVOKE_ACTIONS),
                                                    resources=[endpoint_arn, *component_arns]))
        self.role.add_to_policy(iam.PolicyStatement(actions=[BEARER_TOKEN_ACTION], resources=["*"]))
        if settings.hf_token_secret_arn:
            self.role.add_to_policy(iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"],
                                                        resources=[settings.hf_token_secret_arn]))
        policy = self.role.node.find_child("DefaultPolicy").node.default_child
        acknowledge(
            policy,
            "IAM5",
            "The job reads the workloads the benchmark command uploads under their own prefix and writes its results "
            "under their own prefix, one object per file, named by the job: every object under each prefix, nothing "
            "else in the bucket.",
            f"Resource::arn:<AWS::Partition>:s3:::{settings.bucket}/{settings.workloads_prefix}*",
            f"Resource::arn:<AWS::Partition>:s3:::{settings.bucket}/{settings.results_prefix}*",
        )
        acknowledge(
            policy,
            "IAM5",
            "sagemaker:CallWithBearerToken takes no resource type (IAM's Service Authorization Reference), so it can "
            "only be granted on *; the bearer token it allows invokes only the endpoint and components named above.",
            "Resource::*",
        )
