"""The routing lab: analyze a trace, simulate an endpoint over it, tune PrefixLength and threshold.

- ``analyze(trace)``: how much prefix reuse there is and how routing keys of each PrefixLength
  would group the requests (no fleet involved).
- ``simulate(trace, config)``: drives ``fleet.Fleet`` over the trace in simulated time (arrivals
  from the trace, divided by ``speed``) and reports hit rate, TTFT percentiles, throughput and load
  per instance. ``simulate_many`` runs several strategies side by side.
- ``tune(trace, config, prefix_lengths, thresholds)``: the PREFIX_AWARE grid, the frontier, a
  recommendation and the stage-config snippet.
- ``long_context_workload()``: a reconstruction of the workload of AWS's long-context benchmark.
- ``plot_*``: PNGs (matplotlib, Agg backend, imported only when plotting).

Progress bars (tqdm, stderr) appear only for runs that last more than two seconds.
"""

from __future__ import annotations

import gc
import math
import random
import sys
from array import array
from collections import Counter
from dataclasses import dataclass, field, replace
from heapq import heappop
from pathlib import Path
from typing import Iterable, Sequence

from prefix_routing.errors import UserError
from prefix_routing.fleet import (
    CONCURRENCY_THRESHOLD_RANGE,
    PREFIX_LENGTH_RANGE,
    Fleet,
    FleetConfig,
    Strategy,
    key_blocks,
    routing_key,
)
from prefix_routing.traces import Trace

CANDIDATE_PREFIX_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
CANDIDATE_THRESHOLDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)
KEY_GROUP_BLOCKS = (1, 2, 4, 8, 16, 32)
REUSE_CRITERION = 0.5  # the brief: prefix routing pays when more than half the requests reuse a prefix
SPREAD_SHARE = 0.05  # a key whose largest group is below this share spreads load
PROGRESS_DELAY_S = 2.0
_CHUNK = 4096


def _progress(total: int, desc: str, enabled: bool | None):
    """A tqdm bar on stderr that shows up only after two seconds (None: if stderr is a terminal)."""
    if enabled is False:
        return None
    if enabled is None and not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", unit_scale=True, delay=PROGRESS_DELAY_S, file=sys.stderr, leave=False)


def _percentiles(values: Sequence[float], qs=(50, 90, 99)) -> dict:
    import numpy as np

    if not len(values):
        return {f"p{q}": 0.0 for q in qs}
    arr = np.asarray(values, dtype=float)
    return {f"p{q}": float(np.percentile(arr, q)) for q in qs}


def _distribution(values: Sequence[float]) -> dict:
    import numpy as np

    if not len(values):
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    arr = np.asarray(values, dtype=float)
    return {
        "mean": float(arr.mean()),
        **_percentiles(arr, (50, 90, 99)),
        "max": float(arr.max()),
    }


# --------------------------------------------------------------------------- analyze


def key_groups(trace: Trace, k: int) -> tuple[int, float]:
    """(distinct keys, share of the largest group) when keying on the first k blocks."""
    ids = trace.routing_ids or [None] * len(trace)
    counts = Counter(routing_key(b, k, rid) for b, rid in zip(trace.blocks, ids))
    if not counts:
        return 0, 0.0
    return len(counts), counts.most_common(1)[0][1] / len(trace)


