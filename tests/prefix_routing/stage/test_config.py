"""Configuration mistakes: each gives one clear line naming file, field, value and what is allowed."""

import copy

import pytest

from prefix_routing.stage.config import DEFAULT_STAGE_DATA, ConfigError, load_stage, parse_stage


def _with(path: str, value):
    data = copy.deepcopy(DEFAULT_STAGE_DATA)
    *parents, leaf = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    if value is _DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    "path, value, expected",
    [
        ("routing.prefix_lenght", 4096, "stage.toml: routing.prefix_lenght: unknown key (a typo?)"),
        ("routing.prefix_length", 512, "stage.toml: routing.prefix_length = 512: allowed: from 1024 to 65536"),
        ("routing.prefix_length", 70000, "stage.toml: routing.prefix_length = 70000: allowed: from 1024 to 65536"),
        ("routing.concurrency_threshold", 0, "stage.toml: routing.concurrency_threshold = 0: allowed: from 1 to 1024"),
        ("routing.concurrency_threshold", 2048, "routing.concurrency_threshold = 2048: allowed: from 1 to 1024"),
        ("metrics.publish_frequency_s", 15, "metrics.publish_frequency_s = 15: allowed: one of 10, 30, 60, 120, 180, 240, 300"),
        ("endpoint.instances_min", 4, "stage.toml: endpoint: instances_min (4) must be <= instances_max (3)"),
        ("endpoint.copies_min", 5, "endpoint: copies_min (5) must be <= copies_max (3)"),
        ("routing.prefix_length", "4096", "routing.prefix_length = '4096': allowed: an integer; from 1024 to 65536"),
        ("endpoint.instance_type", _DELETE, "stage.toml: endpoint.instance_type: required field is missing"),
        ("routing.concurrency_threshold", None, "routing: PREFIX_AWARE needs both prefix_length (1024-65536) and concurrency_threshold (1-1024)"),
        ("routing.strategy", "KV_AWARE", "routing.strategy = 'KV_AWARE': KV_AWARE is known to the SageMaker API, but "
         "CloudFormation's resource schema does not list it and cfn-lint rejects it (E3030; CDK's synth-time check "
         "only warns, W3030)"),
        ("routing.strategy", "ROUND_ROBIN", "routing.strategy = 'ROUND_ROBIN': allowed: one of RANDOM, LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE"),
        ("model.image_tag", "latest", "model.image_tag = 'latest': 'latest' changes under a running endpoint; allowed: a pinned tag"),
        ("alarms.emails", ["not-an-address"], "alarms.emails.0 = 'not-an-address': allowed: a list of strings; each matches"),
        ("model.model_s3_uri", "s3://bucket/x/", "model: set exactly one of model_id (Hugging Face id) or model_s3_uri"),
        ("model.accelerators_per_copy", 4, "model: tensor_parallel_degree (1) must equal accelerators_per_copy (4)"),
        ("endpoint.copies_max", 5, "endpoint.copies_max (5) exceeds what instances_max (3) x 1 copies per instance can hold"),
        ("scaling.target_concurrent_requests_per_copy", 20.0, "is above routing.concurrency_threshold (10)"),
        ("normalizer.log_retention_days", 10, "normalizer.log_retention_days = 10: allowed: one of `1`, `3`, `5`, `7`, `14`, `30`"),
    ],
)
def test_mistake_is_named_with_value_and_what_is_allowed(path, value, expected):
    with pytest.raises(ConfigError) as raised:
        parse_stage(_with(path, value), source="stage.toml")
    assert expected in str(raised.value)


def test_all_problems_are_reported_at_once():
    data = _with("routing.prefix_length", 10)
    data["metrics"] = {"publish_frequency_s": 7, "colour": "blue"}
    with pytest.raises(ConfigError) as raised:
        parse_stage(data, source="s.toml")
    assert len(raised.value.problems) == 3


def test_the_embedded_default_is_valid_and_lets_routing_matter():
    config = load_stage()
    assert config.routing.strategy == "PREFIX_AWARE"
    # two single-GPU instances with a copy each at rest: prefix routing has a choice without autoscaling
    assert config.endpoint.instances_min >= 2 and config.endpoint.copies_min >= 2
    assert config.instances_at_rest >= 2 and config.warnings == []


def test_the_default_stage_is_its_file_wherever_stage_files_are_read_from(tmp_path):
    import tomllib

    from prefix_routing.stage.config import DEFAULT_STAGE_FILE

    assert DEFAULT_STAGE_FILE.name == "default.toml" and DEFAULT_STAGE_FILE.parent.name == "config"
    assert DEFAULT_STAGE_DATA == tomllib.loads(DEFAULT_STAGE_FILE.read_text(encoding="utf-8"))
    # a folder of stage files without default.toml still has the default stage, and lists it once
    from_file = load_stage("default", config_dir=DEFAULT_STAGE_FILE.parent)
    assert load_stage("default", config_dir=tmp_path) == from_file == parse_stage(DEFAULT_STAGE_DATA, source="t")
    (tmp_path / "prod.toml").write_text(DEFAULT_STAGE_FILE.read_text().replace('"default"', '"prod"'))
    with pytest.raises(ConfigError, match=r"available stages: default, prod$"):
        load_stage("nope", config_dir=tmp_path)


