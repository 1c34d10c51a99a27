"""The latency model of one engine copy: prefill and decode step times from the model preset (BLIS-style coefficients).

A preset measured on a real engine (``stage/preset_file.py``, written by ``calibrate``) carries its
own coefficients; they are used as they are, with the measured constant ``prefill_constant_s``
added once per prefill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prefix_routing.stage.presets import Preset

# BLIS / inference-sim step coefficients (defaults.yaml, fitted to vLLM on H100).
STEP_WEIGHTS = 1.36
STEP_KV_READ = 1.95
STEP_ALLREDUCE = 0.75
STEP_PER_LAYER_S = 32e-6
STEP_PER_SEQUENCE_S = 4.4e-6
STEP_CONSTANT_S = 126e-6


@dataclass(frozen=True)
class LatencyModel:
    """Times of one engine copy, in seconds. See the module docstring for the formulas."""

    prefill_s_per_token: float  # 2·P / flops
    attention_s_per_token_pair: float  # 4·layers·hidden / flops
    step_base_s: float  # 1.36·weights + 0.75·allreduce + 32 µs·layers + 126 µs
    step_s_per_context_token: float  # 1.95 · KV bytes per token / TP / HBM
    step_s_per_sequence: float  # 4.4 µs + the kv_read term's "+ B"
    chunk_tokens: int  # max_batched_tokens
    max_num_seqs: int
    allreduce_s: float = 0.0  # per step, calibrated
    effective_flops: float = 0.0  # TP · peak · MFU, calibrated
    prefill_constant_s: float = 0.0  # once per prefill; measured presets only (0: the roofline's none)

    @classmethod
    def from_preset(cls, preset: Preset) -> "LatencyModel":
        measured = preset.latency_coefficients
        if measured is not None:
            # A real engine's fit: its batching cost per sequence was not measured, so it is 0.
            return cls(
                prefill_s_per_token=measured.prefill_s_per_token,
                attention_s_per_token_pair=measured.attention_s_per_token_pair,
                step_base_s=measured.step_base_s,
                step_s_per_context_token=measured.step_s_per_context_token,
                step_s_per_sequence=0.0,
                chunk_tokens=preset.max_batched_tokens,
                max_num_seqs=preset.max_num_seqs,
                prefill_constant_s=measured.prefill_constant_s,
            )
        model, gpu, tp = preset.model, preset.instance.gpu, preset.tp
        hbm = gpu.hbm_bytes_per_s
        # Calibrate TP·peak·MFU to the preset's prefill throughput at 4,096 uncached tokens.
        n = 4096
        flops_needed = 2 * model.params * n + 4 * model.layers * model.hidden * n * (n / 2)
        effective_flops = flops_needed * preset.prefill_tokens_per_s / n
        weights_s = (model.weight_bytes / tp) / hbm
        kv_s = (model.kv_bytes_per_token / tp) / hbm
        fixed = STEP_PER_LAYER_S * model.layers + STEP_CONSTANT_S
        # Calibrate the all-reduce term to the preset's decode step at batch 32, 2k context.
        batch, context = 32, 32 * 2048
        others = (
            STEP_WEIGHTS * weights_s
            + STEP_KV_READ * kv_s * (context + batch)
            + STEP_PER_SEQUENCE_S * batch
            + fixed
        )
        allreduce_s = max(0.0, (preset.decode_step_s - others) / STEP_ALLREDUCE) if tp > 1 else 0.0
        return cls(
            prefill_s_per_token=2 * model.params / effective_flops,
            attention_s_per_token_pair=4 * model.layers * model.hidden / effective_flops,
            step_base_s=STEP_WEIGHTS * weights_s + STEP_ALLREDUCE * allreduce_s + fixed,
            step_s_per_context_token=STEP_KV_READ * kv_s,
            step_s_per_sequence=STEP_PER_SEQUENCE_S + STEP_KV_READ * kv_s,
            chunk_tokens=preset.max_batched_tokens,
            max_num_seqs=preset.max_num_seqs,
            allreduce_s=allreduce_s,
            effective_flops=effective_flops,
        )

    def step_s(self, batch: int, context_tokens: float) -> float:
        """One engine step (one token for every running sequence)."""
        return (
            self.step_base_s
            + self.step_s_per_context_token * context_tokens
            + self.step_s_per_sequence * batch
        )

    def prefill_compute_s(self, new_tokens: float, cached_tokens: float) -> float:
        return new_tokens * (
            self.prefill_s_per_token + self.attention_s_per_token_pair * (cached_tokens + new_tokens / 2)
        )

    def prefill_s(self, new_tokens: float, cached_tokens: float, batch: int = 0, context_tokens: float = 0) -> float:
        """The constant, the compute time of the uncached tokens, and one step overhead per chunk."""
        chunks = max(1, math.ceil(new_tokens / self.chunk_tokens))
        return (self.prefill_constant_s + self.prefill_compute_s(new_tokens, cached_tokens)
                + chunks * self.step_s(batch, context_tokens))
