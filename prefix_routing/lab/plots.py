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
