"""The typed stage configuration, validated once, before any construct is built.

A stage is a TOML file under ``config/`` selected with ``cdk synth -c stage=NAME``; the stage
``default`` is embedded here and needs no file. The stacks and the local emulator read the same
:class:`StageConfig`, so what you test locally is what you deploy.

Every error names the file, the field path, the value and what is allowed; ``load_stage`` raises
:class:`ConfigError` with all of them at once. Every field has a ``description``: the configuration
reference (``docs/configuration.md``) is generated from this module by ``tools/config_reference.py``.
"""

from __future__ import annotations

import ipaddress
import os
import re
import typing
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, ValidationError, field_validator, model_validator

from prefix_routing.rules.constants import FINGERPRINT_HEX_DIGITS, MAX_BODY_BYTES_LIMIT
from prefix_routing.rules.limits import (DEFAULT_MAX_TOKENS, DEFAULT_RULE, LIMIT_NAMES, MAX_LIMIT, MAX_OVERRIDES, MAX_PATTERN,
                                         LimitSettings, TenantLimits)
from prefix_routing.rules.domains import MAX_DOMAINS, TrustDomains, shared_without_salt
from prefix_routing.rules.sampling import MIN_RATE
from prefix_routing.stage.benchmark import BenchmarkSettings
from prefix_routing.rules.tenant_match import shadowed
from prefix_routing.stage.reference_text import allowed_words, range_text, without_none
from prefix_routing.stage.domains import (ComponentPlan, DomainSettings, TenancySettings, check_domains, component_name,
                                          tenancy_without_effect)
from prefix_routing.stage.presets import INSTANCES
from prefix_routing.stage.section import Section as _Section
from prefix_routing.stage.section import allowed as _allowed

# PREFIX_ROUTING_CONFIG_DIR points synth at another folder of stage files (tests use it).
CONFIG_DIR = Path(os.environ.get("PREFIX_ROUTING_CONFIG_DIR") or Path(__file__).resolve().parents[2] / "config")
DEFAULT_STAGE = "default"
#: Where the configuration reference lives (generated: ``tools/config_reference.py``).
REFERENCE_DOC = "docs/configuration.md"

ROUTING_STRATEGIES = ("RANDOM", "LEAST_OUTSTANDING_REQUESTS", "PREFIX_AWARE")
PUBLISH_FREQUENCIES = (10, 30, 60, 120, 180, 240, 300)

# Accelerators and host memory of the instance types we know come from the lab's instance table
# (presets.INSTANCES). Other types CloudFormation accepts are taken with a warning; their copy
# packing is then not checked at synth.

#: The instance types CloudFormation accepts for AWS::SageMaker::EndpointConfig
#: ProductionVariants[].InstanceType: its resource schema's enum (cfn-lint 1.58.0's schemas, the same
#: enum in every region; the schema has no pattern). By family: "p6-b200": "48xlarge" is
#: ml.p6-b200.48xlarge. tests/prefix_routing/stage/test_config.py compares it with the installed
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

_NAME = r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$"  # SageMaker resource names and our stage names

# The request log line (prefix_routing/frontdoor/record.py log_record, compact JSON) lists one block
# hash per full block_bytes block of the normalized body (prefix_routing/rules/identity.py
# block_hashes): FINGERPRINT_HEX_DIGITS = 16 hex digits each, as JSON strings separated by commas:
#   16 digits + 2 quotes + 1 comma = 19 bytes per hash (ASCII), and 19 n + 1 bytes for n hashes
#   (n - 1 commas, "[" and "]").
# The largest body is MAX_BODY_BYTES_LIMIT = 6 MiB = 6,291,456 bytes (larger ones are refused).
# CloudWatch Logs takes log events up to 256 KB = 262,144 bytes (26 bytes more count per event in
# PutLogEvents; events over the limit are dropped or truncated). The line's other fields are bounded
# and small (routing id <= 64, application <= 64, tenant header <= 128 or an IAM ARN, error field
# <= 80 characters; about 1 KB in all): 16 KiB = 16,384 bytes are kept for them, which leaves
# 262,144 - 16,384 = 245,760 bytes for the hashes: 19 n + 1 <= 245,760 gives n <= 12,934 hashes, so
# block_bytes >= 6,291,456 / 12,935 = 486.4, rounded up to a power of two:
#   block_bytes = 512: n = 6,291,456 / 512 = 12,288 hashes, 19 x 12,288 + 1 = 233,473 bytes,
#                      leaving 28,671 bytes for the rest of the line;
#   block_bytes = 256: n = 24,576, 466,945 bytes (too long); the former minimum, 64: 98,304 hashes,
#                      1,867,777 bytes (1.78 MiB).
_LOG_EVENT_LIMIT_BYTES = 256 * 1024
_LOG_LINE_OTHER_FIELDS_BYTES = 16 * 1024
_LOG_BYTES_PER_BLOCK_HASH = FINGERPRINT_HEX_DIGITS + 3  # "…",
BLOCK_BYTES_MIN = 512
assert _LOG_BYTES_PER_BLOCK_HASH * (MAX_BODY_BYTES_LIMIT // BLOCK_BYTES_MIN) + 1 <= (
    _LOG_EVENT_LIMIT_BYTES - _LOG_LINE_OTHER_FIELDS_BYTES
), "BLOCK_BYTES_MIN no longer keeps the largest request log line under 256 KB"

