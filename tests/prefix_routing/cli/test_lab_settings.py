"""``simulate`` and ``tune`` say what they model (the stage's fleet, autoscaling, replication, the cache
policy), run the README's commands as written, and warn when an engine refuses the prompts."""

from __future__ import annotations

import json

import pytest

from prefix_routing.stage.preset_file import PresetFile, write_preset_file
from prefix_routing.stage.presets import LatencyCoefficients
from tests.prefix_routing.cli.test_lab_commands import run


@pytest.fixture
def tiny_engine(tmp_path):
    """What `calibrate` writes for the tiny engine: one slot of 8,192 tokens."""
    return write_preset_file(tmp_path / "engine.json", PresetFile(
        name="local-test", coefficients=LatencyCoefficients(0.0224, 0.000185, 1.59e-7, 0.00224, 1.6e-6), slots=1,
        context_per_slot=8192, kv_bytes_per_token=8192, model_name="tiny.gguf"))


def test_simulate_with_a_stage_runs_every_default_strategy_and_says_what_autoscaling_covers(capsys):
    # README: simulate --workload long-context --stage llama70b-p5 (KV_AWARE among the defaults).
    code, out, err = run(capsys, "simulate", "--workload", "long-context", "--stage", "llama70b-p5", "--limit", 1500,
                         "--no-plots")
    assert code == 0, err
    assert "stage: llama70b-p5: its endpoint" in out
    assert ("autoscaling: on (the stage's): copies 2 to 7, target 6 requests in flight per copy, new copies serve "
            "after 300 s; not modelled for KV_AWARE: 7 copies, fixed") in out
    assert "max/mean requests and tokens count the instances that held a provisioned copy" in out
    assert "replication: off" in out and "cache policy: vllm-blocks" in out
    assert "warning: KV_AWARE: autoscaling is not modelled for it: it ran on all 7 copies, fixed" in out
    code, out, err = run(capsys, "simulate", "--workload", "long-context", "--stage", "llama70b-p5", "--limit", 1500,
                         "--no-plots", "--json")
    doc = json.loads(out)
    assert doc["fleet"]["stage"] == "llama70b-p5" and doc["fleet"]["autoscaling"]["max_copies"] == 7
    scaled = {r["strategy"]: "autoscaling" in r for r in doc["results"]}
    assert scaled == {"RANDOM": True, "LEAST_OUTSTANDING_REQUESTS": True, "PREFIX_AWARE": True, "KV_AWARE": False}
    assert any("KV_AWARE: autoscaling is not modelled" in w for w in doc["warnings"])


def test_the_readmes_load_step_command_runs_as_written(capsys):
    code, out, err = run(capsys, "simulate", "--workload", "long-context", "--instances", 14, "--load-step", "1800:3",
                         "--autoscaling", "on", "--autoscaling-min", 2, "--limit", 3000, "--no-plots")
    assert code == 0, err
    assert "autoscaling: on (--autoscaling on): copies 2 to 14" in out and "copy-hours" in out
    assert "stage: none" in out


def test_explicit_autoscaling_with_nothing_it_models_names_the_fix(capsys, tiny_engine):
    code, _, err = run(capsys, "simulate", "--workload", "long-context", "--preset-file", tiny_engine,
                       "--cache-policy", "llamacpp-slots", "--autoscaling", "on", "--limit", 20, "--no-plots")
    assert code == 2 and "give --cache-policy vllm-blocks, or --autoscaling off" in err
    # The stage's own autoscaling, not asked for, gives way: fixed copies, said so.
    code, out, err = run(capsys, "simulate", "--workload", "long-context", "--preset-file", tiny_engine,
                         "--cache-policy", "llamacpp-slots", "--stage", "llama70b-p5", "--limit", 20, "--no-plots")
    assert code == 0, err
    assert "autoscaling: off (the stage's copy autoscaling is not modelled with llamacpp-slots" in out


def test_a_small_engine_says_the_workloads_prompts_exceed_its_context(capsys, tiny_engine, tmp_path):
    # The long-context prompts are 8,000 + 1,500..1,800 tokens: every one is beyond one slot of 8,192.
    code, out, err = run(capsys, "simulate", "--workload", "long-context", "--preset-file", tiny_engine,
                         "--cache-policy", "llamacpp-slots", "--limit", 50, "--no-plots", "--strategy", "RANDOM")
    assert code == 0, err
    assert "warning: 50 of 50 prompts (100%; the longest" in out
    assert "are at least the context of one slot of local-test (8,192 tokens): llama-server refuses them" in out
    assert "cache policy: llamacpp-slots (--cache-policy)" in out
    code, out, _ = run(capsys, "tune", "--workload", "long-context", "--preset-file", tiny_engine, "--cache-policy",
                       "llamacpp-slots", "--limit", 30, "--no-plots", "--prefix-length", 4096,
                       "--concurrency-threshold", 4, "--json")
    assert any(w.startswith("30 of 30 prompts (100%") for w in json.loads(out)["warnings"])
    roomy = write_preset_file(tmp_path / "roomy.json", PresetFile(
        name="roomy", coefficients=LatencyCoefficients(0.0224, 0.000185, 1.59e-7, 0.00224, 1.6e-6), slots=1,
        context_per_slot=16384, kv_bytes_per_token=8192))
    code, out, _ = run(capsys, "simulate", "--workload", "long-context", "--preset-file", roomy, "--cache-policy",
                       "llamacpp-slots", "--limit", 50, "--no-plots", "--strategy", "RANDOM")
    assert code == 0 and "llama-server refuses" not in out


def test_tune_says_what_it_models_too(capsys):
    code, out, err = run(capsys, "tune", "--workload", "long-context", "--stage", "llama70b-p5", "--limit", 600,
                         "--no-plots", "--prefix-length", 4096, "--concurrency-threshold", 8)
    assert code == 0, err
    assert "stage: llama70b-p5" in out and "autoscaling: on (the stage's): copies 2 to 7" in out
    assert "replication: off" in out and "cache policy: vllm-blocks" in out
    assert "the rule of thumb" in out and "brief" not in out
