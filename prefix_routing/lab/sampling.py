"""Miniature simulation: a sample of the routing keys at rate R, on a fleet that keeps each copy's share.

Simulating a cache over a huge trace is the problem SHARDS (Waldspurger et al., FAST 2015) and
miniature simulations (ATC 2017) answer: keep every request of a sampled subset of keys, chosen by
a hash, and give the simulated cache R of its size; the hit rate of the miniature follows the full
one closely. Here the sampled unit is the routing key, as the front door hashes it: the
PrefixAwareId and the first PrefixLength bytes (in a trace, the id and the block the key ends in).
A key is in or out of the sample with all its requests, which land on the copy they would have
without sampling; a conversation's turns share their key, so its reuse stays whole. A setting keyed
on fewer bytes than the sampled key (a shorter PrefixLength in ``tune``) sees the blocks its keys
share at full weight in a cache scaled by R, so its hit rate reads somewhat high.

The miniature fleet keeps each copy's share of the keys and of the load:

- a fleet routed by a strategy that keeps a key on a copy (PREFIX_AWARE, KV_AWARE) shrinks with the
  sample: ⌈R × its instances⌉ (at least MIN_MINIATURE_INSTANCES), each copy whole, so a copy holds
  as many keys, in as much cache, at the same rate as in the whole fleet. Scaling each copy's cache
  instead would leave a few keys per copy in a small cache, where chance piles keys onto some copies
  until they evict (measured: −1.1 points at 10 % and −15 at 1 % on an hour of 1,000 requests per
  second on 2,331 copies);
- the strategies that spread a key over every copy keep the fleet's copies, and each copy gets the
  share s = R of the whole's traffic: its prefix cache holds s of its blocks
  (``FleetConfig.cache_scale``) and time runs 1/s times as fast (``speed``), so the sample's requests
  reach each copy at the whole trace's rate, and its queue and batch are what they would be (an
  engine's admission budget stays whole);
- durations reported (copy-hours, hot seconds, the hit rate over time) are scaled back; routing, the
  latency model and the caches' rules are the same code.

A sample whose error is not bounded is not run (:func:`plan`): the whole trace runs instead, and
the run says why. Three cases, measured (docs/lab.md): a fleet that routes keys to copies
(PREFIX_AWARE, KV_AWARE) too small for a miniature of at least MIN_MINIATURE_INSTANCES whole copies
(scaling a few copies' caches instead misses by −0.5 to −15 points, outside any band); a sample
that leaves the strategies that spread keys fewer than MIN_REQUESTS_PER_COPY requests a copy; and
a sample of fewer than MIN_EFFECTIVE_KEYS effective keys (a few keys carry most prompt tokens, and
whether they fall in the sample decides the figure). Every figure a sampled run reports comes with
its 95 % band (lab/sample_bands.py): over the miniature's copies where they are whole, else over
its keys.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace

from prefix_routing.lab import sample_bands
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.simulate import simulate
from prefix_routing.lab.trace_data import Trace
from prefix_routing.lab.trace_keys import trace_keys
from prefix_routing.rules import sampling as source
from prefix_routing.rules.errors import UserError

#: Buckets of the sample: a key is in a sample at rate R when its bucket is below R × SAMPLE_BUCKETS
#: (the front door's log uses the same buckets: rules/sampling.py).
SAMPLE_BUCKETS = source.SAMPLE_BUCKETS
#: ``auto``: the rate that keeps about this many requests (the lab's speed makes it seconds per run).
AUTO_TARGET_REQUESTS = 200_000
#: The lowest rate: below it too few keys remain to say anything.
MIN_RATE = source.MIN_RATE
#: A miniature of a fleet that routes keys to copies has at least this many whole instances: fewer
#: copies pile the sample's keys onto some of them (their band's t factor is 2.4 at 8).
MIN_MINIATURE_INSTANCES = 8
#: A sample keeps at least this many effective routing keys (Kish's: (Σ tokens)² / Σ tokens² over
#: the keys): below it a few keys decide the figure, whichever fall in the sample.
MIN_EFFECTIVE_KEYS = 100
#: A miniature of every copy (the strategies that spread a key over every copy) leaves each copy at
#: least this many requests: fewer, and the run is mostly the start of each copy's queue (at 15 a
#: copy, P90 TTFT 4 % off).
MIN_REQUESTS_PER_COPY = 50


@dataclass(frozen=True)
class SamplePlan:
    """What a run asked to sample at ``asked`` does: ``rate``, the rate it simulates at (1: the whole
    trace); ``reason``: why it does not sample as asked (None: it does); ``bounded``: whether its
    figures' error is bounded (False only for a window sampled at the source, which has no whole to
    fall back on)."""

    asked: float
    rate: float
    reason: str | None = None
    bounded: bool = True

    def note(self) -> str | None:
        """The line a command prints when the run does not sample as asked."""
        if self.reason is None:
            return None
        if self.rate >= 1.0:
            return f"--sample {self.asked:g}: ran the whole trace instead: {self.reason}"
        return f"sampled at {self.asked:g} at the source, and not bounded: {self.reason}"


def parse_rate(text: str | float | None) -> float | str | None:
    """``--sample``'s value: a rate from 0.0001 to 1 (``10%`` allowed), ``auto``, or None (off)."""
    if text is None or isinstance(text, float):
        return text
    value = text.strip().lower()
    if value == "auto":
        return "auto"
    try:
        rate = float(value[:-1]) / 100.0 if value.endswith("%") else float(value)
    except ValueError:
        rate = math.nan
    if not (MIN_RATE <= rate <= 1.0):
        raise UserError(f"--sample {text!r}: allowed: a rate from {MIN_RATE} to 1 (or a percentage such as 10%), or auto")
    return rate


