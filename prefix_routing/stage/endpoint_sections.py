"""The sections of a stage that describe the endpoint: the serving container and its weights
([model]), instances and copies ([endpoint]), routing ([routing]) and copy autoscaling ([scaling]),
and the rules that join them (a copy's fit on its instance, the spill threshold against the scaling
target, what makes prefix-aware routing take effect).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from prefix_routing.rules.domains import SALT_ISOLATES
from prefix_routing.stage.ami import AMIS
from prefix_routing.stage.presets import INSTANCES
from prefix_routing.stage.section import Section, allowed
from prefix_routing.stage.value_checks import (ENV_MAX_LENGTH, ENVIRONMENT_MAX_ENTRIES, STACK_ENVIRONMENT_ENTRIES,
                                               EnvironmentKey, EnvironmentValue, checked_s3_uri)

ROUTING_STRATEGIES = ("RANDOM", "LEAST_OUTSTANDING_REQUESTS", "PREFIX_AWARE")

# Accelerators and host memory of the instance types we know come from the lab's instance table
# (presets.INSTANCES). Other types CloudFormation accepts are taken with a warning; their copy
# packing is then not checked at synth.

#: The instance types CloudFormation accepts for AWS::SageMaker::EndpointConfig
#: ProductionVariants[].InstanceType: its resource schema's enum (cfn-lint 1.58.0's schemas, the same
#: enum in every region; the schema has no pattern). By family: "p6-b200": "48xlarge" is
#: ml.p6-b200.48xlarge. tests/prefix_routing/stage/test_config_hostile.py compares it with the installed
#: cfn-lint's schema.
_HOSTING_INSTANCE_FAMILIES = {
    "c4": "large xlarge 2xlarge 4xlarge 8xlarge",
    "c5": "large xlarge 2xlarge 4xlarge 9xlarge 18xlarge",
    "c5d": "large xlarge 2xlarge 4xlarge 9xlarge 18xlarge",
    "c6g": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge",
    "c6gd": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge",
    "c6gn": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge",
    "c6i": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 32xlarge",
    "c6in": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 32xlarge",
    "c7g": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge",
    "c7i": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 48xlarge",
    "c8g": "medium large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 48xlarge",
    "dl1": "24xlarge",
    "g4dn": "xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge",
    "g5": "xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 48xlarge",
    "g6": "xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 48xlarge",
    "g6e": "xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 48xlarge",
    "g7": "2xlarge 4xlarge 8xlarge 12xlarge 24xlarge 48xlarge",
    "g7e": "2xlarge 4xlarge 8xlarge 12xlarge 24xlarge 48xlarge",
    "inf1": "xlarge 2xlarge 6xlarge 24xlarge",
    "inf2": "xlarge 8xlarge 24xlarge 48xlarge",
    "m4": "xlarge 2xlarge 4xlarge 10xlarge 16xlarge",
    "m5": "large xlarge 2xlarge 4xlarge 12xlarge 24xlarge",
    "m5d": "large xlarge 2xlarge 4xlarge 12xlarge 24xlarge",
    "m6g": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge",
    "m6gd": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge",
    "m6i": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 32xlarge",
    "m7i": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 48xlarge",
    "m8g": "medium large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 48xlarge",
    "p2": "xlarge 8xlarge 16xlarge",
    "p3": "2xlarge 8xlarge 16xlarge",
    "p4d": "24xlarge",
    "p4de": "24xlarge",
    "p5": "4xlarge 48xlarge",
    "p5e": "48xlarge",
    "p5en": "48xlarge",
    "p6-b200": "48xlarge",
    "p6-b300": "48xlarge",
    "p6e-gb200": "36xlarge",
    "r5": "large xlarge 2xlarge 4xlarge 12xlarge 24xlarge",
    "r5d": "large xlarge 2xlarge 4xlarge 12xlarge 24xlarge",
    "r6g": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge",
    "r6gd": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge",
    "r6i": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 32xlarge",
    "r7gd": "medium large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge",
    "r7i": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 48xlarge",
    "r8g": "medium large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 48xlarge",
    "t2": "medium large xlarge 2xlarge",
    "trn1": "2xlarge 32xlarge",
    "trn1n": "32xlarge",
    "trn2": "48xlarge",
}
HOSTING_INSTANCE_TYPES = frozenset(
    f"ml.{family}.{size}" for family, sizes in _HOSTING_INSTANCE_FAMILIES.items() for size in sizes.split()
)

# ECR's RepositoryName (botocore's ecr model) and Docker's tag grammar (ECR takes the same).
_ECR_REPOSITORY = r"^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*$"
_IMAGE_TAG = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"


class ModelSettings(Section):
    """The [model] section: the serving container and the weights."""

    framework: Literal["vllm", "djl-lmi"] = Field(
        description="the serving container: the SageMaker vLLM DLC (`vllm`) or DJL LMI (`djl-lmi`)"
    )
    image_repository: str = Field(
        min_length=2, max_length=256, pattern=_ECR_REPOSITORY,
        description="ECR repository in the regional Deep Learning Containers account (e.g. `vllm`, `djl-inference`)",
    )
    image_tag: str = Field(
        pattern=_IMAGE_TAG, description="the image tag, pinned",
        json_schema_extra=allowed("not `latest` (it changes under a running endpoint)"),
    )
    model_id: str | None = Field(None, description="Hugging Face model id; exactly one of `model_id`, `model_s3_uri`")
    model_s3_uri: str | None = Field(
        None, max_length=1024,
        description="`s3://bucket/prefix/` of uncompressed weights; the execution role may only read that prefix",
        json_schema_extra=allowed(
            "`s3://<bucket>/<prefix>/`: a bucket name of 3–63 lowercase letters, digits, `.` and `-` (S3's naming "
            "rules), folder names of letters, digits and `! - _ . ' ( )`, each ending with `/` (`*` and `?` would "
            "be IAM wildcards in the role's grant)"
        ),
    )
    environment: dict[EnvironmentKey, EnvironmentValue] = Field(
        default_factory=dict, max_length=ENVIRONMENT_MAX_ENTRIES - STACK_ENVIRONMENT_ENTRIES,
        description="extra container environment; wins over the variables the stack sets. Plain text in the "
        "template: no secrets. Refused: a name whose last word (before a final ID) ends in TOKEN or is KEY, AUTH, "
        "AUTHORIZATION or COOKIE, or that has the word SECRET(S), PASSWORD, PASSWD, PASSPHRASE, CREDENTIAL(S) "
        "or APIKEY; a value that looks like a Hugging Face token or an AWS access key id. A gated Hugging Face "
        "model: put its weights in S3 and set `model_s3_uri` (no token at run time)",
        json_schema_extra=allowed(
            f"names match `[A-Za-z_][A-Za-z0-9_]*`; names and values at most {ENV_MAX_LENGTH} characters "
            f"(SageMaker allows {ENVIRONMENT_MAX_ENTRIES} variables; the stack sets up to {STACK_ENVIRONMENT_ENTRIES})"
        ),
    )
    tensor_parallel_degree: int = Field(
        1, ge=1, le=8, description="GPUs one copy shards the model over; equal to `accelerators_per_copy`"
    )
    accelerators_per_copy: int = Field(1, ge=1, le=8, description="accelerators (GPUs) per copy; at most the instance's")
    memory_per_copy_mb: int = Field(24 * 1024, ge=1024, description="host memory per copy (MiB); at most the instance's")
    startup_health_check_timeout_s: int = Field(
        1800, ge=60, le=3600, description="seconds a copy may take to start (also the model download timeout)"
    )

    @field_validator("image_tag")
    @classmethod
    def _pinned(cls, value: str) -> str:
        if value == "latest":
            raise ValueError("'latest' changes under a running endpoint; allowed: a pinned tag")
        return value

    @field_validator("model_s3_uri")
    @classmethod
    def _s3_uri(cls, value: str | None) -> str | None:
        return checked_s3_uri(value)

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
    def isolates_by_salt(self) -> bool:
        """Whether the serving container keeps tenants' cached blocks apart by their ``cache_salt``
        (``rules.domains.SALT_ISOLATES``: vLLM does, LMI does not)."""
        return SALT_ISOLATES.get(self.framework, False)

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


class EndpointSettings(Section):
    """The [endpoint] section: instances and copies of the inference component."""

    instance_type: str = Field(
        description="SageMaker instance type; the types of the lab's instance table (ml.g6e, ml.p4d, ml.p4de, "
        "ml.p5, ml.p5e) are checked for accelerator and memory fit, others get a warning",
        json_schema_extra=allowed(
            f"one of the {len(HOSTING_INSTANCE_TYPES)} types CloudFormation accepts for an endpoint config "
            "(e.g. `ml.g6e.xlarge`, `ml.p5.48xlarge`, `ml.p6-b200.48xlarge`)"
        ),
    )
    instances_min: int = Field(
        1, ge=0, le=100, description="instances at least; 0 allows scale to zero; at most `instances_max`"
    )
    instances_max: int = Field(2, ge=1, le=100, description="instances at most")
    copies_min: int = Field(1, ge=0, le=1000, description="copies at least; 0 allows scale to zero; at most `copies_max`")
    copies_max: int = Field(2, ge=1, le=1000, description="copies at most; at most what `instances_max` instances hold")
    scale_in_strategy: Literal["IDLE_RELEASE", "CONSOLIDATION"] = Field(
        "IDLE_RELEASE", description="how managed instance scaling scales in: release idle instances, or consolidate copies"
    )
    scale_in_cooldown_minutes: int = Field(15, ge=5, le=1440, description="minutes between instance scale-ins")
    placement: Literal["SPREAD", "BINPACK"] = Field(
        "SPREAD",
        description="how SageMaker places each inference component's copies on the instances (`SchedulingConfig."
        "PlacementStrategy`, also what consolidation scale-in honours): `SPREAD` puts them on as many instances as "
        "it can, so that `PREFIX_AWARE` routing, documented for two or more instances, has instances to choose "
        "among; `BINPACK` fills instances first (fewer instances, several copies on one)",
    )
    az_max_imbalance: int = Field(
        1, ge=0, le=100,
        description="the most copies one Availability Zone may hold beyond another's (`SchedulingConfig."
        "AvailabilityZoneBalance.MaxImbalance`, enforcement `PERMISSIVE`, the only mode: SageMaker still places a "
        "copy when the zones' capacity cannot balance); 1 keeps zones as even as an odd copy count allows; it "
        "applies once the endpoint has instances in two or more zones",
    )
    data_cache: bool = Field(
        True,
        description="cache the model artifacts and container image on each instance (`DataCacheConfig."
        "EnableCaching`), so that a copy added by autoscaling or an update starts without downloading them "
        "again; SageMaker caches on instance types with more than 232 GiB of local NVMe storage whatever this says",
    )
    inference_ami_version: Literal[tuple(AMIS)] | None = Field(  # type: ignore[valid-type] - the table's keys
        None,
        description="the instances' AMI (`ProductionVariant.InferenceAmiVersion`), which sets their NVIDIA driver: "
        "gpu-2 and gpu-2-1 driver 535 (CUDA 12.2), gpu-3-1 550 (CUDA 12.4), gpu-4-1 580 (CUDA 13.0); unset: the "
        "serving container's own (`al2-ami-sagemaker-inference-gpu-3-1` for `vllm` and `djl-lmi`, the AMI AWS's "
        "deployment page for the vLLM container sets); SageMaker's default AMI (driver 535) cannot run an image "
        "built for a newer CUDA, and `preflight` checks the pair",
    )

    @field_validator("instance_type")
    @classmethod
    def _instance_type(cls, value: str) -> str:
        if value not in HOSTING_INSTANCE_TYPES:
            import difflib

            close = difflib.get_close_matches(value, sorted(HOSTING_INSTANCE_TYPES), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(
                f"not an instance type CloudFormation accepts for AWS::SageMaker::EndpointConfig{hint}; allowed: "
                f"ml.<family>.<size> of its {len(HOSTING_INSTANCE_TYPES)} hosting types, e.g. ml.g6e.xlarge, "
                "ml.p5.48xlarge, ml.p6-b200.48xlarge"
            )
        return value

    @model_validator(mode="after")
    def _ranges(self) -> "EndpointSettings":
        if self.instances_min > self.instances_max:
            raise ValueError(f"instances_min ({self.instances_min}) must be <= instances_max ({self.instances_max})")
        if self.copies_min > self.copies_max:
            raise ValueError(f"copies_min ({self.copies_min}) must be <= copies_max ({self.copies_max})")
        return self


class RoutingSettings(Section):
    """The [routing] section: the endpoint config's RoutingConfig."""

    strategy: str = Field(
        description="how SageMaker picks a copy for a request",
        json_schema_extra=allowed(
            "`RANDOM`, `LEAST_OUTSTANDING_REQUESTS`, `PREFIX_AWARE` (`KV_AWARE`: rejected, CloudFormation's "
            "resource schema and cfn-lint (E3030) do not accept it yet)"
        ),
    )
    prefix_length: int | None = Field(
        4096, ge=1024, le=65536, description="bytes from the start of the body that key routing; needed by `PREFIX_AWARE`"
    )
    concurrency_threshold: int | None = Field(
        10, ge=1, le=1024, description="in-flight requests per copy before spilling to another; needed by `PREFIX_AWARE`"
    )

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, value: str) -> str:
        if value == "KV_AWARE":
            raise ValueError(
                "KV_AWARE is known to the SageMaker API, but CloudFormation's resource schema does not list it and "
                "cfn-lint rejects it (E3030; CDK's synth-time check only warns, W3030), so a deploy would fail; "
                "allowed: RANDOM, LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE (simulate KV_AWARE in the lab)"
            )
        if value not in ROUTING_STRATEGIES:
            raise ValueError(f"allowed: one of {', '.join(ROUTING_STRATEGIES)}")
        return value

    @model_validator(mode="after")
    def _prefix_aware_settings(self) -> "RoutingSettings":
        if self.strategy == "PREFIX_AWARE" and (self.prefix_length is None or self.concurrency_threshold is None):
            raise ValueError("PREFIX_AWARE needs both prefix_length (1024-65536) and concurrency_threshold (1-1024)")
        return self


