"""The PREFIX_AWARE grid over PrefixLength and ConcurrencyThreshold, its frontier, a recommendation and the config snippet."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.grids import CANDIDATE_PREFIX_LENGTHS, CANDIDATE_THRESHOLDS
from prefix_routing.lab.progress import progress_bar
from prefix_routing.lab.routing import CONCURRENCY_THRESHOLD_RANGE, PREFIX_LENGTH_RANGE, Strategy
from prefix_routing.lab.sampling import result_bands
from prefix_routing.lab.simulate import SimResult, config_for_trace, for_strategy, simulate
from prefix_routing.lab.tenants import tenant_summary
from prefix_routing.lab.trace_keys import trace_keys
from prefix_routing.lab.traces import Trace
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.limits import LimitSettings
from prefix_routing.rules.replication import ReplicationSettings


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
    replications: Sequence[ReplicationSettings | None] = (None,),
    reuse_share: float | None = None,
    limits: LimitSettings | None = None,
    memo: dict | None = None,
    baseline_fleet: tuple[FleetConfig, float] | None = None,
    sample_rate: float = 1.0,
) -> dict:
    """Sweep PREFIX_AWARE over PrefixLength × ConcurrencyThreshold (× hot-prefix replication: None
    for off, or settings to try), plus baseline strategies. With RANDOM among them the result has
    the verdict (lab/verdict.py); ``reuse_share``: the trace's prefix reuse, if already analyzed;
    ``limits``: the per-tenant limits before the router, in every run (lab/tenant_sim.py).

    Recommendation: among the PREFIX_AWARE points whose max/mean requests per instance is at most
    ``max_imbalance`` and whose hit rate is within ``hit_tolerance`` (relative) of the best hit rate
    found, the one with the lowest P50 TTFT (ties: higher hit rate, lower imbalance, shorter
    PrefixLength, then the lowest threshold: of settings that behave alike on the trace, the one
    that caps a hot copy's queue soonest). PrefixLengths that key the same number of blocks behave
    identically and are simulated once. ``memo``: a dict kept between calls on the same trace, fleet
    and limits (the advisor's coordinate search), so that a setting simulated before is not simulated
    again and each key length's routing keys are computed once. ``baseline_fleet``: (fleet, speed)
    the baselines run on instead of ``config`` and ``speed`` (a miniature's: strategies that spread a
    key over every copy run on a miniature of their own, lab/sampling.py). ``sample_rate`` below 1:
    ``trace`` is a sample of the routing keys at ``config``'s PrefixLength at that rate, and each
    point carries the bands of its figures (``bands``: lab/sample_bands.py).
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
    replications = list(dict.fromkeys(replications)) or [None]
    runs = len(by_blocks) * len(thresholds) * len(replications) + len(baselines)
    bar = progress_bar(len(trace) * runs, "tune", progress)
    points = []
    cache: dict[tuple, SimResult] = {} if memo is None else memo
    banded = _bands_of_sample(trace, config, sample_rate, cache)
    try:
        baseline_rows = []
        base_config, base_speed = baseline_fleet or (config, speed)
        base_config = config_for_trace(base_config, trace)
        for s in baselines:
            # (fixed copies where autoscaling is not modelled)
            r = simulate(trace, for_strategy(base_config, s), speed=base_speed, bar=bar, limits=limits,
                         explain_misses=False)  # (a point has no misses by cause)
            baseline_rows.append(_point(r, None, banded(r)))
        for k, pl in by_blocks.items():
            keys = cache.get(("keys", k))
            if keys is None:
                keys = cache["keys", k] = trace_keys(trace, k)
            for t in thresholds:  # in ascending order: a run that spilled nothing stands for every higher one
                for rep in replications:
                    if (k, t, rep) not in cache:
                        unspilled = _unspilled_below(cache, k, t, rep)
                        if unspilled is not None:
                            cache[(k, t, rep)] = replace(
                                unspilled, config=replace(unspilled.config, concurrency_threshold=t))
                    if (k, t, rep) in cache:
                        if bar is not None:
                            bar.update(len(trace))
                        continue
                    cfg = replace(config, strategy=Strategy.PREFIX_AWARE, prefix_length=pl, concurrency_threshold=t,
                                  replication=rep)
                    cache[(k, t, rep)] = simulate(trace, cfg, speed=speed, keys=keys, bar=bar, limits=limits,
                                                  explain_misses=False)
        for pl in prefix_lengths:
            k = replace(config, prefix_length=pl).key_blocks
            for t in thresholds:
                for rep in replications:
                    points.append(_point(cache[(k, t, rep)], pl, banded(cache[(k, t, rep)])))
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
            p["replication"] is not None,  # replication only when it pays
            -(p["replication"] or 0),  # then the fewest replicas (the highest share factor)
        ),
    )
    frontier = _frontier(points)
    random = next((b for b in baseline_rows if b["strategy"] == Strategy.RANDOM.value), None)
    verdict = None
    if random is not None:  # one verdict, from the recommendation's simulated gain (lab/verdict.py)
        from prefix_routing.lab.analyze import analyze
        from prefix_routing.lab.verdict import routing_verdict

        if reuse_share is None:  # the caller may have it from its own analyze pass already
            reuse_share = analyze(trace, prefix_lengths=(), group_blocks=())["prefix_reuse"]
        verdict = routing_verdict(prefix_aware=best, random=random, reuse_share=reuse_share)
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
        "verdict": verdict,
        "note": note,
        "snippet": config_snippet(best["prefix_length"], best["concurrency_threshold"],
                                  next((r for r in replications if r and r.target_share_factor == best["replication"]), None)),
        "prefix_lengths": prefix_lengths,
        "thresholds": thresholds,
        "tenants": tenant_summary(trace),  # how many, and one that dominates the load (lab/tenants.py)
    }


