"""The routing advisor: the lab run on a window of production's request log, and when to say so.

``advise`` replays the window (the normalizer's log: block hashes, routing ids, lengths) through the
stage's fleet at the current routing settings and over the tune grid, and reports what the
dashboard's advisor row shows: the window's hit-rate bound, the predicted hit rate now, the best
predicted and its settings, the prefix reuse share, and the hit rate production measured in the
same window (so the model's drift is visible). ``notify`` is the rule that turns consecutive
advice into at most one notification per recommendation. The advisor function and ``advise`` on
the command line both call these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from prefix_routing.lab import sampling
from prefix_routing.lab.analyze import analyze
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.grids import CANDIDATE_PREFIX_LENGTHS, CANDIDATE_THRESHOLDS
from prefix_routing.lab.losses import namespace_bound, top_losers
from prefix_routing.lab.overload import overload_text
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.traces import Trace
from prefix_routing.lab.tune import config_snippet, tune
from prefix_routing.lab.verdict import routing_verdict
from prefix_routing.rules import telemetry
from prefix_routing.rules.errors import UserError


# A setting predicted to lose more than this against the current one is never recommended: more
# than a point of hit rate, or a P50 TTFT more than 5 % higher.
WORSE_POINTS = 1.0
WORSE_TTFT = 0.05
# A measured hit rate this many points above the window's bound says the bound or the window is off.
ABOVE_BOUND_POINTS = 1.0


@dataclass(frozen=True)
class NotifySettings:
    """``advisor.notify_gain_points``, ``advisor.notify_ttft_gain`` and ``advisor.notify_after_runs``."""

    gain_points: float = 5.0  # hit-rate points the recommendation must gain over the current settings
    ttft_gain: float = 0.20  # or this share of P50 TTFT it must cut
    after_runs: int = 3  # for this many consecutive runs, with the same recommendation

    def __post_init__(self) -> None:
        if not (isinstance(self.gain_points, (int, float)) and 0 < self.gain_points <= 100):
            raise UserError(f"advisor.notify_gain_points={self.gain_points!r}: allowed: a number of points above 0, at most 100")
        if not (isinstance(self.ttft_gain, (int, float)) and 0 < self.ttft_gain < 1):
            raise UserError(f"advisor.notify_ttft_gain={self.ttft_gain!r}: allowed: a share above 0, below 1")
        if not (isinstance(self.after_runs, int) and not isinstance(self.after_runs, bool) and 1 <= self.after_runs <= 1000):
            raise UserError(f"advisor.notify_after_runs={self.after_runs!r}: allowed: an integer from 1 to 1000")


def advise(
    trace: Trace,
    config: FleetConfig,
    *,
    prefix_lengths: Sequence[int] = CANDIDATE_PREFIX_LENGTHS,
    thresholds: Sequence[int] = CANDIDATE_THRESHOLDS,
    settings: NotifySettings = NotifySettings(),
    min_threshold: float = 1,
    sample: float = 1.0,
    presampled: bool = False,
) -> dict:
    """The advice for one window. ``config`` is the endpoint as deployed: its PrefixLength and
    ConcurrencyThreshold are the current settings (and are always among the candidates). The search
    runs about len(prefix_lengths) + len(thresholds) simulations, not their product. Thresholds
    below ``min_threshold`` (the stage's scaling target: copies must not spill before autoscaling
    adds capacity, a rule the stage file enforces) are not recommended. ``sample`` below 1: the
    simulations run on a miniature of the window (lab/sampling.py: its routing keys at the current
    PrefixLength sampled at that rate); the bound, the reuse share and the measured hit rate stay the
    whole window's. ``presampled``: the window is already that sample (read from a log sampled at the
    source: rules/sampling.py), so only the fleet shrinks; the bound, the reuse share and the measured
    hit rate are then the sample's estimates."""
    if not len(trace):
        raise UserError(f"{trace.source}: the window has no requests")
    current_config = replace(config, strategy=Strategy.PREFIX_AWARE)
    reuse = analyze(trace, prefix_lengths=(), group_blocks=())
    # A coordinate search instead of the whole grid, to fit a Lambda's minutes on a busy hour:
    # every PrefixLength at the current threshold (which includes the current settings), then
    # every threshold at the best PrefixLength.
    grid_lengths = sorted({*prefix_lengths, config.prefix_length})
    grid_thresholds = sorted({*(t for t in thresholds if t >= min_threshold), config.concurrency_threshold})
    deployed = (config.replication,)  # the front door's replication as deployed
    memo: dict = {}  # the two passes share simulations (the best length at the current threshold) and keys
    simulated, speed, baseline_fleet, chosen = trace, 1.0, None, None
    if sample < 1.0:
        sampling.check_sampling(current_config)
        chosen = sampling.plan(trace, current_config, sample, (Strategy.PREFIX_AWARE, Strategy.RANDOM),
                               presampled=presampled)
        sample = chosen.rate  # 1: the whole window, where a sample's error is not bounded
    if sample < 1.0:
        # The grid on whole copies; RANDOM, the verdict's baseline, which spreads a key over every
        # copy, on every copy, each cache × R and the clock × 1/R (lab/sampling.py).
        if not presampled:
            simulated = sampling.sample(trace, sample, current_config.key_blocks)
        current_config, speed, baseline_fleet = sampling.grid_miniatures(current_config, sample)
    by_length = tune(simulated, current_config, prefix_lengths=grid_lengths, thresholds=[config.concurrency_threshold],
                     baselines=(), replications=deployed, memo=memo, speed=speed, sample_rate=sample)
    current = next(p for p in by_length["points"] if p["prefix_length"] == config.prefix_length)
    tuned = tune(simulated, current_config, prefix_lengths=[by_length["recommendation"]["prefix_length"]],
                 thresholds=grid_thresholds, baselines=(Strategy.RANDOM,), replications=deployed,
                 reuse_share=reuse["prefix_reuse"], memo=memo, speed=speed, baseline_fleet=baseline_fleet,
                 sample_rate=sample)
    best = _choose(tuned["recommendation"], current, by_length["points"] + tuned["points"], settings)
    kept = best is current
    gain_points, ttft_gain = _gains(best, current)
    gain_band = _gain_band(best, current)
    # From a sample, a change must clear the bar at the low end of its band; from a sample whose
    # error is not bounded, none is advised.
    low_points, low_ttft = gain_points - gain_band[0], gain_band[1][0]
    better = not kept and (chosen is None or chosen.bounded) and (
        low_points >= settings.gain_points - 1e-9 or low_ttft >= settings.ttft_gain - 1e-9)
    random = next(b for b in tuned["baselines"] if b["strategy"] == Strategy.RANDOM.value)
    # The bound counts only reuse within a tenant's namespace (salts and routing ids allow no other);
    # a log without tenants or routing ids is one namespace: the shared bound.
    namespaces = namespace_bound(trace)
    bound, measured = namespaces["bound_tokens"], trace.measured_hit_rate()
    sampled = None
    if sample < 1.0:
        sampled = {"rate": sample, "requests": len(simulated), "at_source": presampled,
                   "hit_rate_band": (current.get("bands") or {}).get("hit_rate")}
    if chosen is not None and chosen.reason:
        sampled = {**(sampled or {"rate": 1.0, "requests": len(trace)}), "asked": chosen.asked,
                   "bounded": chosen.bounded, "note": chosen.note()}
    return {
        "window": {"source": trace.source, "requests": len(trace), "duration_s": trace.duration_s,
                   **({"sample": sampled} if sampled else {})},
        "hit_rate_bound": bound,
        "prefix_reuse_share": reuse["prefix_reuse"],
        "measured_hit_rate": measured,
        "measured_above_bound": _above_bound(trace, measured, bound),
        "current": _settings(config.prefix_length, config.concurrency_threshold, current),
        "best": _settings(best["prefix_length"], best["concurrency_threshold"], best),
        "kept_current": kept,
        "gain_points": gain_points,
        "ttft_gain": ttft_gain,
        **({"gain_band": {"points": gain_band[0], "ttft_gain": list(gain_band[1])}} if "bands" in current else {}),
        "better": better,
        "overloaded": overload_text(current["waited_share"], current["timeouts"], len(trace), config.timeout_s),
        "verdict": routing_verdict(prefix_aware=best, random=random, reuse_share=reuse["prefix_reuse"]),
        "snippet": config_snippet(best["prefix_length"], best["concurrency_threshold"],
                                  config.replication if best.get("replication") is not None else None),
        "tenants": tuned["tenants"],  # the log's tenants: how many, and one that dominates the load
        "lost_tenants": top_losers(namespaces),  # most prompt tokens their namespace's bound had and the engine not
    }