def auto_rate(requests: int) -> float:
    """The rate ``auto`` picks: all of a trace up to AUTO_TARGET_REQUESTS, else a whole number of
    basis points that keeps about that many requests."""
    if requests <= AUTO_TARGET_REQUESTS:
        return 1.0
    return max(MIN_RATE, math.floor(SAMPLE_BUCKETS * AUTO_TARGET_REQUESTS / requests) / SAMPLE_BUCKETS)


def key_bucket(key: object) -> int:
    """A routing key's sample bucket, 0 to SAMPLE_BUCKETS − 1: a stable hash of it."""
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little") % SAMPLE_BUCKETS


def sample_keys(trace: Trace, key_blocks: int) -> list:
    """Each request's sampled unit: its routing key at ``key_blocks`` (with its PrefixAwareId)."""
    return trace_keys(trace, key_blocks)


def sample(trace: Trace, rate: float, key_blocks: int) -> Trace:
    """The requests of the keys in the sample at ``rate``, in order, on the trace's own clock."""
    if rate >= 1.0:
        return trace
    limit = rate * SAMPLE_BUCKETS
    buckets: dict = {}
    keep = []
    for i, key in enumerate(sample_keys(trace, key_blocks)):
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = key_bucket(key)
        if bucket < limit:
            keep.append(i)
    if not keep:
        raise UserError(f"{trace.source}: no request's routing key falls in a sample at rate {rate:g} "
                        f"({len(buckets):,} keys): raise --sample")

    def pick(column):
        return [column[i] for i in keep] if column else column

    return replace(
        trace,
        arrivals=pick(trace.arrivals), prompt_tokens=pick(trace.prompt_tokens),
        output_tokens=pick(trace.output_tokens), blocks=pick(trace.blocks), routing_ids=pick(trace.routing_ids),
        rekeyed=pick(trace.rekeyed), raw_keys=pick(trace.raw_keys), cached_tokens=pick(trace.cached_tokens),
        tenants=pick(trace.tenants), source=f"{trace.source} (sampled at {rate:g}: {len(keep):,} of {len(trace):,})",
        notes=list(trace.notes),
    )


def effective_keys(trace: Trace, key_blocks: int) -> float:
    """Kish's effective number of routing keys: (Σ tokens)² / Σ tokens² over the keys' prompt tokens
    (as many as there are keys when they weigh alike; about 31 for 15,000 keys of Zipf 1.1)."""
    per_key: dict = {}
    for key, p in zip(sample_keys(trace, key_blocks), trace.prompt_tokens):
        per_key[key] = per_key.get(key, 0.0) + p
    squares = math.fsum(p * p for p in per_key.values())
    return math.fsum(per_key.values()) ** 2 / squares if squares else 0.0


