"""How far a miniature's figures may lie from the whole trace's: 95 % bands over clusters.

A miniature (lab/sampling.py) is a sample of clusters, not of requests: every request of a sampled
routing key is in it, and in a miniature of whole copies each copy is, as a whole, a draw of what
one copy of the whole fleet gets (its share of the keys, so its load and its evictions). So:

- counted by **copies**, the band covers both which keys the sample kept and how the miniature's
  few copies happened to pile them up (what a band over keys alone missed: −0.5 points against
  ±0.3 at 10 %);
- counted by **routing keys**, it covers a key that spreads over every copy (RANDOM and the other
  strategies that do not keep a key on a copy), which copies cannot show.

A run reports the wider of the two, figure by figure (:func:`wider`).

To each band is added what a miniature gets wrong however many keys it keeps (BIAS_HIT_RATE,
BIAS_TTFT). The hit rate's band is a ratio estimator's (Cochran, *Sampling Techniques*, 6.10): cached over
prompt tokens summed per cluster, with the finite-population factor 1 − R and Student's t for the
clusters' number. A percentile's band is Woodruff's (1952): the band of the share of requests at
or under the percentile, by the same estimator, read back through the sample's own percentiles.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from prefix_routing.lab.percentiles import interpolated

#: Student's t at 97.5 % for 1 to 30 degrees of freedom (any table of t); above 30: 1.96 + 2.5 / df,
#: within 0.002 of the table's.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045,
         2.042)
#: The percentiles a sampled run reports, each with its band.
BANDED_PERCENTILES = (50, 90, 99)
#: What a miniature gets wrong however many keys it keeps, added to every band: caches scaled to
#: whole blocks, queues of the same rate over a shorter run. The largest measured on the long-context
#: workload at 100 requests/s (233 copies; 5 to 20 %, two seeds, every strategy): 0.09 points of hit
#: rate and 1.9 % of a TTFT percentile (RANDOM's P99 at 10 %).
BIAS_HIT_RATE = 0.0025
BIAS_TTFT = 0.02


def t_975(clusters: int) -> float:
    """The two-sided 95 % factor for the mean of ``clusters`` clusters (Student's t, clusters − 1 df)."""
    df = clusters - 1
    if df < 1:
        return math.inf
    return T_975[df - 1] if df <= len(T_975) else 1.96 + 2.5 / df


def ratio_band(sums: Sequence[tuple[float, float]], fpc: float) -> float:
    """Half the width of the 95 % band of Σ numerator / Σ denominator over clusters (``sums``: each
    cluster's (numerator, denominator)); ``fpc``: the finite-population factor. Infinite with fewer
    than two clusters or nothing in the denominators: nothing to say about the clusters left out."""
    n = len(sums)
    total_num = math.fsum(a for a, _ in sums)
    total_den = math.fsum(b for _, b in sums)
    if n < 2 or total_den <= 0:
        return math.inf
    ratio = total_num / total_den
    spread = math.fsum((a - ratio * b) ** 2 for a, b in sums)
    variance = max(0.0, fpc) * n / (n - 1) * spread / total_den**2
    return t_975(n) * math.sqrt(variance)


def cluster_sums(clusters: Sequence[Hashable], numerators: Sequence[float],
                 denominators: Sequence[float]) -> list[tuple[float, float]]:
    """Each cluster's (Σ numerator, Σ denominator), in the order clusters first appear."""
    sums: dict = {}
    for c, a, b in zip(clusters, numerators, denominators):
        got = sums.get(c)
        sums[c] = (a, b) if got is None else (got[0] + a, got[1] + b)
    return list(sums.values())


def percentile_band(values: Sequence[float], clusters: Sequence[Hashable], q: float, fpc: float,
                    ordered: Sequence[float] | None = None) -> tuple[float, float]:
    """(low, high): the 95 % band of the ``q``-th percentile of ``values`` (Woodruff's): the share
    of values at or under the sample's percentile, its ratio band over ``clusters``, and the
    sample's percentiles at the band's ends (``ordered``: the values sorted, when the caller has them)."""
    if not len(values):
        return (0.0, 0.0)
    ordered = sorted(values) if ordered is None else ordered
    estimate = interpolated(ordered, q)
    sums = cluster_sums(clusters, [1.0 if v <= estimate else 0.0 for v in values], [1.0] * len(values))
    share = math.fsum(a for a, _ in sums) / len(values)
    half = ratio_band(sums, fpc)
    if not math.isfinite(half):
        return (-math.inf, math.inf)
    low = interpolated(ordered, max(0.0, share - half) * 100.0)
    high = interpolated(ordered, min(1.0, share + half) * 100.0)
    return (min(low, estimate), max(high, estimate))


def bands(*, cached: Sequence[float], prompts: Sequence[float], ttft: Sequence[float], served: Sequence[bool],
          clusters: Sequence[Hashable], fpc: float) -> dict:
    """The bands of a sampled run's figures, the miniature's bias (BIAS_HIT_RATE, BIAS_TTFT) added:
    ``hit_rate`` (± points as a share) over the served requests, and ``ttft_pNN_s`` (low, high) for
    each of BANDED_PERCENTILES over every request (a failed one at its timeout, as the lab counts it)."""
    ordered = sorted(ttft)
    ok = [c for c, good in zip(clusters, served) if good]
    hit = ratio_band(cluster_sums(ok, [c for c, good in zip(cached, served) if good],
                                  [p for p, good in zip(prompts, served) if good]), fpc)
    out = {"hit_rate": hit + BIAS_HIT_RATE, "clusters": len(set(clusters))}
    for q in BANDED_PERCENTILES:
        low, high = percentile_band(ttft, clusters, q, fpc, ordered)
        out[f"ttft_p{q}_s"] = (low * (1.0 - BIAS_TTFT), high * (1.0 + BIAS_TTFT))
    return out


def wider(first: dict, second: dict) -> dict:
    """Of two :func:`bands` of one run (clustered two ways), the wider of each figure's."""
    out = {"hit_rate": max(first["hit_rate"], second["hit_rate"]),
           "clusters": min(first["clusters"], second["clusters"])}
    for q in BANDED_PERCENTILES:
        (a, b), (c, d) = first[f"ttft_p{q}_s"], second[f"ttft_p{q}_s"]
        out[f"ttft_p{q}_s"] = (min(a, c), max(b, d))
    return out


def share_text(value: float, half: float) -> str:
    """A share with its band as the lab prints it: ``73.7% ±0.5%``."""
    return f"{value:.1%} ±{half:.1%}"


def ms_text(seconds: float, band: tuple[float, float]) -> str:
    """A duration in ms with its band as the lab prints it: ``107 (105–110)``."""
    low, high = band
    return f"{seconds * 1000:,.0f} ({low * 1000:,.0f}–{high * 1000:,.0f})"