def _gains(candidate: dict, current: dict) -> tuple[float, float]:
    """(hit-rate points gained, share of P50 TTFT cut) of a candidate against the current settings."""
    points = 100.0 * (candidate["hit_rate"] - current["hit_rate"])
    ttft = 1.0 - candidate["ttft_p50_s"] / current["ttft_p50_s"] if current["ttft_p50_s"] > 0 else 0.0
    return points, ttft


def _gain_band(candidate: dict, current: dict) -> tuple[float, tuple[float, float]]:
    """(± points, (low, high) share of P50 TTFT cut) of the gains of two settings simulated on a
    sample: the ends of their bands against each other (no gain band without a sample)."""
    a, b = candidate.get("bands"), current.get("bands")
    if a is None or b is None:
        _, ttft = _gains(candidate, current)
        return 0.0, (ttft, ttft)
    (cand_low, cand_high), (cur_low, cur_high) = a["ttft_p50_s"], b["ttft_p50_s"]
    low = 1.0 - cand_high / cur_low if cur_low > 0 else 0.0
    high = 1.0 - cand_low / cur_high if cur_high > 0 else 0.0
    return 100.0 * (a["hit_rate"] + b["hit_rate"]), (low, high)


def _no_worse(candidate: dict, current: dict) -> bool:
    points, ttft = _gains(candidate, current)
    return points >= -WORSE_POINTS - 1e-9 and ttft >= -WORSE_TTFT - 1e-9


