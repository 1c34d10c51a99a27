"""The typed stage configuration, validated once, before any construct is built.

A stage is a TOML file under ``config/`` selected with ``cdk synth -c stage=NAME``; the stage
``default`` is embedded here and needs no file. The stacks and the local emulator read the same
:class:`StageConfig`, so what you test locally is what you deploy.

Every error names the file, the field path, the value and what is allowed; ``load_stage`` raises
:class:`ConfigError` with all of them at once.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from prefix_routing.stage.presets import INSTANCES

# PREFIX_ROUTING_CONFIG_DIR points synth at another folder of stage files (tests use it).
CONFIG_DIR = Path(os.environ.get("PREFIX_ROUTING_CONFIG_DIR") or Path(__file__).resolve().parents[2] / "config")
DEFAULT_STAGE = "default"

ROUTING_STRATEGIES = ("RANDOM", "LEAST_OUTSTANDING_REQUESTS", "PREFIX_AWARE")
PUBLISH_FREQUENCIES = (10, 30, 60, 120, 180, 240, 300)

# Accelerators and host memory of the instance types we know come from the lab's instance table
# (presets.INSTANCES). Other ml.* types are accepted with a warning; their copy packing is then
# not checked at synth.

_NAME = r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$"  # SageMaker resource names and our stage names


class ConfigError(Exception):
    """The stage configuration is invalid. ``str()`` lists every problem, one per line."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class _Section(BaseModel):
    # Unknown keys are typos; strict types: "4096" is not 4096.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelSettings(_Section):
    framework: Literal["vllm", "djl-lmi"]
    image_repository: str = Field(min_length=1, description="ECR repository in the regional DLC account")
    image_tag: str = Field(min_length=1, description="a pinned tag, never 'latest'")
    model_id: str | None = Field(None, description="Hugging Face model id")
    model_s3_uri: str | None = Field(None, description="s3://bucket/prefix/ of uncompressed weights")
    environment: dict[str, str] = Field(default_factory=dict, description="extra container environment")
    tensor_parallel_degree: int = Field(1, ge=1, le=8)
    accelerators_per_copy: int = Field(1, ge=1, le=8)
    memory_per_copy_mb: int = Field(24 * 1024, ge=1024)
    startup_health_check_timeout_s: int = Field(1800, ge=60, le=3600)

    @field_validator("image_tag")
    @classmethod
    def _pinned(cls, value: str) -> str:
        if value == "latest":
            raise ValueError("pin a tag; 'latest' changes under a running endpoint")
        return value

    @field_validator("model_s3_uri")
    @classmethod
    def _s3_uri(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"s3://[a-z0-9.\-]{3,63}/.*", value):
            raise ValueError("must look like s3://bucket/prefix/")
        if value is not None and not value.endswith("/"):
            raise ValueError(f"{value!r} must end with '/': an S3Prefix model data URI names a folder")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSettings":
        if (self.model_id is None) == (self.model_s3_uri is None):
            raise ValueError("set exactly one of model_id (Hugging Face id) or model_s3_uri")
        if self.tensor_parallel_degree != self.accelerators_per_copy:
            raise ValueError(
                f"tensor_parallel_degree ({self.tensor_parallel_degree}) must equal accelerators_per_copy "
                f"({self.accelerators_per_copy}): each copy shards the model over its own accelerators"
            )
        return self

    @property
    def reports_cached_tokens(self) -> bool:
        """Whether the container reports ``usage.prompt_tokens_details.cached_tokens`` (the vLLM DLC
        with ``SM_VLLM_ENABLE_PROMPT_TOKENS_DETAILS``; DJL-LMI drops that frontend flag)."""
        return self.framework == "vllm"

    @property
    def s3_bucket(self) -> str | None:
        return self.model_s3_uri.removeprefix("s3://").split("/", 1)[0] if self.model_s3_uri else None

    @property
    def s3_prefix(self) -> str | None:
        return self.model_s3_uri.removeprefix("s3://").split("/", 1)[1] if self.model_s3_uri else None


