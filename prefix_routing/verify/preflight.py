"""``preflight``: what only an account can tell, settled before ``cdk deploy`` (read-only calls).

An endpoint that cannot start fails after its 30-60 minute start-up; a function whose reservation the
account cannot spare fails the deploy. Each check here is one or two read-only calls, one line each
(✔, ✘ with the fix, ? with why it could not ask):

- Lambda ``GetAccountSettings``: the unreserved concurrency left after the function's reservation
  stays at least 100, Lambda's floor ("decreases account's UnreservedConcurrentExecution below its
  minimum value of 100" otherwise;
  https://docs.aws.amazon.com/lambda/latest/dg/configuration-concurrency.html);
- Service Quotas: ``<instance type> for endpoint usage`` at least ``endpoint.instances_max`` (no such
  quota: the type is not offered for endpoints in the region;
  https://docs.aws.amazon.com/sagemaker/latest/dg/regions-quotas.html);
- the CDK bootstrap stack's version (its SSM parameter) at least what the synthesized stacks require
  (``cdk.out/manifest.json``'s ``requiresBootstrapStackVersion``;
  https://docs.aws.amazon.com/cdk/v2/guide/bootstrapping-env.html);
- the model: ``model_s3_uri`` has objects under its prefix; a Hugging Face id of a gated family is
  ✘ (the copy downloads without a token: the stage refuses tokens in its environment);
- the AWS Lambda Web Adapter layer version exists in the region (``GetLayerVersionByArn``);
- the image and the AMI: :func:`prefix_routing.stage.ami.ami_runs_image`;
- the alarm e-mails (confirmed only from their inboxes) and the benchmark's bucket and token secret,
  where the stage sets them.

Every call is bounded (:data:`CLIENT_CONFIG`: short connect and read timeouts, two attempts), so an
unreachable account gives a ? per check within a minute, never a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from prefix_routing.stage.ami import AMI_FOR_FRAMEWORK, ami_for, ami_runs_image, image_cuda
from prefix_routing.stage.config import StageConfig
from prefix_routing.stage.web_adapter import web_adapter_layer_arn
from prefix_routing.verify.deployment import error_code
from prefix_routing.verify.report import Check, fail, ok, unknown

#: Lambda keeps at least this much of an account's concurrency unreserved.
UNRESERVED_FLOOR: Final = 100
#: Model families on the Hugging Face Hub whose weights are gated behind a licence (their model pages).
GATED_PREFIXES: Final = ("meta-llama/", "mistralai/Mistral-Large", "google/gemma")
#: Pages of ``ListServiceQuotas`` read at most (SageMaker has a few thousand quotas, 100 a page).
MAX_QUOTA_PAGES: Final = 60
#: The client settings every preflight call uses: an unreachable endpoint is a ? within seconds.
CLIENT_CONFIG: Final = {"connect_timeout": 3, "read_timeout": 8, "retries": {"max_attempts": 2, "mode": "standard"}}
_FAILED_TO_ASK = ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "NoCredentialsError",
                  "ConnectionClosedError", "NoRegionError", "PartialCredentialsError")


@dataclass(frozen=True, slots=True)
class PreflightClients:
    """The boto3 clients preflight reads with (tests pass stubbed ones)."""

    lambda_: Any
    service_quotas: Any
    ssm: Any
    s3: Any
    secretsmanager: Any

    @classmethod
    def from_session(cls, session: Any) -> PreflightClients:
        from botocore.config import Config

        config = Config(**CLIENT_CONFIG)
        return cls(*(session.client(name, config=config)
                     for name in ("lambda", "service-quotas", "ssm", "s3", "secretsmanager")))


def could_not_ask(title: str, error: Exception, permission: str) -> Check:
    """A ? for a call that failed: unreachable, no credentials, or refused (then the permission it needs)."""
    code = error_code(error)
    if code in _FAILED_TO_ASK or not hasattr(error, "response"):
        return unknown(title, f"could not ask AWS ({code}: {str(error)[:160]})",
                       "run again with credentials for the target account and a network route to AWS")
    return unknown(title, f"could not ask AWS ({code})", f"grant {permission} to whoever runs preflight")


def check_concurrency(lambda_client: Any, reservation: int) -> Check:
    title = "Lambda concurrency"
    try:
        limits = lambda_client.get_account_settings()["AccountLimit"]
    except Exception as error:  # noqa: BLE001 - every failure to ask is a ?
        return could_not_ask(title, error, "lambda:GetAccountSettings")
    unreserved = int(limits.get("UnreservedConcurrentExecutions", 0))
    left = unreserved - reservation
    detail = (f"{unreserved:,} unreserved of {int(limits.get('ConcurrentExecutions', 0)):,}; the normalizer reserves "
              f"{reservation:,}, leaving {left:,}")
    if left >= UNRESERVED_FLOOR:
        return ok(title, detail)
    most = unreserved - UNRESERVED_FLOOR
    fix = (f"set normalizer.reserved_concurrency to at most {most:,}" if most >= 1 else
           "the account has no concurrency to reserve") + (
        ", or ask for a higher 'Concurrent executions' quota (Service Quotas, AWS Lambda); on a redeploy, the "
        "function's current reservation counts as unreserved again")
    return fail(title, f"{detail}, below Lambda's floor of {UNRESERVED_FLOOR}: cdk deploy would fail", fix)


def check_instance_quota(service_quotas: Any, instance_type: str, needed: int, region: str) -> Check:
    title = f"quota {instance_type} for endpoint usage"
    wanted = f"{instance_type} for endpoint usage"
    token = None
    try:
        for _ in range(MAX_QUOTA_PAGES):
            page = service_quotas.list_service_quotas(ServiceCode="sagemaker", MaxResults=100,
                                                      **({"NextToken": token} if token else {}))
            found = next((q for q in page.get("Quotas", []) if q.get("QuotaName") == wanted), None)
            if found is not None:
                value = int(found.get("Value", 0))
                if value >= needed:
                    return ok(title, f"{value} in {region}; the stage asks for up to {needed}")
                return fail(title, f"{value} in {region}; the stage asks for up to {needed} (endpoint.instances_max)",
                            f"request {needed} in Service Quotas (SageMaker, '{wanted}', quota code "
                            f"{found.get('QuotaCode', '?')}), or lower endpoint.instances_max")
            token = page.get("NextToken")
            if not token:
                return fail(title, f"no such quota in {region}: the type is not offered for endpoints there",
                            "choose another endpoint.instance_type or another region")
    except Exception as error:  # noqa: BLE001
        return could_not_ask(title, error, "servicequotas:ListServiceQuotas")
    return unknown(title, f"not found in the first {MAX_QUOTA_PAGES} pages of SageMaker's quotas",
                   f"look it up: Service Quotas, Amazon SageMaker, '{wanted}'")


def required_bootstrap(manifest: Path, stack_prefix: str) -> tuple[int, str] | None:
    """(the highest ``requiresBootstrapStackVersion`` of the stage's synthesized stacks and assets, the
    SSM parameter that holds the bootstrap version), or None when ``cdk.out`` has none of them."""
    try:
        artifacts = json.loads(manifest.read_text(encoding="utf-8")).get("artifacts", {})
    except (OSError, ValueError):
        return None
    found = [(props["requiresBootstrapStackVersion"], props.get("bootstrapStackVersionSsmParameter",
                                                                 "/cdk-bootstrap/hnb659fds/version"))
             for name, artifact in artifacts.items() if name.startswith(f"{stack_prefix}-")
             for props in [artifact.get("properties") or {}] if isinstance(props.get("requiresBootstrapStackVersion"), int)]
    return max(found) if found else None


def check_bootstrap(ssm: Any, manifest: Path, stack_prefix: str, stage_name: str) -> Check:
    title = "CDK bootstrap"
    required = required_bootstrap(manifest, stack_prefix)
    if required is None:
        return unknown(title, f"no synthesized stacks of this stage in {manifest}",
                       f"synthesize first: npx cdk synth -c stage={stage_name}, then run preflight again")
    version, parameter = required
    try:
        value = ssm.get_parameter(Name=parameter)["Parameter"]["Value"]
    except Exception as error:  # noqa: BLE001
        if error_code(error) == "ParameterNotFound":
            return fail(title, f"{parameter} not found: the account and region are not bootstrapped",
                        "npx cdk bootstrap aws://<account>/<region> (by whoever administers the account)")
        return could_not_ask(title, error, f"ssm:GetParameter on {parameter}")
    if not str(value).isdigit():
        return unknown(title, f"{parameter} holds {str(value)[:40]!r}, not a version number")
    if int(value) >= version:
        return ok(title, f"version {value}; the stacks need at least {version}")
    return fail(title, f"version {value}; the stacks need at least {version}",
                "npx cdk bootstrap aws://<account>/<region> to upgrade the bootstrap stack")


def check_model(s3: Any, config: StageConfig) -> Check:
    model = config.model
    if model.model_s3_uri:
        title = f"model weights {model.model_s3_uri}"
        try:
            listed = s3.list_objects_v2(Bucket=model.s3_bucket, Prefix=model.s3_prefix, MaxKeys=1)
        except Exception as error:  # noqa: BLE001
            if error_code(error) == "NoSuchBucket":
                return fail(title, "no such bucket", "upload the weights and set model.model_s3_uri to their folder")
            return could_not_ask(title, error, f"s3:ListBucket on {model.s3_bucket}")
        if listed.get("KeyCount", 0) >= 1:
            return ok(title, "objects under the prefix")
        return fail(title, "no objects under the prefix", "upload the uncompressed weights there (aws s3 sync)")
    title = f"model {model.model_id}"
    if model.model_id and model.model_id.startswith(GATED_PREFIXES):
        return fail(title, "a gated model on the Hugging Face Hub: the copy downloads it without a token (a stage "
                           "never carries one) and cannot start",
                    "download the weights once (after accepting the licence), upload them to S3 and set "
                    "model.model_s3_uri instead of model.model_id")
    return unknown(title, "the copy downloads it from the Hugging Face Hub at start, without a token",
                   "make sure it is not gated (its page on huggingface.co), or use model.model_s3_uri")


def check_web_adapter(lambda_client: Any, region: str) -> Check:
    arn = web_adapter_layer_arn(region, lambda_client.meta.partition)
    title = "Lambda Web Adapter layer"
    try:
        layer = lambda_client.get_layer_version_by_arn(Arn=arn)
    except Exception as error:  # noqa: BLE001
        if error_code(error) in ("ResourceNotFoundException", "AccessDeniedException"):
            # A public layer that is not there, or not shared with the region, refuses the same way.
            return fail(title, f"{arn}: {error_code(error)}", "the layer is not published in this region: "
                        "deploy to a region the Lambda Web Adapter publishes, or pin a version it has")
        return could_not_ask(title, error, "lambda:GetLayerVersion")
    return ok(title, f"{layer.get('LayerVersionArn', arn)}")


def check_image_and_ami(config: StageConfig) -> Check:
    model = config.model
    ami = ami_for(model.framework, config.endpoint.inference_ami_version)
    title = f"image {model.image_repository}:{model.image_tag} on {ami or 'the default AMI'}"
    cuda = image_cuda(model.image_repository, model.image_tag)
    if cuda is None:
        return unknown(title, "the CUDA version this image needs is not in the table (prefix_routing/stage/ami.py)",
                       "read the image's release notes and the AMI's driver (SageMaker's inference-gpu-drivers page)")
    runs, why = ami_runs_image(ami, cuda)
    if runs:
        return ok(title, why)
    return fail(title, why + ": the copy would fail its health check after the start-up timeout",
                f"set endpoint.inference_ami_version = \"{AMI_FOR_FRAMEWORK[model.framework]}\" (or leave it unset)")


def check_alarm_emails(config: StageConfig) -> Check | None:
    emails = config.alarms.emails
    if not emails:
        return None
    return unknown(f"alarm e-mails ({len(emails)})", "SNS asks each address to confirm after deploy; until then "
                   "alarms reach no one", "confirm the subscription from each inbox after cdk deploy")


def check_benchmark(s3: Any, secretsmanager: Any, config: StageConfig) -> list[Check]:
    benchmark = config.benchmark
    if not benchmark.enabled:
        return []
    checks = []
    title = f"benchmark bucket {benchmark.s3_uri}"
    try:
        s3.list_objects_v2(Bucket=benchmark.bucket, Prefix=benchmark.prefix, MaxKeys=1)
        checks.append(ok(title, "readable"))
    except Exception as error:  # noqa: BLE001
        checks.append(fail(title, "no such bucket", "create it, or set benchmark.s3_uri to one that exists")
                      if error_code(error) == "NoSuchBucket" else
                      could_not_ask(title, error, f"s3:ListBucket on {benchmark.bucket}"))
    if benchmark.hf_token_secret_arn:
        title = "benchmark tokenizer token secret"
        try:
            secretsmanager.describe_secret(SecretId=benchmark.hf_token_secret_arn)
            checks.append(ok(title, benchmark.hf_token_secret_arn))
        except Exception as error:  # noqa: BLE001
            checks.append(fail(title, f"{benchmark.hf_token_secret_arn}: not found", "create the secret, or fix "
                               "benchmark.hf_token_secret_arn") if error_code(error) == "ResourceNotFoundException"
                          else could_not_ask(title, error, "secretsmanager:DescribeSecret"))
    return checks


def preflight_stage(config: StageConfig, clients: PreflightClients, *, region: str,
                    manifest: Path = Path("cdk.out/manifest.json")) -> list[Check]:
    """Every check, in the order a first deploy meets them."""
    checks = [check_bootstrap(clients.ssm, manifest, config.stack_prefix, config.name),
              check_concurrency(clients.lambda_, config.normalizer.reserved_concurrency),
              check_web_adapter(clients.lambda_, region),
              check_instance_quota(clients.service_quotas, config.endpoint.instance_type,
                                   config.endpoint.instances_max, region),
              check_image_and_ami(config),
              check_model(clients.s3, config)]
    emails = check_alarm_emails(config)
    return checks + ([emails] if emails else []) + check_benchmark(clients.s3, clients.secretsmanager, config)


def run_preflight(config: StageConfig, *, profile: str | None = None, region: str | None = None,
                  manifest: Path = Path("cdk.out/manifest.json")) -> list[Check]:
    """``preflight_stage`` with the operator's credentials (boto3's usual chain, or ``profile``)."""
    from prefix_routing.verify.session import operator_session

    session = operator_session(profile=profile, region=region or config.region)
    return preflight_stage(config, PreflightClients.from_session(session), region=session.region_name,
                           manifest=manifest)