def analyze(
    trace: Trace,
    *,
    bytes_per_token: float = 4.0,
    key_offset_bytes: int = 0,
    prefix_lengths: Iterable[int] = CANDIDATE_PREFIX_LENGTHS,
    group_blocks: Iterable[int] = KEY_GROUP_BLOCKS,
) -> dict:
    """Prefix reuse in a trace, and how routing keys of each PrefixLength would group it.

    ``hit_rate_bound``: the share of blocks (block-weighted) that a single infinite cache shared by
    all requests would already hold when the request arrives: an upper bound for any routing.
    ``hit_rate_bound_tokens`` is the same weighted by tokens, as simulated hit rates are.
    """
    n = len(trace)
    if not n:
        raise UserError(f"{trace.source}: the trace has no requests")
    seen: set = set()
    first_reuse = beyond_first = 0
    blocks_total = blocks_hit = 0
    tokens_total = tokens_hit = 0.0
    shared_tokens = []
    bt = trace.block_tokens
    contains = seen.__contains__
    for blocks, prompt in zip(trace.blocks, trace.prompt_tokens):
        m = 0
        for b in blocks:
            if not contains(b):
                break
            m += 1
        if m >= 1:
            first_reuse += 1
        if m >= 2:
            beyond_first += 1
        blocks_total += len(blocks)
        blocks_hit += m
        cached = min(m * bt, prompt)
        tokens_total += prompt
        tokens_hit += cached
        shared_tokens.append(cached)
        seen.update(blocks)

    groups = []
    for k in sorted(set(group_blocks)):
        distinct, largest = key_groups(trace, k)
        block_bytes = trace.block_bytes or trace.block_tokens * bytes_per_token
        low = max(PREFIX_LENGTH_RANGE[0], math.floor((k - 1) * block_bytes + key_offset_bytes) + 1)
        high = min(PREFIX_LENGTH_RANGE[1], math.floor(k * block_bytes + key_offset_bytes))
        row = {"blocks": k, "distinct": distinct, "largest_share": largest}
        row["prefix_lengths"] = [low, high] if low <= high else None
        groups.append(row)

    by_length = []
    for pl in sorted(set(prefix_lengths)):
        k = key_blocks(pl, bytes_per_token, trace.block_tokens, trace.block_bytes, key_offset_bytes)
        distinct, largest = key_groups(trace, k)
        by_length.append({"prefix_length": pl, "blocks": k, "distinct": distinct, "largest_share": largest})

    duration = trace.duration_s
    result = {
        "source": trace.source,
        "requests": n,
        "duration_s": duration,
        "rate_rps": n / duration if duration > 0 else None,
        "prompt_tokens": _distribution(trace.prompt_tokens),
        "output_tokens": _distribution(trace.output_tokens),
        "block_tokens": bt,
        "block_bytes": trace.block_bytes,
        "bytes_per_token": bytes_per_token,
        "first_block_reuse": first_reuse / n,
        "prefix_reuse": first_reuse / n,
        "reuse_beyond_first_block": beyond_first / n,
        "hit_rate_bound": blocks_hit / blocks_total if blocks_total else 0.0,
        "hit_rate_bound_tokens": tokens_hit / tokens_total if tokens_total else 0.0,
        "shared_prefix_tokens": _distribution(shared_tokens),
        "key_groups": groups,
        "prefix_length_groups": by_length,
        "skipped": trace.skipped.as_dict(),
        "notes": list(trace.notes),
    }
    result["warnings"] = _analysis_warnings(result)
    return result


def _analysis_warnings(a: dict) -> list[str]:
    warnings = []
    if a["prefix_reuse"] <= REUSE_CRITERION:
        warnings.append(
            f"only {a['prefix_reuse']:.1%} of requests reuse a prefix seen before (more than "
            f"{REUSE_CRITERION:.0%} is needed for prefix-aware routing to pay); RANDOM or "
            "LEAST_OUTSTANDING_REQUESTS will do as well"
        )
    elif a["hit_rate_bound"] < 0.10:
        warnings.append(
            f"even one infinite cache shared by all requests would hold only {a['hit_rate_bound']:.1%} "
            "of the blocks: little to gain from prefix-aware routing"
        )
    rows = a["prefix_length_groups"]
    hot = [r for r in rows if r["largest_share"] >= 0.5]
    spread = [r for r in rows if r["largest_share"] < SPREAD_SHARE]
    if hot:
        worst = max(r["prefix_length"] for r in hot)
        share = hot[-1]["largest_share"]
        advice = f"; use at least {spread[0]['prefix_length']}" if spread else ""
        warnings.append(
            f"a PrefixLength of {worst} bytes or less keys {share:.0%} of requests alike (a shared "
            f"leading block): they would all go to one copy{advice}"
        )
    return warnings


# --------------------------------------------------------------------------- simulate


@dataclass
class SimResult:
    """One strategy over one trace. ``as_dict`` is what ``simulate --json`` prints."""

    strategy: str
    config: FleetConfig
    requests: int
    hit_rate: float
    ttft: list  # per request, seconds; a timed-out request counts as the timeout
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    throughput_tok_s: float
    throughput_req_s: float
    instance_requests: list[int]
    instance_prompt_tokens: list[float]
    instance_hit_rates: list[float]
    max_mean_requests: float
    max_mean_tokens: float
    spills: int
    timeouts: int
    hit_over_time: list[tuple[float, float]]  # (bin start s, hit rate)
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        total_req = sum(self.instance_requests) or 1
        total_tok = sum(self.instance_prompt_tokens) or 1
        cfg = self.config
        return {
            "strategy": self.strategy,
            "requests": self.requests,
            "hit_rate": self.hit_rate,
            "ttft_p50_s": self.ttft_p50_s,
            "ttft_p90_s": self.ttft_p90_s,
            "ttft_p99_s": self.ttft_p99_s,
            "throughput_tok_s": self.throughput_tok_s,
            "throughput_req_s": self.throughput_req_s,
            "max_mean_requests": self.max_mean_requests,
            "max_mean_tokens": self.max_mean_tokens,
            "spills": self.spills,
            "timeouts": self.timeouts,
            "instance_request_share": [r / total_req for r in self.instance_requests],
            "instance_token_share": [t / total_tok for t in self.instance_prompt_tokens],
            "instance_hit_rate": self.instance_hit_rates,
            "prefix_length": cfg.prefix_length,
            "key_blocks": cfg.key_blocks,
            "concurrency_threshold": cfg.concurrency_threshold,
            "wall_s": self.wall_s,
        }