class EndpointSettings(_Section):
    instance_type: str = Field(pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$")
    instances_min: int = Field(1, ge=0, le=100, description="0 allows scale to zero")
    instances_max: int = Field(2, ge=1, le=100)
    copies_min: int = Field(1, ge=0, le=1000, description="0 allows scale to zero")
    copies_max: int = Field(2, ge=1, le=1000)
    scale_in_strategy: Literal["IDLE_RELEASE", "CONSOLIDATION"] = "IDLE_RELEASE"
    scale_in_cooldown_minutes: int = Field(15, ge=5, le=1440)

    @model_validator(mode="after")
    def _ranges(self) -> "EndpointSettings":
        if self.instances_min > self.instances_max:
            raise ValueError(f"instances_min ({self.instances_min}) must be <= instances_max ({self.instances_max})")
        if self.copies_min > self.copies_max:
            raise ValueError(f"copies_min ({self.copies_min}) must be <= copies_max ({self.copies_max})")
        return self


class RoutingSettings(_Section):
    strategy: str
    prefix_length: int | None = Field(4096, ge=1024, le=65536, description="bytes of the body that key routing")
    concurrency_threshold: int | None = Field(10, ge=1, le=1024, description="in-flight requests per copy before spilling")

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, value: str) -> str:
        if value == "KV_AWARE":
            raise ValueError(
                "KV_AWARE is known to the SageMaker API but CloudFormation, cfn-lint and CDK do not accept it "
                "yet; use PREFIX_AWARE (or simulate KV_AWARE in the lab)"
            )
        if value not in ROUTING_STRATEGIES:
            raise ValueError(f"must be one of {', '.join(ROUTING_STRATEGIES)}")
        return value

    @model_validator(mode="after")
    def _prefix_aware_settings(self) -> "RoutingSettings":
        if self.strategy == "PREFIX_AWARE" and (self.prefix_length is None or self.concurrency_threshold is None):
            raise ValueError("PREFIX_AWARE needs both prefix_length (1024-65536) and concurrency_threshold (1-1024)")
        return self


class MetricsSettings(_Section):
    publish_frequency_s: int = 10
    detailed_observability: bool = False  # billed per GB; AWS turns it on by default, so say it

    @field_validator("publish_frequency_s")
    @classmethod
    def _frequency(cls, value: int) -> int:
        if value not in PUBLISH_FREQUENCIES:
            raise ValueError(f"must be one of {', '.join(map(str, PUBLISH_FREQUENCIES))}")
        return value


class ScalingSettings(_Section):
    target_concurrent_requests_per_copy: float = Field(4.0, gt=0, le=1024)
    scale_out_cooldown_s: int = Field(60, ge=0, le=3600)
    scale_in_cooldown_s: int = Field(300, ge=0, le=3600)


