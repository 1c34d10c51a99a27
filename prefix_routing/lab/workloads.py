"""Synthetic workloads: a reconstruction of AWS's long-context benchmark; short requests sharing a few system
prompts; one noisy tenant beside quiet ones."""

from __future__ import annotations

import bisect
import itertools
import math
import random
from dataclasses import dataclass

from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.traces import Trace
from prefix_routing.rules.errors import UserError


@dataclass(frozen=True)
class LongContextSpec:
    """AWS's long-context benchmark, reconstructed (fleet-presets.md, "Rebuilding ...").

    The blog published only relative results; these are the reconstruction's inferences: distinct
    8,000-token prefixes of equal popularity, several times what one p5 replica caches, a unique
    suffix of 1.5–1.8k tokens per request, 100–300 output tokens, light Poisson arrivals for an hour,
    7 × ml.p5.48xlarge with Llama 3.1 70B TP8, PrefixLength 4096 and ConcurrencyThreshold 10.

    Calibrated: the reconstruction suggests about 700 prefixes (≈ 4× the ≈175 prefixes one replica
    holds), but each request's unique suffix also takes cache space, so with 700 RANDOM keeps only
    ≈16 % of tokens in this model. 450 prefixes reproduce the blog's ≈25 % (docs/lab.md).
    """

    prefixes: int = 450
    prefix_tokens: int = 8000
    suffix_tokens: tuple[int, int] = (1500, 1800)
    output_tokens: tuple[int, int] = (100, 300)
    rate_rps: float = 3.0
    duration_s: float = 3600.0
    block_tokens: int = 250  # 8,000 = 32 whole blocks; 16 would match vLLM but cost 40× the memory
    instances: int = 7
    preset: str = "p5.48xlarge-llama3.1-70b"
    prefix_length: int = 4096
    concurrency_threshold: int = 10
    zipf: float = 0.0  # prefix popularity ∝ 1/rank^zipf (0: uniform, the blog's setting)
    load_step: tuple[float, float] | None = None  # (at_s, factor): the arrival rate × factor from at_s on

    @classmethod
    def at_rate(cls, rate_rps: float) -> "LongContextSpec":
        """The workload at ``rate_rps``, its prefixes and instances scaled with the rate, so that each
        copy's load and each prefix's rate stay the default's (the benchmarks' large hours)."""
        scale = rate_rps / cls.rate_rps
        return cls(rate_rps=rate_rps, prefixes=round(cls.prefixes * scale), instances=round(cls.instances * scale))

    def fleet_config(self, **overrides) -> FleetConfig:
        values = dict(
            instances=self.instances,
            preset=self.preset,
            prefix_length=self.prefix_length,
            concurrency_threshold=self.concurrency_threshold,
            block_tokens=self.block_tokens,
        )
        values.update(overrides)
        return FleetConfig(**values)


def long_context_workload(spec: LongContextSpec = LongContextSpec(), *, seed: int = 0) -> Trace:
    """Generate the long-context workload: Poisson arrivals, uniform (or Zipf) prefix choice, unique suffixes."""
    arrivals, prompts, outputs, blocks = [], [], [], []
    for t, prompt, output, ids in long_context_requests(spec, seed=seed):
        arrivals.append(t)
        prompts.append(prompt)
        outputs.append(output)
        blocks.append(ids)
    if not arrivals:
        raise UserError("the long-context workload is empty: raise rate_rps or duration_s")
    t0 = arrivals[0]
    return Trace(
        [a - t0 for a in arrivals], prompts, outputs, blocks, block_tokens=spec.block_tokens,
        source=f"long-context workload (seed {seed})", lines=len(arrivals), chained=True,  # a chain per prefix
    )


