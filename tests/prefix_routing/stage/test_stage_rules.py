"""The stage's rules one function at a time (prefix_routing/stage): which variable names and values
are secrets (the rule in value_checks.py's comment: a secret word anywhere, KEY/AUTH/COOKIE or ...TOKEN as
the last word before a final ID, Hugging Face tokens and AWS key ids as values), S3 model URIs
(S3's bucket naming rules, folders ending in '/'), the reference's range words, and the front
door's environment from a stage (front_door_env.py)."""

from __future__ import annotations

import json
import re

import pytest
from annotated_types import Ge, Gt, Le, Lt

from prefix_routing.stage import value_checks
from prefix_routing.stage.config import DEFAULT_STAGE_DATA, parse_stage
from prefix_routing.stage.reference_text import range_text
from prefix_routing.stage.value_checks import secret_word
from prefix_routing.stage.front_door_env import front_door_environment, function_environment


@pytest.mark.parametrize("name, word", [
    ("HF_TOKEN", "TOKEN"), ("hfToken", "TOKEN"), ("HFToken", "TOKEN"), ("OPENAI_API_KEY", "KEY"),
    ("DB_PASSWORD", "PASSWORD"), ("AWS_SECRET_ACCESS_KEY", "SECRET"), ("AWS_ACCESS_KEY_ID", "KEY"),
    ("GOOGLE_APPLICATION_CREDENTIALS", "CREDENTIALS"), ("MY_APIKEY_FILE", "APIKEY"), ("BASIC_AUTH", "AUTH"),
    ("SESSION_COOKIE", "COOKIE"), ("GITHUB_ACCESSTOKEN", "ACCESSTOKEN"), ("X_AUTHORIZATION", "AUTHORIZATION"),
    ("PASSPHRASE", "PASSPHRASE"), ("secrets_dir", "SECRETS"),
])
def test_a_secrets_name_is_found_by_its_word(name, word):
    assert secret_word(name) == word


@pytest.mark.parametrize("name", ["SM_VLLM_MAX_NUM_BATCHED_TOKENS", "SM_VLLM_LONG_PREFILL_TOKEN_THRESHOLD",
                                  "SM_VLLM_RETURN_TOKENS_AS_TOKEN_IDS", "KEY_PREFIX", "ID", "KEY_ID_EXTRA",
                                  "TOKENIZER", "HF_HOME", ""])
def test_engine_settings_are_not_secrets(name):
    assert secret_word(name) is None


def test_id_alone_is_no_secret_but_a_key_before_a_final_id_is():
    assert secret_word("ID") is None and secret_word("KEY_ID") == "KEY" and secret_word("TOKEN_ID") == "TOKEN"


def test_an_environment_key_is_a_name_of_at_most_1024_characters_and_no_secret():
    assert value_checks.checked_environment_key("A" * 1024) == "A" * 1024
    assert value_checks.checked_environment_key("_x9") == "_x9"
    for key, message in (("A" * 1025, "not an environment variable name"), ("9X", "not an environment variable name"),
                         ("A-B", "not an environment variable name"), ("HF_TOKEN", "names a secret (TOKEN); allowed: no")):
        with pytest.raises(ValueError, match=re.escape(message)):
            value_checks.checked_environment_key(key)


HF = "hf_" + "a1B2" * 8  # 32 characters after hf_
AWS_KEY = "AKIA" + "ABCDEFGH12345678"


def test_an_environment_value_is_at_most_1024_characters_and_no_credential():
    assert value_checks.checked_environment_value("x" * 1024) == "x" * 1024
    assert value_checks.checked_environment_value("hf_short") == "hf_short"
    with pytest.raises(ValueError, match="^1025 characters; allowed: at most 1024"):
        value_checks.checked_environment_value("x" * 1025)
    with pytest.raises(ValueError, match=r"^the value looks like a Hugging Face token \(hf_...\); allowed: no secrets"):
        value_checks.checked_environment_value(f"token={HF}")
    with pytest.raises(ValueError, match="^the value looks like an AWS access key id"):
        value_checks.checked_environment_value(AWS_KEY)
    assert value_checks.checked_environment_value("ASIA" + "A" * 15) == "ASIA" + "A" * 15  # 19 characters: no key id


