"""Per-tenant figures of a run: requests, served, throttled, P50/P90 TTFT, goodput; and their table.

Computed from what the simulator recorded (:class:`~prefix_routing.lab.tenant_sim.TenantBook`):
TTFT percentiles over a tenant's served requests (from the attempt admitted), goodput as the output
tokens of its served requests per second of the run (first arrival to last token, the span the
run's own throughput uses, so the tenants' goodputs add up to it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

from prefix_routing.lab.percentiles import percentiles

#: Tenants shown one per line in the text table; the others are summed into one line.
SHOWN = 10


def tenant_rows(book, ttft: Sequence[float], ok: Sequence[bool], outputs: Sequence[float], span_s: float) -> list[dict]:
    """One row per tenant, most requests first (then by name)."""
    served_ttft: dict[int, list[float]] = defaultdict(list)
    goodput: dict[int, float] = defaultdict(float)
    failed: dict[int, int] = defaultdict(int)
    for t, latency, good, out in zip(book.tenant_of, ttft, ok, outputs):
        if good:
            served_ttft[t].append(latency)
            goodput[t] += out
        else:
            failed[t] += 1
    throttled: dict[int, dict[str, int]] = defaultdict(dict)
    for (t, limit), count in book.throttled.items():
        throttled[t][limit] = count
    rows = []
    for t, name in enumerate(book.names):
        p = percentiles(served_ttft[t], (50, 90)) if served_ttft[t] else {"p50": None, "p90": None}
        rows.append({
            "tenant": name,
            "requests": book.sent[t],
            "served": len(served_ttft[t]),
            "throttled": sum(throttled[t].values()),  # 429 answers (a retried request may get several)
            "throttled_by": dict(sorted(throttled[t].items())),
            "dropped": book.dropped[t],  # never served: refused and not retried (open loop), or given up
            "failed": failed[t],  # admitted, but no first token in time (or no copy serving)
            "ttft_p50_s": p["p50"],
            "ttft_p90_s": p["p90"],
            "goodput_tok_s": goodput[t] / span_s if span_s > 0 else 0.0,
            "retry_wait_s": book.waited_s[t],
        })
    rows.sort(key=lambda r: (-r["requests"], r["tenant"]))
    return rows


def _others(rows: list[dict]) -> dict:
    """The tenants not shown, summed (their TTFT percentiles are not: n/a)."""
    return {
        "tenant": f"{len(rows)} more tenants",
        "requests": sum(r["requests"] for r in rows),
        "served": sum(r["served"] for r in rows),
        "throttled": sum(r["throttled"] for r in rows),
        "ttft_p50_s": None,
        "ttft_p90_s": None,
        "goodput_tok_s": math.fsum(r["goodput_tok_s"] for r in rows),
    }


def tenant_table(strategy: str, rows: list[dict]) -> str:
    """The text table of one strategy's tenants (the first :data:`SHOWN`, then the rest summed)."""
    shown = rows if len(rows) <= SHOWN + 1 else rows[:SHOWN] + [_others(rows[SHOWN:])]
    width = max(12, *(len(r["tenant"]) for r in shown)) + 2

    def ms(value):
        return "n/a" if value is None else f"{value * 1000:,.0f}"

    lines = [f"per tenant ({strategy}):",
             f"  {'tenant':<{width}}{'requests':>10}{'served':>10}{'throttled':>11}{'P50 ms':>10}{'P90 ms':>10}"
             f"{'goodput tok/s':>15}"]
    for r in shown:
        lines.append(f"  {r['tenant']:<{width}}{r['requests']:>10,}{r['served']:>10,}{r['throttled']:>11,}"
                     f"{ms(r['ttft_p50_s']):>10}{ms(r['ttft_p90_s']):>10}{r['goodput_tok_s']:>15,.0f}")
    return "\n".join(lines)
