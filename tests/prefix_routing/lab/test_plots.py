"""The PNGs' legibility: one colour per strategy across the autoscaling panels, and a recommended cell
that stands out in the tune heatmap (prefix_routing/lab/plots.py)."""

from __future__ import annotations

import pytest

from prefix_routing import lab
from prefix_routing.lab import plots
from prefix_routing.lab.autoscaling import AutoscalingSettings
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.workloads import LongContextSpec, long_context_workload


@pytest.fixture(scope="module")
def plt():
    return plots._pyplot()


def test_each_strategy_keeps_one_colour_in_both_autoscaling_panels(plt):
    spec = LongContextSpec(duration_s=600.0)
    config = spec.fleet_config(autoscaling=AutoscalingSettings(min_copies=1, max_copies=7))
    results = lab.simulate_many(long_context_workload(spec), config, [Strategy.PREFIX_AWARE, Strategy.RANDOM],
                                progress=False)
    fig = plots.autoscaling_figure(results, plt)
    try:
        colours: dict[str, set] = {}
        for ax in fig.axes:
            for line in ax.get_lines():
                strategy = line.get_label().split(":")[0]
                if strategy in ("PREFIX_AWARE", "RANDOM"):
                    colours.setdefault(strategy, set()).add(line.get_color())
        # four series per strategy (provisioned, serving; busiest, mean), all in the strategy's colour
        assert {s: len(c) for s, c in colours.items()} == {"PREFIX_AWARE": 1, "RANDOM": 1}
        assert colours["PREFIX_AWARE"] != colours["RANDOM"]
    finally:
        plt.close(fig)


def test_the_recommended_cell_is_framed_and_named_in_a_legend(plt):
    from matplotlib.patches import Rectangle

    trace = long_context_workload(LongContextSpec(duration_s=300.0))
    result = lab.tune(trace, LongContextSpec().fleet_config(), prefix_lengths=(2048, 4096, 8192),
                      thresholds=(4, 16), baselines=(), progress=False)
    rec = result["recommendation"]
    fig = plots.tune_figure(result, plt)
    try:
        ax = fig.axes[0]
        (frame,) = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_edgecolor()[:3] == (1.0, 0.0, 0.0)]
        row = result["prefix_lengths"].index(rec["prefix_length"])
        col = result["thresholds"].index(rec["concurrency_threshold"])
        assert frame.get_xy() == (col - 0.5, row - 0.5) and frame.get_linewidth() >= 3
        (label,) = [t.get_text() for t in ax.get_legend().get_texts()]
        assert label == f"recommended: {rec['prefix_length']} bytes, threshold {rec['concurrency_threshold']}"
        bold = [t for t in ax.texts if t.get_fontweight() == "bold"]
        assert len(bold) == 1 and bold[0].get_position() == (col, row)
    finally:
        plt.close(fig)