# SageMaker's CreateModel ContainerDefinition.Environment (botocore's sagemaker model): EnvironmentMap
# at most 100 entries, EnvironmentKey [a-zA-Z_][a-zA-Z0-9_]* up to 1024 characters, EnvironmentValue
# up to 1024 characters. The stack sets up to 4 variables of its own (stacks/constructs/
# inference_endpoint.py container_environment: vLLM 4, LMI 3), so a stage may add at most 96.
ENVIRONMENT_MAX_ENTRIES = 100
STACK_ENVIRONMENT_ENTRIES = 4
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_MAX_LENGTH = 1024
# A variable is a secret by its name when a word of it says so (HF_TOKEN, OPENAI_API_KEY,
# DB_PASSWORD, AWS_SECRET_ACCESS_KEY, AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS...). TOKEN and
# KEY count only in the last word (before a final ID), so that engine settings such as
# SM_VLLM_MAX_NUM_BATCHED_TOKENS, SM_VLLM_LONG_PREFILL_TOKEN_THRESHOLD or
# SM_VLLM_RETURN_TOKENS_AS_TOKEN_IDS pass.
_SECRET_WORDS_ANYWHERE = ("SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS",
                          "APIKEY")
_SECRET_LAST_WORDS = ("KEY", "AUTH", "AUTHORIZATION", "COOKIE")  # and any last word ending in TOKEN
# Values that are credentials whatever their name: Hugging Face tokens, AWS access key ids.
_SECRET_VALUES = (
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}"), "a Hugging Face token (hf_...)"),
    (re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b"), "an AWS access key id"),
)
_NO_SECRETS = (
    "no secrets: container environment is plain text in the template and in the SageMaker model "
    "(DescribeModel), and SageMaker has no secret references for it; for a gated Hugging Face model, "
    "download the weights once, put them in S3 and set model.model_s3_uri (no token at run time)"
)

# S3 bucket naming rules (general purpose buckets): 3-63 characters, lowercase letters, digits, dots
# and hyphens, beginning and ending with a letter or digit, no two adjacent dots, not an IP address,
# none of the reserved prefixes and suffixes (access point aliases and directory buckets do not take
# the bucket ARN the execution role is granted).
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_S3_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_S3_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
# The prefix goes into IAM resources (s3:GetObject on bucket/prefix*) and the s3:prefix condition,
# where "*" and "?" are wildcards and "${...}" a policy variable: only S3's "safe" key characters
# (letters, digits, ! - _ . ' ( ), less "*") and "/" between non-empty folder names.
_S3_PREFIX = re.compile(r"([A-Za-z0-9!_.'()-]+/)*")
_S3_URI_ALLOWED = (
    "s3://<bucket>/<prefix>/: a bucket name of 3-63 lowercase letters, digits, '.' and '-' (S3's naming "
    "rules), and folder names of letters, digits and ! - _ . ' ( ) each ending with '/' "
    "('*' and '?' would be IAM wildcards in the role's grant)"
)

# ECR's RepositoryName (botocore's ecr model) and Docker's tag grammar (ECR takes the same).
_ECR_REPOSITORY = r"^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*$"
_IMAGE_TAG = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"


