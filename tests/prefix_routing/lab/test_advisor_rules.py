"""The advisor's rules on hand-made points (prefix_routing/lab/advisor.py): the gains, "no worse"
(within 1 point of hit rate and 5 % of P50 TTFT), the choice when the tune rule's pick is worse, the
notification rule's state, the measured-above-the-bound warning, and the notification settings."""

from __future__ import annotations

import dataclasses

import pytest

from prefix_routing.lab import advisor
from prefix_routing.lab.advisor import NotifySettings, _above_bound, _choose, _gains, _no_worse, notify
from prefix_routing.lab.traces import Trace
from prefix_routing.rules.errors import UserError


def point(prefix_length, hit, p50, threshold=10):
    return {"prefix_length": prefix_length, "concurrency_threshold": threshold, "hit_rate": hit, "ttft_p50_s": p50}


NOW = point(4096, 0.50, 1.0)


# ----------------------------------------------------------------------------- gains and "no worse"


def test_gains_are_hit_rate_points_and_the_share_of_p50_cut():
    points, ttft = _gains(point(8192, 0.56, 0.75), NOW)
    assert points == pytest.approx(6.0) and ttft == pytest.approx(0.25)
    points, ttft = _gains(point(8192, 0.45, 1.5), NOW)
    assert points == pytest.approx(-5.0) and ttft == pytest.approx(-0.5)


def test_a_current_p50_of_zero_gives_no_ttft_gain():
    assert _gains(point(8192, 0.5, 0.3), point(4096, 0.5, 0.0)) == (0.0, 0.0)


@pytest.mark.parametrize("hit, p50, no_worse", [
    (0.49, 1.0, True),  # exactly 1 point below: still no worse
    (0.4899, 1.0, False),  # more than a point below
    (0.50, 1.05, True),  # exactly 5 % slower
    (0.50, 1.0501, False),  # more than 5 % slower
    (0.60, 0.5, True),
])
def test_no_worse_allows_a_point_of_hit_rate_and_five_percent_of_p50(hit, p50, no_worse):
    assert _no_worse(point(8192, hit, p50), NOW) is no_worse
    assert (advisor.WORSE_POINTS, advisor.WORSE_TTFT) == (1.0, 0.05)


# ----------------------------------------------------------------------------- the choice


def test_a_recommendation_no_worse_than_now_is_taken_as_it_is():
    slightly = point(2048, 0.495, 1.04)
    assert _choose(slightly, NOW, [NOW, slightly], NotifySettings()) is slightly


def test_a_worse_pick_gives_way_to_the_lowest_p50_that_pays_then_the_highest_hit_rate():
    worse = point(8192, 0.40, 0.5)  # 10 points below now
    fast = point(16384, 0.51, 0.70)  # pays by TTFT (30 %)
    faster = point(32768, 0.495, 0.60)  # pays by TTFT (40 %), half a point below: no worse
    rich = point(65536, 0.60, 0.60)  # the same P50 as `faster` and a higher hit rate
    settings = NotifySettings()
    assert _choose(worse, NOW, [NOW, worse, fast], settings) is fast
    assert _choose(worse, NOW, [NOW, worse, fast, faster], settings) is faster
    assert _choose(worse, NOW, [NOW, worse, fast, faster, rich], settings) is rich


def test_a_tried_setting_pays_by_hit_rate_points_alone():
    worse = point(8192, 0.40, 0.5)
    richer = point(16384, 0.55, 1.0)  # +5 points exactly, the same P50
    assert _choose(worse, NOW, [NOW, worse, richer], NotifySettings()) is richer
    assert _choose(worse, NOW, [NOW, worse, richer], NotifySettings(gain_points=6.0)) is NOW


def test_a_tried_setting_pays_by_a_ttft_cut_at_the_bar():
    worse = point(8192, 0.40, 0.5)
    faster = point(16384, 0.50, 0.8)  # 20 % off P50 exactly
    assert _choose(worse, NOW, [NOW, worse, faster], NotifySettings()) is faster
    assert _choose(worse, NOW, [NOW, worse, faster], NotifySettings(ttft_gain=0.25)) is NOW


