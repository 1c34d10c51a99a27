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

from prefix_routing.lab.analyze import analyze
from prefix_routing.lab.common import CANDIDATE_PREFIX_LENGTHS, CANDIDATE_THRESHOLDS
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.traces import Trace
from prefix_routing.lab.tune import tune
from prefix_routing.rules import telemetry
from prefix_routing.rules.errors import UserError


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
) -> dict:
    """The advice for one window. ``config`` is the endpoint as deployed: its PrefixLength and
    ConcurrencyThreshold are the current settings (and are always among the candidates). The search
    runs about len(prefix_lengths) + len(thresholds) simulations, not their product. Thresholds
    below ``min_threshold`` (the stage's scaling target: copies must not spill before autoscaling
    adds capacity, a rule the stage file enforces) are not recommended."""
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
    by_length = tune(trace, current_config, prefix_lengths=grid_lengths,
                     thresholds=[config.concurrency_threshold], baselines=(), replications=deployed)
    current = next(p for p in by_length["points"] if p["prefix_length"] == config.prefix_length)
    tuned = tune(trace, current_config, prefix_lengths=[by_length["recommendation"]["prefix_length"]],
                 thresholds=grid_thresholds, baselines=(Strategy.RANDOM,), replications=deployed,
                 reuse_share=reuse["prefix_reuse"])
    best = tuned["recommendation"]
    gain_points = 100.0 * (best["hit_rate"] - current["hit_rate"])
    ttft_gain = 1.0 - best["ttft_p50_s"] / current["ttft_p50_s"] if current["ttft_p50_s"] > 0 else 0.0
    same = (best["prefix_length"], best["concurrency_threshold"]) == (config.prefix_length, config.concurrency_threshold)
    better = not same and (gain_points >= settings.gain_points - 1e-9 or ttft_gain >= settings.ttft_gain - 1e-9)
    return {
        "window": {"source": trace.source, "requests": len(trace), "duration_s": trace.duration_s},
        "hit_rate_bound": reuse["hit_rate_bound_tokens"],
        "prefix_reuse_share": reuse["prefix_reuse"],
        "measured_hit_rate": trace.measured_hit_rate(),
        "current": _settings(config.prefix_length, config.concurrency_threshold, current["hit_rate"], current["ttft_p50_s"]),
        "best": _settings(best["prefix_length"], best["concurrency_threshold"], best["hit_rate"], best["ttft_p50_s"]),
        "gain_points": gain_points,
        "ttft_gain": ttft_gain,
        "better": better,
        "verdict": tuned["verdict"],
        "snippet": tuned["snippet"],
    }


def _settings(prefix_length: int, threshold: int, hit_rate: float, p50_s: float) -> dict:
    return {"prefix_length": prefix_length, "concurrency_threshold": threshold,
            "predicted_hit_rate": hit_rate, "ttft_p50_s": p50_s}


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
    lines = [
        f"window: {w['source']}: {w['requests']:,} requests over {w['duration_s']:,.0f} s",
        f"hit rate measured in production: {'not reported' if measured is None else f'{measured:.1%}'}; "
        f"bound (one infinite shared cache): {advice['hit_rate_bound']:.1%}",
        f"now:  PrefixLength {cur['prefix_length']}, ConcurrencyThreshold {cur['concurrency_threshold']}: "
        f"predicted hit rate {cur['predicted_hit_rate']:.1%}, P50 TTFT {_ms(cur['ttft_p50_s'])}",
        f"best: PrefixLength {best['prefix_length']}, ConcurrencyThreshold {best['concurrency_threshold']}: "
        f"predicted hit rate {best['predicted_hit_rate']:.1%}, P50 TTFT {_ms(best['ttft_p50_s'])} "
        f"({advice['gain_points']:+.1f} points, P50 {-advice['ttft_gain']:+.0%})",
        f"prefix reuse share: {advice['prefix_reuse_share']:.1%} of requests (the brief's criterion: above 50 %)",
    ]
    if advice["verdict"]:
        lines.append(f"verdict: {advice['verdict']['text']}")
    if advice["better"]:
        lines += ["", "change the stage file (config/<stage>.toml) to:", advice["snippet"].rstrip(),
                  "(a RoutingConfig change replaces the endpoint config: every copy restarts with a cold cache)"]
    else:
        lines.append("the current settings are within the notification bar of the best found: no change")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return "n/a" if not math.isfinite(seconds) else f"{seconds * 1000:,.0f} ms"