def _choose(recommended: dict, current: dict, tried: list[dict], settings: NotifySettings) -> dict:
    """What to advise: the tune rule's recommendation when it is predicted no worse than the current
    settings (hit rate and P50 TTFT both); else the tried setting that beats the current ones by
    the notification bar with the lowest P50 TTFT (then the highest hit rate); else the current ones."""
    if _no_worse(recommended, current):
        return recommended
    here = (current["prefix_length"], current["concurrency_threshold"])

    def pays(p):
        points, ttft = _gains(p, current)
        return points >= settings.gain_points - 1e-9 or ttft >= settings.ttft_gain - 1e-9

    better = [p for p in tried if (p["prefix_length"], p["concurrency_threshold"]) != here
              and _no_worse(p, current) and pays(p)]
    return min(better, key=lambda p: (round(p["ttft_p50_s"], 4), -round(p["hit_rate"], 4))) if better else current


def _above_bound(trace: Trace, measured: float | None, bound: float) -> dict | None:
    """A measured hit rate above the window's bound (which no routing can beat), and which of the two
    is off: the window (a sample of the log: cut at a bound, or lines skipped) or the bound itself."""
    if measured is None or 100.0 * (measured - bound) <= ABOVE_BOUND_POINTS:
        return None
    head = (f"the hit rate measured in production ({measured:.1%}) is above the window's bound ({bound:.1%}), "
            "which no routing can beat: ")
    skipped = trace.skipped.count
    sampled = [s for s in (trace.sampled, f"{skipped:,} line{'s' if skipped != 1 else ''} skipped" if skipped else None)
               if s]
    if sampled:
        return {"cause": "sampled", "text": head + f"the log is sampled ({'; '.join(sampled)}): requests that warmed "
                "the caches are missing from the window, so the bound and the predictions read low"}
    return {"cause": "bound", "text": head + "the model's bound is too low for this log: it assumes the caches start "
            "empty at the window's start and counts whole blocks of "
            f"{trace.block_bytes or trace.block_tokens:g} {'bytes' if trace.block_bytes else 'tokens'}, while the "
            "engines kept prefixes from before the window and cache in smaller blocks; read the predicted hit rates "
            f"as low by up to {100.0 * (measured - bound):.1f} points"}


def _settings(prefix_length: int, threshold: int, point: dict) -> dict:
    return {"prefix_length": prefix_length, "concurrency_threshold": threshold,
            "predicted_hit_rate": point["hit_rate"], "ttft_p50_s": point["ttft_p50_s"],
            "waited_share": point["waited_share"], "timeouts": point["timeouts"],
            **({"bands": point["bands"]} if "bands" in point else {})}


def notify(advice: dict, state: dict | None, after_runs: int) -> tuple[bool, dict]:
    """(notify now, the state for the next run). ``state`` is what the last run returned (None at
    first); it is plain JSON, so the function can keep it between runs.

    A recommendation that beats the current settings (``advice["better"]``) counts one run; the
    same one again counts the next; after ``after_runs`` in a row it is notified once, and not again
    while it stays the same. A different recommendation starts its own count; a run in which the
    current settings are good enough clears everything, so a later relapse is news again.
    """
    state = dict(state or {})
    if not advice["better"]:
        return False, {"recommendation": None, "runs": 0, "notified": None}
    best = advice["best"]
    key = [best["prefix_length"], best["concurrency_threshold"]]
    runs = state.get("runs", 0) + 1 if state.get("recommendation") == key else 1
    due = runs >= after_runs and state.get("notified") != key
    return due, {"recommendation": key, "runs": runs, "notified": key if due else state.get("notified")}


def metric_values(advice: dict) -> list[tuple[telemetry.MetricSpec, float]]:
    """What one run publishes (names in ``rules.telemetry``); the measured hit rate only when the
    window's log reports cached tokens."""
    values = [
        (telemetry.HIT_RATE_BOUND, advice["hit_rate_bound"]),
        (telemetry.PREDICTED_HIT_RATE, advice["current"]["predicted_hit_rate"]),
        (telemetry.BEST_PREDICTED_HIT_RATE, advice["best"]["predicted_hit_rate"]),
        (telemetry.PREFIX_REUSE_SHARE, advice["prefix_reuse_share"]),
        (telemetry.RECOMMENDED_PREFIX_LENGTH, float(advice["best"]["prefix_length"])),
        (telemetry.RECOMMENDED_CONCURRENCY_THRESHOLD, float(advice["best"]["concurrency_threshold"])),
    ]
    if advice["measured_hit_rate"] is not None:
        values.append((telemetry.MEASURED_HIT_RATE, advice["measured_hit_rate"]))
    return values


