"""Fleet presets for the routing lab: GPUs, instances, models and the (instance × model) presets.

Data only, no computation beyond simple derived figures; the latency model that uses them is in
``fleet.py``. Every number comes from ``../shared/reference/fleet-presets.md`` (gathered
2026-11-30 from public sources), which names these sources:

- instance hardware: the EC2 instance-type pages (SageMaker ``ml.*`` types use the EC2 hardware of
  the same name); GPU peaks from NVIDIA's data sheets (dense bf16, no sparsity);
- model shapes: the models' ``config.json`` on Hugging Face (layers, hidden size, heads, KV heads);
- KV capacity: vLLM's sizing rule (``gpu_memory_utilization = 0.9`` of the memory the driver
  reports, minus weights, minus about 2 GiB of activations per GPU);
- prefill throughput and decode step times: central estimates of the BLIS / inference-sim roofline
  model (github.com/inference-sim/inference-sim, ``defaults.yaml``), checked against NVIDIA NIM
  benchmarks and vLLM's CI latency test (confidence L–M, see the table's last column);
- batching limits: vLLM's ``EngineArgs.get_batch_defaults`` for the OpenAI server (8,192 batched
  tokens and 1,024 sequences on GPUs with at least 70 GiB that are not A100; 2,048 and 256 otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

from prefix_routing.rules.errors import UserError

GiB = 1 << 30
MiB = 1 << 20

# vLLM sizes its KV cache with this share of the accelerator memory (gpu_memory_utilization).
GPU_MEMORY_UTILIZATION = 0.90
# Activations and CUDA graphs, per GPU (fleet-presets.md: "~2 GiB per GPU of activations").
ACTIVATION_BYTES_PER_GPU = 2 * GiB


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: int  # memory the driver reports (nvidia-smi), to which vLLM applies its 0.9
    peak_flops: float  # dense bf16 FLOP/s (NVIDIA data sheets, via fleet-presets.md)
    hbm_bytes_per_s: float  # memory bandwidth
    prefill_mfu: float  # model-FLOPs utilization of prefill (BLIS roofline calibration)

    @property
    def large_memory(self) -> bool:
        """vLLM's test for its larger batching defaults: >= 70 GiB and not an A100."""
        return self.memory_bytes >= 70 * GiB and "A100" not in self.name


# Memory as nvidia-smi reports it: with these, vLLM's rule reproduces the "KV tokens per replica"
# column of fleet-presets.md within 2 % (the marketing figures 48 GB / 80 GB / 141 GB do not).
L40S = Gpu("L40S", 46_068 * MiB, 362e12, 0.86e12, 0.32)
A100_40 = Gpu("A100-SXM4-40GB", 40_960 * MiB, 312e12, 1.555e12, 0.38)
A100_80 = Gpu("A100-SXM4-80GB", 81_920 * MiB, 312e12, 2.04e12, 0.38)
H100 = Gpu("H100-SXM5-80GB", 81_559 * MiB, 989e12, 3.35e12, 0.45)
H200 = Gpu("H200-SXM5-141GB", 143_771 * MiB, 989e12, 4.8e12, 0.45)
GPUS = {gpu.name: gpu for gpu in (L40S, A100_40, A100_80, H100, H200)}
# Note: fleet-presets.md gives A100 figures for the 80 GB part (312 TFLOP/s, 2.04 TB/s); the 40 GB
# part's 1.555 TB/s is NVIDIA's A100 data sheet figure. ml.g5 (A10G) is in the instance table but
# has no compute figures there, so it has no preset.


@dataclass(frozen=True)
class Instance:
    name: str  # SageMaker instance type
    gpu: Gpu
    gpus: int
    host_memory_gib: int
    vcpus: int


INSTANCES = {
    i.name: i
    for i in (
        Instance("ml.g6e.xlarge", L40S, 1, 32, 4),
        Instance("ml.g6e.2xlarge", L40S, 1, 64, 8),
        Instance("ml.g6e.12xlarge", L40S, 4, 384, 48),
        Instance("ml.g6e.48xlarge", L40S, 8, 1536, 192),
        Instance("ml.p4d.24xlarge", A100_40, 8, 1152, 96),
        Instance("ml.p4de.24xlarge", A100_80, 8, 1152, 96),
        Instance("ml.p5.48xlarge", H100, 8, 2048, 192),
        Instance("ml.p5e.48xlarge", H200, 8, 2048, 192),
    )
}


@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    params: float
    dtype_bytes: int = 2  # bf16

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) × layers × KV heads × head dim × bytes per element."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes


# Shapes from the models' config.json (via fleet-presets.md, confidence H).
LLAMA_31_8B = Model("Llama 3.1 8B", 32, 4096, 32, 8, 128, 8.03e9)
LLAMA_31_70B = Model("Llama 3.1 70B", 80, 8192, 64, 8, 128, 70.55e9)
QWEN3_32B = Model("Qwen3-32B", 64, 5120, 64, 8, 128, 32.76e9)
MODELS = {m.name: m for m in (LLAMA_31_8B, LLAMA_31_70B, QWEN3_32B)}


@dataclass(frozen=True)
class LatencyCoefficients:
    """Measured latency figures of one engine copy, in seconds (``stage/preset_file.py`` reads them).

    A prompt of ``n`` new tokens after ``k`` cached ones takes
    ``prefill_constant_s + prefill_s_per_token·n + attention_s_per_token_pair·n·(k + n/2)``; a decode
    step at ``t`` context tokens ``step_base_s + step_s_per_context_token·t``. They replace the
    roofline figures that ``LatencyModel.from_preset`` otherwise derives from the GPU and the model.
    """

    prefill_constant_s: float  # a
    prefill_s_per_token: float  # b
    attention_s_per_token_pair: float  # c
    step_base_s: float  # d
    step_s_per_context_token: float  # e


