"""One verdict on whether prefix-aware routing pays, from the simulated gain against RANDOM.

The rule of thumb ("prefix-aware routing pays when more than 50 % of requests reuse a prefix") is a
proxy: on the public Mooncake trace only 44.6 % of requests reuse one, yet PREFIX_AWARE caches 59 %
of the tokens against RANDOM's 13 %. So ``analyze``, ``tune`` and the advisor decide from what the
fleet model gives (the hit-rate gain in points, the P50 TTFT gain) and show the reuse share beside
it as the rule of thumb, not as the answer.
"""

from __future__ import annotations

from prefix_routing.lab.grids import REUSE_CRITERION
from prefix_routing.lab.sample_bands import share_text

# It pays when PREFIX_AWARE caches at least this many more points of the prompt tokens than
# RANDOM, or cuts P50 TTFT by at least this share (the advisor's default notification gains).
PAYS_HIT_RATE_POINTS = 5.0
PAYS_TTFT_GAIN = 0.20


def _ratio(p50: float, base_p50: float) -> str:
    """P50 against the baseline's, as a signed change (+0 % where the baseline is 0)."""
    return format(p50 / base_p50 - 1.0 if base_p50 > 0 else 0.0, "+.0%")


def routing_verdict(*, prefix_aware: dict, random: dict, reuse_share: float) -> dict:
    """``prefix_aware`` and ``random``: simulated results with ``hit_rate`` and ``ttft_p50_s``
    (a ``SimResult.as_dict()`` or a tune point, with its ``bands`` when simulated on a sample: the
    text then gives each figure's); ``reuse_share``: requests reusing a prefix."""
    points = 100.0 * (prefix_aware["hit_rate"] - random["hit_rate"])
    base_p50, p50 = random["ttft_p50_s"], prefix_aware["ttft_p50_s"]
    ttft_gain = 1.0 - p50 / base_p50 if base_p50 > 0 else 0.0
    pays = points >= PAYS_HIT_RATE_POINTS - 1e-9 or ttft_gain >= PAYS_TTFT_GAIN - 1e-9  # at the bar: pays
    a, b = prefix_aware.get("bands"), random.get("bands")
    if a and b:  # simulated on a sample: each figure with its band, the gains the bands' ends
        (low, high), (base_low, base_high) = a["ttft_p50_s"], b["ttft_p50_s"]
        text = (
            f"prefix-aware routing {'pays' if pays else 'does not pay'} here: PREFIX_AWARE caches "
            f"{share_text(prefix_aware['hit_rate'], a['hit_rate'])} of prompt tokens against RANDOM's "
            f"{share_text(random['hit_rate'], b['hit_rate'])} ({points:+.1f} ±{100 * (a['hit_rate'] + b['hit_rate']):.1f} "
            f"points), P50 TTFT {p50 * 1000:,.0f} ms ({low * 1000:,.0f}–{high * 1000:,.0f}) against "
            f"{base_p50 * 1000:,.0f} ms ({base_low * 1000:,.0f}–{base_high * 1000:,.0f}) "
            f"({-ttft_gain:+.0%}: {_ratio(low, base_high)} to {_ratio(high, base_low)})"
        )
    else:
        text = (
            f"prefix-aware routing {'pays' if pays else 'does not pay'} here: PREFIX_AWARE caches "
            f"{prefix_aware['hit_rate']:.1%} of prompt tokens against RANDOM's {random['hit_rate']:.1%} "
            f"({points:+.1f} points), P50 TTFT {p50 * 1000:,.0f} ms against {base_p50 * 1000:,.0f} ms "
            f"({-ttft_gain:+.0%})"
        )
    if not pays:
        text += (f"; it pays from +{PAYS_HIT_RATE_POINTS:g} points or a {PAYS_TTFT_GAIN:.0%} lower P50: "
                 "RANDOM or LEAST_OUTSTANDING_REQUESTS will do as well")
    met = reuse_share > REUSE_CRITERION
    criterion = (
        f"the rule of thumb: {reuse_share:.1%} of requests reuse a prefix seen before "
        f"({'above' if met else 'not above'} its {REUSE_CRITERION:.0%}"
        + ("" if met == pays else "; the simulation decides") + ")"
    )
    return {
        "pays": pays,
        "hit_rate_gain_points": points,
        "ttft_p50_gain": ttft_gain,
        "reuse_share": reuse_share,
        "reuse_criterion_met": met,
        "text": text,
        "criterion": criterion,
    }
