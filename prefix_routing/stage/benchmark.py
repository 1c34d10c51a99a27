"""The stage's ``[benchmark]`` section: where ``python -m prefix_routing benchmark`` puts its workload
and finds its results, and which role the benchmark job runs as.

A SageMaker AI benchmark job runs AIPerf on AWS's side against the stage's endpoint; it reads the
workload from ``<s3_uri>workloads/`` and writes its results under ``<s3_uri>results/``. With
``s3_uri`` set and no ``role_arn``, the Endpoint stack makes the job's role, allowed exactly that
(stacks/constructs/benchmark_role.py).
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from prefix_routing.stage.section import Section, allowed
from prefix_routing.stage.value_checks import checked_s3_uri

#: The folders under ``s3_uri``: what the job reads, and what it writes.
WORKLOADS_FOLDER = "workloads/"
RESULTS_FOLDER = "results/"

#: botocore's sagemaker model, CreateAIBenchmarkJob.RoleArn (shape RoleArn: 20 to 2048 characters).
ROLE_ARN = r"^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$"
#: A Secrets Manager secret's ARN (its name: letters, digits and /_+=.@-; AWS adds -XXXXXX).
SECRET_ARN = r"^arn:aws[a-z\-]*:secretsmanager:[a-z]{2}(-[a-z]+)+-\d:\d{12}:secret:[A-Za-z0-9/_+=.@-]+$"
#: A Hugging Face repository id (``owner/name``, or ``name``), what AIPerf loads its tokenizer from.
TOKENIZER = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$"


class BenchmarkSettings(Section):
    """The [benchmark] section: benchmark jobs against the deployed endpoint (`python -m prefix_routing
    benchmark`). Setting `s3_uri` turns it on: the Endpoint stack then adds the job's role (unless
    `role_arn` names one), which may read `<s3_uri>workloads/`, write `<s3_uri>results/` and invoke this
    endpoint, nothing else. The bucket is yours: the stacks neither create nor empty it."""

    s3_uri: str | None = Field(
        None, max_length=1024,
        description="`s3://bucket/prefix/` the command uploads workloads to (`workloads/`) and the job writes "
        "results to (`results/`); unset: no benchmark role, and `benchmark` refuses the stage",
        json_schema_extra=allowed(
            "`s3://<bucket>/<prefix>/`: a bucket name of 3–63 lowercase letters, digits, `.` and `-` (S3's naming "
            "rules), folder names of letters, digits and `! - _ . ' ( )`, each ending with `/` (`*` and `?` would "
            "be IAM wildcards in the role's grant)"
        ),
    )
    role_arn: str | None = Field(
        None, max_length=2048, pattern=ROLE_ARN,
        description="an IAM role of your own for the job (assumable by `sagemaker.amazonaws.com`); unset: the "
        "role the Endpoint stack makes",
    )
    tokenizer: str | None = Field(
        None, pattern=TOKENIZER,
        description="the Hugging Face tokenizer AIPerf counts tokens with; unset: `model.model_id` (needed when "
        "the weights come from `model.model_s3_uri`)",
    )
    hf_token_secret_arn: str | None = Field(
        None, max_length=2048, pattern=SECRET_ARN,
        description="a Secrets Manager secret holding a Hugging Face token, for a gated tokenizer; the job's role "
        "may read this secret only",
    )

    @field_validator("s3_uri")
    @classmethod
    def _s3_uri(cls, value: str | None) -> str | None:
        return checked_s3_uri(value)  # the same rules as model.model_s3_uri

    @model_validator(mode="after")
    def _needs_s3_uri(self) -> "BenchmarkSettings":
        if self.s3_uri is None:
            given = [name for name in ("role_arn", "tokenizer", "hf_token_secret_arn")
                     if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{given[0]} is set but s3_uri is not; allowed: set s3_uri (s3://<bucket>/<prefix>/) "
                                 "to benchmark this stage, or leave [benchmark] out")
        return self

    @property
    def enabled(self) -> bool:
        return self.s3_uri is not None

    @property
    def bucket(self) -> str | None:
        return self.s3_uri.removeprefix("s3://").split("/", 1)[0] if self.s3_uri else None

    @property
    def prefix(self) -> str | None:
        """The folder under the bucket, ending in "/" (or "" for the bucket's root)."""
        return self.s3_uri.removeprefix("s3://").split("/", 1)[1] if self.s3_uri else None

    @property
    def workloads_prefix(self) -> str | None:
        return None if self.prefix is None else self.prefix + WORKLOADS_FOLDER

    @property
    def results_prefix(self) -> str | None:
        return None if self.prefix is None else self.prefix + RESULTS_FOLDER
