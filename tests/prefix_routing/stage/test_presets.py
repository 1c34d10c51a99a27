"""Presets: the numbers of fleet-presets.md, and the latency model against its measured anchors."""

import dataclasses
import math

import pytest

from prefix_routing.lab.latency import LatencyModel
from prefix_routing.rules.errors import UserError
from prefix_routing.stage.presets import (
    H100,
    H200,
    INSTANCES,
    LLAMA_31_8B,
    LLAMA_31_70B,
    PRESETS,
    Model,
    Preset,
    get_preset,
)


def test_kv_bytes_per_token_follow_the_formula():
    assert LLAMA_31_70B.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert LLAMA_31_8B.kv_bytes_per_token == 131_072
    assert LLAMA_31_70B.weight_bytes == pytest.approx(141.1e9)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_kv_capacity_matches_the_table(name):
    preset = PRESETS[name]
    assert preset.kv_tokens == pytest.approx(preset.table_kv_tokens, rel=0.02)
    assert preset.tp * preset.replicas <= preset.instance.gpus


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_latency_model_is_calibrated_to_the_table(name):
    preset = PRESETS[name]
    lat = LatencyModel.from_preset(preset)
    assert 4096 / lat.prefill_compute_s(4096, 0) == pytest.approx(preset.prefill_tokens_per_s, rel=1e-6)
    # The all-reduce term absorbs the difference; where it would be negative (TP1) it is 0 and the
    # BLIS terms alone land within 10 % of the table.
    assert lat.step_s(32, 32 * 2048) == pytest.approx(preset.decode_step_s, rel=0.10)
    assert lat.allreduce_s >= 0


def test_batching_defaults_follow_vllm():
    assert get_preset("p5.48xlarge-llama3.1-70b").max_num_seqs == 1024
    assert get_preset("p5.48xlarge-llama3.1-70b").max_batched_tokens == 8192
    assert get_preset("p4de.24xlarge-llama3.1-70b").max_num_seqs == 256  # A100 excluded by vLLM
    assert get_preset("g6e.xlarge-llama3.1-8b").max_batched_tokens == 2048


def test_prefill_anchors_for_70b_tp8_on_h100():
    """fleet-presets.md: 8,200 uncached ≈ 350 ms; 200 / 1,000 new after 8,000 cached ≈ 17 / 52 ms."""
    lat = LatencyModel.from_preset(get_preset("p5.48xlarge-llama3.1-70b"))
    assert lat.prefill_s(8200, 0) == pytest.approx(0.350, rel=0.10)
    assert lat.prefill_s(200, 8000) == pytest.approx(0.017, rel=0.30)
    assert lat.prefill_s(1000, 8000) == pytest.approx(0.052, rel=0.15)


def test_prefill_follows_its_formula_exactly():
    """The anchors above measure the model's fidelity (±10–30 %); this pins its arithmetic, by hand
    from the documented formula and the preset's inputs (Llama 3.1 70B, TP8, 24,000 prefill tokens/s
    at 4,096 uncached): F = [2·P·4096 + 4·L·H·4096·2048] × 24,000 / 4,096, compute = [2·P·n +
    4·L·H·n·(cached + n/2)] / F, plus one engine step per 8,192-token chunk."""
    P, L, H = 70.55e9, 80, 8192
    flops = (2 * P * 4096 + 4 * L * H * 4096 * 2048) * 24_000 / 4096
    lat = LatencyModel.from_preset(get_preset("p5.48xlarge-llama3.1-70b"))
    assert lat.effective_flops == pytest.approx(flops, rel=1e-12)
    for new, cached, chunks in ((200, 8000, 1), (8200, 0, 2), (20_000, 4000, 3)):
        compute = (2 * P * new + 4 * L * H * new * (cached + new / 2)) / flops
        assert lat.prefill_compute_s(new, cached) == pytest.approx(compute, rel=1e-12)
        assert lat.prefill_s(new, cached) == pytest.approx(compute + chunks * lat.step_s(0, 0), rel=1e-12)
        assert lat.prefill_s(new, cached, 4, 9000) == pytest.approx(compute + chunks * lat.step_s(4, 9000), rel=1e-12)
    # 4,096 uncached tokens' compute runs at exactly the preset's prefill throughput.
    assert 4096 / lat.prefill_compute_s(4096, 0) == pytest.approx(24_000, rel=1e-12)


def test_vllm_ci_decode_anchor_h200_8b():
    """vLLM CI: Llama 3.1 8B TP1 on H200, batch 8, 32 in / 128 out ≈ 6.5 ms per step."""
    preset = dataclasses.replace(get_preset("p5.48xlarge-llama3.1-8b"), instance=INSTANCES["ml.p5e.48xlarge"])
    lat = LatencyModel.from_preset(preset)
    assert lat.step_s(8, 8 * (32 + 64)) == pytest.approx(0.0065, rel=0.20)


def test_nim_ttft_anchor_70b_fp8_tp2():
    """NVIDIA NIM: Llama 3.3 70B FP8 on 2 × H100, 5,000 tokens in, concurrency 1: TTFT 407 ms."""
    fp8 = Model("Llama 3.3 70B FP8", 80, 8192, 64, 8, 128, 70.55e9, dtype_bytes=1)
    n = 4096
    flops = 2 * fp8.params * n + 4 * fp8.layers * fp8.hidden * n * n / 2
    tokens_per_s = n / (flops / (2 * 2 * H100.peak_flops * H100.prefill_mfu))  # FP8 doubles the peak
    preset = Preset("nim", INSTANCES["ml.p5.48xlarge"], fp8, 2, 4, tokens_per_s, (0, 0), 0.0, 0, "M")
    lat = LatencyModel.from_preset(preset)
    assert lat.prefill_s(5000, 0) + 0.015 == pytest.approx(0.407, rel=0.15)


def test_preset_lookup():
    assert get_preset("ML.P5.48xlarge-Llama3.1-70B") is PRESETS["p5.48xlarge-llama3.1-70b"]
    with pytest.raises(UserError, match="unknown preset 'p9'.*p5.48xlarge-llama3.1-70b"):
        get_preset("p9")


def test_every_preset_names_a_known_gpu():
    for preset in PRESETS.values():
        assert preset.instance.gpu.peak_flops > 0 and preset.instance.gpu.hbm_bytes_per_s > 0
        assert preset.confidence in {"L", "M", "L-M", "H"}
    assert H200.memory_bytes > H100.memory_bytes
    assert not math.isnan(LatencyModel.from_preset(PRESETS["g6e.12xlarge-llama3.1-70b"]).allreduce_s)
