"""The numbers: percentiles, the summary, the JSON and Markdown reports and the plots of one run."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from prefix_routing.loadtest.runner import LoadResult
from prefix_routing.rules.errors import UserError


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks; None if empty."""
    data = sorted(v for v in values if v is not None and not math.isnan(v))
    if not data:
        return None
    if len(data) == 1:
        return data[0]
    position = (len(data) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (position - low)


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def summarize(result: LoadResult) -> dict[str, Any]:
    """The summary block of the report. Latency figures are over succeeded requests."""
    rows = result.results
    ok = [r for r in rows if r.ok]
    errors = Counter(r.error_kind for r in rows if not r.ok)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2es = [r.e2e_s for r in ok if r.e2e_s is not None]
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    with_usage = [r for r in ok if r.prompt_tokens is not None]
    prompt = sum(r.prompt_tokens or 0 for r in with_usage)
    cached = sum(r.cached_tokens or 0 for r in with_usage if r.cached_tokens is not None)
    decode = [
        (r.output_tokens - 1) / (r.e2e_s - r.ttft_s)
        for r in ok
        if r.output_tokens and r.output_tokens > 1 and r.ttft_s is not None and r.e2e_s and r.e2e_s > r.ttft_s
    ]
    lags = [r.start_s - r.scheduled_s for r in rows if r.scheduled_s is not None]
    summary: dict[str, Any] = {
        "requests_sent": len(rows),
        "succeeded": len(ok),
        "failed": len(rows) - len(ok),
        "errors_by_kind": dict(sorted(errors.items())),
        "error_rate": _round((len(rows) - len(ok)) / len(rows), 4) if rows else None,
        "attempts": sum(r.attempts for r in rows),
        "skipped_not_sent": len(result.skipped),
        "duration_s": _round(result.duration_s, 3),
        "stopped_by": result.stopped_by,
        "achieved_rate_rps": _round(len(rows) / result.duration_s, 3) if result.duration_s > 0 else None,
    }
    for name, values in (("ttft", ttfts), ("e2e", e2es)):
        for q in (50, 90, 99):
            summary[f"{name}_p{q}_s"] = _round(percentile(values, q))
        summary[f"{name}_mean_s"] = _round(sum(values) / len(values)) if values else None
        summary[f"{name}_max_s"] = _round(max(values)) if values else None
    summary.update(
        {
            "output_tokens": out_tokens,
            "output_tokens_per_s": _round(out_tokens / result.duration_s, 3) if result.duration_s > 0 else None,
            "decode_tokens_per_s_p50": _round(percentile(decode, 50), 3),
            "requests_with_usage": len(with_usage),
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "hit_rate": _round(cached / prompt, 4) if prompt else None,
            "request_ids_seen": sum(1 for r in rows if r.request_id),
            "client_cpu_utilization": _round(result.client_cpu_s / result.duration_s, 3)
            if result.client_cpu_s is not None and result.duration_s > 0 else None,
            "client_overhead_p50_s": _round(percentile([r.client_overhead_s for r in rows
                                                        if r.client_overhead_s is not None], 50)),
            "schedule_lag_p50_s": _round(percentile(lags, 50)),
            "schedule_lag_max_s": _round(max(lags)) if lags else None,
        }
    )
    return summary


def report_dict(result: LoadResult) -> dict[str, Any]:
    """The whole JSON report: summary, configuration, notes, skipped bodies and one row per request."""
    return {
        "summary": summarize(result),
        "config": result.config,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(result.started_at)),
        "notes": result.notes,
        "skipped": [{"source": s, "reason": r} for s, r in result.skipped],
        "requests": [dataclasses.asdict(r) | {"hit_rate": _round(r.hit_rate, 4)} for r in result.results],
    }


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value * 1000:.1f} ms" if value < 10 else f"{value:.2f} s"