def test_a_shown_value_is_never_a_secret_nor_a_whole_long_value():
    assert value_checks.shown_environment_value(HF) == "(not shown)"
    assert value_checks.shown_environment_value(f"x {AWS_KEY} y") == "(not shown)"
    assert value_checks.shown_environment_value("a" * 40) == repr("a" * 40)
    assert value_checks.shown_environment_value("a" * 41) == repr("a" * 40) + "..."
    assert value_checks.shown_environment_value(5) == "5"


@pytest.mark.parametrize("uri, problem", [
    ("s3://my-bucket/models/llama/", None),
    ("s3://my.bucket-1/", None),
    ("s3://abc/a!_.'()-/", None),
    ("https://my-bucket/models/", "must begin with s3://"),
    ("s3://my-bucket", "names no folder: it must end with '/'"),
    ("s3://My-Bucket/m/", "bucket 'My-Bucket' is not a valid S3 bucket name"),
    ("s3://ab/m/", "bucket 'ab' is not a valid S3 bucket name"),
    ("s3://" + "b" * 64 + "/m/", "is not a valid S3 bucket name"),
    ("s3://-bucket/m/", "is not a valid S3 bucket name"),
    ("s3://my..bucket/m/", "bucket 'my..bucket' has two adjacent dots"),
    ("s3://192.168.1.1/m/", "bucket '192.168.1.1' is formatted as an IP address"),
    ("s3://xn--bucket/m/", "has a prefix or suffix S3 reserves"),
    ("s3://sthree-bucket/m/", "has a prefix or suffix S3 reserves"),
    ("s3://bucket-s3alias/m/", "has a prefix or suffix S3 reserves"),
    ("s3://bucket--x-s3/m/", "has a prefix or suffix S3 reserves"),
    ("s3://my-bucket/models", "'s3://my-bucket/models' must end with '/'"),
    ("s3://my-bucket/models*/", "prefix 'models*/' has '*'"),
    ("s3://my-bucket/a?b$/", "prefix 'a?b$/' has '$' and '?'"),
    ("s3://my-bucket/a//", "prefix 'a//' has an empty folder name"),
])
def test_s3_model_uris_follow_s3s_naming_rules(uri, problem):
    found = value_checks.s3_uri_problem(uri)
    assert found == problem if problem is None else problem in found


@pytest.mark.parametrize("metadata, text", [
    ((Ge(1024), Le(65536)), "from 1024 to 65536"),
    ((Gt(0), Lt(1)), "more than 0, less than 1"),
    ((Gt(0), Le(1024)), "more than 0 to 1024"),
    ((Ge(0), Lt(1)), "from 0, less than 1"),
    ((Ge(1),), "from 1"),
    ((Gt(1),), "more than 1"),
    ((Le(5),), "at most 5"),
    ((Lt(5),), "less than 5"),
    ((), None),
    (None, None),
])
def test_a_fields_bounds_in_words(metadata, text):
    assert range_text(metadata) == text


def stage(**sections):
    data = json.loads(json.dumps(DEFAULT_STAGE_DATA))
    for section, fields in sections.items():
        data.setdefault(section, {}).update(fields)
    return parse_stage(data, source="test")


