"""The stage's placement, data cache, detailed observability and rolling updates: defaults, one clear
line per mistake (field, value, what is allowed), the alarms an update rolls back on, and the
warnings for legal settings that probably do not do what was meant.

Expected values come from docs/configuration.md and the SageMaker API (botocore's model): SPREAD or
BINPACK, MaxImbalance 0-100, a batch of 5-50 % of the copies, a bake of 0-3600 s, 600-28800 s in all.
"""

import copy

import pytest

from prefix_routing.stage.config import DEFAULT_STAGE_DATA, ConfigError, alarm_name, load_stage, parse_stage


def _stage(**sections):
    data = copy.deepcopy(DEFAULT_STAGE_DATA)
    for section, fields in sections.items():
        data.setdefault(section, {}).update(fields)
    return parse_stage(data, source="s.toml")


def _problem(**sections) -> str:
    with pytest.raises(ConfigError) as raised:
        _stage(**sections)
    (problem,) = raised.value.problems
    return problem


def test_the_defaults_spread_copies_cache_artifacts_and_roll_one_copy_at_a_time():
    config = load_stage()
    assert (config.endpoint.placement, config.endpoint.az_max_imbalance, config.endpoint.data_cache) == (
        "SPREAD", 1, True)
    deployment = config.deployment
    assert (deployment.rolling_update, deployment.batch_type, deployment.batch_size, deployment.wait_interval_s,
            deployment.timeout_s, deployment.auto_rollback) == (True, "COPY_COUNT", 1, 600, 28800, True)


@pytest.mark.parametrize("sections, expected", [
    ({"endpoint": {"placement": "RANDOM"}}, "s.toml: endpoint.placement = 'RANDOM': allowed: one of `SPREAD`, `BINPACK`"),
    ({"endpoint": {"placement": "spread"}}, "s.toml: endpoint.placement = 'spread': allowed: one of `SPREAD`, `BINPACK`"),
    ({"endpoint": {"az_max_imbalance": -1}}, "s.toml: endpoint.az_max_imbalance = -1: allowed: from 0 to 100"),
    ({"endpoint": {"az_max_imbalance": 101}}, "s.toml: endpoint.az_max_imbalance = 101: allowed: from 0 to 100"),
    ({"endpoint": {"data_cache": "yes"}}, "s.toml: endpoint.data_cache = 'yes': allowed: `true` or `false`"),
    ({"metrics": {"detailed_observability": 1}},
     "s.toml: metrics.detailed_observability = 1: allowed: `true` or `false`"),
    ({"deployment": {"batch_type": "ALL_AT_ONCE"}},
     "s.toml: deployment.batch_type = 'ALL_AT_ONCE': allowed: one of `COPY_COUNT`, `CAPACITY_PERCENT`"),
    ({"deployment": {"batch_size": 0}}, "s.toml: deployment.batch_size = 0: allowed: from 1 to 1000"),
    ({"deployment": {"batch_type": "CAPACITY_PERCENT", "batch_size": 4}},
     "s.toml: deployment: batch_size (4) with batch_type CAPACITY_PERCENT; allowed: 5 to 50"),
    ({"deployment": {"batch_type": "CAPACITY_PERCENT", "batch_size": 51}},
     "s.toml: deployment: batch_size (51) with batch_type CAPACITY_PERCENT; allowed: 5 to 50"),
    ({"deployment": {"wait_interval_s": 3601}}, "s.toml: deployment.wait_interval_s = 3601: allowed: from 0 to 3600"),
    ({"deployment": {"timeout_s": 599}}, "s.toml: deployment.timeout_s = 599: allowed: from 600 to 28800"),
    ({"deployment": {"timeout_s": 28801}}, "s.toml: deployment.timeout_s = 28801: allowed: from 600 to 28800"),
    ({"deployment": {"rolling": True}}, "s.toml: deployment.rolling: unknown key (a typo?)"),
])
def test_a_mistake_is_one_line_with_field_value_and_what_is_allowed(sections, expected):
    assert _problem(**sections).startswith(expected)


@pytest.mark.parametrize("percent", [5, 50])
def test_a_percent_batch_takes_5_to_50(percent):
    assert _stage(deployment={"batch_type": "CAPACITY_PERCENT", "batch_size": percent}).deployment.batch_size == percent


def test_a_bake_shorter_than_the_alarms_need_to_fire_is_refused_unless_nothing_rolls_back():
    problem = _problem(deployment={"wait_interval_s": 299})  # 5 evaluation periods: 300 s
    assert "deployment.wait_interval_s (299) is shorter than the 5 minutes (alarms.evaluation_periods)" in problem
    assert "allowed: at least 300, or deployment.auto_rollback = false" in problem
    assert _stage(deployment={"wait_interval_s": 300}).deployment.wait_interval_s == 300
    assert _stage(deployment={"wait_interval_s": 60}, alarms={"evaluation_periods": 1}).deployment.wait_interval_s == 60
    assert _stage(deployment={"wait_interval_s": 0, "auto_rollback": False}).deployment.wait_interval_s == 0
    assert _stage(deployment={"wait_interval_s": 0, "rolling_update": False}).deployment.wait_interval_s == 0