def keys_stay_on_copies(strategies) -> bool:
    """Whether a strategy simulated keeps a key on a copy (PREFIX_AWARE's home, KV_AWARE's cache), so
    that its miniature needs whole copies."""
    return any(s in (Strategy.PREFIX_AWARE, Strategy.KV_AWARE) for s in strategies)


def plan(trace: Trace, config, rate: float, strategies=None, *, presampled: bool = False) -> SamplePlan:
    """What a run asked to sample ``trace`` at ``rate`` with ``strategies`` (default the config's)
    does (:class:`SamplePlan`): sample, or run the whole trace where a sample's error is not
    bounded. ``presampled``: ``trace`` is the sample already (a log read at the source), judged as it
    is; it has no whole to run instead."""
    if rate >= 1.0:
        return SamplePlan(rate, 1.0)
    strategies = strategies or (config.strategy,)
    sampled_requests = len(trace) if presampled else rate * len(trace)
    instances = miniature_instances(config.instances, rate)
    reason = None
    if keys_stay_on_copies(strategies) and instances < MIN_MINIATURE_INSTANCES:
        reason = (f"{config.instances:,} instances at rate {rate:g} leave {instances}, fewer than the "
                  f"{MIN_MINIATURE_INSTANCES} a miniature needs to keep each copy's share of the keys and the load "
                  f"(at this rate it takes {math.floor((MIN_MINIATURE_INSTANCES - 1) / rate + 1e-9) + 1:,} instances "
                  "or more)")
    elif not all(keys_stay_on_copies((s,)) for s in strategies) and (
            sampled_requests < MIN_REQUESTS_PER_COPY * config.total_copies):
        reason = (f"the sample leaves about {sampled_requests / config.total_copies:,.0f} requests per copy to the "
                  f"strategies that spread a key over every copy, fewer than {MIN_REQUESTS_PER_COPY}: their queues "
                  "would not settle")
    else:
        found = effective_keys(trace, config.key_blocks)
        kept = found if presampled else found * rate
        if kept < MIN_EFFECTIVE_KEYS:
            reason = (f"the sample keeps about {kept:,.0f} effective routing keys, fewer than {MIN_EFFECTIVE_KEYS}: a few "
                      "keys carry most prompt tokens, and whether they fall in the sample decides the figures"
                      + ("" if presampled else f" ({found:,.0f} effective keys in the whole trace)"))
    if reason is None:
        return SamplePlan(rate, rate)
    return SamplePlan(rate, rate, reason, bounded=False) if presampled else SamplePlan(rate, 1.0, reason)


def check_sampling(config, *, users=None, limits=None, domains=None) -> None:
    """What a miniature cannot model yet, named: a clear error instead of a figure that misleads."""
    from prefix_routing.lab.slot_cache import VLLM_BLOCKS

    refused = [
        (config.autoscaling is not None, "copy autoscaling (its minutes would run R times as fast)"),
        (config.replicating, "hot-prefix replication (its shares count requests, which a sample thins)"),
        (config.cache_policy != VLLM_BLOCKS, f"cache policy {config.cache_policy} (slots hold whole sequences)"),
        (users is not None, "a closed loop (--users)"),
        (limits is not None and limits.enabled, "per-tenant limits (they count requests per minute)"),
        (domains is not None, "trust domains (--domains)"),
    ]
    for refuse, what in refused:
        if refuse:
            raise UserError(f"--sample: a sampled run does not model {what}; leave --sample out")


def miniature_instances(instances: int, rate: float) -> int:
    """⌈R × ``instances``⌉, the miniature's instances (a product a rounding above a whole number is that number)."""
    return math.ceil(rate * instances - 1e-9)