def config_for_trace(config: FleetConfig, trace: Trace) -> FleetConfig:
    """The config with the trace's block size (the fleet must know what one block id stands for)."""
    if config.block_tokens == trace.block_tokens and config.block_bytes == trace.block_bytes:
        return config
    return replace(config, block_tokens=trace.block_tokens, block_bytes=trace.block_bytes)


def trace_keys(trace: Trace, k: int) -> list:
    ids = trace.routing_ids
    if ids:
        return [routing_key(b, k, rid) for b, rid in zip(trace.blocks, ids)]
    return [routing_key(b, k) for b in trace.blocks]


class Simulator:
    """Drives one ``Fleet`` in simulated time over one trace, or over consecutive chunks of one.

    ``feed`` may be called repeatedly with chunks whose arrivals continue the previous ones (the
    benchmark streams a million requests this way without holding them all); ``result`` reports.
    """

    def __init__(self, config: FleetConfig, *, speed: float = 1.0):
        if not speed > 0:
            raise UserError(f"speed={speed}: must be > 0")
        self.config = config
        self.fleet = Fleet(config)
        self.inv = 1.0 / speed
        self.arrivals = array("d")
        self.prompts = array("d")
        self.outputs = array("d")
        self.firsts = array("d")
        self.cached = array("d")
        self.last_finish = 0.0
        self.wall_s = 0.0
        self.source = ""

    def feed(self, trace: Trace, *, keys: list | None = None, bar=None) -> float:
        """Simulate the requests of ``trace``; returns the seconds the loop took."""
        import time

        config, fleet = self.config, self.fleet
        n = len(trace)
        if keys is None:
            keys = trace_keys(trace, config.key_blocks) if config.strategy is Strategy.PREFIX_AWARE else [None] * n
        arrivals, prompts, outputs, blocks = trace.arrivals, trace.prompt_tokens, trace.output_tokens, trace.blocks
        firsts = [0.0] * n
        cached = [0.0] * n
        collecting = gc.isenabled()
        gc.disable()  # the loop makes many small tuples and no cycles: the collector only costs time
        started = time.perf_counter()
        try:
            self._loop(n, keys, arrivals, prompts, outputs, blocks, firsts, cached, bar)
        finally:
            wall = time.perf_counter() - started
            if collecting:
                gc.enable()
        self.wall_s += wall
        self.arrivals.extend(arrivals)
        self.prompts.extend(prompts)
        self.outputs.extend(outputs)
        self.firsts.extend(firsts)
        self.cached.extend(cached)
        self.source = self.source or trace.source
        return wall

    def _loop(self, n, keys, arrivals, prompts, outputs, blocks, firsts, cached, bar) -> None:
        inv = self.inv
        fleet = self.fleet
        place = fleet._place
        done, out = fleet._done, fleet._out
        last_finish = self.last_finish
        for lo in range(0, n, _CHUNK):
            hi = min(n, lo + _CHUNK)
            for i in range(lo, hi):
                now = arrivals[i] * inv
                while done and done[0][0] <= now:
                    out[heappop(done)[1]] -= 1
                r = place(keys[i], blocks[i], prompts[i], outputs[i], now)
                firsts[i] = r[2]
                cached[i] = r[1]
                if r[4] > last_finish:
                    last_finish = r[4]
            if bar is not None:
                bar.update(hi - lo)
            self.last_finish = last_finish

    def result(self) -> "SimResult":
        return _result(self)


def simulate(
    trace: Trace,
    config: FleetConfig,
    *,
    speed: float = 1.0,
    progress: bool | None = False,
    keys: list | None = None,
    bar=None,
) -> SimResult:
    """Replay ``trace`` through one fleet in simulated time. Deterministic for a config's seed."""
    sim = Simulator(config_for_trace(config, trace), speed=speed)
    own_bar = bar is None
    if own_bar:
        bar = _progress(len(trace), config.strategy.value, progress)
    try:
        sim.feed(trace, keys=keys, bar=bar)
    finally:
        if own_bar and bar is not None:
            bar.close()
    return sim.result()


