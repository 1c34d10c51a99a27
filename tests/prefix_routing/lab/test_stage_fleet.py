"""A stage's endpoint as the lab models it: the values come from the stage files by hand."""

from __future__ import annotations

from prefix_routing.lab.stage_fleet import autoscaling_for_stage, replication_for_stage, stage_fleet_values
from prefix_routing.rules.replication import ReplicationSettings
from prefix_routing.stage.config import load_stage


def test_the_p5_stage_is_seven_p5_copies_routed_as_its_file_says():
    # config/llama70b-p5.toml: 2..7 ml.p5.48xlarge, one TP8 copy each, PrefixLength 4096, threshold 10,
    # target 6 concurrent requests per copy, copies 2..7.
    stage = load_stage("llama70b-p5")
    values = stage_fleet_values(stage)
    assert (values["instances"], values["copies"], values["preset"].name, values["prefix_length"],
            values["concurrency_threshold"]) == (7, 1, "p5.48xlarge-llama3.1-70b", 4096, 10)
    scaling = autoscaling_for_stage(stage)
    assert (scaling.target_per_copy, scaling.min_copies, scaling.max_copies) == (6.0, 2, 7)


def test_the_g6e_stage_rehomes_its_preset_and_packs_four_copies():
    # config/llama8b-g6e.toml: ml.g6e.12xlarge has 4 L40S, the 8B model takes one each.
    values = stage_fleet_values(load_stage("llama8b-g6e"))
    assert (values["instances"], values["copies"], values["prefix_length"], values["concurrency_threshold"]) == (4, 4, 8192, 16)
    assert values["preset"].instance.name == "ml.g6e.12xlarge" and values["preset"].replicas == 4


def test_replication_is_the_stages_section_field_by_field(tmp_path):
    assert replication_for_stage(load_stage()) == ReplicationSettings()  # off, the defaults
    text = (
        '[model]\nframework = "vllm"\nimage_repository = "vllm"\nimage_tag = "v1"\nmodel_id = "m/m-8B"\n'
        '[endpoint]\ninstance_type = "ml.g6e.xlarge"\ninstances_min = 2\ninstances_max = 3\ncopies_min = 2\n'
        'copies_max = 3\n[routing]\nstrategy = "PREFIX_AWARE"\n'
        "[normalizer.replication]\nenabled = true\nmax_replicas = 8\ntarget_share_factor = 0.5\nhalf_life_s = 30\n"
        "min_requests = 4\n"
    )
    (tmp_path / "hot.toml").write_text(text)
    assert replication_for_stage(load_stage("hot", config_dir=tmp_path)) == ReplicationSettings(
        enabled=True, max_replicas=8, target_share_factor=0.5, half_life_s=30.0, min_requests=4.0)
