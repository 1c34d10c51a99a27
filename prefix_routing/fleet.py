"""The model of one SageMaker endpoint: routing, per-copy KV caches, prefill, decode and queueing.

Pure computation, no I/O and no clock of its own: every call takes ``now`` (seconds on any clock).
The lab drives it in simulated time (``lab.simulate``), the emulator in real time. One model, two
clocks:

    fleet = Fleet(FleetConfig(instances=8, strategy=Strategy.PREFIX_AWARE, prefix_length=4096))
    fleet.advance(now)                         # retire the requests finished by `now`
    p = fleet.submit(Request(prompt_tokens=9000, output_tokens=200, blocks=ids), now)
    p.instance, p.copy, p.cached_tokens, p.ttft_s, p.first_token_s, p.per_token_s, p.finish_s

``submit`` decides everything about the request when it arrives: the copy it runs on, how much of its
prompt that copy has cached, when it is admitted to the engine, when its first token appears and when
its last token does. That is possible because each copy serves its queue first come, first served
and the model does not let later arrivals change earlier requests (see "Simplifications" below). The
emulator streams tokens at ``first_token_s + i × per_token_s``; the lab only records the figures.

The endpoint
------------
``instances`` × ``copies`` engine copies (inference-component copies), numbered ``g = instance ×
copies + copy``. Each copy is one vLLM-like engine with its own KV cache: an LRU cache of block ids.

Routing (``Strategy``), as the SageMaker API documents it (``../shared/reference/aws-facts.md``):

- ``RANDOM``: a copy drawn uniformly (seeded).
- ``LEAST_OUTSTANDING_REQUESTS``: the copy with the fewest requests in flight; ties broken by a
  scan from a random position (a fixed tie order would pile an idle fleet onto copy 0).
- ``PREFIX_AWARE``: the routing key is the first ``prefix_length`` bytes of the (normalized) body,
  plus the ``PrefixAwareId`` when the request has one (identical prompts of different ids route
  apart). Traces carry block ids, not bytes, so the key is mapped to blocks: the first
  ``key_offset_bytes`` bytes of the body are JSON before the prompt (``{"messages":[{"role":...``;
  0 by default, i.e. the prompt text starts the body), the rest covers prompt bytes at
  ``bytes_per_token`` bytes per token (default 4, the usual figure for English with Llama 3's
  tokenizer). A block of ``block_tokens`` tokens is ``block_tokens × bytes_per_token`` bytes (or
  ``block_bytes`` when the block ids hash bytes, as the normalizer's log does), so the key covers
  ``ceil((prefix_length − key_offset_bytes) / block_bytes)`` leading blocks, a block only partly
  covered counting whole. Block ids are chained (equal id = equal prefix up to that block), so the
  id of the last covered block identifies the key. Keys map to a "home" copy by a seeded 64-bit
  hash (Fibonacci hashing of integer ids, blake2b for strings), the same in every process.
  ConcurrencyThreshold: a request goes to its home copy unless that copy has ``>= threshold``
  requests in flight; then to the least-loaded other copy on the same instance below the threshold;
  then to the least-loaded copy on another instance below the threshold (scanned from the next
  instance on); if every copy is at the threshold, to the least-loaded copy of all. A request that
  does not go home is a spill.
- ``KV_AWARE``: the API routes "to an instance whose KV cache already holds the start of the
  prompt, weighed against load". Modelled as an idealised router that knows every copy's cache: it
  picks the copy with the lowest ``wait + prefill(uncached part) + kv_load_weight_s × in flight``,
  where ``wait`` is the time until the copy can start the prefill (its prefill backlog, or the first
  free engine slot) and ``prefill`` is the latency model's compute time for the tokens that copy does
  not hold. One request in flight weighs as much as ``kv_load_weight_s`` (default 10 ms ≈ 240
  tokens of 70B prefill on a p5): enough to spread new conversations like least-outstanding routing,
  far too little to send a long cached conversation away from its cache. Ties: random scan.
- Prefix routing only applies when two or more copies can serve; with one copy everything goes there.
- PREFIX_AWARE and KV_AWARE add ``routing_overhead_s`` (1.6 ms, the middle of the 1.3–1.9 ms AWS
  measured) to the time to first token.

The KV cache
------------
Capacity per copy in tokens: ``cache_tokens`` if given (``math.inf`` for unbounded), else the
preset's vLLM-sized capacity (``presets.Preset.kv_tokens``: TP × accelerator memory × 0.9 − weights −
2 GiB per GPU, ÷ KV bytes per token, which is 2 × layers × KV heads × head dim × dtype bytes). It
holds ``capacity // block_tokens`` blocks. A request's cached tokens are its leading blocks found in
the cache (``min(blocks × block_tokens, prompt)``); then all its blocks are touched, the last block
first, so that eviction (least recently used first) takes a prompt's tail before its head, as vLLM's
free-block queue does. With chained ids this keeps every cached chain contiguous from its first
block, so "leading blocks found" equals "blocks found" and is counted at C speed.

The latency model (``LatencyModel``, from ``../shared/reference/fleet-presets.md``)
-------------------------------------------------------------------------------
Per engine step with ``B`` running sequences of total context ``ΣL`` (BLIS / inference-sim
coefficients, fitted to vLLM on H100)::

    step    = 1.36·weights + 1.95·kv_read + 0.75·allreduce + 32 µs·layers + 4.4 µs·B + 126 µs
    weights = (2·P / TP) / HBM bandwidth,   kv_read = (KV bytes per token / TP)·(ΣL + B) / HBM
    prefill = [2·P·n_new + 4·layers·hidden·n_new·(n_cached + n_new/2)] / (TP · peak · MFU)

``TP · peak · MFU`` is calibrated so that a 4,096-token uncached prefill runs at the preset's prefill
throughput, and ``allreduce`` so that a step at B = 32, 2k context takes the preset's decode time
(clamped at 0 where the other terms already exceed it). A request's prefill takes the compute term
plus one step's overhead per chunk of ``max_batched_tokens`` uncached tokens. Its time to first token
is the wait for an engine slot and for the copy's prefill queue, plus its prefill, plus the request
overhead (15 ms) and the routing overhead. Every later token takes one decode step at the batch and
context the copy has when the request starts. An engine admits at most ``max_num_seqs`` requests
(vLLM's default) whose prompt + output tokens fit the KV capacity; the others wait first come, first
served.

Timeouts: SageMaker gives up on a container that has not answered within 60 s
(``timeout_s``). A request whose first token would come later fails: it stays in the in-flight count
for the 60 s, never reaches the engine or the cache (``Placement.timed_out``). An overloaded copy
therefore sheds load instead of queueing without bound.

Simplifications (documented in docs/lab.md):
- prefills on one copy run one after another (the prefill queue is the main queueing of a lightly
  loaded engine); decode runs alongside and does not slow them beyond the per-chunk step overhead;
- a request's decode speed is fixed when it starts: later arrivals do not slow it down;
- a prompt's blocks enter the cache when it is routed, not when its prefill ends;
- a request reserves prompt + output tokens while it runs (vLLM would preempt instead); running
  requests' blocks are not protected from eviction; a request that alone exceeds the capacity runs
  anyway.

Determinism: everything random derives from ``FleetConfig.seed``.
"""

