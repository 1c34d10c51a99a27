"""The benchmark's figures beside the lab's prediction for the same workload and fleet: text and JSON."""

from __future__ import annotations

from typing import Any

from prefix_routing.benchmark.results import Figures

#: (key of Figures, label, format) in the order printed.
ROWS = (
    ("ttft_p50_ms", "TTFT P50 (ms)", "{:,.0f}"),
    ("ttft_p90_ms", "TTFT P90 (ms)", "{:,.0f}"),
    ("request_throughput_rps", "requests/s", "{:,.2f}"),
    ("output_throughput_tok_s", "output tokens/s", "{:,.0f}"),
    ("hit_rate", "hit rate (tokens)", "{:.1%}"),
    ("requests", "requests", "{:,}"),
)
HIT_RATE_NOTE = ("AIPerf measures no KV-cache hit rate; the endpoint's own is the engine's prefix-cache "
                 "metrics (detailed observability) or, through the front door, the dashboard's hit rate")


def predicted_figures(result: Any) -> Figures:
    """The lab's figures from a simulation result (``lab.SimResult``: seconds, shares)."""
    return Figures(
        ttft_p50_ms=result.ttft_p50_s * 1000,
        ttft_p90_ms=result.ttft_p90_s * 1000,
        request_throughput_rps=result.throughput_req_s,
        output_throughput_tok_s=result.throughput_tok_s,
        hit_rate=result.hit_rate,
        requests=result.requests,
    )


def difference(measured: float | None, predicted: float | None) -> float | None:
    """(measured - predicted) / predicted; None when either is unknown or the prediction is 0."""
    if measured is None or predicted is None or predicted == 0:
        return None
    return (measured - predicted) / predicted


def comparison(measured: Figures, predicted: Figures) -> dict[str, dict[str, float | None]]:
    """{figure: {measured, predicted, difference}} in ROWS order."""
    m, p = measured.as_dict(), predicted.as_dict()
    return {key: {"measured": m[key], "predicted": p[key], "difference": difference(m[key], p[key])}
            for key, _, _ in ROWS}


def _cell(fmt: str, value: float | None) -> str:
    return "n/a" if value is None else fmt.format(value)


def render_table(measured: Figures, predicted: Figures) -> str:
    rows = comparison(measured, predicted)
    lines = [f"{'':<20}{'measured (AIPerf)':>19}{'predicted (lab)':>17}{'difference':>12}"]
    for key, label, fmt in ROWS:
        row = rows[key]
        change = row["difference"]
        lines.append(f"{label:<20}{_cell(fmt, row['measured']):>19}{_cell(fmt, row['predicted']):>17}"
                     f"{'' if change is None else f'{change:+.1%}':>12}".rstrip())
    return "\n".join(lines)