def long_context_requests(spec: LongContextSpec = LongContextSpec(), *, seed: int = 0):
    """The long-context workload's requests one at a time, (arrival s, prompt tokens, output tokens,
    block ids): what :func:`long_context_workload` collects, for a caller that cannot hold millions."""
    rng = random.Random(seed)
    if not (isinstance(spec.zipf, (int, float)) and 0 <= spec.zipf <= 10):
        raise UserError(f"zipf={spec.zipf!r}: must be a number from 0 (uniform) to 10")
    # Zipf: prefix p (rank p + 1) is drawn with weight 1/(p + 1)^s, by bisecting the cumulative weights.
    cumulative = list(itertools.accumulate(1.0 / (p + 1) ** spec.zipf for p in range(spec.prefixes))) \
        if spec.zipf else None
    bt = spec.block_tokens
    prefix_blocks = math.ceil(spec.prefix_tokens / bt)
    if spec.prefix_tokens % bt:
        raise UserError(f"prefix_tokens {spec.prefix_tokens} must be a multiple of block_tokens {bt}")
    # Prefix p is blocks [p*prefix_blocks, (p+1)*prefix_blocks): chained ids, one chain per prefix.
    next_id = spec.prefixes * prefix_blocks
    t = 0.0
    step_at, step_factor = spec.load_step or (math.inf, 1.0)
    if not (step_factor > 0 and step_at >= 0):
        raise UserError(f"load_step={spec.load_step!r}: needs a time >= 0 and a factor > 0")
    while True:
        t += rng.expovariate(spec.rate_rps * (step_factor if t >= step_at else 1.0))
        if t > spec.duration_s:
            return
        if cumulative is None:
            p = rng.randrange(spec.prefixes)
        else:
            p = min(bisect.bisect_right(cumulative, rng.random() * cumulative[-1]), spec.prefixes - 1)
        suffix = rng.randint(*spec.suffix_tokens)
        suffix_blocks = math.ceil(suffix / bt)
        ids = list(range(p * prefix_blocks, (p + 1) * prefix_blocks))
        ids.extend(range(next_id, next_id + suffix_blocks))
        next_id += suffix_blocks
        yield t, spec.prefix_tokens + suffix, rng.randint(*spec.output_tokens), ids


@dataclass(frozen=True)
class NoisyTenantSpec:
    """One tenant floods the endpoint beside quiet ones: the case per-tenant limits are for.

    ``tenants`` tenants (``tenant-0001`` is the noisy one), each with its own system prompt (a shared
    prefix of ``system_tokens``) and its own PrefixAwareId, as the front door gives each tenant. The
    quiet tenants each send Poisson arrivals at ``quiet_rate_rps`` with a short unique part; the
    noisy tenant sends ``noisy_factor`` times as often, with long unique parts (documents pasted
    whole), for ``duration_s``. On the default fleet (2 × p5.48xlarge, Llama 3.1 70B TP8) the noisy
    tenant alone offers more uncached prefill than its home copy can do.
    """

    tenants: int = 8
    noisy_factor: float = 10.0
    quiet_rate_rps: float = 0.5
    system_tokens: int = 2000
    quiet_tokens: tuple[int, int] = (500, 1500)
    noisy_tokens: tuple[int, int] = (6000, 10000)
    output_tokens: tuple[int, int] = (100, 300)
    duration_s: float = 600.0
    block_tokens: int = 250
    instances: int = 2
    preset: str = "p5.48xlarge-llama3.1-70b"
    prefix_length: int = 4096
    concurrency_threshold: int = 10

    def fleet_config(self, **overrides) -> FleetConfig:
        values = dict(instances=self.instances, preset=self.preset, prefix_length=self.prefix_length,
                      concurrency_threshold=self.concurrency_threshold, block_tokens=self.block_tokens)
        values.update(overrides)
        return FleetConfig(**values)


NOISY_TENANT = "tenant-0001"