from __future__ import annotations

import enum
import hashlib
import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import repeat as _repeat
from typing import Hashable, Sequence

from prefix_routing.errors import UserError
from prefix_routing.presets import DEFAULT_PRESET, Preset, get_preset

PREFIX_LENGTH_RANGE = (1024, 65536)  # PrefixAwareRoutingConfig.PrefixLength
CONCURRENCY_THRESHOLD_RANGE = (1, 1024)  # PrefixAwareRoutingConfig.ConcurrencyThreshold
DEFAULT_BYTES_PER_TOKEN = 4.0
DEFAULT_BLOCK_TOKENS = 512  # the Mooncake trace's block size
ROUTING_OVERHEAD_S = 0.0016  # AWS blog: prefix-aware routing added 1.3–1.9 ms
REQUEST_OVERHEAD_S = 0.015  # fleet-presets.md: "~15 ms request overhead"
KV_LOAD_WEIGHT_S = 0.010
INVOCATION_TIMEOUT_S = 60.0  # aws-facts.md: the container must answer within 60 s

# BLIS / inference-sim step coefficients (defaults.yaml, fitted to vLLM on H100).
STEP_WEIGHTS = 1.36
STEP_KV_READ = 1.95
STEP_ALLREDUCE = 0.75
STEP_PER_LAYER_S = 32e-6
STEP_PER_SEQUENCE_S = 4.4e-6
STEP_CONSTANT_S = 126e-6

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / golden ratio: Fibonacci hashing
_consume = deque(maxlen=0).extend  # runs an iterator to its end in C
_NONES = _repeat(None)  # endless; map() stops at the shorter iterable