def render_markdown(result: LoadResult, plots: Sequence[str] = ()) -> str:
    s = summarize(result)
    cfg = result.config
    lines = [
        "# Load test report",
        "",
        f"Target: {cfg.get('target_description', cfg.get('target', '?'))}  ",
        f"Source: {cfg.get('source', '?')}  ",
        f"Started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(result.started_at))}, "
        f"ran {s['duration_s']} s, stopped by {s['stopped_by']}.",
        "",
        "| requests sent | succeeded | failed | attempts | achieved rate |",
        "| ---: | ---: | ---: | ---: | ---: |",
        f"| {s['requests_sent']} | {s['succeeded']} | {s['failed']} | {s['attempts']} | "
        f"{s['achieved_rate_rps'] if s['achieved_rate_rps'] is not None else '–'} req/s |",
        "",
        "| measure | P50 | P90 | P99 | mean | max |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, label in (("ttft", "TTFT (client)"), ("e2e", "end-to-end latency")):
        lines.append(
            f"| {label} | {_fmt_s(s[f'{name}_p50_s'])} | {_fmt_s(s[f'{name}_p90_s'])} | "
            f"{_fmt_s(s[f'{name}_p99_s'])} | {_fmt_s(s[f'{name}_mean_s'])} | {_fmt_s(s[f'{name}_max_s'])} |"
        )
    hit = f"{s['hit_rate']:.1%}" if s["hit_rate"] is not None else "– (no usage in the answers)"
    lines += [
        "",
        f"- Output tokens: {s['output_tokens']:,} ({s['output_tokens_per_s'] or 0:,.1f} tokens/s overall; "
        f"per-request decode P50 {s['decode_tokens_per_s_p50'] or 0:,.1f} tokens/s)",
        f"- Cache hit rate (cached ÷ prompt tokens, {s['requests_with_usage']} answers with usage): {hit}",
    ]
    if s["errors_by_kind"]:
        lines += ["", "## Errors", "", "| kind | count | example |", "| --- | ---: | --- |"]
        examples: dict[str, str] = {}
        for r in result.results:
            if not r.ok and r.error_kind not in examples:
                examples[r.error_kind] = (r.error_detail or "").replace("|", "\\|")[:120]
        for kind, count in s["errors_by_kind"].items():
            lines.append(f"| {kind} | {count} | {examples.get(kind, '')} |")
    if result.skipped:
        lines += ["", f"{len(result.skipped)} bodies were not sent (could not be prepared), e.g. "
                      f"{result.skipped[0][0]}: {result.skipped[0][1]}"]
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in result.notes]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots]
    return "\n".join(lines) + "\n"


def plot(result: LoadResult, out_dir: str) -> list[str]:
    """``ttft_cdf.png`` and ``latency_over_time.png`` (matplotlib, Agg); the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in result.results if r.ok]
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ttfts = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    if ttfts:
        ys = [(i + 1) / len(ttfts) for i in range(len(ttfts))]
        ax.step([t * 1000 for t in ttfts], ys, where="post")
        for q in (50, 90, 99):
            value = percentile(ttfts, q)
            ax.axvline(value * 1000, linestyle=":", color="grey")
            ax.annotate(f"P{q}", (value * 1000, q / 100), textcoords="offset points", xytext=(3, -10), fontsize=8)
    else:
        ax.text(0.5, 0.5, "no successful request", ha="center", transform=ax.transAxes)
    ax.set_xlabel("time to first token (ms, client side)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title("TTFT CDF")
    ax.grid(alpha=0.3)
    path = os.path.join(out_dir, "ttft_cdf.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    if ok:
        ax.scatter([r.start_s for r in ok], [(r.e2e_s or 0) * 1000 for r in ok], s=8, label="end-to-end", alpha=0.6)
        timed = [r for r in ok if r.ttft_s is not None]
        ax.scatter([r.start_s for r in timed], [r.ttft_s * 1000 for r in timed], s=8, label="TTFT", alpha=0.6)
    failed = [r for r in result.results if not r.ok]
    if failed:
        ax.scatter([r.start_s for r in failed], [(r.e2e_s or 0) * 1000 for r in failed], s=14, marker="x",
                   color="red", label="failed")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("Latency over time")
    ax.grid(alpha=0.3)
    if ok or failed:
        ax.legend(loc="upper left", fontsize=8)
    path = os.path.join(out_dir, "latency_over_time.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths


def write_reports(result: LoadResult, out_dir: str, *, plots: bool = True) -> dict[str, str]:
    """Write ``report.json``, ``report.md`` and (``plots``) the PNGs into ``out_dir``; their paths."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as error:
        raise UserError(f"--out {out_dir}: cannot create the directory: {error.strerror or error}") from None
    written: dict[str, str] = {}
    pngs = plot(result, out_dir) if plots else []
    for path in pngs:
        written[os.path.splitext(os.path.basename(path))[0]] = path
    json_path = os.path.join(out_dir, "report.json")
    with open(json_path, "w", encoding="utf-8") as handle:
        json.dump(report_dict(result), handle, indent=2, ensure_ascii=False)
        handle.write("\n")
    md_path = os.path.join(out_dir, "report.md")
    with open(md_path, "w", encoding="utf-8") as handle:
        handle.write(render_markdown(result, pngs))
    written["json"], written["markdown"] = json_path, md_path
    return written
