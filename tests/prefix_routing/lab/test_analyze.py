"""Prefix reuse and key groups of the real trace (prefix_routing.lab.analyze)."""

from __future__ import annotations

from prefix_routing import lab
from prefix_routing.lab import traces


def test_analyze_reproduces_the_trace_readme(trace):
    a = lab.analyze(trace)
    assert a["requests"] == 12_031
    assert round(a["duration_s"]) == 3_537
    assert round(a["first_block_reuse"], 4) == 0.9999
    assert round(a["hit_rate_bound"], 3) == 0.366
    groups = {g["blocks"]: g for g in a["key_groups"]}
    assert (groups[1]["distinct"], groups[1]["largest_share"]) == (1, 1.0)
    assert groups[2]["distinct"] == 7_373 and round(groups[2]["largest_share"], 4) == 0.0036
    assert groups[4]["distinct"] == 8_228
    assert groups[2]["prefix_lengths"] == [2049, 4096]
    by_length = {g["prefix_length"]: g for g in a["prefix_length_groups"]}
    assert by_length[2048]["distinct"] == 1 and by_length[4096]["distinct"] == 7_373
    assert a["prefix_reuse"] > lab.REUSE_CRITERION
    assert any("2048 bytes or less" in w and "at least 4096" in w for w in a["warnings"])


def test_analyze_warns_when_even_an_infinite_cache_would_hold_little():
    # Whether routing pays is the simulation's verdict (lab/verdict.py); analyze warns only about the bound.
    t = traces.Trace([0.0, 1.0, 2.0], [600, 600, 600], [1, 1, 1], [[1, 2], [3, 4], [5, 6]])
    a = lab.analyze(t)
    assert a["first_block_reuse"] == 0 and a["hit_rate_bound"] == 0
    assert a["warnings"] == ["even one infinite cache shared by all requests would hold only 0.0% of the blocks: "
                             "little to gain from prefix-aware routing"]