def test_warning_when_one_copy_serves_at_rest():
    data = _with("endpoint.copies_min", 1)
    config = parse_stage(data, source="s.toml")
    warning, batch = config.warnings  # and a rolling update's one-copy batch is all of one copy
    assert "no effect at rest: endpoint.copies_min = 1" in warning and "set copies_min = 2" in warning
    assert batch.startswith("deployment.batch_size 1 (COPY_COUNT)")


def test_several_copies_on_one_instance_at_rest_is_uncertain():
    data = _with("endpoint.instance_type", "ml.g6e.12xlarge")  # 4 GPUs: 4 single-GPU copies per instance
    data["endpoint"].update(instances_min=1, copies_min=2)
    config = parse_stage(data, source="s.toml")
    assert config.copies_per_instance == 4 and config.instances_at_rest == 1
    (warning,) = config.warnings
    assert "2 copies fit on one instance" in warning and "uncertain" in warning and "instances_min = 2" in warning
    data["endpoint"]["instances_min"] = 2
    assert parse_stage(data, source="s.toml").warnings == []


def test_warning_when_only_one_copy_can_serve():
    data = _with("endpoint.copies_max", 1)
    data["endpoint"]["copies_min"] = 1
    config = parse_stage(data, source="s.toml")
    assert any("has no effect" in w for w in config.warnings)


def test_model_s3_uri_must_name_a_folder():
    data = _with("model.model_id", None)
    data["model"]["model_s3_uri"] = "s3://my-weights/llama/8b"
    with pytest.raises(ConfigError, match=r"model.model_s3_uri = .*'s3://my-weights/llama/8b' must end with '/'"):
        parse_stage(data, source="s.toml")
    data["model"]["model_s3_uri"] = "s3://my-weights/llama/8b/"
    assert parse_stage(data, source="s.toml").model.s3_prefix == "llama/8b/"


def test_instance_type_outside_the_lab_table_is_a_warning_not_an_error():
    # ml.g7e.2xlarge: CloudFormation accepts it, the lab's instance table does not know it
    config = parse_stage(_with("endpoint.instance_type", "ml.g7e.2xlarge"), source="s.toml")
    assert any("not in the known table" in w for w in config.warnings)


def test_stage_files(tmp_path):
    (tmp_path / "broken.toml").write_text("[routing\nstrategy = 1\n")
    with pytest.raises(ConfigError, match=r"broken.toml: not valid TOML"):
        load_stage("broken", config_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"stage 'nope': no file .*available stages: broken, default"):
        load_stage("nope", config_dir=tmp_path)


@pytest.mark.parametrize("stage", ["llama8b-g6e", "llama70b-p5"])
def test_example_stages_load(stage):
    config = load_stage(stage)
    assert config.name == stage
    assert config.endpoint.copies_max >= 2
    if stage == "llama8b-g6e":  # two copies at rest, both on one 4-GPU instance: said, not hidden
        (warning,) = config.warnings
        assert "copies fit on one instance" in warning
    else:
        assert not config.warnings


def _field_paths(model, prefix=""):
    for name, field in model.model_fields.items():
        if hasattr(field.annotation, "model_fields"):
            yield from _field_paths(field.annotation, f"{prefix}{name}.")
        else:
            yield prefix + name