def test_the_current_settings_are_never_the_better_setting_even_when_tried_at_another_threshold():
    # The same PrefixLength at another threshold is another setting; the current pair is excluded.
    worse = point(8192, 0.40, 0.5)
    same_pair = point(4096, 0.70, 0.5)  # would pay, but is the current pair (a second run of it)
    other_threshold = point(4096, 0.70, 0.5, threshold=20)
    assert _choose(worse, NOW, [same_pair, worse], NotifySettings()) is NOW
    assert _choose(worse, NOW, [same_pair, worse, other_threshold], NotifySettings()) is other_threshold


# ----------------------------------------------------------------------------- the notification rule


BETTER = {"better": True, "best": {"prefix_length": 8192, "concurrency_threshold": 16}}
FINE = {"better": False, "best": {"prefix_length": 4096, "concurrency_threshold": 10}}


def test_with_one_run_needed_the_first_better_advice_is_notified():
    due, state = notify(BETTER, None, after_runs=1)
    assert due is True and state == {"recommendation": [8192, 16], "runs": 1, "notified": [8192, 16]}
    due, state = notify(BETTER, state, after_runs=1)
    assert due is False and state == {"recommendation": [8192, 16], "runs": 2, "notified": [8192, 16]}


def test_a_count_below_the_runs_needed_keeps_what_was_notified_before():
    other = {"better": True, "best": {"prefix_length": 2048, "concurrency_threshold": 16}}
    state = {"recommendation": [8192, 16], "runs": 5, "notified": [8192, 16]}
    due, state = notify(other, state, after_runs=2)
    assert due is False and state == {"recommendation": [2048, 16], "runs": 1, "notified": [8192, 16]}
    due, state = notify(other, state, after_runs=2)
    assert due is True and state == {"recommendation": [2048, 16], "runs": 2, "notified": [2048, 16]}


def test_good_enough_settings_clear_the_state_whatever_it_was():
    state = {"recommendation": [8192, 16], "runs": 7, "notified": [8192, 16]}
    assert notify(FINE, state, after_runs=3) == (False, {"recommendation": None, "runs": 0, "notified": None})


def test_the_callers_state_is_not_changed():
    state = {"recommendation": [8192, 16], "runs": 1, "notified": None}
    notify(BETTER, state, after_runs=3)
    assert state == {"recommendation": [8192, 16], "runs": 1, "notified": None}


# ----------------------------------------------------------------------------- measured above the bound


def window(**extra) -> Trace:
    return Trace([0.0, 1.0], [1024, 1024], [10, 10], [[1, 2], [3, 4]], block_tokens=512, source="w", **extra)


def test_a_measured_hit_rate_within_a_point_of_the_bound_is_no_warning():
    assert _above_bound(window(), None, 0.3) is None
    assert _above_bound(window(), 0.01, 0.0) is None  # exactly one point (100 × 0.01 is 1.0 in floats)
    assert _above_bound(window(), 0.0102, 0.0)["cause"] == "bound"


def test_the_bound_warning_names_the_blocks_and_the_gap():
    above = _above_bound(window(block_bytes=2048.0), 0.5, 0.2)
    assert above["cause"] == "bound"
    assert above["text"].startswith("the hit rate measured in production (50.0%) is above the window's bound (20.0%)")
    assert "counts whole blocks of 2048 bytes" in above["text"]
    assert above["text"].endswith("read the predicted hit rates as low by up to 30.0 points")
    tokens = _above_bound(window(), 0.5, 0.2)["text"]
    assert "counts whole blocks of 512 tokens" in tokens


def test_a_sampled_window_names_the_sampling_and_the_skipped_lines():
    sampled = window(sampled="read the first 10 events only")
    sampled.skipped.add("w:1", "bad")
    sampled.skipped.add("w:2", "bad")
    above = _above_bound(sampled, 0.5, 0.2)
    assert above["cause"] == "sampled"
    assert "the log is sampled (read the first 10 events only; 2 lines skipped)" in above["text"]


# ----------------------------------------------------------------------------- the notification settings