def noisy_tenant_workload(spec: NoisyTenantSpec = NoisyTenantSpec(), *, seed: int = 0) -> Trace:
    """Generate the noisy-tenant workload (deterministic for a seed)."""
    from prefix_routing.lab.tenants import MAX_TENANTS, tenant_name

    if not (isinstance(spec.tenants, int) and 2 <= spec.tenants <= MAX_TENANTS):
        raise UserError(f"tenants={spec.tenants!r}: the noisy-tenant workload needs 2 to {MAX_TENANTS} tenants")
    if not (spec.noisy_factor > 0 and spec.quiet_rate_rps > 0 and spec.duration_s > 0):
        raise UserError("noisy-tenant workload: noisy_factor, quiet_rate_rps and duration_s must be > 0")
    bt = spec.block_tokens
    if spec.system_tokens % bt:
        raise UserError(f"system_tokens {spec.system_tokens} must be a multiple of block_tokens {bt}")
    rng = random.Random(seed)
    system_blocks = spec.system_tokens // bt
    quiet = spec.tenants - 1
    total_rate = spec.quiet_rate_rps * (quiet + spec.noisy_factor)
    noisy_share = spec.noisy_factor / (quiet + spec.noisy_factor)
    next_id = spec.tenants * system_blocks  # tenant j's system prompt is blocks [j*S, (j+1)*S)
    arrivals, prompts, outputs, blocks, tenants = [], [], [], [], []
    t = 0.0
    while True:
        t += rng.expovariate(total_rate)
        if t > spec.duration_s:
            break
        j = 0 if rng.random() < noisy_share else 1 + rng.randrange(quiet)
        unique = rng.randint(*(spec.noisy_tokens if j == 0 else spec.quiet_tokens))
        unique_blocks = math.ceil(unique / bt)
        ids = list(range(j * system_blocks, (j + 1) * system_blocks))
        ids.extend(range(next_id, next_id + unique_blocks))
        next_id += unique_blocks
        arrivals.append(t)
        prompts.append(spec.system_tokens + unique)
        outputs.append(rng.randint(*spec.output_tokens))
        blocks.append(ids)
        tenants.append(tenant_name(j))
    if not arrivals:
        raise UserError("the noisy-tenant workload is empty: raise quiet_rate_rps or duration_s")
    t0 = arrivals[0]
    return Trace(
        [a - t0 for a in arrivals], prompts, outputs, blocks, block_tokens=bt, routing_ids=list(tenants),
        source=f"noisy-tenant workload (seed {seed}; {NOISY_TENANT} sends {spec.noisy_factor:g}× as often as each of "
               f"{quiet} quiet tenants)",
        lines=len(arrivals), tenants=tenants, chained=True,  # a chain per tenant's system prompt
    )


@dataclass(frozen=True)
class SharedPrefixSpec(LongContextSpec):
    """Short requests that share one of a few system prompts: the common case of chat and RAG
    front ends (AWS's short-context chats are of this kind; these numbers are ours, not AWS's).

    128 system prompts of 2,048 tokens (262,144 tokens in all: more than one 8B copy on an L40S
    caches), each request one of them (uniform) and a unique question of 100–500 tokens, 100–300
    output tokens, Poisson arrivals at 2 requests/s for 10 minutes (about 1,200 requests: a short,
    cheap benchmark that a small stage serves without queueing).
    Blocks of 512 tokens, Mooncake's and AIPerf's own, and a system prompt of whole blocks: a
    benchmark of this workload (``benchmark --workload shared-prefix``) shares exactly the tokens
    the lab shares.
    """

    prefixes: int = 128
    prefix_tokens: int = 2048
    suffix_tokens: tuple[int, int] = (100, 500)
    output_tokens: tuple[int, int] = (100, 300)
    rate_rps: float = 2.0
    duration_s: float = 600.0
    block_tokens: int = 512
    instances: int = 2


def shared_prefix_workload(spec: SharedPrefixSpec = SharedPrefixSpec(), *, seed: int = 0) -> Trace:
    """Generate the shared-prefix workload: the long-context generator with the shared-prefix numbers."""
    trace = long_context_workload(spec, seed=seed)
    trace.source = f"shared-prefix workload (seed {seed})"
    return trace


WORKLOADS = {"long-context": (LongContextSpec, long_context_workload),
             "noisy-tenant": (NoisyTenantSpec, noisy_tenant_workload),
             "shared-prefix": (SharedPrefixSpec, shared_prefix_workload)}