VLLM_GPU_BLOCK_TOKENS = 16


@dataclass(frozen=True)
class Preset:
    """One replica layout of a model on an instance type, with its calibrated speed figures."""

    name: str
    instance: Instance
    model: Model
    tp: int  # tensor-parallel degree: GPUs per copy
    replicas: int  # copies per instance (inference-component copies)
    prefill_tokens_per_s: float  # central estimate, 4,096-token uncached prompt
    prefill_range: tuple[float, float]  # low–high estimates
    decode_step_s: float  # engine step at batch 32, 2k context per sequence
    table_kv_tokens: int  # fleet-presets.md's "KV tokens per replica", to check kv_tokens against
    confidence: str  # H / M / L as in fleet-presets.md
    # Overrides of what is otherwise derived (None: derive): a preset measured on a real engine.
    latency_coefficients: LatencyCoefficients | None = None
    kv_tokens_override: int | None = None  # KV capacity of one copy in tokens
    max_num_seqs_override: int | None = None
    max_batched_tokens_override: int | None = None
    #: Tokens per KV block of the copy's engine: vLLM caches whole blocks only (16 on GPUs, its
    #: default, which SageMaker's vLLM and LMI containers keep; 128 on CPUs).
    engine_block_tokens: int = VLLM_GPU_BLOCK_TOKENS

    @property
    def kv_tokens(self) -> int:
        """KV-cache capacity of one replica in tokens, sized as vLLM does (unless overridden).

        (TP × GPU memory × 0.9 − weights − 2 GiB × TP) ÷ KV bytes per token.
        """
        if self.kv_tokens_override is not None:
            return self.kv_tokens_override
        gpu = self.instance.gpu
        free = (
            self.tp * gpu.memory_bytes * GPU_MEMORY_UTILIZATION
            - self.model.weight_bytes
            - self.tp * ACTIVATION_BYTES_PER_GPU
        )
        return max(0, int(free // self.model.kv_bytes_per_token))

    @property
    def max_num_seqs(self) -> int:
        """vLLM's default concurrent sequences per engine (OpenAI server context), unless overridden."""
        if self.max_num_seqs_override is not None:
            return self.max_num_seqs_override
        return 1024 if self.instance.gpu.large_memory else 256

    @property
    def max_batched_tokens(self) -> int:
        """vLLM's default tokens per engine step, i.e. the chunked-prefill chunk, unless overridden."""
        if self.max_batched_tokens_override is not None:
            return self.max_batched_tokens_override
        return 8192 if self.instance.gpu.large_memory else 2048


def _preset(name, instance, model, tp, replicas, prefill, low, high, decode_ms, kv, conf) -> Preset:
    return Preset(
        name, INSTANCES[instance], model, tp, replicas, prefill, (low, high), decode_ms / 1000.0, kv, conf
    )


# fleet-presets.md, "Presets (vLLM-like engine, bf16) — central estimates, L–M".
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        _preset("g6e.xlarge-llama3.1-8b", "ml.g6e.xlarge", LLAMA_31_8B, 1, 1, 9.3e3, 7.5e3, 15e3, 43, 193_000, "L-M"),
        _preset("g6e.12xlarge-llama3.1-70b", "ml.g6e.12xlarge", LLAMA_31_70B, 4, 1, 2.4e3, 2.1e3, 3.1e3, 79, 74_000, "L"),
        _preset("g6e.48xlarge-llama3.1-70b", "ml.g6e.48xlarge", LLAMA_31_70B, 8, 1, 3.2e3, 2.9e3, 3.8e3, 47, 578_000, "L"),
        _preset("p4d.24xlarge-llama3.1-70b", "ml.p4d.24xlarge", LLAMA_31_70B, 8, 1, 8.5e3, 6.5e3, 11e3, 24, 461_000, "M"),
        _preset("p4de.24xlarge-llama3.1-70b", "ml.p4de.24xlarge", LLAMA_31_70B, 8, 1, 8.6e3, 6.6e3, 11e3, 19, 1_400_000, "M"),
        _preset("p5.48xlarge-llama3.1-8b", "ml.p5.48xlarge", LLAMA_31_8B, 1, 8, 29e3, 24e3, 38e3, 12, 448_000, "M"),
        _preset("p5.48xlarge-llama3.1-70b-tp4", "ml.p5.48xlarge", LLAMA_31_70B, 4, 2, 12e3, 10e3, 16e3, 22, 483_000, "M"),
        _preset("p5.48xlarge-llama3.1-70b", "ml.p5.48xlarge", LLAMA_31_70B, 8, 1, 24e3, 20e3, 31e3, 14, 1_400_000, "M"),
        _preset("p5e.48xlarge-llama3.1-70b", "ml.p5e.48xlarge", LLAMA_31_70B, 8, 1, 24e3, 20e3, 32e3, 11, 2_830_000, "M"),
    )
}

# The setup of AWS's published benchmark (7 × ml.p5.48xlarge, Llama 3.1 70B, TP8).
DEFAULT_PRESET = "p5.48xlarge-llama3.1-70b"


def get_preset(name: str) -> Preset:
    """Look a preset up by name; ``ml.`` prefix and case are ignored."""
    key = name.strip().lower()
    if key.startswith("ml."):
        key = key[3:]
    if key in PRESETS:
        return PRESETS[key]
    raise UserError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