@pytest.mark.parametrize("kwargs", [dict(gain_points=100), dict(gain_points=0.01), dict(ttft_gain=0.99),
                                    dict(after_runs=1), dict(after_runs=1000)])
def test_notify_settings_at_their_bounds(kwargs):
    NotifySettings(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(gain_points=0), r"advisor.notify_gain_points=0: allowed: a number of points above 0, at most 100"),
    (dict(gain_points=100.5), r"notify_gain_points=100.5"),
    (dict(gain_points="5"), r"notify_gain_points='5'"),
    (dict(ttft_gain=0), r"advisor.notify_ttft_gain=0: allowed: a share above 0, below 1"),
    (dict(ttft_gain=1), r"notify_ttft_gain=1:"),
    (dict(ttft_gain=None), r"notify_ttft_gain=None"),
    (dict(after_runs=1001), r"advisor.notify_after_runs=1001: allowed: an integer from 1 to 1000"),
    (dict(after_runs=True), r"notify_after_runs=True"),
    (dict(after_runs=2.0), r"notify_after_runs=2.0"),
])
def test_notify_settings_out_of_bounds(kwargs, message):
    with pytest.raises(UserError, match=message):
        NotifySettings(**kwargs)


# ----------------------------------------------------------------------------- the coordinate search


from prefix_routing.lab.fleet_config import FleetConfig  # noqa: E402
from prefix_routing.lab.routing import Strategy  # noqa: E402
from prefix_routing.lab.tune import config_snippet  # noqa: E402
from prefix_routing.lab.verdict import routing_verdict  # noqa: E402
from prefix_routing.rules.replication import ReplicationSettings  # noqa: E402


def sim_point(prefix_length, threshold, hit, p50, *, waited=0.0, timeouts=0, replication=None):
    return {"prefix_length": prefix_length, "concurrency_threshold": threshold, "hit_rate": hit, "ttft_p50_s": p50,
            "waited_share": waited, "timeouts": timeouts, "replication": replication}


RANDOM = {"strategy": "RANDOM", "hit_rate": 0.10, "ttft_p50_s": 2.0}


class FakeTune:
    """tune() answering from a table {(PrefixLength, threshold): point}; records every call. The
    recommendation is the table's ``pick`` per call (by PrefixLength for the first, threshold for the second)."""

    def __init__(self, table, picks):
        self.table, self.picks, self.calls = table, list(picks), []

    def __call__(self, trace, config, *, prefix_lengths, thresholds, baselines, replications, reuse_share=None,
                 memo=None, speed=1.0, baseline_fleet=None, sample_rate=1.0):
        self.calls.append({"trace": trace, "config": config, "prefix_lengths": list(prefix_lengths),
                           "thresholds": list(thresholds), "baselines": tuple(baselines),
                           "replications": tuple(replications), "reuse_share": reuse_share, "memo": memo,
                           "speed": speed, "baseline_fleet": baseline_fleet, "sample_rate": sample_rate})
        points = [self.table[(pl, t)] for pl in prefix_lengths for t in thresholds]
        return {"points": points, "recommendation": self.table[self.picks.pop(0)],
                "baselines": [RANDOM] if Strategy.RANDOM in baselines else [], "tenants": TENANTS}


TENANTS = {"tenants": 3, "dominant": None}


@pytest.fixture
def searched(monkeypatch):
    def run(table, picks, config, window_trace, **kwargs):
        tune = FakeTune(table, picks)
        analyzed = []
        monkeypatch.setattr(advisor, "tune", tune)
        monkeypatch.setattr(advisor, "analyze", lambda trace, **kw: analyzed.append((trace, kw)) or {
            "prefix_reuse": 0.6, "hit_rate_bound_tokens": 0.75})
        # The advice's bound is the tenants' namespaces' (lab/losses.py), not analyze's shared one.
        monkeypatch.setattr(advisor, "namespace_bound", lambda trace: {"bound_tokens": 0.7, "tenants": []})
        return advisor.advise(window_trace, config, **kwargs), tune, analyzed
    return run