class ScalingSettings(Section):
    """The [scaling] section: copy autoscaling (Application Auto Scaling target tracking)."""

    target_concurrent_requests_per_copy: float = Field(
        4.0, gt=0, le=1024,
        description="target of concurrent requests per copy; with `PREFIX_AWARE` at most `routing.concurrency_threshold`",
    )
    scale_out_cooldown_s: int = Field(60, ge=0, le=3600, description="seconds after a scale-out before the next")
    scale_in_cooldown_s: int = Field(300, ge=0, le=3600, description="seconds after a scale-in before the next")


def copies_per_instance(model: ModelSettings, endpoint: EndpointSettings) -> int:
    """Copies of the model one instance holds (an instance type outside the lab's table: one)."""
    known = INSTANCES.get(endpoint.instance_type)
    gpus = known.gpus if known else model.accelerators_per_copy
    return max(1, gpus // model.accelerators_per_copy)


def copy_capacity(model: ModelSettings, endpoint: EndpointSettings) -> int | None:
    """Copies ``instances_max`` instances hold at most; None for an instance type outside the lab's table."""
    if endpoint.instance_type not in INSTANCES:
        return None
    return endpoint.instances_max * copies_per_instance(model, endpoint)


def instances_at_rest(model: ModelSettings, endpoint: EndpointSettings) -> int:
    """Instances serving when traffic is low: the minimum, or what the minimum copies need."""
    return max(endpoint.instances_min, -(-endpoint.copies_min // copies_per_instance(model, endpoint)))


def check_fit(model: ModelSettings, endpoint: EndpointSettings) -> None:
    """Raise ValueError when a copy does not fit the instance type (accelerators, host memory) or the
    instances cannot hold ``copies_max``; an instance type outside the lab's table is not checked."""
    known = INSTANCES.get(endpoint.instance_type)
    if known:
        gpus, memory_mb = known.gpus, known.host_memory_gib * 1024
        if model.accelerators_per_copy > gpus:
            raise ValueError(
                f"model.accelerators_per_copy ({model.accelerators_per_copy}) exceeds the "
                f"{gpus} accelerators of {endpoint.instance_type}"
            )
        if model.memory_per_copy_mb > memory_mb:
            raise ValueError(
                f"model.memory_per_copy_mb ({model.memory_per_copy_mb}) exceeds the host memory "
                f"of {endpoint.instance_type} ({memory_mb} MiB)"
            )
        per_instance = copies_per_instance(model, endpoint)
        capacity = endpoint.instances_max * per_instance
        if endpoint.copies_max > capacity:
            raise ValueError(
                f"endpoint.copies_max ({endpoint.copies_max}) exceeds what instances_max "
                f"({endpoint.instances_max}) x {per_instance} copies per instance can hold"
            )


def check_spill(routing: RoutingSettings, scaling: ScalingSettings,
                domain_targets: dict[str, float | None]) -> None:
    """Raise ValueError when a copy autoscaling target (the stage's, or a domain's in ``domain_targets``)
    is above ``PREFIX_AWARE``'s concurrency threshold: copies would spill before autoscaling adds more."""
    if routing.concurrency_threshold is not None and routing.strategy == "PREFIX_AWARE":
        for name, target in domain_targets.items():
            if target is not None and target > routing.concurrency_threshold:
                raise ValueError(f"domains.{name}.target_concurrent_requests_per_copy ({target}) is above "
                                 f"routing.concurrency_threshold ({routing.concurrency_threshold}): copies "
                                 "would spill before autoscaling adds capacity")
        if scaling.target_concurrent_requests_per_copy > routing.concurrency_threshold:
            raise ValueError(
                f"scaling.target_concurrent_requests_per_copy ({scaling.target_concurrent_requests_per_copy})"
                f" is above routing.concurrency_threshold ({routing.concurrency_threshold}): copies would "
                "spill before autoscaling adds capacity"
            )


def fit_warnings(model: ModelSettings, endpoint: EndpointSettings) -> list[str]:
    """Legal model and instance settings that probably do not do what was meant."""
    found = []
    if not model.reports_cached_tokens:
        found.append(
            f"model.framework {model.framework!r} reports no cached tokens (LMI does not forward vLLM's "
            "enable_prompt_tokens_details): the KV-cache hit-rate alarm is left out and its chart stays empty"
        )
    if endpoint.instance_type not in INSTANCES:
        found.append(
            f"endpoint.instance_type {endpoint.instance_type!r} is not in the known table; "
            "accelerator and memory fit are not checked"
        )
    return found


def routing_warnings(model: ModelSettings, endpoint: EndpointSettings, routing: RoutingSettings, *,
                     replication: bool) -> list[str]:
    """Routing settings that probably do not do what was meant: prefix-aware routing with too few
    instances or copies to choose among, and hot-prefix ``replication`` (the front door's) without it."""
    found = []
    prefix_aware = routing.strategy == "PREFIX_AWARE"
    per_instance = copies_per_instance(model, endpoint)
    if prefix_aware and endpoint.placement == "BINPACK" and per_instance > 1:
        found.append(
            f"endpoint.placement BINPACK with routing.strategy PREFIX_AWARE: up to {per_instance} "
            "copies fill one instance before the next, and botocore documents routing by prefix 'only when two "
            "or more instances can serve the request'; SPREAD keeps copies on distinct instances"
        )
    if replication and not prefix_aware:
        found.append(
            f"normalizer.replication has no effect with routing.strategy {routing.strategy}: replicas "
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
    elif prefix_aware and instances_at_rest(model, endpoint) < 2:
        found.append(
            f"routing.strategy PREFIX_AWARE at rest: {endpoint.copies_min} copies fit on one instance "
            f"(endpoint.instances_min = {endpoint.instances_min}); botocore documents routing by prefix "
            "'only when two or more instances can serve the request', so whether copies on one instance "
            "count is uncertain (no document settles it, nor does verify): set instances_min = 2, or check "
            "under load that the copies' KV-cache hit rates match the lab's"
        )
    return found