class ConfigError(Exception):
    """The stage configuration is invalid. ``str()`` lists every problem, one per line."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def _name_words(name: str) -> list[str]:
    """The words of a variable name, upper case: HF_TOKEN, hfToken and HFToken give HF, TOKEN."""
    return [w.upper() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+", name)]


def secret_word(name: str) -> str | None:
    """The word that makes ``name`` the name of a secret (``HF_TOKEN``: ``TOKEN``), else None."""
    words = _name_words(name)
    for word in words:
        if word in _SECRET_WORDS_ANYWHERE:
            return word
    if len(words) > 1 and words[-1] == "ID":  # AWS_ACCESS_KEY_ID
        words.pop()
    if words and (words[-1] in _SECRET_LAST_WORDS or words[-1].endswith("TOKEN")):
        return words[-1]
    return None


def _environment_key(key: str) -> str:
    if not _ENV_KEY.fullmatch(key) or len(key) > _ENV_MAX_LENGTH:
        raise ValueError(
            f"not an environment variable name; allowed: [A-Za-z_][A-Za-z0-9_]*, at most {_ENV_MAX_LENGTH} "
            "characters (SageMaker's EnvironmentKey)"
        )
    word = secret_word(key)
    if word:
        raise ValueError(f"names a secret ({word}); allowed: {_NO_SECRETS}")
    return key


def _environment_value(value: str) -> str:
    for pattern, what in _SECRET_VALUES:
        if pattern.search(value):
            raise ValueError(f"the value looks like {what}; allowed: {_NO_SECRETS}")
    if len(value) > _ENV_MAX_LENGTH:
        raise ValueError(f"{len(value)} characters; allowed: at most {_ENV_MAX_LENGTH} (SageMaker's EnvironmentValue)")
    return value


def _shown_environment_value(value: Any) -> str:
    """How an environment value appears in an error: never a secret, never a whole long value."""
    if not isinstance(value, str):
        return repr(value)
    if any(pattern.search(value) for pattern, _ in _SECRET_VALUES):
        return "(not shown)"
    return repr(value) if len(value) <= 40 else repr(value[:40]) + "..."


EnvironmentKey = Annotated[str, AfterValidator(_environment_key)]
EnvironmentValue = Annotated[str, AfterValidator(_environment_value)]


def checked_s3_uri(value: str | None) -> str | None:
    """An S3 folder URI a stage may name (the model's, the benchmark's), unchanged; ValueError otherwise."""
    problem = _s3_uri_problem(value) if value is not None else None
    if problem:
        raise ValueError(f"{problem}; allowed: {_S3_URI_ALLOWED}")
    return value


def _s3_uri_problem(value: str) -> str | None:
    if not value.startswith("s3://"):
        return "must begin with s3://"
    bucket, slash, prefix = value.removeprefix("s3://").partition("/")
    if not slash:
        return "names no folder: it must end with '/'"
    if not _S3_BUCKET.fullmatch(bucket):
        return f"bucket {bucket!r} is not a valid S3 bucket name"
    if ".." in bucket:
        return f"bucket {bucket!r} has two adjacent dots"
    try:
        ipaddress.IPv4Address(bucket)
        return f"bucket {bucket!r} is formatted as an IP address"
    except ValueError:
        pass
    if bucket.startswith(_S3_RESERVED_PREFIXES) or bucket.endswith(_S3_RESERVED_SUFFIXES):
        return f"bucket {bucket!r} has a prefix or suffix S3 reserves (access point aliases, directory buckets)"
    if prefix and not prefix.endswith("/"):
        return f"{value!r} must end with '/': an S3Prefix model data URI names a folder"
    if not _S3_PREFIX.fullmatch(prefix):
        odd = sorted({c for c in prefix if not re.fullmatch(r"[A-Za-z0-9!_.'()/-]", c)})
        if odd:
            return f"prefix {prefix!r} has {' and '.join(map(repr, odd))}"
        return f"prefix {prefix!r} has an empty folder name"
    return None


class ModelSettings(_Section):
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
        json_schema_extra=_allowed("not `latest` (it changes under a running endpoint)"),
    )
    model_id: str | None = Field(None, description="Hugging Face model id; exactly one of `model_id`, `model_s3_uri`")
    model_s3_uri: str | None = Field(
        None, max_length=1024,
        description="`s3://bucket/prefix/` of uncompressed weights; the execution role may only read that prefix",
        json_schema_extra=_allowed(
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
        json_schema_extra=_allowed(
            f"names match `[A-Za-z_][A-Za-z0-9_]*`; names and values at most {_ENV_MAX_LENGTH} characters "
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
    """The [endpoint] section: instances and copies of the inference component."""

    instance_type: str = Field(
        description="SageMaker instance type; the types of the lab's instance table (ml.g6e, ml.p4d, ml.p4de, "
        "ml.p5, ml.p5e) are checked for accelerator and memory fit, others get a warning",
        json_schema_extra=_allowed(
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


class RoutingSettings(_Section):
    """The [routing] section: the endpoint config's RoutingConfig."""

    strategy: str = Field(
        description="how SageMaker picks a copy for a request",
        json_schema_extra=_allowed(
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


class MetricsSettings(_Section):
    """The [metrics] section: the endpoint config's MetricsConfig (enhanced metrics are always on)."""

    publish_frequency_s: int = Field(
        10, description="seconds between the endpoint's metric publications (with detailed observability, also "
        "between scrapes of the container's metrics)",
        json_schema_extra=_allowed(", ".join(map(str, PUBLISH_FREQUENCIES))),
    )
    # Billed per GB ingested, and AWS turns it on for new endpoint configs: the template always says which.
    detailed_observability: bool | None = Field(
        None,
        description="the endpoint's detailed observability: the engine's own metrics (vLLM's prefix-cache queries "
        "and hits, the server-side hit rate), per-GPU, host and placement metrics, as OpenTelemetry metrics in "
        "CloudWatch (queried with PromQL; billed per GB ingested); unset: on for `vllm` stages, off otherwise",
        json_schema_extra=_allowed("`true`, `false`", doc_default="on for `vllm`, off for `djl-lmi`"),
    )

    def detailed_observability_for(self, framework: str) -> bool:
        """Whether the endpoint config turns detailed observability on for a stage of ``framework``."""
        if self.detailed_observability is None:
            return framework == "vllm"
        return self.detailed_observability

    @field_validator("publish_frequency_s")
    @classmethod
    def _frequency(cls, value: int) -> int:
        if value not in PUBLISH_FREQUENCIES:
            raise ValueError(f"allowed: one of {', '.join(map(str, PUBLISH_FREQUENCIES))}")
        return value


class ScalingSettings(_Section):
    """The [scaling] section: copy autoscaling (Application Auto Scaling target tracking)."""

    target_concurrent_requests_per_copy: float = Field(
        4.0, gt=0, le=1024,
        description="target of concurrent requests per copy; with `PREFIX_AWARE` at most `routing.concurrency_threshold`",
    )
    scale_out_cooldown_s: int = Field(60, ge=0, le=3600, description="seconds after a scale-out before the next")
    scale_in_cooldown_s: int = Field(300, ge=0, le=3600, description="seconds after a scale-in before the next")


class AlarmSettings(_Section):
    """The [alarms] section: thresholds of the stage's alarms (notifications go to its SNS topic)."""

    ttft_p50_ms: float = Field(
        2000.0, gt=0, le=900_000,
        description="alarm when P50 time to first token exceeds this (ms); a first token later than the front "
        "door's longest timeout (900 s) never comes",
    )
    hotspot_factor: float = Field(
        2.0, gt=1, le=100, description="an instance above this multiple of its fair share (the scaling target)"
    )
    minimum_hit_rate: float = Field(0.3, ge=0, le=1, description="alarm when cached ÷ prompt tokens fall below this")
    error_rate_percent: float = Field(1.0, gt=0, le=100, description="5XX errors as % of invocations")
    evaluation_periods: int = Field(5, ge=1, le=60, description="minutes a condition must hold")
    emails: list[Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")]] = Field(
        default_factory=list, description="e-mail subscriptions of the alarm topic"
    )


#: Alarms whose names the stacks fix (``<component>-<suffix>``), because something outside the
#: observability stack names them: each component's DeploymentConfig (the endpoint stack) its rollback
#: alarms, and ``verify`` the engine-metrics alarm. The other alarms are named by CloudFormation.
ERROR_RATE_ALARM = "error-rate"
TTFT_P50_ALARM = "ttft-p50"
ENGINE_HIT_RATE_ALARM = "engine-hit-rate"
ENGINE_METRICS_ALARM = "engine-metrics-missing"
ROLLBACK_ALARMS = (ERROR_RATE_ALARM, TTFT_P50_ALARM)
#: SageMaker's documented bounds on a rolling update's batch: 5 to 50 % of the component's copies.
BATCH_PERCENT_MIN, BATCH_PERCENT_MAX = 5, 50


def alarm_name(component: str, alarm: str) -> str:
    """The fixed name of one of a component's alarms (``ROLLBACK_ALARMS``, the engine alarms)."""
    return f"{component}-{alarm}"


class DeploymentSettings(_Section):
    """The [deployment] section: how a new image, model or container setting reaches the copies (each
    inference component's DeploymentConfig). A rolling update replaces a batch of copies at a time and
    rolls back when the component's error-rate or TTFT alarm fires; each new copy starts with an empty
    KV cache."""

    rolling_update: bool = Field(
        True,
        description="replace copies a batch at a time, each batch baking on live traffic before the next; false: "
        "SageMaker's default update of the component, without rollback alarms",
    )
    batch_type: Literal["COPY_COUNT", "CAPACITY_PERCENT"] = Field(
        "COPY_COUNT", description="what `batch_size` counts: copies, or percent of the component's copies"
    )
    batch_size: int = Field(
        1, ge=1, le=1000,
        description="copies (or percent of them) replaced per step (`RollingUpdatePolicy.MaximumBatchSize`); small "
        "batches keep most KV caches warm during an update. SageMaker documents 5-50 % of the copy count",
        json_schema_extra=_allowed(f"with `CAPACITY_PERCENT` from {BATCH_PERCENT_MIN} to {BATCH_PERCENT_MAX}"),
    )
    wait_interval_s: int = Field(
        600, ge=0, le=3600,
        description="seconds each batch bakes on live traffic while the rollback alarms watch it "
        "(`WaitIntervalInSeconds`); with `auto_rollback`, at least `alarms.evaluation_periods` minutes, the time "
        "an alarm needs to fire",
    )
    timeout_s: int = Field(
        28800, ge=600, le=28800,
        description="the longest the whole update may take (`MaximumExecutionTimeoutInSeconds`)",
    )
    auto_rollback: bool = Field(
        True,
        description="roll the update back when the component's 5XX error-rate alarm or its TTFT P50 alarm (the "
        "front door's) fires during it",
    )

    @model_validator(mode="after")
    def _percent(self) -> "DeploymentSettings":
        if self.batch_type == "CAPACITY_PERCENT" and not BATCH_PERCENT_MIN <= self.batch_size <= BATCH_PERCENT_MAX:
            raise ValueError(
                f"batch_size ({self.batch_size}) with batch_type CAPACITY_PERCENT; allowed: {BATCH_PERCENT_MIN} to "
                f"{BATCH_PERCENT_MAX} (SageMaker's batch is 5-50 % of the copy count)"
            )
        return self


class ReplicationStageSettings(_Section):
    """The [normalizer.replication] section: hot-prefix replication by the front door
    (``prefix_routing.rules.replication``; the function reads it from ``REPLICATION_*``).

    Replication sizes a prefix's replicas by the inference component's current copy count, which the
    front door reads once a minute (``DescribeInferenceComponent``); until its first reading it assumes
    ``endpoint.copies_min`` (the conservative bound: fewer and later replicas), and it never assumes
    more than ``endpoint.copies_max``. Each execution environment of the function counts its own
    requests."""

    enabled: bool = Field(
        False,
        description="hot-prefix replication: the front door sends replica j of a hot prefix with `PrefixAwareId "
        "<id>-r<j>`, so it gets more than one warm copy",
    )
    max_replicas: int = Field(
        32, ge=1, le=64, description="the most replicas (PrefixAwareIds) one prefix (tenant and prefix fingerprint) gets"
    )
    target_share_factor: float = Field(
        0.05, ge=0.01, le=1000,
        description="a prefix is replicated once it takes more than this many fair shares, 1/copies, of recent "
        "requests; each replica then carries at most that many (small pieces even out the router's random "
        "placement; replicas on one copy share its cache)",
    )
    half_life_s: float = Field(
        300.0, ge=1, le=86400, description="seconds after which a request counts half in the recent-request shares"
    )
    min_requests: float = Field(
        12.0, ge=1, le=10000,
        description="recent (decayed) requests of a prefix before it may be replicated, so that chance does not "
        "split cold prefixes",
    )
    steering: bool = Field(
        True,
        description="true: a hot prefix's replicas are chosen by load (fewest in flight) and a replica whose first "
        "answer finds the prefix already cached (it landed on a copy that held it) gets a fresh id, with the "
        "state in the front door's shared table; false: each execution environment uses the replicas in turn",
    )


#: An account id, or the ARN of an IAM role or user (what a Lambda resource policy names as principal).
_PRINCIPAL = r"^(\d{12}|arn:aws[a-z-]*:iam::\d{12}:(role|user)/[A-Za-z0-9_+=,.@/-]+)$"
_LOG_RETENTION_DAYS = Literal[1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365]


class NormalizerFunctionSettings(_Section):
    """The [normalizer] section: how the front-door Lambda is deployed (its normalization rules are
    ``prefix_routing.rules``)."""

    tenancy: Literal["iam", "header", "none"] = Field(
        "iam", description="who the tenant is: `iam` (the caller's IAM identity), `header` (trusted callers), `none`"
    )
    tenant_header: str = Field("x-tenant-id", pattern=r"^[a-z0-9-]+$", description="header read when tenancy is `header`")
    allow_direct_invoke: bool = Field(
        False,
        description="true: answer direct invocations (`lambda:InvokeFunction`), trusting every direct caller with "
        "the tenant its event names; false: refused with 403, the Function URL is the one way in",
    )
    invoke_principals: list[Annotated[str, Field(pattern=_PRINCIPAL, max_length=2048)]] = Field(
        default_factory=list,
        description="accounts (12 digits) or IAM role/user ARNs the function's resource policy lets call its URL "
        "(`lambda:InvokeFunctionUrl`, and `lambda:InvokeFunction` only via the URL)",
    )
    reserved_concurrency: int = Field(
        50, ge=1, le=1000, description="the function's reserved concurrency: the client-level throughput limit"
    )
    memory_mb: int = Field(512, ge=128, le=10240, description="the function's memory (MB)")
    timeout_s: int = Field(120, ge=5, le=900, description="the function's timeout (s)")
    log_retention_days: _LOG_RETENTION_DAYS = Field(
        30, description="retention of the function's log group (a CloudWatch Logs value)"
    )
    block_bytes: int = Field(
        2048, ge=BLOCK_BYTES_MIN, le=65536,
        description="block size of the chained hashes in the request log line; from 512 so that the line of the "
        "largest body (6 MiB) stays under CloudWatch Logs' 256 KB event limit",
    )
    replication: ReplicationStageSettings = Field(
        ReplicationStageSettings(), description="hot-prefix replication by the front door"
    )


class TenantLimitSettings(_Section):
    """The limits of one tenant (or class of tenants): unset is unlimited."""

    requests_per_minute: int | None = Field(
        None, ge=1, le=MAX_LIMIT,
        description="requests a tenant may send per calendar minute (429 beyond); unset: unlimited",
    )
    tokens_per_minute: int | None = Field(
        None, ge=1, le=MAX_LIMIT,
        description="tokens (prompt + completion) a tenant may use per calendar minute; a request is admitted while "
        "the minute has room for the most it can use (its prompt, estimated from the body's size, plus the output "
        "it asks for: `max_tokens`, `max_completion_tokens` or `default_max_tokens`), and its answer's own usage "
        "then replaces that charge; unset: unlimited",
    )
    concurrent_streams: int | None = Field(
        None, ge=1, le=100_000, description="answers a tenant may have in flight at once; unset: unlimited"
    )


class LimitsSettings(TenantLimitSettings):
    """The [limits] section: per-tenant limits, enforced by the front door in a DynamoDB table that every
    execution environment shares (``prefix_routing.rules.limits``, ``prefix_routing.frontdoor.limiter``)."""

    tenants: dict[str, TenantLimitSettings] = Field(
        default_factory=dict,
        description="overrides: `[limits.tenants.\"<tenant id or pattern>\"]` (`*`, `?` as in shell patterns; a "
        "tenant's own id first, then the first pattern that matches, in file order) with any of the three limits; "
        "the others are the defaults'",
        json_schema_extra=_allowed(f"at most {MAX_OVERRIDES} tenant ids or patterns"),
    )
    on_store_error: Literal["open", "closed"] = Field(
        "open",
        description="when the table cannot be reached in time: `open` serves the request and counts it "
        "(`LimiterStoreErrors`), `closed` refuses it with 503",
    )
    store_timeout_ms: int = Field(
        50, ge=5, le=5000, description="the most one call to the table may take before it counts as a store error"
    )
    default_max_tokens: int = Field(
        DEFAULT_MAX_TOKENS, ge=1, le=MAX_LIMIT,
        description="the output tokens `tokens_per_minute` charges up front for a request that sets none of "
        "`max_completion_tokens`, `max_tokens` or `parameters.max_new_tokens` (its answer's usage then replaces "
        "the charge)",
    )

    @field_validator("tenants")
    @classmethod
    def _few_enough(cls, value: dict) -> dict:
        if len(value) > MAX_OVERRIDES:
            raise ValueError(f"{len(value)} overrides; allowed: at most {MAX_OVERRIDES}")
        for key in value:
            if not 1 <= len(key) <= MAX_PATTERN or not all("!" <= c <= "~" for c in key):
                raise ValueError(f"key {key[:60]!r}: allowed: a tenant id or pattern of 1-{MAX_PATTERN} printable "
                                 "ASCII characters without spaces")
        dead = shadowed(list(value))
        if dead:
            raise ValueError("; ".join(f"{key!r} never applies: the earlier pattern {by!r} takes every tenant it "
                                       "matches" for key, by in dead)
                             + "; allowed: a pattern before the more general ones that would take its tenants, or none")
        return value

    @model_validator(mode="after")
    def _default_output_fits(self) -> LimitsSettings:
        # A request without max_tokens is charged default_max_tokens: above a tokens_per_minute, every
        # such request of those tenants would be refused for good.
        small = [("the defaults" if key == DEFAULT_RULE else repr(key), value)
                 for key, value in self.to_rules().below_default_output()]
        if small:
            named = ", ".join(f"{key} {value:,}" for key, value in small)
            raise ValueError(f"default_max_tokens: got {self.default_max_tokens:,}, above tokens_per_minute ({named}): "
                             "a request without max_tokens could never be admitted; allowed: at most "
                             f"{min(value for _, value in small):,}")
        return self

    @property
    def enabled(self) -> bool:
        return self.to_rules().enabled

    def to_rules(self) -> LimitSettings:
        """The front door's settings (a stream's lease: ``rules.limits.LEASE_S``, renewed while it streams)."""
        def rule(section: TenantLimitSettings) -> TenantLimits:
            return TenantLimits(**{name: getattr(section, name) for name in LIMIT_NAMES})

        return LimitSettings(default=rule(self), tenants=tuple((key, rule(value)) for key, value in self.tenants.items()),
                             on_store_error=self.on_store_error, store_timeout_ms=self.store_timeout_ms,
                             default_max_tokens=self.default_max_tokens)


_SAMPLE_ALLOWED = f"allowed: `auto`, or a rate from {MIN_RATE:g} to 1"  # the lowest rate: one log bucket


def _sample_rate(value: Any) -> float | str:
    """``advisor.sample``: ``auto`` or a rate (one message for both, not one per kind)."""
    if value == "auto":
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and MIN_RATE <= value <= 1.0:
        return float(value)
    raise ValueError(_SAMPLE_ALLOWED)


class AdvisorSettings(_Section):
    """The [advisor] section: the routing advisor function (prefix_routing.advisor), run on a schedule
    over the last window of the normalizer's request log."""

    enabled: bool = Field(
        True,
        description="the routing advisor function: every `schedule_minutes` it replays that window of the request "
        "log through the lab, publishes `PredictedHitRate`, `BestPredictedHitRate`, `HitRateBound`, "
        "`MeasuredHitRate`, `PrefixReuseShare` and the recommended settings, and notifies the alarm topic when "
        "they would pay",
    )
    schedule_minutes: int = Field(60, ge=5, le=1440, description="minutes between runs; each run reads the window since the last")
    notify_gain_points: float = Field(
        5.0, gt=0, le=100, description="hit-rate points the recommended settings must gain over the current ones to count"
    )
    notify_ttft_gain: float = Field(0.2, gt=0, lt=1, description="or the share of P50 TTFT they must cut")
    notify_after_runs: int = Field(
        3, ge=1, le=1000,
        description="consecutive runs with the same recommendation before one notification (then none until it changes)",
    )
    max_events: int = Field(
        100_000, ge=1000, le=1_000_000,
        description="request-log lines read per run at most; a run that hits the bound logs where it cut the window",
    )
    sample: Annotated[float | str, BeforeValidator(_sample_rate)] = Field(
        "auto",
        description="the share of routing keys a run reads (the front door logs each request's key bucket and "
        "CloudWatch Logs filters by it): `auto` reads about half of `max_events` from the window's `Requests` "
        "count (every key while they fit), or a rate; hot prefixes are read in every sample",
        json_schema_extra=_allowed(_SAMPLE_ALLOWED.removeprefix("allowed: ")),
    )
    memory_mb: int = Field(1024, ge=256, le=10240, description="the function's memory (MB)")
    timeout_s: int = Field(300, ge=60, le=900, description="the function's timeout (s)")
    log_retention_days: _LOG_RETENTION_DAYS = Field(
        30, description="retention of the function's log group (a CloudWatch Logs value)"
    )


class StageConfig(_Section):
    """A stage: one TOML file (``config/<name>.toml``), or the embedded default."""

    name: str = Field(
        DEFAULT_STAGE, pattern=_NAME, max_length=20,
        description="stage name: the stacks are `PrefixRouting-<name>-…`, the endpoint `<name>-prefix-llm` "
        "(lower case); in a stage file it must equal the file name, and no two stages may differ only in case",
        json_schema_extra=_allowed("letters, digits and `-`, beginning and ending with a letter or digit",
                                   doc_default="the file name"),
    )
    region: str | None = Field(
        None, pattern=r"^[a-z]{2}(-[a-z]+)+-\d$", description="pins the stacks' region; unset: environment-agnostic"
    )
    account: str | None = Field(None, pattern=r"^\d{12}$", description="pins the stacks' account; unset: environment-agnostic")
    model: ModelSettings = Field(description="the serving container and the weights")
    endpoint: EndpointSettings = Field(description="instances and copies")
    routing: RoutingSettings = Field(description="the endpoint's routing")
    metrics: MetricsSettings = Field(MetricsSettings(), description="the endpoint's metrics")
    scaling: ScalingSettings = Field(ScalingSettings(), description="copy autoscaling")
    alarms: AlarmSettings = Field(AlarmSettings(), description="alarm thresholds")
    deployment: DeploymentSettings = Field(
        DeploymentSettings(), description="how a new image or model reaches the copies"
    )
    normalizer: NormalizerFunctionSettings = Field(NormalizerFunctionSettings(), description="the front-door function")
    advisor: AdvisorSettings = Field(AdvisorSettings(), description="the routing advisor function")
    limits: LimitsSettings = Field(LimitsSettings(), description="per-tenant limits at the front door")
    domains: dict[str, DomainSettings] = Field(
        default_factory=dict,
        description="trust domains: `[domains.<name>]`, each an inference component of its own (its own copies "
        "and KV caches) serving the tenants it lists; none: one component serves every tenant",
        json_schema_extra=_allowed(f"at most {MAX_DOMAINS}; names of lower-case letters, digits and hyphens"),
    )
    tenancy: TenancySettings = Field(TenancySettings(), description="trust domains: unknown tenants, isolation")
    benchmark: BenchmarkSettings = Field(
        BenchmarkSettings(), description="benchmark jobs against the endpoint (`python -m prefix_routing benchmark`)"
    )

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
        check_domains(self.domains, self.tenancy, stage_name=self.name, copies_min=self.endpoint.copies_min,
                      copies_max=self.endpoint.copies_max,
                      capacity=self.endpoint.instances_max * self.copies_per_instance if known else None)
        idle = tenancy_without_effect(self.tenancy, bool(self.domains))
        if idle:
            raise ValueError(idle)
        if self.tenancy.require_isolation and self.tenants_sharing_a_cache:
            raise ValueError("tenancy.require_isolation: " + "; ".join(self.tenants_sharing_a_cache))
        deployment, periods = self.deployment, self.alarms.evaluation_periods
        if deployment.rolling_update and deployment.auto_rollback and deployment.wait_interval_s < periods * 60:
            raise ValueError(
                f"deployment.wait_interval_s ({deployment.wait_interval_s}) is shorter than the {periods} minutes "
                f"(alarms.evaluation_periods) a rollback alarm needs to fire: a bad batch would pass its bake; "
                f"allowed: at least {periods * 60}, or deployment.auto_rollback = false"
            )
        if self.routing.concurrency_threshold is not None and self.routing.strategy == "PREFIX_AWARE":
            for name, domain in self.domains.items():
                target = domain.target_concurrent_requests_per_copy
                if target is not None and target > self.routing.concurrency_threshold:
                    raise ValueError(f"domains.{name}.target_concurrent_requests_per_copy ({target}) is above "
                                     f"routing.concurrency_threshold ({self.routing.concurrency_threshold}): copies "
                                     "would spill before autoscaling adds capacity")
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
        """The inference component's explicit name (CloudFormation's Ref gives only its ARN); with trust
        domains, the default domain's (else the first domain's): what serves a caller not yet known."""
        if self.domains:
            primary = self.tenancy.default_domain if self.tenancy.default_domain in self.domains else next(iter(self.domains))
            return component_name(self.name, primary)
        return f"{self.name}-prefix-llm-ic".lower()

    def components(self) -> list[ComponentPlan]:
        """Every inference component the stage deploys: one per trust domain, else one; the component
        named by :attr:`component_name` first."""
        endpoint, target = self.endpoint, self.scaling.target_concurrent_requests_per_copy
        if not self.domains:
            return [ComponentPlan(None, self.component_name, endpoint.copies_min, endpoint.copies_max, target)]
        plans = [
            ComponentPlan(name, component_name(self.name, name),
                          endpoint.copies_min if d.copies_min is None else d.copies_min,
                          endpoint.copies_max if d.copies_max is None else d.copies_max,
                          target if d.target_concurrent_requests_per_copy is None
                          else d.target_concurrent_requests_per_copy)
            for name, d in self.domains.items()
        ]
        return sorted(plans, key=lambda plan: plan.name != self.component_name)

    def trust_domains(self) -> TrustDomains | None:
        """The front door's rule for the stage's ``[domains]`` (None: one component for every tenant)."""
        if not self.domains:
            return None
        default = self.tenancy.default_domain if self.tenancy.unknown_tenants == "default" else None
        return TrustDomains(
            components=tuple((name, component_name(self.name, name)) for name in self.domains),
            tenants=tuple((tenant, name) for name, domain in self.domains.items() for tenant in domain.tenants),
            default=default,
        )

    @property
    def tenants_sharing_a_cache(self) -> list[str]:
        """Where tenants share copies whose engine ignores ``cache_salt`` (one line per domain)."""
        default = self.tenancy.default_domain if self.tenancy.unknown_tenants == "default" else None
        return shared_without_salt(self.model.framework, {n: d.tenants for n, d in self.domains.items()}, default,
                                   self.normalizer.tenancy)

    @property
    def detailed_observability(self) -> bool:
        """Whether the endpoint config turns detailed observability on (``metrics.detailed_observability``,
        unset: on for vLLM)."""
        return self.metrics.detailed_observability_for(self.model.framework)

    @property
    def engine_hit_rate_published(self) -> bool:
        """Whether the engine's own prefix-cache counters reach CloudWatch: the vLLM container under
        detailed observability (the engine hit-rate widget, its PromQL alarms and verify's line)."""
        return self.model.framework == "vllm" and self.detailed_observability

    def rollback_alarm_names(self, component: str) -> list[str]:
        """The alarms a component's rolling update rolls back on (none without auto-rollback)."""
        if not (self.deployment.rolling_update and self.deployment.auto_rollback):
            return []
        return [alarm_name(component, alarm) for alarm in ROLLBACK_ALARMS]

    def _batch_warnings(self) -> list[str]:
        deployment = self.deployment
        if not deployment.rolling_update or deployment.batch_type != "COPY_COUNT":
            return []
        size, found = deployment.batch_size, []
        # 5-50 % of the copy count: the batch fits counts from 2 x size to 20 x size.
        fits = (2 * size, 20 * size)
        for plan in self.components():
            low, high = max(1, plan.copies_min), plan.copies_max
            if low < fits[0] or high > fits[1]:
                found.append(
                    f"deployment.batch_size {size} (COPY_COUNT) is 5-50 % of {fits[0]} to {fits[1]} copies, but "
                    f"{plan.name} may have {low} to {high}: SageMaker documents batches of 5-50 % of the copy count, "
                    "so an update at another count may be refused (CAPACITY_PERCENT follows the count)"
                )
        return found

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
        found += [f"tenancy: {line}" for line in self.tenants_sharing_a_cache]
        prefix_aware = self.routing.strategy == "PREFIX_AWARE"
        endpoint = self.endpoint
        if prefix_aware and endpoint.placement == "BINPACK" and self.copies_per_instance > 1:
            found.append(
                f"endpoint.placement BINPACK with routing.strategy PREFIX_AWARE: up to {self.copies_per_instance} "
                "copies fill one instance before the next, and botocore documents routing by prefix 'only when two "
                "or more instances can serve the request'; SPREAD keeps copies on distinct instances"
            )
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
        return found + self._batch_warnings()


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


def field_at(loc: tuple[Any, ...]) -> Any:
    """The pydantic FieldInfo of the field at ``loc`` (e.g. ``("routing", "prefix_length")``, or
    ``("limits", "tenants", "<key>", "concurrent_streams")`` inside a table of sections), or None."""
    model: Any = StageConfig
    field = None
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        field = fields[part]
        model = without_none(field.annotation)[0]
        if typing.get_origin(model) is dict and parts:  # a table of sections: its key, then the section
            model = typing.get_args(model)[1]
            parts.pop(0)
    return field


def _allowed_range(loc: tuple[Any, ...]) -> str | None:
    """'allowed: 1024 to 65536' from the Field bounds of the field at ``loc``."""
    field = field_at(loc)
    text = range_text(field.metadata if field else None)
    return f"allowed: {text}" if text else None


def _format_error(source: str, error: dict[str, Any]) -> str:
    loc = tuple(error["loc"])
    path = ".".join(str(part) for part in loc) or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return f"{source}: {path}: unknown key (a typo?); see the configuration reference in {REFERENCE_DOC}"
    if error["type"] == "missing":
        return f"{source}: {path}: required field is missing"
    if loc[:2] == ("model", "environment") and len(loc) > 2:
        # A variable's name or value: the value is never shown whole (it may be a secret).
        if loc[-1] == "[key]":
            return f"{source}: model.environment key {error['input']!r}: {message}"
        if "allowed" not in message:
            message = "allowed: a string"  # a value of another type (TOML gives numbers and booleans)
        return f"{source}: model.environment.{loc[2]} = {_shown_environment_value(error['input'])}: {message}"
    if error["type"] == "too_long" and isinstance(error["input"], (dict, list)):
        limit = error.get("ctx", {}).get("max_length")
        why = (f" (SageMaker takes {ENVIRONMENT_MAX_ENTRIES} variables; the stack sets up to {STACK_ENVIRONMENT_ENTRIES})"
               if loc == ("model", "environment") else "")
        return f"{source}: {path}: {len(error['input'])} entries; allowed: at most {limit}{why}"
    field = field_at(tuple(part for part in loc if not isinstance(part, int)))  # a list's items: the list's field
    leaf = field is not None and not _is_section(field.annotation)
    if isinstance(error["input"], dict) and not leaf:  # a rule across fields: the message names them and their values
        return f"{source}: {path}: {message}"
    if error["type"] in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        message = _allowed_range(loc) or message
    if error["type"] == "finite_number":  # inf, -inf, nan
        bounds = _allowed_range(loc)
        message = f"{bounds}, a finite number" if bounds else "allowed: a finite number"
    if "allowed" not in message and leaf:  # pydantic's own words (a type, a pattern): what the reference says instead
        message = allowed_words(field) if error["type"] != "value_error" else f"{message}; {allowed_words(field)}"
    return f"{source}: {path} = {error['input']!r}: {message}"


def _is_section(annotation: Any) -> bool:
    base = without_none(annotation)[0]
    return isinstance(base, type) and issubclass(base, BaseModel)


def parse_stage(data: dict[str, Any], *, source: str) -> StageConfig:
    try:
        return StageConfig.model_validate(data)
    except ValidationError as error:
        errors = error.errors(include_url=False)
        # A variable whose name is refused needs no second line about its value.
        refused = {e["loc"][:3] for e in errors
                   if tuple(e["loc"][:2]) == ("model", "environment") and e["loc"][-1] == "[key]"}
        errors = [e for e in errors if len(e["loc"]) != 3 or tuple(e["loc"]) not in refused]
        raise ConfigError([_format_error(source, e) for e in errors]) from None


def _case_twins(name: str, config_dir: Path) -> list[str]:
    """Other stages whose names differ from ``name`` only in case (they would share the endpoint)."""
    names = {p.stem for p in config_dir.glob("*.toml")} | {DEFAULT_STAGE}
    return sorted(other for other in names if other != name and other.lower() == name.lower())


def load_stage(name: str = DEFAULT_STAGE, *, config_dir: Path = CONFIG_DIR) -> StageConfig:
    """The stage ``name``: the embedded default, or ``config_dir/<name>.toml``."""
    path = config_dir / f"{name}.toml"
    files = {p.name for p in config_dir.glob("*.toml")}  # exact names, on case-insensitive disks too
    if not re.fullmatch(_NAME, name) or (path.name not in files and name != DEFAULT_STAGE):
        available = sorted(p.removesuffix(".toml") for p in files) + [DEFAULT_STAGE]
        raise ConfigError([f"stage {name!r}: no file {path}; available stages: {', '.join(sorted(set(available)))}"])
    twins = _case_twins(name, config_dir)
    if twins:
        raise ConfigError([
            f"{path if path.name in files else 'embedded default stage'}: name {name!r} differs only in case from "
            f"stage {', '.join(map(repr, twins))}: both would deploy the endpoint {name.lower()}-prefix-llm; "
            "allowed: stage names that differ in more than case (rename one file)"
        ])
    if name == DEFAULT_STAGE and path.name not in files:
        return parse_stage(DEFAULT_STAGE_DATA, source="embedded default stage")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError([f"{path}: not valid TOML: {error}"]) from None
    problems = []
    if data.get("name", name) != name:
        problems.append(
            f"{path}: name = {data['name']!r}: must equal the file name {name!r} (a stage is selected by its file "
            f"name, -c stage={name}); allowed: {name!r}, or leave name out"
        )
        data["name"] = name  # the other fields are still checked, all problems at once
    data.setdefault("name", name)
    try:
        config = parse_stage(data, source=str(path))
    except ConfigError as error:
        problems.extend(error.problems)
    if problems:
        raise ConfigError(problems)
    return config
