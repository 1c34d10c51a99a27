"""Miniature simulation: a sample of the keys at rate R, on caches and a clock scaled by R.

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

- a large fleet routed by PREFIX_AWARE shrinks with the sample: R × its instances (when that is at
  least MIN_MINIATURE_INSTANCES), each copy whole, so a copy holds as many keys, in as much cache, at
  the same rate as in the whole fleet (strategies that spread a key over every copy, RANDOM and the
  others, need the whole fleet's copies and scale each copy instead). Scaling each copy's cache instead would leave a few keys per copy
  in a small cache, where chance piles keys onto some copies until they evict (measured: −1.1 points
  at 10 % and −15 at 1 % on an hour of 1,000 requests per second on 2,331 copies);
- a small fleet keeps its copies, and each copy gets the share s = R of the whole's traffic: its
  prefix cache holds s of its blocks (``FleetConfig.cache_scale``) and time runs 1/s times as fast
  (``speed``), so the sample's requests reach each copy at the whole trace's rate, and its queue and
  batch are what they would be (an engine's admission budget stays whole);
- durations reported (copy-hours, hot seconds, the hit rate over time) are scaled back; routing, the
  latency model and the caches' rules are the same code.

The error band (:func:`hit_rate_band`) is the sampling error of the hit rate as a ratio estimator
over the sampled keys (cluster sampling without replacement): it says how much another sample of
keys could move the figure, not the bias of scaling the caches (measured in docs/lab.md). Where
few keys carry most of the traffic (a short PrefixLength inside a shared system prompt, heavy skew), a
sample keeps or drops them whole and the band is wide: such a trace is not worth sampling.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import replace

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
#: A miniature fleet has at least this many instances; a smaller one keeps the whole fleet's and
#: scales each copy's cache and clock instead.
MIN_MINIATURE_INSTANCES = 8


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


def hit_rate_band(trace: Trace, cached: Sequence[float], served: Sequence[bool], rate: float, key_blocks: int) -> float:
    """Half the width of the 95 % band of the hit rate: the ratio estimator's sampling error over
    the sampled keys (each key a cluster; finite-population factor 1 − rate)."""
    if rate >= 1.0:
        return 0.0
    per_key: dict = {}
    for key, c, p, ok in zip(sample_keys(trace, key_blocks), cached, trace.prompt_tokens, served):
        if ok:
            got = per_key.get(key)
            per_key[key] = (c, p) if got is None else (got[0] + c, got[1] + p)
    n = len(per_key)
    total_c = math.fsum(c for c, _ in per_key.values())
    total_p = math.fsum(p for _, p in per_key.values())
    if n < 2 or not total_p:
        return 1.0  # one key: nothing to say about the others
    h = total_c / total_p
    spread = math.fsum((c - h * p) ** 2 for c, p in per_key.values())
    variance = (1.0 - rate) * n / (n - 1) * spread / total_p**2
    return 1.96 * math.sqrt(variance)


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


def miniature(config, rate: float, strategies=None):
    """(the fleet of a sample at ``rate``, each copy's share s of a whole copy's traffic): R × the
    instances when every strategy simulated is PREFIX_AWARE (``strategies``; default the config's)
    and that leaves at least MIN_MINIATURE_INSTANCES (s about 1), else the same instances with each
    copy's prefix cache scaled by s = R; the caller runs the clock 1/s times as fast."""
    from prefix_routing.lab.routing import Strategy

    keyed = all(s is Strategy.PREFIX_AWARE for s in (strategies or (config.strategy,)))
    instances = round(rate * config.instances)
    if not keyed or instances < MIN_MINIATURE_INSTANCES:
        return replace(config, cache_scale=rate), rate
    share = rate * config.instances / instances
    return replace(config, instances=instances, cache_scale=min(1.0, share)), share


def shrink(trace: Trace, config, rate: float, strategies=None):
    """(the sampled trace, its miniature fleet, each miniature copy's share of a whole copy's
    traffic): :func:`sample` by ``config``'s routing keys and :func:`miniature`, which every sampled
    run does alike; run the result with the clock 1/share times as fast."""
    fleet, share = miniature(config, rate, strategies)
    return sample(trace, rate, config.key_blocks), fleet, share


def scale_back(result, trace: Trace, rate: float, full_requests: int, key_blocks: int, share: float):
    """A miniature's result in the whole trace's units: durations (its clock ran 1/``share`` times as
    fast) scaled back, copy-hours for the whole fleet over the trace's span plus the last requests'
    tail (which runs at the engines' speed, not the clock's), and the sample's rate, size and
    hit-rate band in ``extra["sample"]``."""
    if rate >= 1.0:
        return result
    copies = result.config.total_copies
    span = result.copy_hours * 3600.0 / copies  # the miniature's: arrivals (× share) and the tail
    tail = max(0.0, span - trace.duration_s * share)
    result.copy_hours = copies * share / rate * (trace.duration_s + tail) / 3600.0
    result.hotspot_seconds /= share
    result.hit_over_time = [(t / share, h) for t, h in result.hit_over_time]
    result.extra["sample"] = {"rate": rate, "requests": len(trace), "of_requests": full_requests,
                              "instances": result.config.instances,
                              "hit_rate_band": result_band(result, trace, rate, key_blocks)}
    return result


def result_band(result, trace: Trace, rate: float, key_blocks: int) -> float:
    """:func:`hit_rate_band` of a miniature's result (a failed request counts at the timeout, unserved)."""
    timeout = result.config.timeout_s if result.config.timeout_s is not None else math.inf
    served = [t < timeout for t in result.ttft]
    return hit_rate_band(trace, result.cached_tokens, served, rate, key_blocks)
