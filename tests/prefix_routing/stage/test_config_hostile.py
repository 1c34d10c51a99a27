"""Hostile stage values: each is refused with one line naming the file, the field, the value and what
is allowed, before synth builds anything from it."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from prefix_routing.stage import endpoint_sections, front_door_sections
from prefix_routing.stage.config import DEFAULT_STAGE_DATA, ConfigError, StageConfig, load_stage, parse_stage
from prefix_routing.stage.presets import INSTANCES

ROOT = Path(__file__).resolve().parents[3]


def _stage(**changes):
    """The default stage's data with dotted paths set (``model__environment`` is ``model.environment``)."""
    data = copy.deepcopy(DEFAULT_STAGE_DATA)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return data


def _problems(data) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        parse_stage(data, source="stage.toml")
    return raised.value.problems


# ---------------------------------------------------------------------------------- infinities and NaN

def _float_fields(model=StageConfig, prefix=""):
    for name, field in model.model_fields.items():
        if hasattr(field.annotation, "model_fields"):
            yield from _float_fields(field.annotation, f"{prefix}{name}.")
        elif field.annotation in (float, float | None):
            yield prefix + name


FLOAT_FIELDS = list(_float_fields())


def test_the_float_fields_are_found():
    # guards the parametrization below: a refactor that hid the float fields would make it pass empty
    assert {"alarms.ttft_p50_ms", "scaling.target_concurrent_requests_per_copy", "advisor.notify_ttft_gain",
            "normalizer.replication.half_life_s"} <= set(FLOAT_FIELDS)
    assert len(FLOAT_FIELDS) == 10


