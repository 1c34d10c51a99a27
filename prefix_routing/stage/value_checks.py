"""Checks that more than one section of a stage uses: stage and resource names, container
environment variables (no secrets), S3 folder URIs, log retention values. Imports no other module of
the stage's sections, so that any of them can use it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator

STAGE_NAME = r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$"  # SageMaker resource names and our stage names

#: The retention values CloudWatch Logs takes (days), for the functions' log groups.
LOG_RETENTION_DAYS = Literal[1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365]

# SageMaker's CreateModel ContainerDefinition.Environment (botocore's sagemaker model): EnvironmentMap
# at most 100 entries, EnvironmentKey [a-zA-Z_][a-zA-Z0-9_]* up to 1024 characters, EnvironmentValue
# up to 1024 characters. The stack sets up to 4 variables of its own (stacks/constructs/
# inference_endpoint.py container_environment: vLLM 4, LMI 3), so a stage may add at most 96.
ENVIRONMENT_MAX_ENTRIES = 100
STACK_ENVIRONMENT_ENTRIES = 4
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_MAX_LENGTH = 1024
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


def checked_environment_key(key: str) -> str:
    if not _ENV_KEY.fullmatch(key) or len(key) > ENV_MAX_LENGTH:
        raise ValueError(
            f"not an environment variable name; allowed: [A-Za-z_][A-Za-z0-9_]*, at most {ENV_MAX_LENGTH} "
            "characters (SageMaker's EnvironmentKey)"
        )
    word = secret_word(key)
    if word:
        raise ValueError(f"names a secret ({word}); allowed: {_NO_SECRETS}")
    return key


def checked_environment_value(value: str) -> str:
    for pattern, what in _SECRET_VALUES:
        if pattern.search(value):
            raise ValueError(f"the value looks like {what}; allowed: {_NO_SECRETS}")
    if len(value) > ENV_MAX_LENGTH:
        raise ValueError(f"{len(value)} characters; allowed: at most {ENV_MAX_LENGTH} (SageMaker's EnvironmentValue)")
    return value


def shown_environment_value(value: Any) -> str:
    """How an environment value appears in an error: never a secret, never a whole long value."""
    if not isinstance(value, str):
        return repr(value)
    if any(pattern.search(value) for pattern, _ in _SECRET_VALUES):
        return "(not shown)"
    return repr(value) if len(value) <= 40 else repr(value[:40]) + "..."


EnvironmentKey = Annotated[str, AfterValidator(checked_environment_key)]
EnvironmentValue = Annotated[str, AfterValidator(checked_environment_value)]


def checked_s3_uri(value: str | None) -> str | None:
    """An S3 folder URI a stage may name (the model's, the benchmark's), unchanged; ValueError otherwise."""
    problem = s3_uri_problem(value) if value is not None else None
    if problem:
        raise ValueError(f"{problem}; allowed: {_S3_URI_ALLOWED}")
    return value


def s3_uri_problem(value: str) -> str | None:
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