def test_the_front_door_environment_of_the_default_stage():
    config = stage()
    env = front_door_environment(config)
    normalizer = config.normalizer
    request_timeout = normalizer.timeout_s - 5  # 5 s kept to answer 504 and log
    expected = {
        "ENDPOINT_NAME": "default-prefix-llm", "INFERENCE_COMPONENT_NAME": "default-prefix-llm-ic",
        "ROUTING_STRATEGY": "PREFIX_AWARE", "PREFIX_LENGTH": "4096", "BLOCK_BYTES": str(normalizer.block_bytes),
        "TENANCY": normalizer.tenancy, "TENANT_HEADER": normalizer.tenant_header,
        "ALLOW_DIRECT_INVOKE": "true" if normalizer.allow_direct_invoke else "false",
        "REQUEST_TIMEOUT_S": str(request_timeout), "UPSTREAM_READ_TIMEOUT_S": str(min(65, request_timeout)),
        "REPLICATION_ENABLED": "false", "REPLICATION_MAX_REPLICAS": str(normalizer.replication.max_replicas),
        "REPLICATION_TARGET_SHARE_FACTOR": repr(float(normalizer.replication.target_share_factor)),
        "REPLICATION_HALF_LIFE_S": repr(float(normalizer.replication.half_life_s)),
        "REPLICATION_MIN_REQUESTS": repr(float(normalizer.replication.min_requests)),
        "COPIES_MIN": "2", "COPIES_MAX": "3",
    }
    assert {k: env.get(k) for k in expected} == expected
    assert all(isinstance(v, str) for v in env.values())


def test_timeouts_keep_five_seconds_for_the_answer_and_reads_wait_at_most_65_seconds():
    short = function_environment(endpoint_name="e", component_name="c", routing=stage().routing,
                                 endpoint=stage().endpoint, normalizer=stage(normalizer={"timeout_s": 30}).normalizer)
    assert (short["REQUEST_TIMEOUT_S"], short["UPSTREAM_READ_TIMEOUT_S"]) == ("25", "25")
    long = function_environment(endpoint_name="e", component_name="c", routing=stage().routing,
                                endpoint=stage().endpoint, normalizer=stage(normalizer={"timeout_s": 300}).normalizer)
    assert (long["REQUEST_TIMEOUT_S"], long["UPSTREAM_READ_TIMEOUT_S"]) == ("295", "65")


def test_replication_and_other_routing_reach_the_environment():
    config = stage(normalizer={"replication": {"enabled": True, "max_replicas": 8, "target_share_factor": 2,
                                               "half_life_s": 120, "min_requests": 4}},
                   routing={"strategy": "RANDOM", "prefix_length": None, "concurrency_threshold": None})
    env = front_door_environment(config)
    assert (env["REPLICATION_ENABLED"], env["REPLICATION_MAX_REPLICAS"], env["REPLICATION_TARGET_SHARE_FACTOR"],
            env["REPLICATION_HALF_LIFE_S"], env["REPLICATION_MIN_REQUESTS"]) == ("true", "8", "2.0", "120.0", "4.0")
    assert (env["ROUTING_STRATEGY"], env["PREFIX_LENGTH"]) == ("RANDOM", "0")  # no PrefixLength: 0


def test_a_five_second_function_still_gives_requests_one_second():
    # timeout_s may be 5 (its lower bound): 5 - 5 = 0 s would be no deadline at all, so 1 s.
    for timeout_s in (5, 6):
        env = front_door_environment(stage(normalizer={"timeout_s": timeout_s}))
        assert (env["REQUEST_TIMEOUT_S"], env["UPSTREAM_READ_TIMEOUT_S"]) == ("1", "1")
    env = front_door_environment(stage(normalizer={"timeout_s": 7}))
    assert (env["REQUEST_TIMEOUT_S"], env["UPSTREAM_READ_TIMEOUT_S"]) == ("2", "2")


def test_the_normalizers_own_settings_reach_the_environment_as_set():
    env = front_door_environment(stage(normalizer={"tenancy": "header", "tenant_header": "x-team",
                                                   "allow_direct_invoke": True, "block_bytes": 4096}))
    assert (env["TENANCY"], env["TENANT_HEADER"], env["ALLOW_DIRECT_INVOKE"], env["BLOCK_BYTES"]) == (
        "header", "x-team", "true", "4096")
    env = front_door_environment(stage(normalizer={"tenancy": "none", "allow_direct_invoke": False}))
    assert (env["TENANCY"], env["ALLOW_DIRECT_INVOKE"]) == ("none", "false")
    env = function_environment(endpoint_name="ep-1", component_name="ic-1", routing=stage().routing,
                               endpoint=stage(endpoint={"copies_min": 1, "copies_max": 3}).endpoint,
                               normalizer=stage().normalizer)
    assert (env["ENDPOINT_NAME"], env["INFERENCE_COMPONENT_NAME"], env["COPIES_MIN"], env["COPIES_MAX"]) == (
        "ep-1", "ic-1", "1", "3")


