"""A stage's endpoint as the lab models it: the values come from the stage files by hand."""

from __future__ import annotations

import pytest

from prefix_routing.lab.stage_fleet import autoscaling_for_stage, preset_for, replication_for_stage, stage_fleet_values
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.replication import ReplicationSettings
from prefix_routing.stage.config import load_stage
from prefix_routing.stage.presets import PRESETS


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


# preset_for: the size read from the model's name, the GPU, TP and the instance type decide; with no
# preset for the exact instance type, one of the same GPU, model size and TP is re-homed to it.

@pytest.mark.parametrize("instance, model, tp, name", [
    ("ml.p5.48xlarge", "meta-llama/Llama-3.1-70B-Instruct", 8, "p5.48xlarge-llama3.1-70b"),
    ("ml.p5.48xlarge", "meta-llama/Llama-3.1-70B-Instruct", 4, "p5.48xlarge-llama3.1-70b-tp4"),
    ("ml.p5.48xlarge", "meta-llama/Llama-3.1-8B-Instruct", 1, "p5.48xlarge-llama3.1-8b"),
    ("ml.g6e.xlarge", "s3://weights/llama-8b/", 1, "g6e.xlarge-llama3.1-8b"),
    ("ml.g6e.48xlarge", "Llama 70 B", 8, "g6e.48xlarge-llama3.1-70b"),
    ("ml.p5e.48xlarge", "x/Model-70b", 8, "p5e.48xlarge-llama3.1-70b"),
])
def test_the_preset_of_the_exact_instance_type_is_taken_as_it_is(instance, model, tp, name):
    assert preset_for(instance, model, tp) == PRESETS[name]


@pytest.mark.parametrize("instance, model, tp, source, replicas", [
    ("ml.g6e.2xlarge", "m/Llama-3.1-8B", 1, "g6e.xlarge-llama3.1-8b", 1),
    ("ml.g6e.48xlarge", "m/Llama-3.1-8B", 1, "g6e.xlarge-llama3.1-8b", 8),  # 8 L40S, one copy each
    ("ml.g6e.48xlarge", "m/Llama-3.1-70B", 4, "g6e.12xlarge-llama3.1-70b", 2),  # 8 GPUs / TP4
])
def test_a_preset_of_the_same_gpu_is_rehomed_to_the_instance_type(instance, model, tp, source, replicas):
    preset = preset_for(instance, model, tp)
    suffix = source.split("-", 1)[1]
    assert preset.name == f"{instance.removeprefix('ml.')}-{suffix} (from {source})"
    assert preset.instance.name == instance and preset.replicas == replicas and type(preset.replicas) is int
    assert preset.model == PRESETS[source].model and preset.tp == tp


@pytest.mark.parametrize("instance, model, tp", [
    ("ml.p4d.24xlarge", "m/Llama-3.1-8B", 1),  # no A100-40GB preset of the 8B model
    ("ml.p5.48xlarge", "m/Llama-3.1-70B", 2),  # no TP2 preset
    ("ml.p5.48xlarge", "m/Llama-13B", 1),  # no 13B preset
    ("ml.p5.48xlarge", "m/Llama-70Bx", 8),  # no size word: "70Bx" is not "70B"
    ("ml.p5.48xlarge", "m/llama", 8),  # no size at all
    ("ml.p9.48xlarge", "m/Llama-3.1-70B", 8),  # no such instance type
    ("ml.p5.48xlarge", "m/Llama-3.1-170B", 8),  # 170B is not 70B
])
def test_no_preset_is_a_user_error_naming_what_was_asked(instance, model, tp):
    with pytest.raises(UserError) as error:
        preset_for(instance, model, tp, stage="s1")
    assert str(error.value) == (f"stage 's1': no lab preset for {instance} with {model} at TP {tp}; "
                                f"pass --preset (one of {', '.join(PRESETS)})")
    with pytest.raises(UserError, match=r"^no lab preset for "):
        preset_for(instance, model, tp)