def _result(sim: Simulator) -> SimResult:
    import numpy as np

    config, fleet = sim.config, sim.fleet
    n = len(sim.arrivals)
    arr = np.frombuffer(sim.arrivals, dtype=float) * sim.inv
    first = np.frombuffer(sim.firsts, dtype=float)
    timeout = config.timeout_s if config.timeout_s is not None else math.inf
    failed = ~np.isfinite(first)
    ttft = np.where(failed, timeout, first - arr)
    prompts = np.frombuffer(sim.prompts, dtype=float)
    cached_arr = np.frombuffer(sim.cached, dtype=float)
    served_prompt = float(prompts[~failed].sum())
    hit = float(cached_arr.sum()) / served_prompt if served_prompt else 0.0
    p = _percentiles(ttft) if n else {"p50": 0.0, "p90": 0.0, "p99": 0.0}
    rows = fleet.instance_totals()
    req = [r["requests"] for r in rows]
    tok = [r["prompt_tokens"] for r in rows]
    mean_req = sum(req) / len(req) if req else 0
    mean_tok = sum(tok) / len(tok) if tok else 0
    span = sim.last_finish - (arr[0] if n else 0.0)
    outputs = np.frombuffer(sim.outputs, dtype=float)
    served_out = float(outputs[~failed].sum())
    served = int((~failed).sum())
    # Hit rate over time: 60 bins over the trace (at least 1 s each).
    duration = float(arr[-1] - arr[0]) if n else 0.0
    bin_s = max(1.0, duration / 60.0)
    idx = ((arr - arr[0]) // bin_s).astype(int) if n else np.zeros(0, int)
    bins = int(idx.max()) + 1 if n else 0
    hit_num = np.bincount(idx, weights=np.where(failed, 0.0, cached_arr), minlength=bins)
    hit_den = np.bincount(idx, weights=np.where(failed, 0.0, prompts), minlength=bins)
    over_time = [
        (float(b * bin_s), float(hit_num[b] / hit_den[b]) if hit_den[b] else 0.0) for b in range(bins)
    ]
    return SimResult(
        strategy=config.strategy.value,
        config=config,
        requests=n,
        hit_rate=hit,
        ttft=ttft.tolist(),
        ttft_p50_s=p["p50"],
        ttft_p90_s=p["p90"],
        ttft_p99_s=p["p99"],
        throughput_tok_s=served_out / span if span > 0 else 0.0,
        throughput_req_s=served / span if span > 0 else 0.0,
        instance_requests=req,
        instance_prompt_tokens=tok,
        instance_hit_rates=[r["hit_rate"] for r in rows],
        max_mean_requests=max(req) / mean_req if mean_req else 0.0,
        max_mean_tokens=max(tok) / mean_tok if mean_tok else 0.0,
        spills=fleet.spills,
        timeouts=fleet.timeouts,
        hit_over_time=over_time,
        wall_s=sim.wall_s,
    )


def simulate_many(
    trace: Trace,
    config: FleetConfig,
    strategies: Sequence[Strategy],
    *,
    speed: float = 1.0,
    progress: bool | None = None,
) -> list[SimResult]:
    """The same trace and fleet under each strategy, with one progress bar for all."""
    bar = _progress(len(trace) * len(strategies), "simulate", progress)
    try:
        return [
            simulate(trace, replace(config, strategy=s), speed=speed, bar=bar)
            for s in strategies
        ]
    finally:
        if bar is not None:
            bar.close()


# --------------------------------------------------------------------------- tune


def tune(
    trace: Trace,
    config: FleetConfig,
    *,
    prefix_lengths: Sequence[int] = CANDIDATE_PREFIX_LENGTHS,
    thresholds: Sequence[int] = CANDIDATE_THRESHOLDS,
    baselines: Sequence[Strategy] = (Strategy.RANDOM, Strategy.LEAST_OUTSTANDING_REQUESTS),
    max_imbalance: float = 1.2,
    hit_tolerance: float = 0.05,
    speed: float = 1.0,
    progress: bool | None = None,
) -> dict:
    """Sweep PREFIX_AWARE over PrefixLength × ConcurrencyThreshold, plus baseline strategies.

    Recommendation: among the PREFIX_AWARE points whose max/mean requests per instance is at most
    ``max_imbalance`` and whose hit rate is within ``hit_tolerance`` (relative) of the best hit rate
    found, the one with the lowest P50 TTFT (ties: higher hit rate, lower imbalance, shorter
    PrefixLength, then the lowest threshold: of settings that behave alike on the trace, the one
    that caps a hot copy's queue soonest). PrefixLengths that key the same number of blocks behave
    identically and are simulated once.
    """
    for pl in prefix_lengths:
        if not PREFIX_LENGTH_RANGE[0] <= pl <= PREFIX_LENGTH_RANGE[1]:
            raise UserError(f"prefix length {pl}: must be from {PREFIX_LENGTH_RANGE[0]} to {PREFIX_LENGTH_RANGE[1]}")
    for t in thresholds:
        if not CONCURRENCY_THRESHOLD_RANGE[0] <= t <= CONCURRENCY_THRESHOLD_RANGE[1]:
            raise UserError(
                f"concurrency threshold {t}: must be from {CONCURRENCY_THRESHOLD_RANGE[0]} to {CONCURRENCY_THRESHOLD_RANGE[1]}"
            )
    config = config_for_trace(config, trace)
    prefix_lengths = sorted(set(prefix_lengths))
    thresholds = sorted(set(thresholds))
    by_blocks: dict[int, int] = {}
    for pl in prefix_lengths:
        k = replace(config, prefix_length=pl).key_blocks
        by_blocks.setdefault(k, pl)
    runs = len(by_blocks) * len(thresholds) + len(baselines)
    bar = _progress(len(trace) * runs, "tune", progress)
    points = []
    try:
        baseline_rows = []
        for s in baselines:
            r = simulate(trace, replace(config, strategy=s), speed=speed, bar=bar)
            baseline_rows.append(_point(r, None))
        cache: dict[tuple[int, int], SimResult] = {}
        for k, pl in by_blocks.items():
            keys = trace_keys(trace, k)
            for t in thresholds:
                cfg = replace(config, strategy=Strategy.PREFIX_AWARE, prefix_length=pl, concurrency_threshold=t)
                cache[(k, t)] = simulate(trace, cfg, speed=speed, keys=keys, bar=bar)
        for pl in prefix_lengths:
            k = replace(config, prefix_length=pl).key_blocks
            for t in thresholds:
                points.append(_point(cache[(k, t)], pl))
    finally:
        if bar is not None:
            bar.close()
    best_hit = max(p["hit_rate"] for p in points)
    eligible = [
        p for p in points
        if p["max_mean_requests"] <= max_imbalance and p["hit_rate"] >= (1 - hit_tolerance) * best_hit
    ]
    note = None
    if not eligible:
        eligible = [p for p in points if p["max_mean_requests"] <= max_imbalance]
        note = f"no setting keeps the hit rate within {hit_tolerance:.0%} of the best under the imbalance bound"
    if not eligible:
        eligible = points
        note = f"no setting keeps max/mean requests per instance at or under {max_imbalance}; least imbalanced shown"
        eligible = sorted(points, key=lambda p: p["max_mean_requests"])[:1]
    best = min(
        eligible,
        key=lambda p: (
            round(p["ttft_p50_s"], 4),
            -round(p["hit_rate"], 4),
            round(p["max_mean_requests"], 3),
            p["prefix_length"],
            p["concurrency_threshold"],
        ),
    )
    frontier = _frontier(points)
    return {
        "source": trace.source,
        "requests": len(trace),
        "instances": config.instances,
        "copies": config.copies,
        "preset": config.preset.name,
        "max_imbalance": max_imbalance,
        "hit_tolerance": hit_tolerance,
        "best_hit_rate": best_hit,
        "baselines": baseline_rows,
        "points": points,
        "frontier": frontier,
        "recommendation": best,
        "note": note,
        "snippet": config_snippet(best["prefix_length"], best["concurrency_threshold"]),
        "prefix_lengths": prefix_lengths,
        "thresholds": thresholds,
    }


def _point(r: SimResult, prefix_length: int | None) -> dict:
    return {
        "strategy": r.strategy,
        "prefix_length": prefix_length,
        "key_blocks": r.config.key_blocks if prefix_length else None,
        "concurrency_threshold": r.config.concurrency_threshold if prefix_length else None,
        "hit_rate": r.hit_rate,
        "ttft_p50_s": r.ttft_p50_s,
        "ttft_p90_s": r.ttft_p90_s,
        "ttft_p99_s": r.ttft_p99_s,
        "max_mean_requests": r.max_mean_requests,
        "spills": r.spills,
        "timeouts": r.timeouts,
    }


def _frontier(points: list[dict]) -> list[dict]:
    """Points no other point beats on all of: higher hit rate, lower P50 TTFT, lower imbalance."""

    def dominated(p, q):
        return (
            q["hit_rate"] >= p["hit_rate"]
            and q["ttft_p50_s"] <= p["ttft_p50_s"]
            and q["max_mean_requests"] <= p["max_mean_requests"]
            and (q["hit_rate"], -q["ttft_p50_s"], -q["max_mean_requests"])
            != (p["hit_rate"], -p["ttft_p50_s"], -p["max_mean_requests"])
        )

    front = [p for p in points if not any(dominated(p, q) for q in points)]
    seen, unique = set(), []
    for p in sorted(front, key=lambda p: (p["max_mean_requests"], p["ttft_p50_s"])):
        key = (round(p["hit_rate"], 6), round(p["ttft_p50_s"], 6), round(p["max_mean_requests"], 6))
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def config_snippet(prefix_length: int, threshold: int) -> str:
    """The ``[routing]`` table of a stage file under ``config/`` (see prefix_routing/config.py)."""
    return (
        "[routing]\n"
        'strategy = "PREFIX_AWARE"\n'
        f"prefix_length = {prefix_length}\n"
        f"concurrency_threshold = {threshold}\n"
    )


# --------------------------------------------------------------------------- the long-context workload


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
    """Generate the long-context workload: Poisson arrivals, uniform prefix choice, unique suffixes."""
    rng = random.Random(seed)
    bt = spec.block_tokens
    prefix_blocks = math.ceil(spec.prefix_tokens / bt)
    if spec.prefix_tokens % bt:
        raise UserError(f"prefix_tokens {spec.prefix_tokens} must be a multiple of block_tokens {bt}")
    # Prefix p is blocks [p*prefix_blocks, (p+1)*prefix_blocks): chained ids, one chain per prefix.
    next_id = spec.prefixes * prefix_blocks
    arrivals, prompts, outputs, blocks = [], [], [], []
    t = 0.0
    while True:
        t += rng.expovariate(spec.rate_rps)
        if t > spec.duration_s:
            break
        p = rng.randrange(spec.prefixes)
        suffix = rng.randint(*spec.suffix_tokens)
        suffix_blocks = math.ceil(suffix / bt)
        ids = list(range(p * prefix_blocks, (p + 1) * prefix_blocks))
        ids.extend(range(next_id, next_id + suffix_blocks))
        next_id += suffix_blocks
        arrivals.append(t)
        prompts.append(spec.prefix_tokens + suffix)
        outputs.append(rng.randint(*spec.output_tokens))
        blocks.append(ids)
    if not arrivals:
        raise UserError("the long-context workload is empty: raise rate_rps or duration_s")
    t0 = arrivals[0]
    return Trace(
        [a - t0 for a in arrivals], prompts, outputs, blocks, block_tokens=bt,
        source=f"long-context workload (seed {seed})", lines=len(arrivals),
    )


WORKLOADS = {"long-context": (LongContextSpec, long_context_workload)}


# --------------------------------------------------------------------------- plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_simulation(results: Sequence[SimResult], out_dir: str | Path) -> list[Path]:
    """TTFT CDF per strategy, load per instance, hit rate over time. Returns the PNG paths."""
    import numpy as np

    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        x = np.sort(np.asarray(r.ttft))
        y = np.arange(1, len(x) + 1) / max(1, len(x))
        ax.plot(x, y, label=f"{r.strategy} (P50 {r.ttft_p50_s * 1000:.0f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("share of requests")
    ax.set_title("TTFT CDF per strategy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / "ttft_cdf.png", plt))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / max(1, len(results))
    for j, r in enumerate(results):
        total = sum(r.instance_requests) or 1
        xs = np.arange(len(r.instance_requests)) + j * width
        ax.bar(xs, [q / total for q in r.instance_requests], width, label=f"{r.strategy} (max/mean {r.max_mean_requests:.2f})")
    ax.set_xlabel("instance")
    ax.set_ylabel("share of requests")
    ax.set_title("Load per instance")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / "load_per_instance.png", plt))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        xs = [t / 60 for t, _ in r.hit_over_time]
        ax.plot(xs, [h for _, h in r.hit_over_time], label=f"{r.strategy} ({r.hit_rate:.1%})")
    ax.set_xlabel("simulated time (min)")
    ax.set_ylabel("KV-cache hit rate (tokens)")
    ax.set_ylim(0, 1)
    ax.set_title("Hit rate over time")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / "hit_rate_over_time.png", plt))
    return paths


