"""The model of one SageMaker endpoint: routing, per-copy KV caches, prefill, decode and queueing.

Pure computation, no I/O and no clock of its own: every call takes ``now`` (seconds on any clock).
The lab drives it in simulated time (:mod:`prefix_routing.lab.simulate`), the emulator in real time. One model, two
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

With ``cache_policy="llamacpp-slots"`` each copy is a ``llama-server`` instead
(:mod:`prefix_routing.lab.slot_cache`): ``max_num_seqs`` slots (``-np``) sharing the capacity
(``-c``), each reusing the common prefix of the one sequence it holds, and the saved states of
``--cache-ram``. A slot is busy until its request's engine finish; KV_AWARE probes the longest
prefix that a slot or a saved state holds.

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

Determinism: everything random derives from ``FleetConfig.seed``."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from heapq import heappush
from itertools import takewhile as _takewhile
from typing import Hashable, NamedTuple, Sequence

from prefix_routing.lab.autoscaling import CopyPool
from prefix_routing.lab.copy_caches import CopyCaches, touch, whole_blocks_cached
from prefix_routing.lab.engine_model import EngineModel
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.fleet_stats import CopyCounters, CopyStats, instance_totals
from prefix_routing.lab.in_flight import InFlight
from prefix_routing.lab.latency import LatencyModel
from prefix_routing.lab.misses import ClientKey, MissLedger
from prefix_routing.lab.routing import KV_AWARE, Router, routing_key
from prefix_routing.lab.slot_cache import slot_caches
from prefix_routing.lab.steered_replicas import SteeredReplicas
from prefix_routing.rules.replication import HotPrefixes, replica_id

_REPLICA = "replica"  # a client-keyed replica's routing key: ClientKey((_REPLICA, j, key))


def replica_key(key: Hashable, j: int) -> Hashable:
    """The routing key of replica ``j`` > 0 of ``key``, as the router sees the front door's request:
    the same prefix under the ``PrefixAwareId`` ``<id>-r<j>`` (``r<j>`` without an id), so that the
    lab and the emulator hash a replica to the same copy."""
    if key.__class__ is ClientKey:
        return ClientKey((_REPLICA, j, key))
    if key.__class__ is tuple and len(key) == 2 and key[0].__class__ is str:  # (PrefixAwareId, prefix)
        return replica_id(key[0], j), key[1]
    return replica_id(None, j), key


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


class Placed(NamedTuple):
    """``Fleet._place``'s decision, a tuple that the simulator's loops index and ``submit`` unpacks."""

    copy: int  # the global index, instance × copies + copy
    cached_tokens: float
    first_token_s: float  # math.inf: timed out
    per_token_s: float
    finish_s: float
    spilled: bool
    start_s: float


_placed = tuple.__new__  # _placed(Placed, (...)): a Placed at the cost of a tuple (no keyword handling)


class Fleet:
    """One endpoint's state. Not thread-safe: callers serialize ``submit``/``advance``/``release``."""

    def __init__(self, config: FleetConfig, *, explain_misses: bool = True):
        self.config = config
        self.latency = LatencyModel.from_preset(config.preset)
        n = self.n = config.total_copies
        self._copies = config.copies
        self._rng = random.Random(config.seed)
        # RANDOM, LOR and PREFIX_AWARE (with its spill) route as the emulator on real engines does.
        self.router = Router(config.strategy, n, concurrency_threshold=config.concurrency_threshold,
                             copies_per_instance=config.copies, seed=config.seed, rng=self._rng)
        capacity = config.capacity_tokens
        self._slots = slot_caches(config, n, self.latency.max_num_seqs)
        self.caches = CopyCaches(n, capacity, config.cache_scale, config.block_tokens, self._slots)
        self.in_flight = InFlight(n)
        self.counters = CopyCounters(n)
        self.spills = self.replicated = self.timeouts = self.no_capacity = 0  # replicated: to replicas j > 0
        # Uncached tokens by cause (lab/misses.py). None: not asked (tune's grid and the advisor read
        # no causes): a fifth of a request's time saved.
        self.misses = MissLedger.for_fleet(n, capacity, config.block_tokens) if explain_misses else None
        self.pool = CopyPool(config.autoscaling, n) if config.autoscaling else None
        self._next_start = math.inf  # when a starting copy begins to serve
        # Hot-prefix replication as the front door does it: replicas steered by load and collisions
        # (lab/steered_replicas.py), or used in turn (``replication.steering`` off).
        self._steered = config.replicating and config.replication.steering
        self._hot = (SteeredReplicas(config.replication) if self._steered else HotPrefixes(config.replication)) \
            if config.replicating else None
        self._timeout = math.inf if config.timeout_s is None else config.timeout_s
        self._ttft_overhead = config.ttft_overhead_s
        self._k = config.key_blocks
        if config.autoscaling:
            self.router.set_active(list(range(config.autoscaling.start_copies)))
        self.engines = EngineModel(n, self.latency, budget=capacity, overhead_s=self._ttft_overhead,
                                   timeout_s=self._timeout)
        # Flat copies for the hot path.
        self._strategy, self._choose = config.strategy, self.router.choose
        self._bt, self._eb = config.block_tokens, config.engine_block
        self._caches, self._infinite, self._cap_blocks = self.caches.caches, self.caches.infinite, self.caches.cap_blocks
        self._out, self._done = self.in_flight.out, self.in_flight.done
        c = self.counters
        self._requests, self._prompt, self._cached, self._spills_in, self._timeouts = \
            c.requests, c.prompt, c.cached, c.spills_in, c.timeouts

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
        return self.router.home(key)

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
        if self.pool is None:
            return self.in_flight.retire(now)
        retired = self.in_flight.retire_scaled(now, self.pool, self.caches.clear_copy, self._serving_from)
        if self._next_start <= now:  # a starting copy began to serve since the last look
            self._serving_from(now)
        return retired

    def _serving_from(self, t: float) -> None:
        self.router.set_active(self.pool.serving(t))
        self._next_start = self.pool.next_start(t)

    def release(self, placement: Placement, now: float | None = None) -> None:
        """A request ended early (client went away): drop it from the in-flight count now.

        Its engine slot stays reserved until its modelled finish (the engine notices late too).
        ``now``: when, for autoscaling's time-averaged concurrency.
        """
        g = placement.instance * self._copies + placement.copy
        if self.pool is not None and now is not None:
            self.pool.record(g, now, self._out[g])
        self.in_flight.release(g, placement.finish_s)

    def set_slowdown(self, instance: int, factor: float) -> None:
        """Make every copy of an instance ``factor`` times slower (fault injection)."""
        self.engines.slow_down(range(instance * self._copies, (instance + 1) * self._copies), factor)

    def steering_summary(self) -> dict:
        """With replica steering: its collisions (a replica's first answer found the prefix already
        cached) and redraws (fresh replica ids drawn for them), as the front door counts them."""
        return self._hot.summary() if self._steered else {}

    def outstanding(self) -> list[int]:
        return list(self._out)

    def copy_stats(self) -> list[CopyStats]:
        return self.counters.stats(self._copies, self._out, self.caches.blocks_held)

    def instance_totals(self) -> list[dict]:
        """Per instance: requests, prompt tokens, cached tokens, hit rate, in flight."""
        return instance_totals(self.copy_stats(), self.config.instances)

    # ----------------------------------------------------------------- the hot path

    def _place(self, key, blocks, prompt, output, now):
        """Route and schedule; returns the ``Placed`` decision.

        Written for speed (the lab calls it once per simulated request): configuration and
        latency constants are read from flat attributes and the cache work runs in C (``map``).
        """
        n = self.n
        out = self._out
        strategy = self._strategy
        spilled = False
        caches = self._caches
        pool = self.pool
        prefix, j = key, 0  # the request's own key and its replica (0: the key itself)
        if n == 1 and pool is None:
            g = 0
        elif strategy is KV_AWARE:
            g = self._kv_choose(blocks, prompt, now)
        else:
            hot = self._hot
            if hot is not None:  # the front door's PrefixAwareId <id>-r<j>: another key for the router
                j = hot.route(key, now, n) if self._steered else hot.assign(key, now, n)[0]
                if j:
                    key = replica_key(key, j)
                    self.replicated += 1
            g, spilled = self._choose(key, out)
            if g < 0:  # autoscaling: no copy serving; SageMaker fails it (NoCapacityInvocationFailures)
                pool.no_capacity += 1
                self.no_capacity += 1
                return _placed(Placed, (0, 0, math.inf, 0.0, now, False, now))
            if spilled:
                self.spills += 1
                self._spills_in[g] += 1
        slots = self._slots
        if slots is None:
            cache = caches[g]
            # The leading blocks it holds, as an engine's prefix cache matches (the lookups stop at
            # the first block missing; for chained ids the only ones held).
            m = len(list(_takewhile(cache.__contains__, blocks)))
            held_tokens = m * self._bt
            if held_tokens > prompt:
                held_tokens = prompt
            cached = whole_blocks_cached(held_tokens, prompt, self._eb)
        else:
            cached = held_tokens = slots.lookup(g, blocks, prompt, output, now)
        self._requests[g] += 1
        if pool is not None:
            pool.record(g, now, out[g])
        out[g] += 1
        scheduled = self.engines.schedule(g, prompt, cached, output, now)
        if scheduled is None:
            # SageMaker gives up on the container (60 s): the request fails, holding its place in
            # the in-flight count until then, and never reaches the engine or the cache.
            self.timeouts += 1
            self._timeouts[g] += 1
            finish = now + self._timeout
            heappush(self._done, (finish, g))
            if self._steered:
                self._hot.sent(prefix, j, finish, None, 0.0)
            return _placed(Placed, (g, 0, math.inf, 0.0, finish, spilled, now))
        start, first, tpot, finish = scheduled
        heappush(self._done, (finish, g))
        if self._steered:  # the answer tells the front door its cached tokens when it ends
            key_tokens = min(prompt, self._k * self._bt)
            self._hot.sent(prefix, j, finish, cached, key_tokens)
        self._prompt[g] += prompt
        self._cached[g] += cached
        # Why not cached: judged against the caches as the request found them (lab/misses.py).
        if self.misses is not None:
            self.misses.record(blocks, g, m if slots is None else int(cached // self._bt), prompt, held_tokens,
                               cached, self._bt, self.caches.held_elsewhere, key.__class__ is ClientKey)
        if slots is None:
            touch(cache, blocks, m, self._infinite, self._cap_blocks)
        else:
            slots.occupy(g, finish - self._ttft_overhead)  # the engine releases the slot at its finish
        return _placed(Placed, (g, cached, first, tpot, finish, spilled, start))

    def _kv_choose(self, blocks, prompt, now):
        """KV_AWARE: the lowest estimated wait + uncached prefill + load penalty (scan from a seeded copy)."""
        start = int(self._rng.random() * self.n)
        caches = self._caches if self._slots is None else self._slots.probes(blocks)
        return self.engines.kv_aware_copy(caches, self._out, blocks, prompt, now, start=start,
                                          block_tokens=self.config.block_tokens,
                                          load_weight_s=self.config.kv_load_weight_s)