TABLE = {
    (1024, 10): sim_point(1024, 10, 0.30, 1.0), (4096, 10): sim_point(4096, 10, 0.40, 1.0, waited=0.6, timeouts=2),
    (8192, 10): sim_point(8192, 10, 0.50, 0.9), (8192, 4): sim_point(8192, 4, 0.52, 0.8),
    (8192, 16): sim_point(8192, 16, 0.49, 0.95), (8192, 2): sim_point(8192, 2, 0.60, 0.1),
}
CONFIG = FleetConfig(instances=2, prefix_length=4096, concurrency_threshold=10, block_tokens=512, block_bytes=2048)


def test_the_search_tries_every_prefix_length_at_the_current_threshold_then_every_threshold_at_the_best(searched):
    trace = window()
    advice, tune, analyzed = searched(TABLE, [(8192, 10), (8192, 4)], CONFIG, trace,
                                      prefix_lengths=(8192, 1024), thresholds=(16, 2, 4), min_threshold=4)
    first, second = tune.calls
    assert first["prefix_lengths"] == [1024, 4096, 8192] and first["thresholds"] == [10]  # the current ones added
    assert first["baselines"] == () and first["replications"] == (None,)
    assert first["config"].strategy is Strategy.PREFIX_AWARE and first["trace"] is trace
    assert second["prefix_lengths"] == [8192] and second["thresholds"] == [4, 10, 16]  # 2 is below the target
    assert second["baselines"] == (Strategy.RANDOM,) and second["reuse_share"] == 0.6
    assert first["memo"] == {} and second["memo"] is first["memo"]  # one memo: no setting simulated twice
    assert analyzed == [(trace, {"prefix_lengths": (), "group_blocks": ()})]
    # The pick (8192, 4) gains 12 points and 20 % of P50 over now (4096, 10): better.
    assert (advice["best"]["prefix_length"], advice["best"]["concurrency_threshold"]) == (8192, 4)
    assert advice["gain_points"] == pytest.approx(12.0) and advice["ttft_gain"] == pytest.approx(0.2)
    assert advice["better"] is True and advice["kept_current"] is False
    assert advice["current"] == {"prefix_length": 4096, "concurrency_threshold": 10, "predicted_hit_rate": 0.40,
                                 "ttft_p50_s": 1.0, "waited_share": 0.6, "timeouts": 2}
    assert advice["best"] == {"prefix_length": 8192, "concurrency_threshold": 4, "predicted_hit_rate": 0.52,
                              "ttft_p50_s": 0.8, "waited_share": 0.0, "timeouts": 0}
    assert advice["window"] == {"source": "w", "requests": 2, "duration_s": trace.duration_s}
    assert (advice["hit_rate_bound"], advice["prefix_reuse_share"], advice["measured_hit_rate"]) == (0.7, 0.6, None)
    assert advice["measured_above_bound"] is None
    assert advice["overloaded"] == advisor.overload_text(0.6, 2, 2, 60.0)  # the current settings' figures
    assert advice["verdict"] == routing_verdict(prefix_aware=TABLE[(8192, 4)], random=RANDOM, reuse_share=0.6)
    assert advice["snippet"] == config_snippet(8192, 4)
    assert advice["tenants"] is TENANTS


def test_a_current_threshold_below_the_target_is_still_tried(searched):
    config = FleetConfig(instances=2, prefix_length=4096, concurrency_threshold=2, block_tokens=512)
    table = {**TABLE, (4096, 2): sim_point(4096, 2, 0.40, 1.0), (8192, 2): sim_point(8192, 2, 0.41, 0.99),
             (4096, 4): sim_point(4096, 4, 0.39, 1.0), (4096, 16): sim_point(4096, 16, 0.38, 1.0)}
    advice, tune, _ = searched(table, [(4096, 2), (4096, 2)], config, window(), prefix_lengths=(8192,),
                               thresholds=(4, 16), min_threshold=4)
    assert tune.calls[0]["thresholds"] == [2] and tune.calls[1]["thresholds"] == [2, 4, 16]
    assert tune.calls[1]["prefix_lengths"] == [4096]
    assert advice["kept_current"] is True and advice["better"] is False
    assert (advice["gain_points"], advice["ttft_gain"]) == (0.0, 0.0)