def render(advice: dict) -> str:
    """The comparison an operator reads (``advise`` on the command line, and the notification)."""
    cur, best = advice["current"], advice["best"]
    measured = advice["measured_hit_rate"]
    w = advice["window"]
    sampled = w.get("sample") or {}
    lines = [
        f"window: {w['source']}: {w['requests']:,} requests over {w['duration_s']:,.0f} s"
        + (f"; simulated on a sample of its routing keys at rate {sampled['rate']:g} ({sampled['requests']:,} "
           f"requests{', sampled in the log' if sampled.get('at_source') else ''}; each prediction with its 95 % band)"
           if sampled.get("rate", 1.0) < 1.0 else ""),
        *([f"sample: {sampled['note']}"] if sampled.get("note") else []),
        f"hit rate measured in production: {'not reported' if measured is None else f'{measured:.1%}'}; "
        f"bound (one infinite cache per tenant's namespace): {advice['hit_rate_bound']:.1%}",
    ]
    losers = advice.get("lost_tenants") or []
    if losers:
        lines.append("tenants that lost the most prompt tokens (their namespace's bound, not cached): " + "; ".join(
            f"{row['tenant']} {row['lost_tokens']:,} of {row['prompt_tokens']:,}" for row in losers))
    if advice.get("measured_above_bound"):
        lines.append(f"warning: {advice['measured_above_bound']['text']}")
    lines.append(f"now:  PrefixLength {cur['prefix_length']}, ConcurrencyThreshold {cur['concurrency_threshold']}: "
                 f"predicted hit rate {_hit(cur)}, P50 TTFT {_p50(cur)}")
    if advice.get("overloaded"):
        lines.append(f"warning: {advice['overloaded']}")
    if advice.get("kept_current"):
        lines.append("best: keep the current settings: every other setting tried is predicted worse on hit rate (by "
                     f"more than {WORSE_POINTS:g} point) or P50 TTFT (by more than {WORSE_TTFT:.0%}), or no better by "
                     "the notification bar")
    else:
        lines.append(
            f"best: PrefixLength {best['prefix_length']}, ConcurrencyThreshold {best['concurrency_threshold']}: "
            f"predicted hit rate {_hit(best)}, P50 TTFT {_p50(best)} ({_gain_text(advice)})")
    lines += [
        f"prefix reuse share: {advice['prefix_reuse_share']:.1%} of requests (the rule of thumb: above 50 %)",
    ]
    if advice["verdict"]:
        lines.append(f"verdict: {advice['verdict']['text']}")
    dominant = (advice.get("tenants") or {}).get("dominant")
    if dominant:
        lines.append(f"warning: {dominant['text']}")
    if advice["better"]:
        lines += ["", "change the stage file (config/<stage>.toml) to:", advice["snippet"].rstrip(),
                  "(a RoutingConfig change replaces the endpoint config: every copy restarts with a cold cache)"]
    elif not advice.get("kept_current"):
        lines.append("the current settings are within the notification bar of the best found: no change")
    return "\n".join(lines)


def _hit(settings: dict) -> str:
    """A setting's predicted hit rate, with its band when it was simulated on a sample."""
    bands = settings.get("bands")
    return f"{settings['predicted_hit_rate']:.1%}" + (f" ±{100 * bands['hit_rate']:.1f} points" if bands else "")


def _p50(settings: dict) -> str:
    """A setting's predicted P50 TTFT, with its band (low–high) when it was simulated on a sample."""
    bands = settings.get("bands")
    if not bands:
        return _ms(settings["ttft_p50_s"])
    low, high = bands["ttft_p50_s"]
    return f"{_ms(settings['ttft_p50_s'])} ({_ms(low).removesuffix(' ms')}–{_ms(high)})"


def _gain_text(advice: dict) -> str:
    """The best setting's gains on the current ones, with their bands from a sample."""
    band = advice.get("gain_band")
    if not band:
        return f"{advice['gain_points']:+.1f} points, P50 {-advice['ttft_gain']:+.0%}"
    low, high = band["ttft_gain"]
    return (f"{advice['gain_points']:+.1f} ±{band['points']:.1f} points, P50 {-advice['ttft_gain']:+.0%} "
            f"({-high:+.0%} to {-low:+.0%})")


def _ms(seconds: float) -> str:
    return "n/a" if not math.isfinite(seconds) else f"{seconds * 1000:,.0f} ms"