def _unspilled_below(cache: dict, k: int, threshold: int, replication) -> SimResult | None:
    """A run of the same key length and replication at a lower threshold that spilled no request:
    at every arrival its home copy had fewer requests in flight than that threshold, so at this one
    too, and every routing decision, hence the whole run, is the same (the threshold enters the
    model nowhere else). None when there is none."""
    for key, result in cache.items():
        if (len(key) == 3 and key[0] == k and key[2] == replication and key[1] < threshold
                and result.spills == 0 and result.config.concurrency_threshold == key[1]):
            return result
    return None


def _bands_of_sample(trace: Trace, config: FleetConfig, rate: float, cache: dict):
    """``result -> its bands`` for a sample at ``rate`` (keyed at ``config``'s PrefixLength), or
    ``result -> None`` for a whole trace. The sample's keys are the grid's at that length: kept in
    ``cache`` under ("keys", blocks), where the grid looks for them."""
    if rate >= 1.0:
        return lambda result: None
    k = config.key_blocks
    keys = cache.get(("keys", k))
    if keys is None:
        keys = cache["keys", k] = trace_keys(trace, k)
    return lambda result: result_bands(result, trace, rate, k, keys)


def _point(r: SimResult, prefix_length: int | None, bands: dict | None = None) -> dict:
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
        "throttled": r.throttled,
        "waited_share": r.waited_share,
        # None: off; else the target share factor (fair shares above which a prefix is replicated)
        "replication": r.config.replication.target_share_factor if r.config.replicating else None,
        "replicated_requests": r.replicated_requests,
        **({"bands": bands} if bands is not None else {}),
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


def config_snippet(prefix_length: int, threshold: int, replication: ReplicationSettings | None = None) -> str:
    """The ``[routing]`` table of a stage file under ``config/`` (see prefix_routing/stage/config.py),
    and ``[normalizer.replication]`` when the recommendation replicates hot prefixes."""
    snippet = (
        "[routing]\n"
        'strategy = "PREFIX_AWARE"\n'
        f"prefix_length = {prefix_length}\n"
        f"concurrency_threshold = {threshold}\n"
    )
    if replication is not None:
        snippet += (
            "\n[normalizer.replication]\n"
            "enabled = true\n"
            f"target_share_factor = {replication.target_share_factor:g}\n"
            f"max_replicas = {replication.max_replicas}\n"
            f"half_life_s = {replication.half_life_s:g}\n"
        )
    return snippet
