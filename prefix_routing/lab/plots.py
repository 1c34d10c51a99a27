"""PNGs of simulations and tuning grids (matplotlib, Agg backend, imported only when plotting)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from prefix_routing.lab.simulate import SimResult


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
    scaled = [r for r in results if r.autoscaling]
    if scaled:
        paths.append(_plot_autoscaling(scaled, out / "copies_over_time.png", plt))
    return paths


def _plot_autoscaling(results: Sequence[SimResult], path: Path, plt) -> Path:
    return _save(autoscaling_figure(results, plt), path, plt)


def autoscaling_figure(results: Sequence[SimResult], plt):
    """Copies (provisioned, serving) and per-copy load over time, per strategy, with the hotspot
    threshold: one colour per strategy in both panels (line styles tell the series apart)."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for j, r in enumerate(results):
        color = f"C{j}"
        rows = r.autoscaling["copies_over_time"]
        minutes = [row["t_s"] / 60 for row in rows]
        top.step(minutes, [row["provisioned"] for row in rows], where="post", color=color,
                 label=f"{r.strategy}: provisioned")
        top.step(minutes, [row["serving"] for row in rows], where="post", linestyle="--", color=color,
                 label=f"{r.strategy}: serving")
        bottom.plot(minutes, [row["busiest_copy"] for row in rows], color=color, label=f"{r.strategy}: busiest copy")
        bottom.plot(minutes, [row["concurrency_per_copy"] for row in rows], color=color, alpha=0.5,
                    linestyle=":", label=f"{r.strategy}: mean per copy")
    threshold = results[0].autoscaling["hotspot_threshold"]
    bottom.axhline(threshold, color="red", linewidth=0.8, label=f"hotspot threshold ({threshold:g})")
    top.set_ylabel("copies")
    top.set_title("Copy autoscaling: copies and per-copy load (1-minute means)")
    bottom.set_ylabel("requests in flight per copy")
    bottom.set_xlabel("simulated time (min)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def plot_tune(result: dict, out_dir: str | Path) -> list[Path]:
    """Heatmap of P50 TTFT over PrefixLength × ConcurrencyThreshold, hit rate in each cell."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [_save(tune_figure(result, plt), out / "tune_heatmap.png", plt)]


def tune_figure(result: dict, plt):
    """The heatmap; the recommended cell framed in red, its text bold, and a legend that says so."""
    import numpy as np
    from matplotlib.patches import Rectangle

    pls, ths = result["prefix_lengths"], result["thresholds"]
    # One cell per PrefixLength × threshold: the points without replication when it was swept too.
    grid = {(p["prefix_length"], p["concurrency_threshold"]): p for p in result["points"] if not p.get("replication")}
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
    chosen = (rec["prefix_length"], rec["concurrency_threshold"])
    for i, pl in enumerate(pls):
        for j, t in enumerate(ths):
            p = grid[(pl, t)]
            color = "black" if norm(ttft[i, j]) < 0.5 else "white"
            ax.text(j, i, f"{p['hit_rate']:.0%}\n{p['max_mean_requests']:.2f}", ha="center", va="center",
                    fontsize=8 if (pl, t) == chosen else 7, color=color,
                    fontweight="bold" if (pl, t) == chosen else "normal")
    if chosen in grid and chosen[0] in pls and chosen[1] in ths:
        i, j = pls.index(chosen[0]), ths.index(chosen[1])
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=3,
                               label=f"recommended: {chosen[0]} bytes, threshold {chosen[1]}"))
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=8, frameon=False)
    ax.set_title("P50 TTFT; cells: hit rate, max/mean requests", fontsize=9, pad=22)
    return fig


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