class Strategy(str, enum.Enum):
    RANDOM = "RANDOM"
    LEAST_OUTSTANDING_REQUESTS = "LEAST_OUTSTANDING_REQUESTS"
    PREFIX_AWARE = "PREFIX_AWARE"
    KV_AWARE = "KV_AWARE"

    @classmethod
    def parse(cls, text: str) -> "Strategy":
        key = text.strip().upper().replace("-", "_")
        aliases = {"LOR": "LEAST_OUTSTANDING_REQUESTS", "PREFIX": "PREFIX_AWARE", "KV": "KV_AWARE"}
        key = aliases.get(key, key)
        try:
            return cls(key)
        except ValueError:
            raise UserError(
                f"unknown routing strategy {text!r}; allowed: {', '.join(s.value for s in cls)}"
            ) from None


_PREFIX_AWARE = Strategy.PREFIX_AWARE
_RANDOM = Strategy.RANDOM
_LEAST_OUTSTANDING = Strategy.LEAST_OUTSTANDING_REQUESTS


# --------------------------------------------------------------------------- latency model


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

    @classmethod
    def from_preset(cls, preset: Preset) -> "LatencyModel":
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
        """Compute time of the uncached tokens plus one step overhead per chunk."""
        chunks = max(1, math.ceil(new_tokens / self.chunk_tokens))
        return self.prefill_compute_s(new_tokens, cached_tokens) + chunks * self.step_s(batch, context_tokens)


# --------------------------------------------------------------------------- configuration


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
    preset: Preset | str = DEFAULT_PRESET
    seed: int = 0
    request_overhead_s: float = REQUEST_OVERHEAD_S
    routing_overhead_s: float | None = None  # None: ROUTING_OVERHEAD_S for PREFIX/KV_AWARE, else 0
    kv_load_weight_s: float = KV_LOAD_WEIGHT_S
    timeout_s: float | None = INVOCATION_TIMEOUT_S  # None: never

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
        if self.cache_tokens is not None and not (self.cache_tokens >= 0):
            raise UserError(f"cache_tokens={self.cache_tokens}: must be >= 0 or infinite")
        if not (self.bytes_per_token > 0):
            raise UserError(f"bytes_per_token={self.bytes_per_token}: must be > 0")
        if not (self.block_tokens > 0):
            raise UserError(f"block_tokens={self.block_tokens}: must be > 0")
        if self.key_offset_bytes < 0:
            raise UserError(f"key_offset_bytes={self.key_offset_bytes}: must be >= 0")

    @property
    def total_copies(self) -> int:
        return self.instances * self.copies

    @property
    def capacity_tokens(self) -> float:
        return float(self.preset.kv_tokens) if self.cache_tokens is None else float(self.cache_tokens)

    @property
    def key_blocks(self) -> int:
        """Leading blocks that the PrefixLength-byte routing key covers."""
        return key_blocks(
            self.prefix_length, self.bytes_per_token, self.block_tokens, self.block_bytes, self.key_offset_bytes
        )