@pytest.mark.parametrize("path", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_infinity_and_nan_are_refused_in_every_float_field(path, value):
    (line,) = _problems(_stage(**{path.replace(".", "__"): value}))
    assert line.startswith(f"stage.toml: {path} = {value!r}: allowed: ")
    assert line.endswith("a finite number")


def test_infinite_ttft_threshold_is_one_line_not_a_synth_crash():
    # Before: accepted, and synth crashed in jsii ("threshold": Infinity is not JSON).
    assert _problems(_stage(alarms__ttft_p50_ms=math.inf)) == [
        "stage.toml: alarms.ttft_p50_ms = inf: allowed: more than 0 to 900000, a finite number"
    ]


def test_infinity_from_a_toml_file(tmp_path):
    text = (ROOT / "config" / "llama8b-g6e.toml").read_text().replace("ttft_p50_ms = 800", "ttft_p50_ms = inf")
    (tmp_path / "hot.toml").write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_stage("hot", config_dir=tmp_path)
    assert raised.value.problems == [f"{tmp_path / 'hot.toml'}: alarms.ttft_p50_ms = inf: allowed: more than 0 to "
                                     "900000, a finite number"]


# ------------------------------------------------------------------------------------------ model_s3_uri

S3_ALLOWED = "allowed: s3://<bucket>/<prefix>/: a bucket name of 3-63 lowercase letters"
RESERVED = "has a prefix or suffix S3 reserves (access point aliases, directory buckets)"


def _s3(uri):
    return _stage(model__model_id=None, model__model_s3_uri=uri)


@pytest.mark.parametrize(
    "uri, why",
    [
        ("s3://bucket/*/", "prefix '*/' has '*'"),  # the grant would be bucket/*/*: nearly the whole bucket
        ("s3://bucket/weights?/", "prefix 'weights?/' has '?'"),
        ("s3://bucket/${aws:username}/", "prefix '${aws:username}/' has '$' and ':' and '{' and '}'"),
        ("s3://bucket/llama 8b/", "prefix 'llama 8b/' has ' '"),
        ("s3://bucket/a//b/", "prefix 'a//b/' has an empty folder name"),
        ("s3://bucket//", "prefix '/' has an empty folder name"),
        ("s3://*/weights/", "bucket '*' is not a valid S3 bucket name"),
        ("s3://my-*/weights/", "bucket 'my-*' is not a valid S3 bucket name"),
        ("s3://My-Weights/w/", "bucket 'My-Weights' is not a valid S3 bucket name"),
        ("s3://ab/w/", "bucket 'ab' is not a valid S3 bucket name"),  # 3 characters at least
        ("s3://" + "a" * 64 + "/w/", f"bucket '{'a' * 64}' is not a valid S3 bucket name"),  # 63 at most
        ("s3://-weights/w/", "bucket '-weights' is not a valid S3 bucket name"),
        ("s3://weights./w/", "bucket 'weights.' is not a valid S3 bucket name"),
        ("s3://my_weights/w/", "bucket 'my_weights' is not a valid S3 bucket name"),
        ("s3://my..weights/w/", "bucket 'my..weights' has two adjacent dots"),
        ("s3://192.168.5.4/w/", "bucket '192.168.5.4' is formatted as an IP address"),
        ("s3://xn--weights/w/", f"bucket 'xn--weights' {RESERVED}"),
        ("s3://weights-ab12-s3alias/w/", f"bucket 'weights-ab12-s3alias' {RESERVED}"),  # an access point alias
        ("s3://weights--x-s3/w/", f"bucket 'weights--x-s3' {RESERVED}"),  # a directory bucket
        ("https://weights.s3.amazonaws.com/w/", "must begin with s3://"),
        ("s3://weights", "names no folder: it must end with '/'"),
        ("s3://weights/llama/8b", "'s3://weights/llama/8b' must end with '/': an S3Prefix model data URI names a folder"),
    ],
)
def test_model_s3_uri_that_iam_or_s3_would_read_otherwise_is_refused(uri, why):
    (line,) = _problems(_s3(uri))
    assert line.startswith(f"stage.toml: model.model_s3_uri = {uri!r}: {why}; {S3_ALLOWED}")


@pytest.mark.parametrize(
    "uri, bucket, prefix",
    [
        ("s3://my-weights/llama/8b/", "my-weights", "llama/8b/"),
        ("s3://my.weights-2/Llama-3.1_8B(instruct)!/", "my.weights-2", "Llama-3.1_8B(instruct)!/"),
        ("s3://abc/", "abc", ""),  # the whole bucket, as asked
        ("s3://" + "a" * 63 + "/w/", "a" * 63, "w/"),
    ],
)
def test_valid_model_s3_uris_pass(uri, bucket, prefix):
    model = parse_stage(_s3(uri), source="stage.toml").model
    assert (model.s3_bucket, model.s3_prefix) == (bucket, prefix)
    assert "*" not in f"{model.s3_bucket}/{model.s3_prefix}" and "?" not in model.s3_prefix


# ------------------------------------------------------------------------------------- model.environment

NO_SECRETS = "allowed: no secrets: container environment is plain text in the template"


@pytest.mark.parametrize(
    "name, word",
    [
        ("HF_TOKEN", "TOKEN"),
        ("HUGGING_FACE_HUB_TOKEN", "TOKEN"),
        ("SM_VLLM_HF_TOKEN", "TOKEN"),  # the vLLM DLC would pass it as --hf-token
        ("hfToken", "TOKEN"),
        ("AWS_SESSION_TOKEN", "TOKEN"),
        ("OPENAI_API_KEY", "KEY"),
        ("SM_VLLM_API_KEY", "KEY"),
        ("AWS_ACCESS_KEY_ID", "KEY"),
        ("AWS_SECRET_ACCESS_KEY", "SECRET"),
        ("DB_PASSWORD", "PASSWORD"),
        ("GOOGLE_APPLICATION_CREDENTIALS", "CREDENTIALS"),
        ("APIKEY", "APIKEY"),
        ("MY_SECRET_FILE", "SECRET"),
        ("GITHUB_AUTHTOKEN", "AUTHTOKEN"),
        ("SESSION_COOKIE", "COOKIE"),
    ],
)
def test_environment_variable_named_as_a_secret_is_refused(name, word):
    (line,) = _problems(_stage(model__environment={name: "value-not-shown-123"}))
    assert line.startswith(f"stage.toml: model.environment key {name!r}: names a secret ({word}); {NO_SECRETS}")
    assert "model.model_s3_uri" in line  # the way to a gated model without a token
    assert "value-not-shown-123" not in line


@pytest.mark.parametrize(
    "value, what",
    [
        ("hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3", "a Hugging Face token (hf_...)"),
        ("--hf-token hf_" + "x" * 34, "a Hugging Face token (hf_...)"),
        ("AKIA" + "ABCDEFGHIJKLMNOP", "an AWS access key id"),
    ],
)
def test_environment_value_that_is_a_credential_is_refused_and_not_shown(value, what):
    (line,) = _problems(_stage(model__environment={"EXTRA_ARGS": value}))
    assert line == f"stage.toml: model.environment.EXTRA_ARGS = (not shown): the value looks like {what}; " + line.split(
        f"the value looks like {what}; ", 1)[1]
    assert NO_SECRETS in line
    assert value not in line and value[-10:] not in line


def test_engine_settings_whose_names_mention_tokens_pass():
    benign = ["SM_VLLM_MAX_NUM_BATCHED_TOKENS", "SM_VLLM_LONG_PREFILL_TOKEN_THRESHOLD", "SM_VLLM_TOKENIZER",
              "SM_VLLM_RETURN_TOKENS_AS_TOKEN_IDS", "OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS", "SM_VLLM_KV_CACHE_DTYPE",
              "SM_VLLM_SSL_KEYFILE", "HF_HUB_ENABLE_HF_TRANSFER", "MONKEY_ID", "KEYS_TO_CACHE"]
    model = parse_stage(_stage(model__environment={name: "1" for name in benign}), source="stage.toml").model
    assert list(model.environment) == benign


@pytest.mark.parametrize("key", ["1BAD", "A-B", "A B", "A.B", "", "É", "X" * 1025])
def test_environment_key_that_is_not_a_variable_name_is_refused(key):
    (line,) = _problems(_stage(model__environment={key: "1"}))
    assert line == (f"stage.toml: model.environment key {key!r}: not an environment variable name; allowed: "
                    "[A-Za-z_][A-Za-z0-9_]*, at most 1024 characters (SageMaker's EnvironmentKey)")


def test_environment_limits_are_sagemakers():
    assert parse_stage(_stage(model__environment={"X" * 1024: "v" * 1024}), source="s").model.environment
    (line,) = _problems(_stage(model__environment={"LONG": "v" * 1025}))
    assert line == ("stage.toml: model.environment.LONG = '" + "v" * 40 + "'...: 1025 characters; allowed: at most 1024 "
                    "(SageMaker's EnvironmentValue)")
    many = {f"EXTRA_{i}": "1" for i in range(96)}
    assert len(parse_stage(_stage(model__environment=many), source="s").model.environment) == 96
    many["EXTRA_96"] = "1"
    assert _problems(_stage(model__environment=many)) == [
        "stage.toml: model.environment: 97 entries; allowed: at most 96 (SageMaker takes 100 variables; the stack sets "
        "up to 4)"
    ]
    (line,) = _problems(_stage(model__environment={"N": 1}))
    assert line == "stage.toml: model.environment.N = 1: allowed: a string"


# ------------------------------------------------------------------------------------------- block_bytes

@pytest.mark.parametrize("value", [64, 256, 511])
def test_block_bytes_too_small_for_a_cloudwatch_log_event_is_refused(value):
    assert _problems(_stage(normalizer={"block_bytes": value})) == [
        f"stage.toml: normalizer.block_bytes = {value}: allowed: from 512 to 65536"
    ]


def test_the_request_log_line_of_the_largest_body_fits_one_cloudwatch_log_event():
    """At the smallest block_bytes, the log line of a 6 MiB body with the longest other fields stays
    under 256 KB (CloudWatch Logs' event limit, 26 bytes of overhead counted)."""
    from prefix_routing.frontdoor import InvokeConfig, RequestRecord, Telemetry
    from prefix_routing.rules import MAX_BODY_BYTES_LIMIT, NormalizerSettings
    from prefix_routing.rules.identity import block_hashes

    block = parse_stage(_stage(normalizer={"block_bytes": 512}), source="s").normalizer.block_bytes
    assert block == front_door_sections.BLOCK_BYTES_MIN == 512
    body = bytes(range(256)) * (MAX_BODY_BYTES_LIMIT // 256)
    hashes = block_hashes(body, block)
    assert len(hashes) == 12_288  # 6,291,456 / 512, by hand
    assert len(json.dumps(list(hashes), separators=(",", ":"))) == 233_473  # 19 x 12,288 + 1, by hand
    record = RequestRecord(
        arrival_ms=1796032800000, request_id="r" * 64,
        tenant="arn:aws:iam::111122223333:user/" + "path/" * 100 + "u" * 64, application="a" * 64,
        routing_id="p" * 64, body_kind="chat", fingerprint="f" * 16, block_hashes=hashes,
        body_bytes=MAX_BODY_BYTES_LIMIT, normalize_ms=123456.789, sent=True, attempts=10, ttft_ms=899999.999,
        total_ms=899999.999, upstream_ttft_ms=899999.999, wall_ms=899999.999, prompt_tokens=10**9,
        cached_tokens=10**9, output_tokens=10**9, status=504, error_kind="e" * 64, error_field="f" * 80,
        origin="upstream", rekeyed=True, replica=63, replicas=64, hot_prefixes=10**6,
    )
    config = InvokeConfig(endpoint_name="e" * 63, component_name="c" * 63, settings=NormalizerSettings(block_bytes=block))
    lines: list[str] = []
    Telemetry(config, emit=lines.append).publish(record)
    assert len(lines) == 2 and '"block_hashes":[' in lines[1]
    for line in lines:
        assert len(line.encode("utf-8")) + 26 <= 256 * 1024
    assert len(lines[1].encode("utf-8")) - 233_473 < 16 * 1024  # the other fields, within front_door_sections.py's allowance


# ------------------------------------------------------------------------------------- names, stage files

def _write(folder: Path, name: str, extra: str = "") -> Path:
    path = folder / f"{name}.toml"
    path.write_text(extra + (ROOT / "config" / "llama8b-g6e.toml").read_text())
    return path


def test_name_that_differs_from_the_file_name_is_refused(tmp_path):
    path = _write(tmp_path, "mine", 'name = "prod"\n')
    with pytest.raises(ConfigError) as raised:
        load_stage("mine", config_dir=tmp_path)
    assert raised.value.problems == [
        f"{path}: name = 'prod': must equal the file name 'mine' (a stage is selected by its file name, "
        "-c stage=mine); allowed: 'mine', or leave name out"
    ]
    _write(tmp_path, "same", 'name = "same"\n')
    assert load_stage("same", config_dir=tmp_path).name == "same"


def test_name_mismatch_is_reported_with_the_other_problems(tmp_path):
    path = tmp_path / "both.toml"
    path.write_text('name = "prod"\n' + (ROOT / "config" / "llama8b-g6e.toml").read_text().replace(
        "prefix_length = 8192", "prefix_length = 10"))
    with pytest.raises(ConfigError) as raised:
        load_stage("both", config_dir=tmp_path)
    assert [p.split(": ", 2)[1] for p in raised.value.problems] == ["name = 'prod'", "routing.prefix_length = 10"]


def test_stage_names_that_differ_only_in_case_are_refused(tmp_path):
    _write(tmp_path, "Prod")
    _write(tmp_path, "prod")
    assert {p.name for p in tmp_path.iterdir()} == {"Prod.toml", "prod.toml"}  # a case-sensitive disk
    for name, twin in (("Prod", "prod"), ("prod", "Prod")):
        with pytest.raises(ConfigError) as raised:
            load_stage(name, config_dir=tmp_path)
        assert raised.value.problems == [
            f"{tmp_path / (name + '.toml')}: name {name!r} differs only in case from stage {twin!r}: both would "
            "deploy the endpoint prod-prefix-llm; allowed: stage names that differ in more than case (rename one file)"
        ]


def test_a_stage_file_that_shadows_the_embedded_default_in_another_case_is_refused(tmp_path):
    _write(tmp_path, "Default")
    for name in ("Default", "default"):
        with pytest.raises(ConfigError, match=r"differs only in case from stage .*default-prefix-llm"):
            load_stage(name, config_dir=tmp_path)


def test_a_stage_is_found_by_its_exact_file_name(tmp_path):
    _write(tmp_path, "prod")
    with pytest.raises(ConfigError, match=r"stage 'PROD': no file .*available stages: default, prod"):
        load_stage("PROD", config_dir=tmp_path)  # also on a case-insensitive disk, where PROD.toml "exists"


# ------------------------------------------------------------------------------------------ instance types

def _cloudformation_instance_types() -> set[str]:
    """ProductionVariant.InstanceType's enum in the installed cfn-lint's AWS::SageMaker::EndpointConfig
    schemas, over every region."""
    import cfnlint

    schemas = Path(cfnlint.__file__).parent / "data" / "schemas"
    found: set[str] = set()
    for provider in (schemas / "providers").glob("*.json"):
        schema_id = json.loads(provider.read_text()).get("AWS::SageMaker::EndpointConfig")
        if schema_id:
            schema = json.loads((schemas / "resources" / f"{schema_id}.json").read_text())
            instance_type = schema["definitions"]["ProductionVariant"]["properties"]["InstanceType"]
            assert "pattern" not in instance_type  # an enum, no pattern: if that changes, use the pattern
            found |= set(instance_type["enum"])
    return found


def test_instance_types_are_cloudformations():
    assert endpoint_sections.HOSTING_INSTANCE_TYPES == _cloudformation_instance_types(), (
        "cfn-lint's AWS::SageMaker::EndpointConfig InstanceType enum changed: update _HOSTING_INSTANCE_FAMILIES"
    )
    assert set(INSTANCES) <= endpoint_sections.HOSTING_INSTANCE_TYPES  # the lab's table is deployable


@pytest.mark.parametrize("instance_type", ["ml.p6-b200.48xlarge", "ml.p6-b300.48xlarge", "ml.p6e-gb200.36xlarge"])
def test_hyphenated_instance_types_are_accepted(instance_type):
    config = parse_stage(_stage(endpoint__instance_type=instance_type), source="stage.toml")
    assert config.endpoint.instance_type == instance_type
    assert any("not in the known table" in w for w in config.warnings)


@pytest.mark.parametrize(
    "instance_type, hint",
    [
        ("ml.g6e.xlarg", " (did you mean ml.g6e.xlarge"),
        ("ml.g7.xlarge", " (did you mean ml.g7."),  # the g7 family starts at 2xlarge
        ("g6e.xlarge", " (did you mean ml.g6e.xlarge"),
        ("ml.*.48xlarge", ""),
        ("ml.p6-b200", " (did you mean ml.p6-b200.48xlarge"),
    ],
)
def test_instance_type_cloudformation_does_not_accept_is_refused(instance_type, hint):
    (line,) = _problems(_stage(endpoint__instance_type=instance_type))
    assert line.startswith(f"stage.toml: endpoint.instance_type = {instance_type!r}: not an instance type "
                           f"CloudFormation accepts for AWS::SageMaker::EndpointConfig{hint}")
    assert line.endswith("allowed: ml.<family>.<size> of its 277 hosting types, e.g. ml.g6e.xlarge, ml.p5.48xlarge, "
                         "ml.p6-b200.48xlarge")


# ------------------------------------------------------------------------------------------- the image

@pytest.mark.parametrize(
    "path, value",
    [
        ("model__image_repository", "vllm*"),  # would widen the role's ECR pull to every repository
        ("model__image_repository", "Vllm"),
        ("model__image_repository", "v"),
        ("model__image_tag", "v1 beta"),
        ("model__image_tag", "-v1"),
    ],
)
def test_image_reference_outside_ecr_and_docker_rules_is_refused(path, value):
    (line,) = _problems(_stage(**{path: value}))
    field = path.replace("__", ".")
    assert line.startswith(f"stage.toml: {field} = {value!r}: allowed: a string; ") and "matches" in line
