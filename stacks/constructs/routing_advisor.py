"""The routing advisor: a Python Lambda (arm64) on a schedule that runs the lab on production's log.

Every ``advisor.schedule_minutes`` an EventBridge rule invokes ``lambda/advisor/handler.py``, which
runs ``prefix_routing.advisor.run_once`` over that window of the normalizer's request log (see
``prefix_routing/lab/advisor.py`` for what it computes). Its role may read only that log group
(``logs:FilterLogEvents``), read metrics (the window's ``Requests``, which sets the log's sample
rate), publish metrics only under the stage's namespace, describe only the
stage's inference component, publish only to the stage's alarm topic, and read and write only its
own SSM parameter, where the notification rule keeps its state between runs.

The asset is ``lambda/advisor/`` plus the subpackages of ``prefix_routing`` it runs (rules, the lab, the
stage's preset tables, the advisor): a plain file copy, no numpy, no matplotlib, no pydantic (the
lab's results and the presets are standard library only). boto3 is the runtime's: the advisor's
calls are all older than the runtime.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, Duration, ILocalBundling, RemovalPolicy, Stack
from aws_cdk import aws_events as events, aws_events_targets as targets, aws_iam as iam, aws_lambda as lambda_
from aws_cdk import aws_logs as logs, aws_sns as sns, aws_ssm as ssm
from constructs import Construct

from prefix_routing.rules import telemetry
from prefix_routing.stage.config import StageConfig
from stacks.constructs.lambda_assets import IGNORE, RETENTION, copy_library
from stacks.nag import acknowledge

HANDLER_DIR = Path(__file__).resolve().parents[2] / "lambda" / "advisor"
#: What the function imports: never the front door, the emulator, the load tester or the command line.
LIBRARY_PACKAGES = ("rules", "lab", "advisor")
STAGE_MODULES = ("__init__.py", "presets.py")  # the preset tables only: stage/config.py needs pydantic


@jsii.implements(ILocalBundling)
class _CopyBundler:
    """Lays out the asset by copying files; never falls back to Docker."""

    def try_bundle(self, output_dir: str, *, image: DockerImage, **_: object) -> bool:
        out = Path(output_dir)
        shutil.copytree(HANDLER_DIR, out, dirs_exist_ok=True, ignore=IGNORE)
        copy_library(out, LIBRARY_PACKAGES, modules={"stage": STAGE_MODULES})
        return True


def advisor_code() -> lambda_.Code:
    return lambda_.Code.from_asset(
        str(HANDLER_DIR),
        asset_hash_type=AssetHashType.OUTPUT,
        bundling=BundlingOptions(image=DockerImage.from_registry("unused-local-bundling"), local=_CopyBundler()),
    )


class RoutingAdvisor(Construct):
    """Attributes: ``function``, ``log_group``, ``role``, ``state``, ``schedule``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StageConfig,
        request_log: logs.ILogGroup,
        topic: sns.ITopic,
        code: lambda_.Code | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        settings = config.advisor
        stack = Stack.of(self)
        self.log_group = logs.LogGroup(self, "Logs", retention=RETENTION[settings.log_retention_days],
                                       removal_policy=RemovalPolicy.DESTROY)
        self.state = ssm.StringParameter(
            self, "State", string_value="{}",
            description="The routing advisor's notification state (JSON): the last recommendation, its runs, "
                        "whether it was notified",
        )
        component_arn = stack.format_arn(service="sagemaker", resource="inference-component",
                                         resource_name=config.component_name)
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        self.role.add_to_policy(iam.PolicyStatement(actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                                                    resources=[self.log_group.log_group_arn]))
        self.role.add_to_policy(iam.PolicyStatement(actions=["logs:FilterLogEvents"],
                                                    resources=[request_log.log_group_arn]))
        # PutMetricData has no resource type: the namespace condition is its only scope.
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": telemetry.NAMESPACE}},
        ))
        # The window's volume (the front door's Requests metric) picks the sample rate; reading metrics
        # has no resource type either.
        self.role.add_to_policy(iam.PolicyStatement(actions=["cloudwatch:GetMetricStatistics"], resources=["*"]))
        self.role.add_to_policy(iam.PolicyStatement(actions=["sagemaker:DescribeInferenceComponent"],
                                                    resources=[component_arn]))
        topic.grant_publish(self.role)
        self.state.grant_read(self.role)
        self.state.grant_write(self.role)
        routing = config.routing
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=lambda_.Runtime.PYTHON_3_14,
            architecture=lambda_.Architecture.ARM_64,
            handler="handler.handler",
            code=code or advisor_code(),
            role=self.role,
            log_group=self.log_group,
            memory_size=settings.memory_mb,
            timeout=Duration.seconds(settings.timeout_s),
            reserved_concurrent_executions=1,  # one run at a time: the rule's state is read, then written
            environment={  # prefix_routing.advisor.AdvisorConfig.from_env
                "REQUEST_LOG_GROUP": request_log.log_group_name,
                "INFERENCE_COMPONENT_NAME": config.component_name,
                "STAGE": config.name,
                "INSTANCE_TYPE": config.endpoint.instance_type,
                "MODEL": config.model.model_id or config.model.model_s3_uri or "",
                "TENSOR_PARALLEL_DEGREE": str(config.model.tensor_parallel_degree),
                "COPIES_PER_INSTANCE": str(config.copies_per_instance),
                "COPIES_MAX": str(config.endpoint.copies_max),
                "PREFIX_LENGTH": str(routing.prefix_length or 4096),
                "CONCURRENCY_THRESHOLD": str(routing.concurrency_threshold or 1024),
                "SCALING_TARGET": repr(float(config.scaling.target_concurrent_requests_per_copy)),
                "ALARM_TOPIC_ARN": topic.topic_arn,
                "STATE_PARAMETER": self.state.parameter_name,
                "METRIC_NAMESPACE": telemetry.NAMESPACE,
                "WINDOW_S": str(settings.schedule_minutes * 60),
                "MAX_EVENTS": str(settings.max_events),
                "SAMPLE": str(settings.sample),
                "NOTIFY_GAIN_POINTS": repr(float(settings.notify_gain_points)),
                "NOTIFY_TTFT_GAIN": repr(float(settings.notify_ttft_gain)),
                "NOTIFY_AFTER_RUNS": str(settings.notify_after_runs),
            },
        )
        policy = self.role.node.find_child("DefaultPolicy").node.default_child  # the finding's own resource
        acknowledge(
            policy,
            "IAM5",
            "cloudwatch:PutMetricData has no resource type; the statement is limited by the cloudwatch:namespace "
            "condition to the stage's namespace. cloudwatch:GetMetricStatistics has no resource type: the run "
            "reads the window's Requests count (to pick the log's sample rate), a read of metrics only.",
            "Resource::*",
        )
        acknowledge(
            policy,
            "IAM5",
            "Publishing to the KMS-encrypted alarm topic (grant_publish): kms:GenerateDataKey* on the topic's own "
            "key only.",
            "Action::kms:GenerateDataKey*",
        )
        self.schedule = events.Rule(
            self, "Schedule", schedule=events.Schedule.rate(Duration.minutes(settings.schedule_minutes)),
            description=f"The routing advisor of stage {config.name}: every {settings.schedule_minutes} minutes",
            targets=[targets.LambdaFunction(self.function, retry_attempts=0)],
        )