def check_int(name: str, value, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise UserError(f"{name}={value!r}: must be an integer from {low} to {high}")


def key_blocks(
    prefix_length: int,
    bytes_per_token: float = DEFAULT_BYTES_PER_TOKEN,
    block_tokens: float = DEFAULT_BLOCK_TOKENS,
    block_bytes: float | None = None,
    key_offset_bytes: int = 0,
) -> int:
    """How many leading blocks a routing key of ``prefix_length`` body bytes covers (0: none)."""
    size = block_bytes if block_bytes else block_tokens * bytes_per_token
    prompt_bytes = prefix_length - key_offset_bytes
    return 0 if prompt_bytes <= 0 else math.ceil(prompt_bytes / size)


def routing_key(blocks: Sequence[Hashable], k: int, routing_id: str | None = None) -> Hashable:
    """The key of a request: the id of its k-th block (chained ids), or its last if shorter."""
    n = len(blocks)
    key = blocks[(k if k < n else n) - 1] if n and k else None
    return key if routing_id is None else (routing_id, key)


def stable_hash(value: Hashable) -> int:
    """A 64-bit hash that is the same in every process (``hash`` of str is salted per process)."""
    if value is None:
        return 0x5BD1E995
    if isinstance(value, int):
        return value & _MASK
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, (bytes, bytearray)):
        return int.from_bytes(hashlib.blake2b(value, digest_size=8).digest(), "little")
    if isinstance(value, tuple):
        x = 0x9E3779B97F4A7C15
        for item in value:
            x = mix64(x ^ stable_hash(item))
        return x
    return stable_hash(repr(value))


def mix64(x: int) -> int:
    """splitmix64's finalizer: a cheap, well-spread 64-bit mix."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


# --------------------------------------------------------------------------- requests, placements


@dataclass(frozen=True, slots=True)
class Request:
    prompt_tokens: int
    output_tokens: int
    blocks: Sequence[Hashable] = ()  # chained block ids of the prompt (or of the normalized body)
    routing_id: str | None = None  # PrefixAwareId
    key: Hashable | None = None  # the routing key if the caller has the body's bytes; else from blocks


@dataclass(frozen=True, slots=True)
class Placement:
    """What the fleet decided for one request. Times are absolute on the caller's clock."""

    instance: int
    copy: int
    prompt_tokens: int
    cached_tokens: int
    arrival_s: float
    start_s: float  # admitted to the engine (after waiting for a slot)
    first_token_s: float
    per_token_s: float  # time between later tokens
    finish_s: float  # last token; the request leaves the in-flight count then
    spilled: bool  # PREFIX_AWARE: not sent to its key's home copy
    timed_out: bool = False  # no first token within the invocation timeout: the call fails


    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def queued_s(self) -> float:
        return self.start_s - self.arrival_s

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class CopyStats:
    instance: int
    copy: int
    outstanding: int
    requests: int
    prompt_tokens: float
    cached_tokens: float
    cached_blocks: float  # blocks in the cache now (inf never)
    spills_in: int
    timeouts: int

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


# --------------------------------------------------------------------------- the fleet


