"""One endpoint's configuration for the fleet model, validated on creation."""

from __future__ import annotations

from dataclasses import dataclass

from prefix_routing.lab.autoscaling import AutoscalingSettings
from prefix_routing.lab.routing import (
    CONCURRENCY_THRESHOLD_RANGE,
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_BYTES_PER_TOKEN,
    PREFIX_LENGTH_RANGE,
    ROUTING_OVERHEAD_S,
    Strategy,
    key_blocks,
)
from prefix_routing.lab.slot_cache import CACHE_POLICIES, CACHE_RAM_MIB, SLOT_PROMPT_SIMILARITY, VLLM_BLOCKS
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.replication import ReplicationSettings
from prefix_routing.stage.presets import DEFAULT_PRESET, Preset, get_preset

REQUEST_OVERHEAD_S = 0.015  # fleet-presets.md: "~15 ms request overhead"
KV_LOAD_WEIGHT_S = 0.010
INVOCATION_TIMEOUT_S = 60.0  # aws-facts.md: the container must answer within 60 s


@dataclass(frozen=True)
class FleetConfig:
    """One endpoint. Validated on creation (UserError names the field and what is allowed)."""

    instances: int = 8
    copies: int | None = None  # per instance; None: the preset's replicas per instance
    strategy: Strategy = Strategy.PREFIX_AWARE
    prefix_length: int = 4096  # bytes (the AWS blog's illustrative setting)
    concurrency_threshold: int = 10  # the AWS blog's illustrative setting
    cache_tokens: float | None = None  # per copy; None: from the preset; math.inf: unbounded
    bytes_per_token: float = DEFAULT_BYTES_PER_TOKEN
    key_offset_bytes: int = 0  # JSON bytes before the prompt in the normalized body
    block_tokens: float = DEFAULT_BLOCK_TOKENS  # tokens per block id of the requests' `blocks`
    block_bytes: float | None = None  # bytes per block id, when ids hash bytes (normalizer log)
    # Tokens per KV block of the copies' vLLM (None: the preset's, 16 on GPUs): cached tokens are whole
    # blocks of it, never the prompt's last token.
    engine_block_tokens: int | None = None
    preset: Preset | str = DEFAULT_PRESET
    seed: int = 0
    request_overhead_s: float = REQUEST_OVERHEAD_S
    routing_overhead_s: float | None = None  # None: ROUTING_OVERHEAD_S for PREFIX/KV_AWARE, else 0
    kv_load_weight_s: float = KV_LOAD_WEIGHT_S
    timeout_s: float | None = INVOCATION_TIMEOUT_S  # None: never
    # The engines' cache (prefix_routing.lab.slot_cache): vLLM's block LRU, or llama.cpp's slots, one
    # per max_num_seqs (-np), sharing the capacity (-c), with --slot-prompt-similarity and --cache-ram.
    cache_policy: str = VLLM_BLOCKS
    slot_prompt_similarity: float = SLOT_PROMPT_SIMILARITY
    cache_ram_mib: float = CACHE_RAM_MIB  # per copy; 0: off, -1: no byte limit (llama.cpp's values)
    # Hot-prefix replication by the front door (rules/replication.py); None or enabled=False: off.
    replication: ReplicationSettings | None = None
    # Copy autoscaling (lab/autoscaling.py); None: the copies are fixed. instances × copies is the
    # most copies there can be.
    autoscaling: AutoscalingSettings | None = None
    # The share of each copy's KV cache its prefix cache holds: a simulation of a sample of the keys
    # at rate R (lab/sampling.py) gives each copy R of its cache; the engine's admission budget (the
    # tokens running requests may reserve) stays whole.
    cache_scale: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.preset, str):
            object.__setattr__(self, "preset", get_preset(self.preset))
        if isinstance(self.strategy, str) and not isinstance(self.strategy, Strategy):
            object.__setattr__(self, "strategy", Strategy.parse(self.strategy))
        if self.copies is None:
            object.__setattr__(self, "copies", self.preset.replicas)
        check_int("instances", self.instances, 1, 10_000)
        check_int("copies", self.copies, 1, 1024)
        gpus = self.preset.instance.gpus
        if self.copies * self.preset.tp > gpus:
            raise UserError(
                f"copies={self.copies}: {self.preset.name} needs {self.preset.tp} GPUs per copy and "
                f"{self.preset.instance.name} has {gpus}; at most {gpus // self.preset.tp} copies per instance"
            )
        check_int("prefix_length", self.prefix_length, *PREFIX_LENGTH_RANGE)
        check_int("concurrency_threshold", self.concurrency_threshold, *CONCURRENCY_THRESHOLD_RANGE)
        if not (isinstance(self.cache_scale, (int, float)) and 0 < self.cache_scale <= 1):
            raise UserError(f"cache_scale={self.cache_scale!r}: must be a number above 0, at most 1")
        if self.cache_tokens is not None and not (self.cache_tokens >= 0):
            raise UserError(f"cache_tokens={self.cache_tokens}: must be >= 0 or infinite")
        if not (self.bytes_per_token > 0):
            raise UserError(f"bytes_per_token={self.bytes_per_token}: must be > 0")
        if not (self.block_tokens > 0):
            raise UserError(f"block_tokens={self.block_tokens}: must be > 0")
        if self.engine_block_tokens is not None:
            check_int("engine_block_tokens", self.engine_block_tokens, 1, 4096)
        if self.key_offset_bytes < 0:
            raise UserError(f"key_offset_bytes={self.key_offset_bytes}: must be >= 0")
        if self.replication is not None and not isinstance(self.replication, ReplicationSettings):
            raise UserError(f"replication={self.replication!r}: must be ReplicationSettings or None")
        if self.autoscaling is not None:
            if not isinstance(self.autoscaling, AutoscalingSettings):
                raise UserError(f"autoscaling={self.autoscaling!r}: must be AutoscalingSettings or None")
            if self.autoscaling.max_copies > self.instances * self.copies:
                raise UserError(f"autoscaling max_copies={self.autoscaling.max_copies}: more than instances × copies "
                                f"= {self.instances * self.copies}")
            if not autoscaling_modelled(self.strategy, self.cache_policy):
                raise autoscaling_error([self.strategy], self.cache_policy)
        if self.cache_policy not in CACHE_POLICIES:
            raise UserError(f"cache_policy={self.cache_policy!r}: allowed: {', '.join(CACHE_POLICIES)}")
        if not _number(self.slot_prompt_similarity) or not 0 <= self.slot_prompt_similarity <= 1:
            raise UserError(f"slot_prompt_similarity={self.slot_prompt_similarity!r}: must be a number from 0 to 1")
        ram = self.cache_ram_mib
        if not _number(ram) or not (ram == -1 or 0 <= ram < float("inf")):
            raise UserError(f"cache_ram_mib={ram!r}: must be a number of MiB >= 0 (0: off) or -1 (no limit)")

    @property
    def replicating(self) -> bool:
        """The front door replicates hot prefixes (PREFIX_AWARE only: other strategies ignore ids)."""
        return bool(self.replication and self.replication.enabled and self.strategy is Strategy.PREFIX_AWARE)

    @property
    def total_copies(self) -> int:
        return self.instances * self.copies

    @property
    def capacity_tokens(self) -> float:
        return float(self.preset.kv_tokens) if self.cache_tokens is None else float(self.cache_tokens)

    @property
    def engine_block(self) -> int:
        """Tokens per KV block of the copies' engine (vLLM caches whole blocks)."""
        return self.engine_block_tokens or self.preset.engine_block_tokens

    @property
    def ttft_overhead_s(self) -> float:
        """What every first token waits beyond the engine: the request overhead, and the routing
        overhead of PREFIX_AWARE and KV_AWARE (``routing_overhead_s``, when given, for any strategy)."""
        routing = self.routing_overhead_s
        if routing is None:
            routing = ROUTING_OVERHEAD_S if self.strategy in (Strategy.PREFIX_AWARE, Strategy.KV_AWARE) else 0.0
        return self.request_overhead_s + routing

    @property
    def slot_tokens(self) -> float:
        """llamacpp-slots: one slot's context, the capacity shared by max_num_seqs slots (-c / -np)."""
        return self.capacity_tokens / self.preset.max_num_seqs

    @property
    def key_blocks(self) -> int:
        """Leading blocks that the PrefixLength-byte routing key covers."""
        return key_blocks(
            self.prefix_length, self.bytes_per_token, self.block_tokens, self.block_bytes, self.key_offset_bytes
        )