def test_a_pick_within_the_bar_is_advised_but_not_better(searched):
    table = {(4096, 10): sim_point(4096, 10, 0.40, 1.0), (8192, 10): sim_point(8192, 10, 0.44, 0.85)}
    advice, _, _ = searched(table, [(8192, 10), (8192, 10)], CONFIG, window(), prefix_lengths=(8192,),
                            thresholds=(10,))
    assert advice["kept_current"] is False and advice["better"] is False  # +4 points, 15 %: under the bar
    assert "within the notification bar" in advisor.render(advice)
    settings = NotifySettings(gain_points=4.0)
    advice, _, _ = searched(table, [(8192, 10), (8192, 10)], CONFIG, window(), prefix_lengths=(8192,),
                            thresholds=(10,), settings=settings)
    assert advice["better"] is True  # +4 points meets a bar of 4


def test_the_snippet_carries_the_deployed_replication_when_the_best_point_replicates(searched):
    replication = ReplicationSettings(enabled=True, max_replicas=4)
    config = FleetConfig(instances=2, prefix_length=4096, concurrency_threshold=10, block_tokens=512,
                         replication=replication)
    table = {(4096, 10): sim_point(4096, 10, 0.40, 1.0, replication="on"),
             (8192, 10): sim_point(8192, 10, 0.55, 0.7, replication="on")}
    advice, tune, _ = searched(table, [(8192, 10), (8192, 10)], config, window(), prefix_lengths=(8192,),
                               thresholds=(10,))
    assert tune.calls[0]["replications"] == (replication,) == tune.calls[1]["replications"]
    assert advice["snippet"] == config_snippet(8192, 10, replication)


def test_a_window_without_requests_is_refused():
    empty = Trace([], [], [], [], source="cloudwatch:g")
    with pytest.raises(UserError, match="^cloudwatch:g: the window has no requests$"):
        advisor.advise(empty, CONFIG)


def test_a_pick_that_cuts_p50_by_exactly_the_bar_is_better_on_ttft_alone(searched):
    table = {(4096, 10): sim_point(4096, 10, 0.40, 1.0), (8192, 10): sim_point(8192, 10, 0.40, 0.8)}
    advice, _, _ = searched(table, [(8192, 10), (8192, 10)], CONFIG, window(), prefix_lengths=(8192,),
                            thresholds=(10,))
    assert advice["gain_points"] == 0.0 and advice["ttft_gain"] == pytest.approx(0.2)
    assert advice["better"] is True  # 20 % off P50 meets the 20 % bar


def many_keys_window(keys: int = 5000) -> Trace:
    """A window of ``keys`` routing keys alike (one request each): ``keys`` effective keys."""
    return Trace([float(i) for i in range(keys)], [1024] * keys, [10] * keys, [[10 * i, 10 * i + 1] for i in range(keys)],
                 block_tokens=512, source="w")


def test_a_sampled_search_runs_the_grid_on_whole_copies_and_random_on_every_copy_scaled(searched):
    # 100 instances at rate 0.1 (a window already sampled at the source, 5,000 keys): PREFIX_AWARE's
    # grid on 10 instances, each copy whole, at the whole's clock; RANDOM, which spreads a key over
    # every copy, on all 100 with each copy's cache x 0.1 and the clock x 10 (lab/sampling.py).
    trace = many_keys_window()
    config = dataclasses.replace(CONFIG, instances=100)
    advice, tune, _ = searched(TABLE, [(8192, 10), (8192, 4)], config, trace, prefix_lengths=(8192, 1024),
                               thresholds=(4,), sample=0.1, presampled=True)
    first, second = tune.calls
    for call in (first, second):
        assert (call["config"].instances, call["config"].cache_scale, call["speed"]) == (10, 1.0, 1.0)
        assert call["trace"] is trace and call["sample_rate"] == 0.1  # sampled at the source: not sampled again
    base, speed = second["baseline_fleet"]
    assert (base.instances, base.cache_scale, speed) == (100, 0.1, pytest.approx(10.0))
    assert advice["window"]["sample"] == {"rate": 0.1, "requests": len(trace), "at_source": True,
                                          "hit_rate_band": None}  # (the fake tune's points carry no bands)