def miniature(config, rate: float, strategy=None):
    """(the fleet of a sample at ``rate``, each copy's share s of a whole copy's traffic; the caller
    runs the clock 1/s times as fast). ``strategy`` (default the config's):

    - one that keeps a key on a copy gets ⌈R × the instances⌉ whole instances, s = R × instances /
      that (about 1, each copy's cache × s), when that leaves at least MIN_MINIATURE_INSTANCES: each
      copy holds as many keys, in as much cache, at the same rate as a copy of the whole fleet;
    - one that spreads a key over every copy, or too few instances (a window sampled at the source,
      which has no whole to run instead), gets every instance, each copy's cache × R and s = R: each
      copy sees R of the keys, R of its requests over the trace, in R of its cache (SHARDS on each
      copy), at the whole trace's rate."""
    instances = miniature_instances(config.instances, rate)
    if not keys_stay_on_copies((strategy or config.strategy,)) or instances < MIN_MINIATURE_INSTANCES:
        return replace(config, cache_scale=rate), rate
    share = rate * config.instances / instances
    return replace(config, instances=instances, cache_scale=share), share


def grid_miniatures(config, rate: float, speed: float = 1.0):
    """(the PREFIX_AWARE grid's fleet, its clock's speed, (the baselines' fleet, its speed)) of a sample
    at ``rate`` replayed at ``speed``, as ``tune`` and the advisor run them: the grid on whole copies,
    the baselines, which spread a key over every copy, on theirs (:func:`miniature`)."""
    base, base_share = miniature(config, rate, Strategy.RANDOM)
    fleet, share = miniature(config, rate, Strategy.PREFIX_AWARE)
    return fleet, speed / share, (base, speed / base_share)


def shrink(trace: Trace, config, rate: float, strategy=None):
    """(the sampled trace, its miniature fleet, each miniature copy's share of a whole copy's
    traffic): :func:`sample` by ``config``'s routing keys and :func:`miniature`, which every sampled
    run does alike; run the result with the clock 1/share times as fast."""
    fleet, share = miniature(config, rate, strategy)
    return sample(trace, rate, config.key_blocks), fleet, share


def simulate_miniature(sample_trace: Trace, config, strategy, rate: float, whole_requests: int, *,
                       speed: float = 1.0, as_sent: bool = False):
    """One strategy on the miniature of a sample at ``rate`` (:func:`miniature`), its result in the
    whole trace's units with its bands (:func:`scale_back`)."""
    fleet, share = miniature(replace(config, strategy=strategy), rate)
    result = simulate(sample_trace, fleet, speed=speed / share, as_sent=as_sent)
    return scale_back(result, sample_trace, rate, whole_requests, config.key_blocks, share)


def scale_back(result, trace: Trace, rate: float, full_requests: int, key_blocks: int, share: float):
    """A miniature's result in the whole trace's units: durations (its clock ran 1/``share`` times as
    fast) scaled back, copy-hours for the whole fleet over the trace's span plus the last requests'
    tail (which runs at the engines' speed, not the clock's), and the sample's rate, size and bands
    in ``extra["sample"]``."""
    if rate >= 1.0:
        return result
    copies = result.config.total_copies
    span = result.copy_hours * 3600.0 / copies  # the miniature's: arrivals (× share) and the tail
    tail = max(0.0, span - trace.duration_s * share)
    result.copy_hours = copies * share / rate * (trace.duration_s + tail) / 3600.0
    result.hotspot_seconds /= share
    result.hit_over_time = [(t / share, h) for t, h in result.hit_over_time]
    found = result_bands(result, trace, rate, key_blocks)
    result.extra["sample"] = {"rate": rate, "requests": len(trace), "of_requests": full_requests,
                              "instances": result.config.instances, "hit_rate_band": found.pop("hit_rate"),
                              "bands": found}
    return result


def result_bands(result, trace: Trace, rate: float, key_blocks: int, keys: list | None = None) -> dict:
    """:func:`sample_bands.bands` of a miniature's result, the wider of two: over its copies (each a
    draw of what one copy of the whole fleet gets: which keys, so how loaded) and over its routing
    keys (which keys the sample kept, where a key spreads over every copy); a failed request counts
    at the timeout, unserved. ``keys``: the sample's keys at ``key_blocks``, when the caller has them."""
    timeout = result.config.timeout_s if result.config.timeout_s is not None else math.inf
    served = [t < timeout for t in result.ttft]
    by_copy, by_key = (sample_bands.bands(cached=result.cached_tokens, prompts=trace.prompt_tokens, ttft=result.ttft,
                                          served=served, clusters=clusters, fpc=1.0 - rate)
                       for clusters in (result.copy_of, keys or sample_keys(trace, key_blocks)))
    return sample_bands.wider(by_copy, by_key)