def test_configuration_reference_lists_every_field():
    from pathlib import Path

    from prefix_routing.stage.config import StageConfig

    reference = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    missing = [path for path in _field_paths(StageConfig) if f"| `{path}` |" not in reference]
    assert not missing, f"docs/configuration.md lacks: {missing}; run .venv/bin/python tools/config_reference.py"


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("enabled", "yes", "normalizer.replication.enabled = 'yes': allowed: `true` or `false`"),
        ("enabled", 1, "normalizer.replication.enabled = 1: allowed: `true` or `false`"),
        ("max_replicas", 0, "normalizer.replication.max_replicas = 0: allowed: from 1 to 64"),
        ("max_replicas", 65, "normalizer.replication.max_replicas = 65: allowed: from 1 to 64"),
        ("max_replicas", 2.0, "normalizer.replication.max_replicas = 2.0: allowed: an integer; from 1 to 64"),
        ("max_replicas", "4", "normalizer.replication.max_replicas = '4': allowed: an integer; from 1 to 64"),
        ("target_share_factor", 0.005, "normalizer.replication.target_share_factor = 0.005: allowed: from 0.01 to 1000"),
        ("target_share_factor", 1001, "normalizer.replication.target_share_factor = 1001: allowed: from 0.01 to 1000"),
        ("target_share_factor", float("nan"), "normalizer.replication.target_share_factor = nan: allowed: from 0.01"),
        ("target_share_factor", "2", "normalizer.replication.target_share_factor = '2': allowed: a number; from 0.01 to 1000"),
        ("half_life_s", 0.5, "normalizer.replication.half_life_s = 0.5: allowed: from 1 to 86400"),
        ("half_life_s", 86401, "normalizer.replication.half_life_s = 86401: allowed: from 1 to 86400"),
        ("half_life_s", True, "normalizer.replication.half_life_s = True: allowed: a number"),
        ("min_requests", 0.5, "normalizer.replication.min_requests = 0.5: allowed: from 1 to 10000"),
        ("min_requests", "8", "normalizer.replication.min_requests = '8': allowed: a number"),
        ("half_lfe_s", 60, "normalizer.replication.half_lfe_s: unknown key (a typo?)"),
        ("capacity", 64, "normalizer.replication.capacity: unknown key (a typo?)"),  # not a stage setting
    ],
)
def test_replication_mistake_is_named_with_value_and_what_is_allowed(field, value, expected):
    with pytest.raises(ConfigError) as raised:
        parse_stage(_with(f"normalizer.replication.{field}", value), source="stage.toml")
    assert str(raised.value).startswith(f"stage.toml: {expected}")
    assert len(raised.value.problems) == 1


def test_replication_defaults_and_a_stage_file(tmp_path):
    replication = load_stage().normalizer.replication
    assert (replication.enabled, replication.max_replicas, replication.target_share_factor,
            replication.half_life_s, replication.min_requests, replication.steering) == (False, 32, 0.05, 300.0, 12.0, True)
    (tmp_path / "hot.toml").write_text(
        '[model]\nframework = "vllm"\nimage_repository = "vllm"\nimage_tag = "v1"\nmodel_id = "m/m"\n'
        '[endpoint]\ninstance_type = "ml.g6e.xlarge"\ninstances_min = 2\ninstances_max = 3\ncopies_min = 2\n'
        'copies_max = 3\n[routing]\nstrategy = "PREFIX_AWARE"\n'
        "[normalizer.replication]\nenabled = true\nmax_replicas = 8\ntarget_share_factor = 3\nhalf_life_s = 30\n"
    )
    stage = load_stage("hot", config_dir=tmp_path)
    assert stage.normalizer.replication.model_dump() == {"enabled": True, "max_replicas": 8,
                                                         "target_share_factor": 3.0, "half_life_s": 30.0,
                                                         "min_requests": 12.0, "steering": True}
    assert stage.warnings == []
    (tmp_path / "typo.toml").write_text((tmp_path / "hot.toml").read_text().replace("max_replicas = 8", "max_replicas = 99"))
    with pytest.raises(ConfigError, match=r"typo.toml: normalizer.replication.max_replicas = 99: allowed: from 1 to 64"):
        load_stage("typo", config_dir=tmp_path)


def test_replication_without_prefix_aware_routing_is_a_warning():
    data = _with("normalizer.replication.enabled", True)
    data["routing"] = {"strategy": "LEAST_OUTSTANDING_REQUESTS"}
    (warning,) = parse_stage(data, source="s.toml").warnings
    assert "normalizer.replication has no effect with routing.strategy LEAST_OUTSTANDING_REQUESTS" in warning


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("schedule_minutes", 2, "advisor.schedule_minutes = 2: allowed: from 5 to 1440"),
        ("notify_gain_points", 0, "advisor.notify_gain_points = 0: allowed: more than 0 to 100"),
        ("notify_ttft_gain", 1, "advisor.notify_ttft_gain = 1: allowed: more than 0, less than 1"),
        ("notify_after_runs", 0, "advisor.notify_after_runs = 0: allowed: from 1 to 1000"),
        ("enabled", "yes", "advisor.enabled = 'yes': allowed: `true` or `false`"),
        ("shedule_minutes", 60, "advisor.shedule_minutes: unknown key (a typo?)"),
    ],
)
def test_advisor_mistake_is_named_with_value_and_what_is_allowed(field, value, expected):
    with pytest.raises(ConfigError) as raised:
        parse_stage(_with(f"advisor.{field}", value), source="stage.toml")
    assert str(raised.value).startswith(f"stage.toml: {expected}")


def test_advisor_defaults():
    advisor = load_stage().advisor
    assert (advisor.enabled, advisor.schedule_minutes, advisor.notify_gain_points, advisor.notify_ttft_gain,
            advisor.notify_after_runs, advisor.max_events) == (True, 60, 5.0, 0.2, 3, 100_000)