class AlarmSettings(_Section):
    ttft_p50_ms: float = Field(2000.0, gt=0, description="alarm when P50 time to first token exceeds this")
    hotspot_factor: float = Field(
        2.0, gt=1, le=100, description="an instance above this multiple of its fair share (the scaling target)"
    )
    minimum_hit_rate: float = Field(0.3, ge=0, le=1, description="cached / prompt tokens below this")
    error_rate_percent: float = Field(1.0, gt=0, le=100, description="5XX errors as % of invocations")
    evaluation_periods: int = Field(5, ge=1, le=60, description="minutes a condition must hold")
    emails: list[Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")]] = Field(default_factory=list)


class ReplicationStageSettings(_Section):
    """The [normalizer.replication] section: hot-prefix replication by the front door
    (``prefix_routing.rules.replication``; the function reads it from ``REPLICATION_*``)."""

    enabled: bool = False
    max_replicas: int = Field(32, ge=1, le=64, description="the most replicas (PrefixAwareIds) one prefix gets")
    target_share_factor: float = Field(
        0.1, ge=0.01, le=1000,
        description="a prefix is replicated once it takes more than this many fair shares, 1/copies, of recent requests",
    )
    half_life_s: float = Field(300.0, ge=1, le=86400, description="seconds after which a request counts half")
    min_requests: float = Field(8.0, ge=1, le=10000, description="recent requests of a prefix before it is replicated")


#: An account id, or the ARN of an IAM role or user (what a Lambda resource policy names as principal).
_PRINCIPAL = r"^(\d{12}|arn:aws[a-z-]*:iam::\d{12}:(role|user)/[A-Za-z0-9_+=,.@/-]+)$"


class NormalizerFunctionSettings(_Section):
    """The [normalizer] section: how the front-door Lambda is deployed (the rules are in normalize.py)."""

    tenancy: Literal["iam", "header", "none"] = "iam"
    tenant_header: str = Field("x-tenant-id", pattern=r"^[a-z0-9-]+$")
    allow_direct_invoke: bool = Field(
        False, description="answer direct invocations, trusting every direct caller with the tenant it names",
    )
    invoke_principals: list[Annotated[str, Field(pattern=_PRINCIPAL, max_length=2048)]] = Field(
        default_factory=list,
        description="accounts (12 digits) or IAM role/user ARNs the function's resource policy lets call its URL",
    )
    reserved_concurrency: int = Field(50, ge=1, le=1000)
    memory_mb: int = Field(512, ge=128, le=10240)
    timeout_s: int = Field(120, ge=5, le=900)
    log_retention_days: Literal[1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365] = 30
    block_bytes: int = Field(2048, ge=64, le=65536)
    replication: ReplicationStageSettings = ReplicationStageSettings()


class AdvisorSettings(_Section):
    """The [advisor] section: the routing advisor function (prefix_routing.advisor), run on a schedule
    over the last window of the normalizer's request log."""

    enabled: bool = True
    schedule_minutes: int = Field(60, ge=5, le=1440, description="minutes between runs; each reads that window")
    notify_gain_points: float = Field(5.0, gt=0, le=100, description="hit-rate points the best settings must gain")
    notify_ttft_gain: float = Field(0.2, gt=0, lt=1, description="or this share of P50 TTFT they must cut")
    notify_after_runs: int = Field(3, ge=1, le=1000, description="consecutive runs with the same advice before notifying")
    max_events: int = Field(100_000, ge=1000, le=1_000_000, description="request-log lines read per run at most")
    memory_mb: int = Field(1024, ge=256, le=10240)
    timeout_s: int = Field(300, ge=60, le=900)
    log_retention_days: Literal[1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365] = 30


class StageConfig(_Section):
    name: str = Field(DEFAULT_STAGE, pattern=_NAME, max_length=20)
    region: str | None = Field(None, pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")
    account: str | None = Field(None, pattern=r"^\d{12}$")
    model: ModelSettings
    endpoint: EndpointSettings
    routing: RoutingSettings
    metrics: MetricsSettings = MetricsSettings()
    scaling: ScalingSettings = ScalingSettings()
    alarms: AlarmSettings = AlarmSettings()
    normalizer: NormalizerFunctionSettings = NormalizerFunctionSettings()
    advisor: AdvisorSettings = AdvisorSettings()

    @model_validator(mode="after")
    def _cross_section(self) -> "StageConfig":
        known = INSTANCES.get(self.endpoint.instance_type)
        if known:
            gpus, memory_mb = known.gpus, known.host_memory_gib * 1024
            if self.model.accelerators_per_copy > gpus:
                raise ValueError(
                    f"model.accelerators_per_copy ({self.model.accelerators_per_copy}) exceeds the "
                    f"{gpus} accelerators of {self.endpoint.instance_type}"
                )
            if self.model.memory_per_copy_mb > memory_mb:
                raise ValueError(
                    f"model.memory_per_copy_mb ({self.model.memory_per_copy_mb}) exceeds the host memory "
                    f"of {self.endpoint.instance_type} ({memory_mb} MiB)"
                )
            capacity = self.endpoint.instances_max * self.copies_per_instance
            if self.endpoint.copies_max > capacity:
                raise ValueError(
                    f"endpoint.copies_max ({self.endpoint.copies_max}) exceeds what instances_max "
                    f"({self.endpoint.instances_max}) x {self.copies_per_instance} copies per instance can hold"
                )
        if self.routing.concurrency_threshold is not None and self.routing.strategy == "PREFIX_AWARE":
            if self.scaling.target_concurrent_requests_per_copy > self.routing.concurrency_threshold:
                raise ValueError(
                    f"scaling.target_concurrent_requests_per_copy ({self.scaling.target_concurrent_requests_per_copy})"
                    f" is above routing.concurrency_threshold ({self.routing.concurrency_threshold}): copies would "
                    "spill before autoscaling adds capacity"
                )
        return self

    @property
    def endpoint_name(self) -> str:
        """The endpoint's name (fixed: the endpoint is updated in place, never replaced)."""
        return f"{self.name}-prefix-llm".lower()

    @property
    def stack_prefix(self) -> str:
        """The stacks are ``<prefix>-Endpoint``, ``<prefix>-Normalizer`` and ``<prefix>-Observability``."""
        return f"PrefixRouting-{self.name}"

    @property
    def dashboard_name(self) -> str:
        return f"{self.endpoint_name}-routing"

    @property
    def component_name(self) -> str:
        """The inference component's explicit name (CloudFormation's Ref gives only its ARN)."""
        return f"{self.name}-prefix-llm-ic".lower()

    @property
    def instances_at_rest(self) -> int:
        """Instances serving when traffic is low: the minimum, or what the minimum copies need."""
        return max(self.endpoint.instances_min, -(-self.endpoint.copies_min // self.copies_per_instance))

    @property
    def copies_per_instance(self) -> int:
        known = INSTANCES.get(self.endpoint.instance_type)
        gpus = known.gpus if known else self.model.accelerators_per_copy
        return max(1, gpus // self.model.accelerators_per_copy)

    @property
    def warnings(self) -> list[str]:
        """Legal settings that probably do not do what was meant."""
        found = []
        if not self.model.reports_cached_tokens:
            found.append(
                f"model.framework {self.model.framework!r} reports no cached tokens (LMI does not forward vLLM's "
                "enable_prompt_tokens_details): the KV-cache hit-rate alarm is left out and its chart stays empty"
            )
        if self.endpoint.instance_type not in INSTANCES:
            found.append(
                f"endpoint.instance_type {self.endpoint.instance_type!r} is not in the known table; "
                "accelerator and memory fit are not checked"
            )
        prefix_aware = self.routing.strategy == "PREFIX_AWARE"
        endpoint = self.endpoint
        if self.normalizer.replication.enabled and not prefix_aware:
            found.append(
                f"normalizer.replication has no effect with routing.strategy {self.routing.strategy}: replicas "
                "are other PrefixAwareIds, which only PREFIX_AWARE routing reads"
            )
        if prefix_aware and endpoint.copies_max < 2:
            found.append(
                "routing.strategy PREFIX_AWARE has no effect: at most "
                f"{endpoint.copies_max} copy can serve (routing by prefix needs two or more instances or copies)"
            )
        elif prefix_aware and endpoint.copies_min < 2:
            found.append(
                f"routing.strategy PREFIX_AWARE has no effect at rest: endpoint.copies_min = {endpoint.copies_min}, "
                "so one copy serves until autoscaling adds another (routing by prefix needs two or more "
                "instances or copies); set copies_min = 2"
            )
        elif prefix_aware and self.instances_at_rest < 2:
            found.append(
                f"routing.strategy PREFIX_AWARE at rest: {endpoint.copies_min} copies fit on one instance "
                f"(endpoint.instances_min = {endpoint.instances_min}); botocore documents routing by prefix "
                "'only when two or more instances can serve the request', so whether copies on one instance "
                "count is uncertain (no document settles it, nor does verify): set instances_min = 2, or check "
                "under load that the copies' KV-cache hit rates match the lab's"
            )
        return found


# The embedded default: Llama 3.1 8B on single-GPU ml.g6e.xlarge instances, two of them at rest (one
# copy each), so that prefix-aware routing always has a choice to make; up to three under load.
# Synthesizes with no file and no account.
DEFAULT_STAGE_DATA: dict[str, Any] = {
    "name": DEFAULT_STAGE,
    "model": {
        "framework": "vllm",
        "image_repository": "vllm",
        "image_tag": "server-sagemaker-cuda-v1",
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "tensor_parallel_degree": 1,
        "accelerators_per_copy": 1,
        "memory_per_copy_mb": 24 * 1024,
    },
    "endpoint": {"instance_type": "ml.g6e.xlarge", "instances_min": 2, "instances_max": 3, "copies_min": 2, "copies_max": 3},
    "routing": {"strategy": "PREFIX_AWARE", "prefix_length": 4096, "concurrency_threshold": 10},
}


def _allowed_range(loc: tuple[Any, ...]) -> str | None:
    """'allowed: 1024 to 65536' from the Field bounds of the field at ``loc``."""
    model: Any = StageConfig
    field = None
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        field = fields[part]
        model = field.annotation
    bounds = {
        type(m).__name__: getattr(m, type(m).__name__.lower())
        for m in (field.metadata if field else ())
        if type(m).__name__ in ("Ge", "Gt", "Le", "Lt")
    }
    low = bounds.get("Ge", bounds.get("Gt"))
    high = bounds.get("Le", bounds.get("Lt"))
    if low is None and high is None:
        return None
    low_word = "more than" if "Gt" in bounds else "from"
    high_word = "less than" if "Lt" in bounds else "to"  # "to 1" would wrongly allow 1
    if high is None:
        return f"allowed: {low_word} {low}"
    return f"allowed: {low_word} {low} to {high}" if high_word == "to" else f"allowed: {low_word} {low}, {high_word} {high}"


def _format_error(source: str, error: dict[str, Any]) -> str:
    path = ".".join(str(part) for part in error["loc"]) or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return f"{source}: {path}: unknown key (a typo?); see the configuration reference in README.md"
    if error["type"] == "missing":
        return f"{source}: {path}: required field is missing"
    if isinstance(error["input"], dict):  # a rule across fields: the message names them and their values
        return f"{source}: {path}: {message}"
    if error["type"] in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        message = _allowed_range(error["loc"]) or message
    return f"{source}: {path} = {error['input']!r}: {message}"


def parse_stage(data: dict[str, Any], *, source: str) -> StageConfig:
    try:
        return StageConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError([_format_error(source, e) for e in error.errors(include_url=False)]) from None


def load_stage(name: str = DEFAULT_STAGE, *, config_dir: Path = CONFIG_DIR) -> StageConfig:
    """The stage ``name``: the embedded default, or ``config_dir/<name>.toml``."""
    if name == DEFAULT_STAGE and not (config_dir / f"{name}.toml").exists():
        return parse_stage(DEFAULT_STAGE_DATA, source="embedded default stage")
    path = config_dir / f"{name}.toml"
    if not re.fullmatch(_NAME, name) or not path.is_file():
        available = sorted(p.stem for p in config_dir.glob("*.toml")) + [DEFAULT_STAGE]
        raise ConfigError([f"stage {name!r}: no file {path}; available stages: {', '.join(sorted(set(available)))}"])
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError([f"{path}: not valid TOML: {error}"]) from None
    data.setdefault("name", name)
    return parse_stage(data, source=str(path))