class Fleet:
    """One endpoint's state. Not thread-safe: callers serialize ``submit``/``advance``/``release``."""

    def __init__(self, config: FleetConfig):
        self.config = config
        self.latency = LatencyModel.from_preset(config.preset)
        n = self.n = config.total_copies
        self._copies = config.copies
        self._rng = random.Random(config.seed)
        self._seed_mix = mix64(config.seed & _MASK)
        self._home_of: dict = {}
        capacity = config.capacity_tokens
        self._infinite = math.isinf(capacity)
        self._cap_blocks = 0 if self._infinite else int(capacity // config.block_tokens)
        self._budget = capacity  # KV tokens that running requests may reserve
        self._caches: list = [set() if self._infinite else OrderedDict() for _ in range(n)]
        self._out = [0] * n  # in flight (routing's view)
        self._slots: list[list] = [[] for _ in range(n)]  # engine: heap of (finish, reserved tokens)
        self._run_tokens = [0.0] * n
        self._last_start = [-math.inf] * n
        self._prefill_free = [-math.inf] * n
        self._slow = [1.0] * n
        self._done: list = []  # heap of (client finish, copy) for the in-flight counts
        self._early: dict = {}
        self._requests = [0] * n
        self._prompt = [0.0] * n
        self._cached = [0.0] * n
        self._spills_in = [0] * n
        self._timeouts = [0] * n
        self.spills = 0
        self.timeouts = 0
        self._timeout = math.inf if config.timeout_s is None else config.timeout_s
        routing = config.routing_overhead_s
        if routing is None:
            routing = ROUTING_OVERHEAD_S if config.strategy in (Strategy.PREFIX_AWARE, Strategy.KV_AWARE) else 0.0
        self._ttft_overhead = config.request_overhead_s + routing
        self._k = config.key_blocks
        # Flat copies for the hot path.
        self._strategy = config.strategy
        self._threshold = config.concurrency_threshold
        self._bt = config.block_tokens
        lat = self.latency
        self._engine = (
            lat.step_base_s,
            lat.step_s_per_context_token,
            lat.step_s_per_sequence,
            lat.chunk_tokens,
            lat.prefill_s_per_token,
            lat.attention_s_per_token_pair,
            lat.max_num_seqs,
            self._budget,
        )

    # ----------------------------------------------------------------- public API

    def key_for(self, request: Request) -> Hashable:
        """The PREFIX_AWARE routing key of a request (its own ``key`` if given)."""
        if request.key is not None:
            return request.key if request.routing_id is None else (request.routing_id, request.key)
        return routing_key(request.blocks, self._k, request.routing_id)

    def home(self, key: Hashable) -> int:
        """The copy (global index) a routing key maps to: a seeded 64-bit hash of it, mod copies.

        Integer keys (chained block ids) use Fibonacci hashing inline, others a memoized mix of
        their ``stable_hash``; both are the same in every process.
        """
        if type(key) is int:
            return ((((key ^ self._seed_mix) * _GOLDEN) & _MASK) >> 16) % self.n
        g = self._home_of.get(key)
        if g is None:
            g = self._home_of[key] = mix64(stable_hash(key) ^ self._seed_mix) % self.n
        return g

    def submit(self, request: Request, now: float) -> Placement:
        """Route and schedule one request arriving at ``now``. Call ``advance(now)`` first."""
        g, cached, first, tpot, finish, spilled, start = self._place(
            self.key_for(request), request.blocks, request.prompt_tokens, request.output_tokens, now
        )
        c = self._copies
        return Placement(
            g // c, g % c, request.prompt_tokens, int(cached), now, start, first, tpot, finish, spilled,
            first == math.inf,
        )

    def advance(self, now: float) -> int:
        """Retire the requests whose last token is out by ``now``; returns how many."""
        done, out, retired = self._done, self._out, 0
        while done and done[0][0] <= now:
            entry = heappop(done)
            if self._early and self._early.get(entry):
                self._early[entry] -= 1
                continue
            out[entry[1]] -= 1
            retired += 1
        return retired

    def release(self, placement: Placement) -> None:
        """A request ended early (client went away): drop it from the in-flight count now.

        Its engine slot stays reserved until its modelled finish (the engine notices late too).
        """
        g = placement.instance * self._copies + placement.copy
        entry = (placement.finish_s, g)
        self._out[g] -= 1
        self._early[entry] = self._early.get(entry, 0) + 1

    def set_slowdown(self, instance: int, factor: float) -> None:
        """Make every copy of an instance ``factor`` times slower (fault injection)."""
        if not factor > 0:
            raise UserError(f"slowdown factor {factor}: must be > 0")
        c = self._copies
        for g in range(instance * c, instance * c + c):
            self._slow[g] = float(factor)

    def outstanding(self) -> list[int]:
        return list(self._out)

    def copy_stats(self) -> list[CopyStats]:
        c = self._copies
        return [
            CopyStats(
                g // c,
                g % c,
                self._out[g],
                self._requests[g],
                self._prompt[g],
                self._cached[g],
                math.inf if self._infinite else len(self._caches[g]),
                self._spills_in[g],
                self._timeouts[g],
            )
            for g in range(self.n)
        ]

    def instance_totals(self) -> list[dict]:
        """Per instance: requests, prompt tokens, cached tokens, hit rate, in flight."""
        rows = []
        stats = self.copy_stats()
        for i in range(self.config.instances):
            mine = [s for s in stats if s.instance == i]
            prompt = sum(s.prompt_tokens for s in mine)
            cached = sum(s.cached_tokens for s in mine)
            rows.append(
                {
                    "instance": i,
                    "requests": sum(s.requests for s in mine),
                    "prompt_tokens": prompt,
                    "cached_tokens": cached,
                    "hit_rate": cached / prompt if prompt else 0.0,
                    "outstanding": sum(s.outstanding for s in mine),
                }
            )
        return rows

    def cached_prefix_blocks(self, g: int, blocks: Sequence[Hashable]) -> int:
        """Leading blocks of ``blocks`` that copy ``g`` holds (no side effects)."""
        contains = self._caches[g].__contains__
        m = 0
        for b in blocks:
            if not contains(b):
                break
            m += 1
        return m

    # ----------------------------------------------------------------- the hot path

    def _place(self, key, blocks, prompt, output, now):
        """Route and schedule; returns (copy, cached, first_token, per_token, finish, spilled, start).

        Written for speed (the lab calls it once per simulated request): configuration and
        latency constants are read from flat attributes and the cache work runs in C (``map``).
        """
        n = self.n
        out = self._out
        strategy = self._strategy
        spilled = False
        caches = self._caches
        if n == 1:
            g = 0
        elif strategy is _PREFIX_AWARE:
            if type(key) is int:
                g = ((((key ^ self._seed_mix) * _GOLDEN) & _MASK) >> 16) % n
            else:
                g = self._home_of.get(key)
                if g is None:
                    g = self.home(key)
            if out[g] >= self._threshold:
                home = g
                g = self._spill(home)
                if g != home:
                    spilled = True
                    self.spills += 1
                    self._spills_in[g] += 1
        elif strategy is _RANDOM:
            g = int(self._rng.random() * n)
        elif strategy is _LEAST_OUTSTANDING:
            start = int(self._rng.random() * n)
            g, best = start, out[start]
            for j in range(start + 1, start + n):
                j = j if j < n else j - n
                if out[j] < best:
                    g, best = j, out[j]
        else:
            g = self._kv_choose(blocks, prompt, now)
        cache = caches[g]
        m = sum(map(cache.__contains__, blocks))

        cached = m * self._bt
        if cached > prompt:
            cached = prompt
        new = prompt - cached

        # The engine: wait for a slot (at most max_num_seqs running, their tokens within the KV
        # budget), first come first served, then for the copy's prefill queue. Nothing is
        # committed until we know the request is served before the timeout.
        base, per_ctx, per_seq, chunk, a1, a2, limit, budget = self._engine
        slots = self._slots[g]
        run = self._run_tokens[g]
        start = self._last_start[g]
        if now > start:
            start = now
        while slots and slots[0][0] <= start:
            run -= heappop(slots)[1]
        need = prompt + output
        popped = None
        while slots and (len(slots) >= limit or run + need > budget):
            entry = heappop(slots)
            if popped is None:
                popped = []
            popped.append(entry)
            run -= entry[1]
            if entry[0] > start:
                start = entry[0]
            while slots and slots[0][0] <= start:
                entry = heappop(slots)
                popped.append(entry)
                run -= entry[1]
        batch = len(slots)
        slow = self._slow[g]
        free = self._prefill_free[g]
        begin = start if start > free else free
        chunks = -(-new // chunk) if new > 0 else 1
        end = begin + (
            new * (a1 + a2 * (cached + new * 0.5)) + chunks * (base + per_ctx * run + per_seq * batch)
        ) * slow
        overhead = self._ttft_overhead
        first = end + overhead
        self._requests[g] += 1
        out[g] += 1
        if first - now > self._timeout:
            # SageMaker gives up on the container (60 s): the request fails, holding its place in
            # the in-flight count until then, and never reaches the engine or the cache.
            if popped:  # the slots it would have waited for are still taken
                for entry in popped:
                    heappush(slots, entry)
            self.timeouts += 1
            self._timeouts[g] += 1
            finish = now + self._timeout
            heappush(self._done, (finish, g))
            return g, 0, math.inf, 0.0, finish, spilled, now

        self._prefill_free[g] = end
        run += need
        tpot = (base + per_ctx * run + per_seq * (batch + 1)) * slow
        engine_finish = end + (output - 1) * tpot if output > 1 else end
        heappush(slots, (engine_finish, need))
        self._run_tokens[g] = run
        self._last_start[g] = start
        finish = engine_finish + overhead
        heappush(self._done, (finish, g))
        self._prompt[g] += prompt
        self._cached[g] += cached

        # The cache: touch the request's blocks, tail first; evict the least recently used.
        if m < len(blocks):
            if self._infinite:
                cache.update(blocks)
            else:
                _consume(map(cache.__setitem__, reversed(blocks[m:]), _NONES))
        if m and not self._infinite:
            try:
                _consume(map(cache.move_to_end, reversed(blocks[:m])))
            except KeyError:  # ids that are not chained (or repeat): touch one by one
                for b in reversed(blocks[:m]):
                    if b in cache:
                        cache.move_to_end(b)
                    else:
                        cache[b] = None
        extra = len(cache) - self._cap_blocks
        if extra > 0 and not self._infinite:
            _consume(map(cache.popitem, _repeat(False, extra)))
        return g, cached, first, tpot, finish, spilled, start

    def _spill(self, home: int) -> int:
        """ConcurrencyThreshold: another copy on the home instance, then another instance."""
        out, thr, c, n = self._out, self.config.concurrency_threshold, self._copies, self.n
        base = home - home % c
        best, best_load = -1, thr
        for j in range(1, c):  # other copies on the same instance, in order from the home copy
            g = base + (home - base + j) % c
            if out[g] < best_load:
                best, best_load = g, out[g]
        if best >= 0:
            return best
        instances = n // c
        for i in range(1, instances):  # other instances, from the next one on
            b = ((base // c + i) % instances) * c
            for g in range(b, b + c):
                if out[g] < best_load:
                    best, best_load = g, out[g]
        if best >= 0:
            return best
        # Every copy is at the threshold: the least loaded of all (home on ties).
        best, best_load = home, out[home]
        for j in range(1, n):
            g = (home + j) % n
            if out[g] < best_load:
                best, best_load = g, out[g]
        return best

    def _kv_choose(self, blocks, prompt, now):
        """KV_AWARE: the lowest estimated wait + uncached prefill + load penalty."""
        n, out, lat, bt = self.n, self._out, self.latency, self.config.block_tokens
        weight = self.config.kv_load_weight_s
        limit = lat.max_num_seqs
        start = int(self._rng.random() * n)
        best_g, best_cost = start, math.inf
        for j in range(start, start + n):
            g = j if j < n else j - n
            m = sum(map(self._caches[g].__contains__, blocks))
            cached = m * bt
            if cached > prompt:
                cached = prompt
            new = prompt - cached
            ready = self._prefill_free[g]
            slots = self._slots[g]
            if len(slots) >= limit and slots[0][0] > ready:
                ready = slots[0][0]
            wait = ready - now if ready > now else 0.0
            cost = (
                wait
                + self._slow[g] * lat.prefill_compute_s(new, cached)
                + weight * out[g]
            )
            if cost < best_cost:
                best_g, best_cost = g, cost
        return best_g
