"""The isolation canary: a Python Lambda (arm64) on a schedule that proves, per trust domain, that the
KV cache works and that tenants stay apart in it.

Every ``canary.every_minutes`` an EventBridge rule invokes ``lambda/canary/handler.py``, which runs
``prefix_routing.canary.run_canary`` against the stage's endpoint with the routing ids and salts the
front door would give two synthetic tenants (see ``prefix_routing/canary/probe.py``), and writes each
domain's ``CanaryIsolationBreach`` and ``CanaryCacheCold`` in the Embedded Metric Format to its log
(CloudWatch takes the metrics from there: no ``cloudwatch:PutMetricData``). The alarms on them are
the observability stack's (``stacks/constructs/canary_alarms.py``), beside the alarm topic.

Its role may write only its own log group, invoke only this endpoint and its inference components
(``sagemaker:InvokeEndpoint``, nothing else of SageMaker) and read only the tenant key's secret.

The asset is ``lambda/canary/`` plus the subpackages of ``prefix_routing`` it runs (the rules, the
front door's configuration, the canary) and the SDK the front door vendors (``build/lambda-python``,
without Powertools): ``PrefixAwareId`` is newer than the boto3 some runtimes bundle, and the Python
runtime puts the asset first on ``sys.path``. A plain file copy; no bytecode is compiled for it (the
front door's cold starts are on its callers' path, the canary's on nobody's).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, Duration, ILocalBundling, RemovalPolicy
from aws_cdk import aws_events as events, aws_events_targets as targets, aws_iam as iam, aws_lambda as lambda_
from aws_cdk import aws_logs as logs, aws_secretsmanager as secretsmanager
from constructs import Construct

from prefix_routing.stage.config import StageConfig
from prefix_routing.stage.front_door_env import function_environment
from stacks.constructs.lambda_assets import RETENTION, ROOT, copy_library

HANDLER_DIR = ROOT / "lambda" / "canary"
VENDORED_DIR = ROOT / "build" / "lambda-python"
#: What the function imports: never the lab, the emulator, the load tester, the stage or the command line.
LIBRARY_PACKAGES = ("rules", "frontdoor", "canary")
#: Of the vendored packages, the SDK only: the canary writes its metrics without Powertools.
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "aws_lambda_powertools*", "bin")
MEMORY_MB = 256
TIMEOUT_S = 300


@jsii.implements(ILocalBundling)
class _CopyBundler:
    """Lays out the asset by copying files; never falls back to Docker."""

    def try_bundle(self, output_dir: str, *, image: DockerImage, **_: object) -> bool:
        if not VENDORED_DIR.is_dir():
            raise RuntimeError(f"{VENDORED_DIR} is missing: run `make install` (it vendors the functions' SDK)")
        out = Path(output_dir)
        shutil.copytree(VENDORED_DIR, out, dirs_exist_ok=True, ignore=SKIP)
        shutil.copytree(HANDLER_DIR, out, dirs_exist_ok=True, ignore=SKIP)
        copy_library(out, LIBRARY_PACKAGES)
        return True


def canary_code() -> lambda_.Code:
    return lambda_.Code.from_asset(
        str(HANDLER_DIR),
        asset_hash_type=AssetHashType.OUTPUT,  # the hash covers the copied library and SDK too
        bundling=BundlingOptions(image=DockerImage.from_registry("unused-local-bundling"), local=_CopyBundler()),
    )


def canary_environment(config: StageConfig, tenant_key_arn: str) -> dict[str, str]:
    """The front door's variables as the stage sets them, without per-tenant limits (the canary's
    tenants have none, and it has no table) and without replica steering (it sends its own ids),
    plus where the key is and how the canary runs."""
    environment = function_environment(endpoint_name=config.endpoint_name, component_name=config.component_name,
                                       routing=config.routing, endpoint=config.endpoint, normalizer=config.normalizer,
                                       limits=None, domains=config.trust_domains())
    return {
        **environment,
        "REPLICATION_STEERING": "false",
        "TENANT_KEY_SECRET_ARN": tenant_key_arn,  # where the key is, not the key
        "CANARY_PROMPT_TOKENS": str(config.canary.prompt_tokens),
        # The engine keeps tenants apart by salt: the second tenant shares the domain; else it is the next domain's.
        "CANARY_SALTED": "true" if config.model.isolates_by_salt else "false",
    }


class IsolationCanary(Construct):
    """Attributes: ``function``, ``role``, ``log_group``, ``schedule``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StageConfig,
        tenant_key: secretsmanager.ISecret,
        endpoint_arn: str,
        component_arns: Sequence[str],
        code: lambda_.Code | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        settings = config.canary
        self.log_group = logs.LogGroup(self, "Logs", retention=RETENTION[config.normalizer.log_retention_days],
                                       removal_policy=RemovalPolicy.DESTROY)
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        self.role.add_to_policy(iam.PolicyStatement(actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                                                    resources=[self.log_group.log_group_arn]))
        # Only this endpoint and its components (one per trust domain); buffered calls only (one output token).
        self.role.add_to_policy(iam.PolicyStatement(actions=["sagemaker:InvokeEndpoint"],
                                                    resources=[endpoint_arn, *component_arns]))
        # The tenant key, to compute the ids and salts the front door gives; no DescribeSecret, no other secret.
        self.role.add_to_policy(iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"],
                                                    resources=[tenant_key.secret_arn]))
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=lambda_.Runtime.PYTHON_3_14,
            architecture=lambda_.Architecture.ARM_64,
            handler="handler.handler",
            code=code or canary_code(),
            role=self.role,
            log_group=self.log_group,
            memory_size=MEMORY_MB,
            timeout=Duration.seconds(TIMEOUT_S),
            reserved_concurrent_executions=1,  # one run at a time: a slow run never overlaps the next
            environment=canary_environment(config, tenant_key.secret_arn),
        )
        self.schedule = events.Rule(
            self, "Schedule", schedule=events.Schedule.rate(Duration.minutes(settings.every_minutes)),
            description=f"The isolation canary of stage {config.name}: every {settings.every_minutes} minutes",
            targets=[targets.LambdaFunction(self.function, retry_attempts=0)],
        )
