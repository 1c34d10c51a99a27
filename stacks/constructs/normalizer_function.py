"""The normalizer front door: a Python Lambda (arm64) behind a Function URL with IAM auth.

Its asset is ``lambda/normalizer/`` plus the stdlib-only parts of ``prefix_routing`` (the rules
and the telemetry contract) plus the vendored Python dependencies that ``make install`` puts in
``build/lambda-python``: a plain file copy, so synth needs neither Docker nor the network.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, Duration, ILocalBundling, RemovalPolicy
from aws_cdk import aws_iam as iam, aws_lambda as lambda_, aws_logs as logs
from constructs import Construct

from prefix_routing.config import NormalizerSettings, RoutingSettings
from prefix_routing.telemetry import NAMESPACE

ROOT = Path(__file__).resolve().parents[2]
HANDLER_DIR = ROOT / "lambda" / "normalizer"
VENDORED_DIR = ROOT / "build" / "lambda-python"
# The library modules the Lambda needs: standard library only, by the house rules.
LIBRARY_MODULES = ("__init__.py", "errors.py", "normalize.py", "telemetry.py")


@jsii.implements(ILocalBundling)
class _CopyBundler:
    """Lays out the asset by copying files; never falls back to Docker."""

    def try_bundle(self, output_dir: str, *, image: DockerImage, **_: object) -> bool:
        if not VENDORED_DIR.is_dir():
            raise RuntimeError(
                f"{VENDORED_DIR} is missing: run `make install` (it vendors the Lambda's pinned dependencies)"
            )
        out = Path(output_dir)
        shutil.copytree(VENDORED_DIR, out, dirs_exist_ok=True)
        shutil.copytree(HANDLER_DIR, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (out / "prefix_routing").mkdir(exist_ok=True)
        for module in LIBRARY_MODULES:
            source = ROOT / "prefix_routing" / module
            if source.exists():
                shutil.copy2(source, out / "prefix_routing" / module)
        return True


def normalizer_code() -> lambda_.Code:
    return lambda_.Code.from_asset(
        str(HANDLER_DIR),
        asset_hash_type=AssetHashType.OUTPUT,  # the hash covers the copied library too
        bundling=BundlingOptions(image=DockerImage.from_registry("unused-local-bundling"), local=_CopyBundler()),
    )


class NormalizerFunction(Construct):
    """Attributes: ``function``, ``function_url``, ``log_group``, ``role``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        endpoint_name: str,
        component_name: str,
        endpoint_arn: str,
        component_arn: str,
        routing: RoutingSettings,
        settings: NormalizerSettings,
        code: lambda_.Code,
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=_RETENTION[settings.log_retention_days],
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[self.log_group.log_group_arn],
            )
        )
        # Only this endpoint and its component, only the two invoke actions.
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream"],
                resources=[endpoint_arn, component_arn],
            )
        )
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=lambda_.Runtime.PYTHON_3_14,
            architecture=lambda_.Architecture.ARM_64,
            handler="handler.handler",
            code=code,
            role=self.role,
            log_group=self.log_group,
            memory_size=settings.memory_mb,
            timeout=Duration.seconds(settings.timeout_s),
            # The client-level throughput limit: the endpoint never sees more in-flight requests.
            reserved_concurrent_executions=settings.reserved_concurrency,
            environment={
                "ENDPOINT_NAME": endpoint_name,
                "INFERENCE_COMPONENT_NAME": component_name,
                "ROUTING_STRATEGY": routing.strategy,
                "PREFIX_LENGTH": str(routing.prefix_length or 0),
                "BLOCK_BYTES": str(settings.block_bytes),
                "TENANCY": settings.tenancy,
                "TENANT_HEADER": settings.tenant_header,
                "POWERTOOLS_METRICS_NAMESPACE": NAMESPACE,
            },
        )
        self.function_url = self.function.add_function_url(auth_type=lambda_.FunctionUrlAuthType.AWS_IAM)


# NormalizerSettings.log_retention_days allows exactly these values.
_RETENTION = {
    1: logs.RetentionDays.ONE_DAY, 3: logs.RetentionDays.THREE_DAYS, 5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK, 14: logs.RetentionDays.TWO_WEEKS, 30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS, 90: logs.RetentionDays.THREE_MONTHS, 120: logs.RetentionDays.FOUR_MONTHS,
    150: logs.RetentionDays.FIVE_MONTHS, 180: logs.RetentionDays.SIX_MONTHS, 365: logs.RetentionDays.ONE_YEAR,
}