def autoscaling_modelled(strategy: Strategy, cache_policy: str) -> bool:
    """Copy autoscaling is modelled for RANDOM, LEAST_OUTSTANDING_REQUESTS and PREFIX_AWARE on the
    vLLM block cache (KV_AWARE's cost model and llama.cpp's slots do not follow copies that come and go)."""
    return strategy is not Strategy.KV_AWARE and cache_policy == VLLM_BLOCKS


def autoscaling_error(strategies, cache_policy: str) -> UserError:
    """What to change when autoscaling is on and models none of the run: the cache, or the strategies."""
    if cache_policy != VLLM_BLOCKS:
        what, fix = f"with {cache_policy}", f"--cache-policy {VLLM_BLOCKS}, or --autoscaling off"
    else:
        what = f"for {', '.join(Strategy.parse(s).value for s in strategies)}"
        fix = "--strategy PREFIX_AWARE (or RANDOM, LEAST_OUTSTANDING_REQUESTS), or --autoscaling off"
    return UserError(f"autoscaling: modelled for RANDOM, LEAST_OUTSTANDING_REQUESTS and PREFIX_AWARE with the "
                     f"{VLLM_BLOCKS} cache only, not {what}: give {fix}")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(name: str, value, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise UserError(f"{name}={value!r}: must be an integer from {low} to {high}")