def plot_tune(result: dict, out_dir: str | Path) -> list[Path]:
    """Heatmap of P50 TTFT over PrefixLength × ConcurrencyThreshold, hit rate in each cell."""
    import numpy as np

    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pls, ths = result["prefix_lengths"], result["thresholds"]
    grid = {(p["prefix_length"], p["concurrency_threshold"]): p for p in result["points"]}
    ttft = np.array([[grid[(pl, t)]["ttft_p50_s"] * 1000 for t in ths] for pl in pls])
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(ths), 1.5 + 0.6 * len(pls)))
    from matplotlib.colors import LogNorm

    norm = LogNorm(vmin=max(1e-3, float(ttft.min())), vmax=max(float(ttft.max()), float(ttft.min()) * 1.01, 1e-3))
    image = ax.imshow(ttft, cmap="viridis_r", aspect="auto", norm=norm)
    fig.colorbar(image, ax=ax, label="P50 TTFT (ms)")
    ax.set_xticks(range(len(ths)), [str(t) for t in ths])
    ax.set_yticks(range(len(pls)), [str(p) for p in pls])
    ax.set_xlabel("ConcurrencyThreshold")
    ax.set_ylabel("PrefixLength (bytes)")
    rec = result["recommendation"]
    for i, pl in enumerate(pls):
        for j, t in enumerate(ths):
            p = grid[(pl, t)]
            mark = "*" if (pl, t) == (rec["prefix_length"], rec["concurrency_threshold"]) else ""
            color = "black" if norm(ttft[i, j]) < 0.5 else "white"
            ax.text(j, i, f"{p['hit_rate']:.0%}{mark}\n{p['max_mean_requests']:.2f}", ha="center", va="center", fontsize=7, color=color)
    ax.set_title("P50 TTFT; cells: hit rate, max/mean (* recommended)", fontsize=9)
    return [_save(fig, out / "tune_heatmap.png", plt)]


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- command-line helpers
# Shared by commands/analyze.py, simulate.py and tune.py (argparse only; no behaviour of its own).


