"""One benchmark job against a stage's endpoint: the names, the workload spec, and the calls.

The calls and their shapes are botocore's sagemaker model (service-2.json of the pinned botocore):
``CreateAIWorkloadConfig`` (``AIWorkloadConfigName``; ``DatasetConfig.InputDataConfig[]`` of
``{ChannelName, DataSource.S3DataSource.S3Uri}``; ``AIWorkloadConfigs.WorkloadSpec.Inline``, a YAML or
JSON document), ``CreateAIBenchmarkJob`` (``AIBenchmarkJobName``, ``BenchmarkTarget.Endpoint``
``{Identifier, InferenceComponents[].Identifier}``, ``OutputConfig.S3OutputLocation``,
``AIWorkloadConfigIdentifier``, ``RoleArn``), ``DescribeAIBenchmarkJob`` (``AIBenchmarkJobStatus``
``InProgress`` | ``Completed`` | ``Failed`` | ``Stopping`` | ``Stopped``, ``FailureReason``,
``OutputConfig.CloudWatchLogs[]``) and ``StopAIBenchmarkJob``. Names are 1-63 characters of
``[a-zA-Z0-9](-*[a-zA-Z0-9])``; ours are lower case, because CloudFormation's schema for
``AWS::SageMaker::AIWorkloadConfig`` (cfn-lint's) says DeleteAIWorkloadConfig lowercases the name.
CloudFormation's schema also says the spec must declare ``benchmark.type`` ``aiperf``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

from prefix_routing.benchmark.workload import AIPERF_BLOCK_TOKENS
from prefix_routing.rules.errors import UserError

#: Where DescribeAIBenchmarkJob's status ends.
TERMINAL = ("Completed", "Failed", "Stopped")
#: The dataset channel the workload config names.
CHANNEL = "mooncake-trace"
_NAME_MAX = 63
_STAMP = "%Y%m%d-%H%M%S"


@dataclass(frozen=True, slots=True)
class Clients:
    """The boto3 clients a benchmark uses (tests pass stubbed ones)."""

    sagemaker: Any
    s3: Any
    cloudformation: Any

    @classmethod
    def from_session(cls, session: Any) -> Clients:
        return cls(session.client("sagemaker"), session.client("s3"), session.client("cloudformation"))


def clients_for(*, profile: str | None, region: str | None) -> Clients:
    """The clients of the operator's credentials (boto3's usual chain, or ``profile``) in ``region``."""
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        session = boto3.Session(profile_name=profile, region_name=region)
    except BotoCoreError as error:  # an unknown profile
        raise UserError(str(error)) from None
    if not session.region_name:
        raise UserError("no region: pass --region, or set one in the stage file or your AWS configuration")
    return Clients.from_session(session)


@dataclass(frozen=True)
class JobPlan:
    """Everything one job needs, decided before the first call."""

    name: str  # the job's and its workload config's name
    endpoint_name: str
    component_name: str
    bucket: str
    workload_key: str
    results_prefix: str  # a key prefix ending in "/": the job's S3OutputLocation
    role_arn: str
    spec: dict

    @property
    def workload_uri(self) -> str:
        return f"s3://{self.bucket}/{self.workload_key}"

    @property
    def results_uri(self) -> str:
        return f"s3://{self.bucket}/{self.results_prefix}"


def job_name(stage: str, workload: str, now: datetime) -> str:
    """``<stage>-<workload>-<yyyymmdd-hhmmss>``, lower case, at most 63 characters."""
    slug = re.sub(r"[^a-z0-9]+", "-", workload.lower()).strip("-") or "trace"
    stamp = now.strftime(_STAMP)
    head = f"{stage.lower()}-{slug}"[: _NAME_MAX - len(stamp) - 1].rstrip("-")
    return f"{head}-{stamp}"


def workload_spec(tokenizer: str, hf_token_secret_arn: str | None = None) -> dict:
    """The WorkloadSpec document: AIPerf replays the Mooncake trace of the dataset channel on its
    fixed schedule (the trace's timestamps), streaming, counting tokens with ``tokenizer``.

    ``benchmark.type`` ``aiperf`` is what CloudFormation's schema requires; ``parameters`` are
    AIPerf's options with ``_`` for ``-`` (AWS's example: ``prompt_input_tokens_mean``), here
    ``--custom-dataset-type mooncake_trace``, ``--fixed-schedule``, ``--prompt-input-tokens-block-size``,
    ``--streaming`` and ``--tokenizer`` (aiperf/common/config/input_config.py, prompt_config.py,
    endpoint_config.py, tokenizer_config.py)."""
    spec: dict[str, Any] = {
        "benchmark": {"type": "aiperf"},
        "parameters": {
            "custom_dataset_type": "mooncake_trace",
            "fixed_schedule": True,
            "prompt_input_tokens_block_size": AIPERF_BLOCK_TOKENS,
            "streaming": True,
            "tokenizer": tokenizer,
        },
        "tooling": {"api_standard": "openai"},
    }
    if hf_token_secret_arn:
        spec["secrets"] = {"hf_token": hf_token_secret_arn}
    return spec


def check_stage(config: Any) -> str:
    """The tokenizer of a stage that can be benchmarked; else a UserError saying what to set."""
    if not config.benchmark.enabled:
        raise UserError(f"stage {config.name} has no [benchmark] s3_uri: set benchmark.s3_uri = "
                        "\"s3://<bucket>/<prefix>/\" in its stage file and deploy it (the job's role comes with it)")
    tokenizer = config.benchmark.tokenizer or config.model.model_id
    if not tokenizer:
        raise UserError(f"stage {config.name}: benchmark.tokenizer is unset and the model has no model_id "
                        "(its weights come from model_s3_uri): name the Hugging Face tokenizer AIPerf counts with")
    return tokenizer


def plan_job(config: Any, workload: str, role_arn: str, now: datetime) -> JobPlan:
    """The job for ``workload`` (its label) on the stage ``config`` (a StageConfig with [benchmark] on)."""
    tokenizer = check_stage(config)
    settings = config.benchmark
    name = job_name(config.name, workload, now)
    return JobPlan(
        name=name,
        endpoint_name=config.endpoint_name,
        component_name=config.component_name,
        bucket=settings.bucket,
        workload_key=f"{settings.workloads_prefix}{name}.jsonl",
        results_prefix=f"{settings.results_prefix}{name}/",
        role_arn=role_arn,
        spec=workload_spec(tokenizer, settings.hf_token_secret_arn),
    )


def _unreachable(error: Exception) -> UserError | None:
    """No credentials, no network (botocore's own errors, not an answer of AWS): one line."""
    from botocore.exceptions import BotoCoreError

    return UserError(f"cannot reach AWS: {error}") if isinstance(error, BotoCoreError) else None


def _code(error: Exception) -> str:
    return getattr(error, "response", {}).get("Error", {}).get("Code", type(error).__name__)


def _message(error: Exception) -> str:
    return getattr(error, "response", {}).get("Error", {}).get("Message", "") or str(error)


def role_arn_for(config: Any, cloudformation: Any) -> str:
    """The job's role: ``benchmark.role_arn``, else the Endpoint stack's ``BenchmarkRoleArn`` output."""
    if config.benchmark.role_arn:
        return config.benchmark.role_arn
    stack = f"{config.stack_prefix}-Endpoint"
    try:
        (described,) = cloudformation.describe_stacks(StackName=stack)["Stacks"]
    except Exception as error:  # noqa: BLE001 - every API error becomes one line
        if unreachable := _unreachable(error):
            raise unreachable from None
        raise UserError(f"stack {stack}: cannot read it ({_code(error)}: {_message(error)}); deploy the stage "
                        f"(npx cdk deploy --all -c stage={config.name}) or set benchmark.role_arn") from None
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    if "BenchmarkRoleArn" not in outputs:
        raise UserError(f"stack {stack} has no BenchmarkRoleArn output (deployed before [benchmark] was set): "
                        f"deploy it again (npx cdk deploy --all -c stage={config.name}) or set benchmark.role_arn")
    return outputs["BenchmarkRoleArn"]


def upload_workload(s3: Any, plan: JobPlan, body: bytes) -> None:
    """The Mooncake trace to ``plan.workload_uri``, once the bucket is known to exist."""
    try:
        s3.head_bucket(Bucket=plan.bucket)
    except Exception as error:  # noqa: BLE001
        if unreachable := _unreachable(error):
            raise unreachable from None
        code = _code(error)
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise UserError(f"bucket {plan.bucket} does not exist (benchmark.s3_uri): create it in the stage's "
                            "region, or name another in the stage file") from None
        if code in ("403", "AccessDenied", "Forbidden"):
            raise UserError(f"bucket {plan.bucket}: not allowed to use it ({code}); your credentials need "
                            f"s3:ListBucket and s3:PutObject on it") from None
        raise UserError(f"bucket {plan.bucket}: {code}: {_message(error)}") from None
    try:
        s3.put_object(Bucket=plan.bucket, Key=plan.workload_key, Body=body, ContentType="application/jsonl")
    except Exception as error:  # noqa: BLE001
        raise _unreachable(error) or UserError(
            f"cannot upload the workload to {plan.workload_uri} ({_code(error)}: {_message(error)})") from None


def start_job(sagemaker: Any, plan: JobPlan) -> str:
    """Creates the workload config and the job; the job's ARN."""
    try:
        sagemaker.create_ai_workload_config(
            AIWorkloadConfigName=plan.name,
            DatasetConfig={"InputDataConfig": [
                {"ChannelName": CHANNEL, "DataSource": {"S3DataSource": {"S3Uri": plan.workload_uri}}}]},
            AIWorkloadConfigs={"WorkloadSpec": {"Inline": json.dumps(plan.spec, sort_keys=True)}},
        )
    except Exception as error:  # noqa: BLE001
        raise _unreachable(error) or UserError(
            f"cannot create the workload config {plan.name} ({_code(error)}: {_message(error)})") from None
    try:
        created = sagemaker.create_ai_benchmark_job(
            AIBenchmarkJobName=plan.name,
            BenchmarkTarget={"Endpoint": {"Identifier": plan.endpoint_name,
                                          "InferenceComponents": [{"Identifier": plan.component_name}]}},
            OutputConfig={"S3OutputLocation": plan.results_uri},
            AIWorkloadConfigIdentifier=plan.name,
            RoleArn=plan.role_arn,
        )
    except Exception as error:  # noqa: BLE001
        raise _unreachable(error) or UserError(
            f"cannot create the benchmark job {plan.name} ({_code(error)}: {_message(error)})") from None
    return created["AIBenchmarkJobArn"]


def duration_text(seconds: float) -> str:
    """``45s``, ``12m05s``, ``1h02m``."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _stop_hint(name: str) -> str:
    return f"aws sagemaker stop-ai-benchmark-job --ai-benchmark-job-name {name}"


def _log_text(job: dict) -> str:
    logs = (job.get("OutputConfig") or {}).get("CloudWatchLogs") or []
    where = [f"{log.get('LogGroupArn', '?')} {log.get('LogStreamName', '')}".strip() for log in logs]
    return f"; its log: {', '.join(where)}" if where else ""


def wait_for_job(sagemaker: Any, name: str, *, timeout_s: float, poll_s: float, clock: Callable[[], float],
                 sleep: Callable[[float], None], report: Callable[[str], None]) -> dict:
    """Polls the job every ``poll_s`` until it ends; its last description. Failed or stopped: a
    UserError with the reason. Still running after ``timeout_s``: the job is stopped (so that it
    costs no more) and a UserError says so."""
    start = clock()
    deadline = start + timeout_s
    while True:
        try:
            job = sagemaker.describe_ai_benchmark_job(AIBenchmarkJobName=name)
        except Exception as error:  # noqa: BLE001
            raise _unreachable(error) or UserError(
                f"cannot read benchmark job {name} ({_code(error)}: {_message(error)}); it may still be running: "
                f"{_stop_hint(name)}") from None
        status = job["AIBenchmarkJobStatus"]
        now = clock()
        report(f"benchmark job {name}: {status}, {duration_text(now - start)} of at most {duration_text(timeout_s)}")
        if status == "Completed":
            return job
        if status == "Failed":
            raise UserError(f"benchmark job {name} failed: {job.get('FailureReason') or 'no reason given'}"
                            f"{_log_text(job)}")
        if status == "Stopped":
            raise UserError(f"benchmark job {name} was stopped before it completed{_log_text(job)}")
        if now >= deadline:
            try:
                sagemaker.stop_ai_benchmark_job(AIBenchmarkJobName=name)
                stopped = "stopped it, so that it costs no more"
            except Exception as error:  # noqa: BLE001
                stopped = f"could not stop it ({_code(error)}): stop it yourself: {_stop_hint(name)}"
            raise UserError(f"benchmark job {name} is still {status} after {duration_text(now - start)} "
                            f"(--timeout {timeout_s:g}): {stopped}; give a longer --timeout, or a shorter workload "
                            "(--limit)")
        sleep(min(poll_s, max(0.0, deadline - now)))