def test_an_update_rolls_back_on_the_components_error_rate_and_ttft_alarms():
    config = load_stage()
    assert config.rollback_alarm_names("x-ic") == ["x-ic-error-rate", "x-ic-ttft-p50"]
    assert alarm_name("x-ic", "engine-hit-rate") == "x-ic-engine-hit-rate"
    assert _stage(deployment={"auto_rollback": False}).rollback_alarm_names("x-ic") == []
    assert _stage(deployment={"rolling_update": False}).rollback_alarm_names("x-ic") == []


def test_detailed_observability_is_on_for_vllm_and_off_for_lmi_unless_the_stage_says():
    assert load_stage().detailed_observability is True and load_stage().engine_hit_rate_published is True
    lmi = load_stage("trust-domains")
    assert lmi.model.framework == "djl-lmi" and lmi.detailed_observability is False
    assert lmi.engine_hit_rate_published is False
    off = _stage(metrics={"detailed_observability": False})
    assert off.detailed_observability is False and off.engine_hit_rate_published is False
    data = copy.deepcopy(lmi.model_dump(mode="python"))
    data["metrics"]["detailed_observability"] = True
    on_lmi = parse_stage(data, source="s.toml")
    # On, but LMI's engine counters are not what the engine widget reads (the vLLM DLC's are).
    assert on_lmi.detailed_observability is True and on_lmi.engine_hit_rate_published is False


def test_binpack_with_prefix_aware_routing_warns_where_copies_can_share_an_instance():
    shared = {"instance_type": "ml.g6e.12xlarge", "copies_max": 8}  # 4 single-GPU copies per instance
    (warning,) = _stage(endpoint={**shared, "placement": "BINPACK"}).warnings
    assert warning.startswith("endpoint.placement BINPACK with routing.strategy PREFIX_AWARE: up to 4 copies")
    assert "SPREAD keeps copies on distinct instances" in warning
    assert _stage(endpoint={**shared, "placement": "SPREAD"}).warnings == []
    assert _stage(endpoint={"placement": "BINPACK"}).warnings == []  # one copy per instance: nothing to pack
    random = {"strategy": "RANDOM", "prefix_length": None, "concurrency_threshold": None}
    assert _stage(endpoint={**shared, "placement": "BINPACK"}, routing=random).warnings == []


def test_a_copy_batch_outside_5_to_50_percent_of_the_copies_a_component_may_have_warns():
    # The default component has 2 to 3 copies: 1 copy is 33-50 %.
    assert load_stage().warnings == []
    (warning,) = _stage(endpoint={"copies_min": 1}).warnings[1:]  # the first: one copy at rest
    assert warning == (
        "deployment.batch_size 1 (COPY_COUNT) is 5-50 % of 2 to 20 copies, but default-prefix-llm-ic may have 1 to 3: "
        "SageMaker documents batches of 5-50 % of the copy count, so an update at another count may be refused "
        "(CAPACITY_PERCENT follows the count)")
    (warning,) = _stage(endpoint={"instance_type": "ml.g6e.48xlarge", "copies_max": 21}).warnings
    assert "is 5-50 % of 2 to 20 copies, but default-prefix-llm-ic may have 2 to 21" in warning
    assert _stage(endpoint={"instance_type": "ml.g6e.48xlarge", "copies_max": 20}).warnings == []
    (warning,) = _stage(deployment={"batch_size": 2}).warnings
    assert "batch_size 2 (COPY_COUNT) is 5-50 % of 4 to 40 copies" in warning
    assert _stage(endpoint={"copies_min": 0, "instances_min": 0}, deployment={"batch_size": 1}).warnings[-1].endswith(
        "may have 1 to 3: SageMaker documents batches of 5-50 % of the copy count, so an update at another count may "
        "be refused (CAPACITY_PERCENT follows the count)")  # no copies: nothing to update; the count is 1 at least
    for quiet in ({"batch_type": "CAPACITY_PERCENT", "batch_size": 50}, {"rolling_update": False}):
        assert not any("batch_size" in w for w in _stage(endpoint={"copies_min": 1}, deployment=quiet).warnings)


def test_trust_domains_are_each_checked_against_their_own_copies():
    config = load_stage("trust-domains")  # acme: 1 to 4 copies, shared: 2 to 12
    batch = [w for w in config.warnings if w.startswith("deployment.batch_size")]
    assert len(batch) == 1 and "trust-domains-acme-ic may have 1 to 4" in batch[0]