# The variables every stage sets (front_door_env.py); LIMITS only with a limit set.
BASE_VARIABLES = {
    "ENDPOINT_NAME", "INFERENCE_COMPONENT_NAME", "ROUTING_STRATEGY", "PREFIX_LENGTH", "BLOCK_BYTES", "TENANCY",
    "TENANT_HEADER", "ALLOW_DIRECT_INVOKE", "REQUEST_TIMEOUT_S", "UPSTREAM_READ_TIMEOUT_S", "REPLICATION_ENABLED",
    "REPLICATION_MAX_REPLICAS", "REPLICATION_TARGET_SHARE_FACTOR", "REPLICATION_HALF_LIFE_S",
    "REPLICATION_MIN_REQUESTS", "REPLICATION_STEERING", "COPIES_MIN", "COPIES_MAX",
}


def test_without_a_limit_there_is_no_limits_variable():
    assert set(front_door_environment(stage())) == BASE_VARIABLES  # [limits] with every limit unset
    normalizer = stage().normalizer
    env = function_environment(endpoint_name="e", component_name="c", routing=stage().routing,
                               endpoint=stage().endpoint, normalizer=normalizer)  # no limits at all
    assert set(env) == BASE_VARIABLES


def test_limits_reach_the_environment_with_a_short_lease_whatever_the_timeout():
    config = stage(normalizer={"timeout_s": 900},
                   limits={"requests_per_minute": 10, "tenants": {"team-*": {"concurrent_streams": 2}},
                           "default_max_tokens": 300})
    env = front_door_environment(config)
    assert set(env) == BASE_VARIABLES | {"LIMITS"}
    assert json.loads(env["LIMITS"]) == {
        "default": {"requests_per_minute": 10}, "tenants": [["team-*", {"concurrent_streams": 2}]],
        "on_store_error": "open", "store_timeout_ms": 50, "lease_s": 30, "default_max_tokens": 300,
    }


def test_a_prefixs_problem_names_only_the_characters_s3_does_not_take():
    # Upper case letters are safe key characters: only '*' is named.
    assert value_checks.s3_uri_problem("s3://my-bucket/Models*/") == "prefix 'Models*/' has '*'"


def test_a_default_output_charge_above_a_tokens_per_minute_is_refused_naming_both():
    from prefix_routing.stage.config import ConfigError

    with pytest.raises(ConfigError) as refused:
        stage(limits={"tokens_per_minute": 5000, "default_max_tokens": 2000,
                      "tenants": {"batch-*": {"tokens_per_minute": 1500}, "big": {"tokens_per_minute": 9000},
                                  "edge": {"tokens_per_minute": 2000}}})
    [line] = refused.value.problems
    assert line.endswith("default_max_tokens: got 2,000, above tokens_per_minute ('batch-*' 1,500): a request "
                         "without max_tokens could never be admitted; allowed: at most 1,500")
    assert stage(limits={"tokens_per_minute": 2000, "default_max_tokens": 2000}).limits.default_max_tokens == 2000
    assert stage(limits={"default_max_tokens": 10**6}).limits.to_rules().default_max_tokens == 10**6  # no token limit


def test_the_canary_needs_an_engine_that_reports_cached_tokens():
    import copy

    from prefix_routing.stage.config import DEFAULT_STAGE_DATA, ConfigError, parse_stage

    data = copy.deepcopy(DEFAULT_STAGE_DATA)
    data["canary"] = {"enabled": True}
    assert parse_stage(data, source="t").canary.enabled  # vLLM: it reports them
    data["model"].update(framework="djl-lmi", image_repository="djl-inference", image_tag="0.33.0-lmi15.0.0-cu128")
    with pytest.raises(ConfigError, match="canary.enabled: model.framework 'djl-lmi' reports no cached tokens"):
        parse_stage(data, source="t")