def test_a_sample_whose_error_is_not_bounded_runs_the_whole_window_or_advises_no_change(searched):
    # A window of 2 keys read whole at 0.1: the whole window runs instead, and says why.
    advice, tune, _ = searched(TABLE, [(8192, 10), (8192, 2)], CONFIG, window(), prefix_lengths=(8192,),
                               thresholds=(2,), sample=0.1)
    assert all(call["sample_rate"] == 1.0 and call["config"].instances == 2 for call in tune.calls)
    sample = advice["window"]["sample"]
    assert (sample["rate"], sample["asked"], sample["bounded"]) == (1.0, 0.1, True)
    assert sample["note"].startswith("--sample 0.1: ran the whole trace instead: 2 instances at rate 0.1 leave 1")
    assert advice["better"] is True  # +20 points, measured on the whole window
    # The same window sampled at the source has no whole to fall back on: its figures stand, unbounded,
    # and no change is advised from them.
    advice, tune, _ = searched(TABLE, [(8192, 10), (8192, 2)], CONFIG, window(), prefix_lengths=(8192,),
                               thresholds=(2,), sample=0.1, presampled=True)
    assert advice["window"]["sample"]["bounded"] is False and advice["better"] is False
    assert "sample: sampled at 0.1 at the source, and not bounded: 2 instances at rate 0.1 leave 1" in advisor.render(advice)


def banded(point: dict, hit_band: float, p50_band: tuple[float, float]) -> dict:
    return {**point, "bands": {"hit_rate": hit_band, "ttft_p50_s": p50_band}}


def test_from_a_sample_a_change_must_clear_the_bar_at_the_low_end_of_its_band(searched):
    # Now 40 % ± 1 point, best 50 % ± 1 point: +10 ± 2 points clears a 5-point bar; at ± 3 points
    # each, +10 ± 6 points does not (4 points at its low end), nor does P50 (0.9 s within 0.8–1.1
    # against 1.0 within 0.8–1.2: at best 1 − 0.8/1.2 = 33 % faster, at worst 1 − 1.1/0.8 = −38 %).
    config = dataclasses.replace(CONFIG, instances=100)
    for band, better in ((0.01, True), (0.03, False)):
        table = {(4096, 10): banded(TABLE[(4096, 10)], band, (0.8, 1.2)),
                 (8192, 10): banded(sim_point(8192, 10, 0.50, 0.9), band, (0.8, 1.1))}
        advice, _, _ = searched(table, [(8192, 10), (8192, 10)], config, many_keys_window(), prefix_lengths=(8192,),
                                thresholds=(10,), sample=0.1, presampled=True)
        assert advice["better"] is better, band
        assert advice["gain_band"]["points"] == pytest.approx(200 * band)
        assert advice["gain_band"]["ttft_gain"] == [pytest.approx(1 - 1.1 / 0.8), pytest.approx(1 - 0.8 / 1.2)]
    text = advisor.render(advice)
    assert "now:  PrefixLength 4096, ConcurrencyThreshold 10: predicted hit rate 40.0% ±3.0 points, P50 TTFT 1,000 ms (800–1,200 ms)" in text
    assert "predicted hit rate 50.0% ±3.0 points, P50 TTFT 900 ms (800–1,100 ms) (+10.0 ±6.0 points, P50 -10% (-33% to +38%))" in text




