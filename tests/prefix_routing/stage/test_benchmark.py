"""A stage's [benchmark] section: what parses, where the workloads and results go, and one line per
problem naming the field, the value and what is allowed."""

from __future__ import annotations

import copy

import pytest

from prefix_routing.stage.config import DEFAULT_STAGE_DATA, ConfigError, load_stage, parse_stage

ROLE = "arn:aws:iam::111122223333:role/bench-role"
SECRET = "arn:aws:secretsmanager:us-east-1:111122223333:secret:hf-token-AbCdEf"


def stage(**benchmark):
    data = copy.deepcopy(DEFAULT_STAGE_DATA)
    data["benchmark"] = benchmark
    return data


def problems(data) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        parse_stage(data, source="stage.toml")
    return raised.value.problems


def test_without_the_section_benchmarking_is_off():
    settings = load_stage().benchmark
    assert settings.enabled is False
    assert (settings.bucket, settings.prefix, settings.workloads_prefix, settings.results_prefix) == (None,) * 4


def test_s3_uri_turns_it_on_and_names_the_two_folders():
    settings = parse_stage(stage(s3_uri="s3://acme-bench/prefix-routing/runs/"), source="t").benchmark
    assert settings.enabled is True
    assert settings.bucket == "acme-bench"
    assert settings.prefix == "prefix-routing/runs/"
    assert settings.workloads_prefix == "prefix-routing/runs/workloads/"
    assert settings.results_prefix == "prefix-routing/runs/results/"


def test_the_buckets_root_is_a_folder_too():
    settings = parse_stage(stage(s3_uri="s3://acme-bench/"), source="t").benchmark
    assert (settings.prefix, settings.workloads_prefix, settings.results_prefix) == ("", "workloads/", "results/")


def test_every_optional_field_parses():
    settings = parse_stage(stage(s3_uri="s3://acme-bench/b/", role_arn=ROLE, tokenizer="meta-llama/Llama-3.1-8B-Instruct",
                                 hf_token_secret_arn=SECRET), source="t").benchmark
    assert (settings.role_arn, settings.tokenizer, settings.hf_token_secret_arn) == (
        ROLE, "meta-llama/Llama-3.1-8B-Instruct", SECRET)


ALLOWED_URI = ("allowed: s3://<bucket>/<prefix>/: a bucket name of 3-63 lowercase letters, digits, '.' and '-' (S3's "
               "naming rules), and folder names of letters, digits and ! - _ . ' ( ) each ending with '/' ('*' and '?' "
               "would be IAM wildcards in the role's grant)")


@pytest.mark.parametrize(("fields", "expected"), [
    ({"s3_uri": "s3://Acme_Bench/b/"},
     f"stage.toml: benchmark.s3_uri = 's3://Acme_Bench/b/': bucket 'Acme_Bench' is not a valid S3 bucket name; {ALLOWED_URI}"),
    ({"s3_uri": "s3://acme-bench/b"},
     "stage.toml: benchmark.s3_uri = 's3://acme-bench/b': 's3://acme-bench/b' must end with '/': an S3Prefix model data "
     f"URI names a folder; {ALLOWED_URI}"),
    ({"s3_uri": "s3://acme-bench/runs*/"},
     f"stage.toml: benchmark.s3_uri = 's3://acme-bench/runs*/': prefix 'runs*/' has '*'; {ALLOWED_URI}"),
    ({"s3_uri": "https://acme-bench/b/"},
     f"stage.toml: benchmark.s3_uri = 'https://acme-bench/b/': must begin with s3://; {ALLOWED_URI}"),
    ({"s3_uri": "s3://acme-bench/b/", "role_arn": "arn:aws:iam::111122223333:user/bob"},
     "stage.toml: benchmark.role_arn = 'arn:aws:iam::111122223333:user/bob': allowed: a string; at most 2048 "
     r"characters; matches `^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$`"),
    ({"s3_uri": "s3://acme-bench/b/", "tokenizer": "meta llama"},
     "stage.toml: benchmark.tokenizer = 'meta llama': allowed: a string; matches "
     r"`^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$`"),
    ({"s3_uri": "s3://acme-bench/b/", "hf_token_secret_arn": "arn:aws:ssm:us-east-1:111122223333:parameter/hf"},
     "stage.toml: benchmark.hf_token_secret_arn = 'arn:aws:ssm:us-east-1:111122223333:parameter/hf': allowed: a "
     r"string; at most 2048 characters; matches "
     r"`^arn:aws[a-z\-]*:secretsmanager:[a-z]{2}(-[a-z]+)+-\d:\d{12}:secret:[A-Za-z0-9/_+=.@-]+$`"),
    ({"role_arn": ROLE},
     "stage.toml: benchmark: role_arn is set but s3_uri is not; allowed: set s3_uri (s3://<bucket>/<prefix>/) to "
     "benchmark this stage, or leave [benchmark] out"),
    ({"hf_token_secret_arn": SECRET},
     "stage.toml: benchmark: hf_token_secret_arn is set but s3_uri is not; allowed: set s3_uri (s3://<bucket>/<prefix>/)"
     " to benchmark this stage, or leave [benchmark] out"),
    ({"s3_uri": "s3://acme-bench/b/", "bucket": "acme-bench"},
     "stage.toml: benchmark.bucket: unknown key (a typo?); see the configuration reference in docs/configuration.md"),
    ({"s3_uri": 5}, "stage.toml: benchmark.s3_uri = 5: allowed: a string; at most 1024 characters; "
                    "`s3://<bucket>/<prefix>/`: a bucket name of 3–63 lowercase letters, digits, `.` and `-` (S3's naming "
                    "rules), folder names of letters, digits and `! - _ . ' ( )`, each ending with `/` (`*` and `?` "
                    "would be IAM wildcards in the role's grant)"),
])
def test_a_bad_field_is_one_line_naming_field_value_and_allowed(fields, expected):
    assert problems(stage(**fields)) == [expected]