def _ranged_int(name: str, low: int, high: int):
    import argparse

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer (allowed: {low} to {high})") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value}: must be from {low} to {high}")
        return value

    return parse


def _positive_float(name: str):
    import argparse

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text}: must be a number > 0")
        return value

    return parse


def parse_cache_tokens(text: str) -> float:
    """``infinite`` (or ``inf``), or a token count such as ``500000``, ``500k``, ``1.4M``."""
    import argparse

    t = text.strip().lower()
    if t in ("infinite", "inf", "unbounded"):
        return math.inf
    scale = 1
    if t[-1:] in ("k", "m"):
        scale = 1_000 if t[-1] == "k" else 1_000_000
        t = t[:-1]
    try:
        value = float(t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: takes a token count (e.g. 500k) or 'infinite'") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 0")
    return value


def _strategy(text: str) -> Strategy:
    import argparse

    try:
        return Strategy.parse(text)
    except UserError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_trace_arguments(parser) -> None:
    parser.add_argument(
        "trace", nargs="?", metavar="TRACE",
        help="a trace file (Mooncake JSONL, the normalizer's request log, or raw request bodies; .gz ok), "
        "or cloudwatch:LOG_GROUP to read the normalizer's log from CloudWatch Logs",
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), help="generate a workload instead of reading TRACE")
    parser.add_argument("--format", default="auto", choices=("auto", "mooncake", "log", "bodies"), help="trace format (default: from the first line)")
    parser.add_argument("--strict", action="store_true", help="fail on the first broken line instead of skipping it")
    parser.add_argument("--limit", type=_ranged_int("--limit", 1, 10**9), help="use only the first N requests")
    parser.add_argument("--start", help="cloudwatch: start time (ISO 8601 or epoch ms; default: 1 hour before --end)")
    parser.add_argument("--end", help="cloudwatch: end time (ISO 8601 or epoch ms; default: now)")
    parser.add_argument("--region", help="cloudwatch: AWS region")
    parser.add_argument("--body-rate", type=_positive_float("--body-rate"), default=1.0, help="raw bodies: arrivals per second (bodies carry no times; default 1)")
    parser.add_argument("--body-block-bytes", type=_ranged_int("--body-block-bytes", 16, 65536), help="raw bodies: bytes per hashed block (default: the normalizer's)")
    parser.add_argument("--bytes-per-token", type=_positive_float("--bytes-per-token"), default=4.0, metavar="R", help="bytes of body per prompt token (default 4)")
    parser.add_argument("--key-offset-bytes", type=_ranged_int("--key-offset-bytes", 0, 65536), default=0, metavar="B", help="JSON bytes before the prompt in the normalized body (default 0)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (routing, generated workloads; default 0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def add_fleet_arguments(parser, *, grid: bool) -> None:
    """The fleet flags; with ``grid`` (tune) --prefix-length and --concurrency-threshold repeat."""
    parser.add_argument("--instances", type=_ranged_int("--instances", 1, 10_000), metavar="N", help="instances (default 8; 7 for --workload long-context)")
    parser.add_argument("--copies", type=_ranged_int("--copies", 1, 1024), metavar="C", help="copies per instance (default: the preset's)")
    parser.add_argument("--strategy", type=_strategy, action="append", metavar="S", help="RANDOM, LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE or KV_AWARE; repeatable")
    pl = _ranged_int("--prefix-length", *PREFIX_LENGTH_RANGE)
    ct = _ranged_int("--concurrency-threshold", *CONCURRENCY_THRESHOLD_RANGE)
    if grid:
        parser.add_argument("--prefix-length", type=pl, action="append", metavar="B", help=f"PrefixLength to try (bytes); repeatable (default {', '.join(map(str, CANDIDATE_PREFIX_LENGTHS))})")
        parser.add_argument("--concurrency-threshold", type=ct, action="append", metavar="T", help=f"ConcurrencyThreshold to try; repeatable (default {', '.join(map(str, CANDIDATE_THRESHOLDS))})")
    else:
        parser.add_argument("--prefix-length", type=pl, metavar="B", help="PrefixLength in bytes, 1024–65536 (default 4096)")
        parser.add_argument("--concurrency-threshold", type=ct, metavar="T", help="ConcurrencyThreshold, 1–1024 (default 10)")
    parser.add_argument("--cache-tokens", type=parse_cache_tokens, metavar="K", help="KV-cache tokens per copy, or 'infinite' (default: from the preset)")
    parser.add_argument("--preset", metavar="NAME", help="instance × model preset (default p5.48xlarge-llama3.1-70b); 'list' lists them")
    parser.add_argument("--speed", type=_positive_float("--speed"), default=1.0, metavar="F", help="replay F times faster than the trace (default 1)")
    parser.add_argument("--out-dir", default=None, metavar="DIR", help="where to write the PNG plots (default out/<command>)")
    parser.add_argument("--no-plots", action="store_true", help="write no PNG")
    parser.add_argument("--progress", action=__import__("argparse").BooleanOptionalAction, default=None, help="progress bar on stderr (default: when stderr is a terminal)")


def _time_ms(text: str | None, default_ms: int) -> int:
    from datetime import datetime, timezone

    if text is None:
        return default_ms
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"time {text!r}: use ISO 8601 (2026-11-30T10:00:00Z) or epoch milliseconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def load_from_args(args) -> tuple[Trace, "LongContextSpec | None"]:
    """The trace the command works on: read (any format, or CloudWatch) or generated."""
    import time

    from prefix_routing import traces

    spec = None
    if args.workload:
        if args.trace:
            raise UserError("give either TRACE or --workload, not both")
        spec_cls, generate = WORKLOADS[args.workload]
        spec = spec_cls()
        trace = generate(spec, seed=args.seed)
    elif not args.trace:
        raise UserError("no trace: give a TRACE file (or cloudwatch:LOG_GROUP), or --workload long-context")
    elif args.trace.startswith("cloudwatch:"):
        group = args.trace.split(":", 1)[1]
        if not group:
            raise UserError("cloudwatch: needs a log group name, e.g. cloudwatch:/aws/lambda/normalizer")
        end = _time_ms(args.end, int(time.time() * 1000))
        start = _time_ms(args.start, end - 3600_000)
        if start >= end:
            raise UserError(f"--start must be before --end ({start} >= {end})")
        trace = traces.read_cloudwatch(group, start, end, region=args.region, strict=args.strict, bytes_per_token=args.bytes_per_token)
    else:
        body_options = {"rate": args.body_rate, "block_bytes": args.body_block_bytes}
        if getattr(args, "prefix_length", None) and isinstance(args.prefix_length, int):
            body_options["prefix_length"] = args.prefix_length
        trace = traces.load_trace(args.trace, args.format, strict=args.strict, bytes_per_token=args.bytes_per_token, **body_options)
    if args.limit:
        trace = trace.head(args.limit)
    report_skipped(trace)
    return trace, spec


def report_skipped(trace: Trace) -> None:
    """Broken lines (with their line numbers) and the summary, on stderr."""
    skipped = trace.skipped
    for example in skipped.examples:
        print(f"warning: {example}", file=sys.stderr)
    if skipped.count > len(skipped.examples):
        print(f"warning: ... and {skipped.count - len(skipped.examples):,} more", file=sys.stderr)
    summary = skipped.summary(trace.lines)
    if summary:
        print(f"{trace.source}: {summary}", file=sys.stderr)
    for note in trace.notes:
        print(f"{trace.source}: {note}", file=sys.stderr)


def fleet_config_from_args(args, trace: Trace | None, spec: "LongContextSpec | None", **fixed) -> FleetConfig:
    """A FleetConfig from the flags; unset flags fall back to the workload's or the lab's defaults.

    Called once before the trace is read (``trace=None``), so that bad flags fail fast.
    """
    if spec is None and trace is None and getattr(args, "workload", None):
        spec = WORKLOADS[args.workload][0]()
    base = spec.fleet_config() if spec else FleetConfig()
    values = {
        "instances": args.instances or base.instances,
        "copies": args.copies,
        "preset": args.preset or (base.preset.name),
        "prefix_length": base.prefix_length,
        "concurrency_threshold": base.concurrency_threshold,
        "cache_tokens": args.cache_tokens if args.cache_tokens is not None else base.cache_tokens,
        "bytes_per_token": args.bytes_per_token,
        "key_offset_bytes": args.key_offset_bytes,
        "block_tokens": trace.block_tokens if trace else base.block_tokens,
        "block_bytes": trace.block_bytes if trace else base.block_bytes,
        "seed": args.seed,
    }
    values.update(fixed)
    return FleetConfig(**values)


def presets_table() -> str:
    """The presets, one line each (``--preset list``)."""
    from prefix_routing.presets import DEFAULT_PRESET, PRESETS

    lines = [f"{'preset':<30}{'TP×copies':>10}{'KV tokens':>12}{'prefill tok/s':>15}{'decode ms':>11}  conf."]
    for name, p in PRESETS.items():
        mark = " (default)" if name == DEFAULT_PRESET else ""
        lines.append(
            f"{name:<30}{f'{p.tp}×{p.replicas}':>10}{p.kv_tokens:>12,}{p.prefill_tokens_per_s:>15,.0f}"
            f"{p.decode_step_s * 1000:>11.0f}  {p.confidence}{mark}"
        )
    return "\n".join(lines)


def plot_dir(args, command: str) -> Path | None:
    if args.no_plots:
        return None
    return Path(args.out_dir or Path("out") / command)


def describe_fleet(config: FleetConfig) -> str:
    p = config.preset
    cache = "unbounded" if math.isinf(config.capacity_tokens) else f"{config.capacity_tokens / 1e6:.2f}M tokens (LRU)"
    return (
        f"{config.instances} × {p.instance.name}, {p.model.name} TP{p.tp}, {config.copies} "
        f"cop{'y' if config.copies == 1 else 'ies'} each; KV cache {cache} per copy"
    )


def print_json(obj) -> None:
    import json

    print(json.dumps(obj, indent=2, default=_json_default, allow_nan=False))


def _json_default(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Strategy):
        return value.value
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