def test_the_gains_band_needs_both_settings_banded_and_has_no_ratio_to_zero():
    plain, other = sim_point(4096, 10, 0.40, 1.0), sim_point(8192, 10, 0.50, 0.8)
    # Without bands on both (a whole window, or one setting not simulated on the sample): no band.
    assert advisor._gain_band(other, plain) == (0.0, (pytest.approx(0.2), pytest.approx(0.2)))
    assert advisor._gain_band(banded(other, 0.01, (0.7, 0.9)), plain) == (0.0, (pytest.approx(0.2), pytest.approx(0.2)))
    # A current P50 band at 0 ms gives no ratio: 0 at that end.
    points, (low, high) = advisor._gain_band(banded(other, 0.01, (0.7, 0.9)), banded(plain, 0.02, (0.0, 0.0)))
    assert points == pytest.approx(3.0) and (low, high) == (0.0, 0.0)
    points, (low, high) = advisor._gain_band(banded(other, 0.01, (0.7, 0.9)), banded(plain, 0.02, (0.0, 1.4)))
    assert (low, high) == (0.0, pytest.approx(0.5))  # 1 − 0.7/1.4
    _, (low, high) = advisor._gain_band(banded(other, 0.01, (0.7, 0.9)), banded(plain, 0.02, (0.0, 0.875)))
    assert high == pytest.approx(0.2)  # 1 − 0.7/0.875: a P50 under a second is a ratio like any other


def test_a_window_read_whole_and_sampled_here_is_simulated_on_its_sample_at_its_share(searched):
    # 75 instances at 0.1, a RANDOM deployment: PREFIX_AWARE's grid on 8 instances, each carrying
    # 7.5/8 of a copy's traffic, so the clock runs 8/7.5 as fast; the window sampled here by its keys
    # (40,000 keys: RANDOM's 75 copies see about 53 requests each).
    trace = many_keys_window(40_000)
    config = dataclasses.replace(CONFIG, instances=75, strategy=Strategy.RANDOM)
    advice, tune, _ = searched(TABLE, [(8192, 10), (8192, 4)], config, trace, prefix_lengths=(8192, 1024),
                               thresholds=(4,), sample=0.1)
    for call in tune.calls:
        assert call["config"].strategy is Strategy.PREFIX_AWARE and call["config"].instances == 8
        assert call["speed"] == pytest.approx(8 / 7.5) and call["sample_rate"] == 0.1
        assert "(sampled at 0.1: " in call["trace"].source and 3_700 < len(call["trace"]) < 4_300
    assert advice["window"]["sample"]["requests"] == len(tune.calls[0]["trace"])
    assert advice["lost_tenants"] == []  # (the fake bound names no tenant)


def test_the_verdicts_random_baseline_needs_its_own_requests_per_copy(searched):
    # 5,000 lines sampled at the source at 0.1 on 200 instances: 20 whole instances for PREFIX_AWARE,
    # but RANDOM on all 200 would see 25 requests a copy: not bounded, so no change is advised.
    config = dataclasses.replace(CONFIG, instances=200)
    advice, _, _ = searched(TABLE, [(8192, 10), (8192, 2)], config, many_keys_window(), prefix_lengths=(8192,),
                            thresholds=(2,), sample=0.1, presampled=True)
    assert advice["window"]["sample"]["bounded"] is False and advice["better"] is False
    assert "about 25 requests per copy" in advice["window"]["sample"]["note"]


def test_the_snippet_carries_the_deployed_replication_only_when_the_best_replicates(searched):
    replicated = ReplicationSettings(enabled=True)
    config = dataclasses.replace(CONFIG, replication=replicated)
    advice, _, _ = searched(TABLE, [(8192, 10), (8192, 2)], config, window(), prefix_lengths=(8192,), thresholds=(2,))
    assert advice["best"]["prefix_length"] == 8192 and "[normalizer.replication]" not in advice["snippet"]
    table = {**TABLE, (8192, 2): sim_point(8192, 2, 0.60, 0.1, replication=2.0)}
    advice, _, _ = searched(table, [(8192, 10), (8192, 2)], config, window(), prefix_lengths=(8192,), thresholds=(2,))
    assert "[normalizer.replication]" in advice["snippet"]


def test_without_a_scaling_target_every_threshold_from_1_is_tried(searched):
    table = {**TABLE, (8192, 1): sim_point(8192, 1, 0.50, 0.9)}
    _, tune, _ = searched(table, [(8192, 10), (8192, 10)], CONFIG, window(), prefix_lengths=(8192,), thresholds=(1,))
    assert tune.calls[1]["thresholds"] == [1, 10]
