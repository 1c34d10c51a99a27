"""The lab's rules one decision at a time, with hand-computed figures: copy autoscaling's cooldowns
and scale-in window (lab/autoscaling.py, as its docstring and stacks/constructs/copy_autoscaling.py
say), the misses ledger's classes and memory (lab/misses.py), overload and context (lab/overload.py)."""

from __future__ import annotations

import math

import pytest

from prefix_routing.lab.autoscaling import SCALE_IN_PERIODS, AutoscalingSettings, CopyPool
from prefix_routing.lab.misses import MissLedger
from prefix_routing.lab.overload import is_overloaded, prompts_beyond_context
from prefix_routing.lab.routing import spill_copy
from prefix_routing.rules.errors import UserError


def ticks(pool: CopyPool, minutes, in_flight: list[int]) -> None:
    """One tick per minute in ``minutes``, each period at constant ``in_flight`` counts."""
    for minute in minutes:
        pool.tick(minute * 60.0, in_flight)


# ----------------------------------------------------------------------------- autoscaling: scale-in


def test_scale_in_waits_for_the_scale_in_cooldown_counted_from_the_last_scale_out():
    # Target 1 per copy: 3 in flight in minute 1 want 3 copies (1 -> 3 at 60 s). Then nothing: after
    # 15 quiet minutes (at 960 s) the low alarm allows 1, but the scale-in cooldown of 1,200 s from
    # the scale-out at 60 s holds it until 1,260 s exactly.
    settings = AutoscalingSettings(target_per_copy=1.0, min_copies=1, max_copies=4, initial_copies=1,
                                   scale_in_cooldown_s=1200, scale_out_cooldown_s=60)
    pool = CopyPool(settings, 4)
    ticks(pool, [1], [3, 0, 0, 0])
    assert pool.events == [(60.0, 1, 3)]
    ticks(pool, range(2, 21), [0, 0, 0, 0])
    assert pool.events == [(60.0, 1, 3)]  # 1,140 s after the scale-out: not yet
    removed = pool.tick(21 * 60.0, [0, 0, 0, 0])
    assert pool.events == [(60.0, 1, 3), (1260.0, 3, 1)] and removed == [1, 2]
    assert pool.provisioned() == [0]


def test_scale_in_goes_only_as_low_as_the_busiest_of_the_last_fifteen_periods():
    # Four copies, target 1, no scale-in cooldown. Minute 1 has 3 in flight, minutes 2-16 have 1.
    # At 900 s the 15 periods (minutes 1-15) allow ceil(max(3, 1, ...) / 1) = 3; at 960 s minute 1
    # has left the window and they allow 1.
    settings = AutoscalingSettings(target_per_copy=1.0, min_copies=1, max_copies=4, initial_copies=4,
                                   scale_in_cooldown_s=0)
    pool = CopyPool(settings, 4)
    ticks(pool, [1], [3, 0, 0, 0])
    ticks(pool, range(2, 15), [1, 0, 0, 0])
    assert pool.events == []  # 14 periods: the low alarm has not the datapoints yet
    assert pool.tick(15 * 60.0, [1, 0, 0, 0]) == [3]
    assert pool.tick(16 * 60.0, [1, 0, 0, 0]) == [1, 2]
    assert pool.events == [(900.0, 4, 3), (960.0, 3, 1)]
    assert SCALE_IN_PERIODS == 15


def test_a_scale_in_does_not_hold_the_next_scale_out():
    # The scale-out cooldown counts from the last scale-out only: right after a scale-in (and no
    # scale-out ever), a burst scales out at once.
    settings = AutoscalingSettings(target_per_copy=1.0, min_copies=1, max_copies=4, initial_copies=4,
                                   scale_in_cooldown_s=0, scale_out_cooldown_s=600)
    pool = CopyPool(settings, 4)
    ticks(pool, range(1, 16), [1, 0, 0, 0])
    assert pool.events == [(900.0, 4, 1)]
    ticks(pool, [16], [3, 0, 0, 0])
    assert pool.events == [(900.0, 4, 1), (960.0, 1, 3)]
    assert pool.provisioned() == [0, 1, 2] and pool.serving(960.0) == [0]


def test_an_old_peak_never_scales_out_once_the_metric_wants_the_copies_there_are():
    # Target 1, scale-out cooldown 300 s. Minute 1: 2 in flight, 1 -> 2 copies. Minute 2: 3 in flight,
    # but within the cooldown. Then 2 in flight for 14 minutes: 2 copies are wanted, as there are; the
    # peak of 3 in the last 15 periods only bounds a scale-in, it never adds a copy.
    pool = CopyPool(AutoscalingSettings(target_per_copy=1.0, min_copies=1, max_copies=4, initial_copies=1,
                                        scale_out_cooldown_s=300), 4)
    ticks(pool, [1], [2, 0, 0, 0])
    ticks(pool, [2], [3, 0, 0, 0])
    ticks(pool, range(3, 17), [2, 0, 0, 0])
    assert pool.events == [(60.0, 1, 2)]


def test_the_scale_out_cooldown_is_inclusive():
    # Cooldown 120 s: after the scale-out at 60 s, the next one may come at 180 s, not later.
    settings = AutoscalingSettings(target_per_copy=1.0, max_copies=8, initial_copies=1, scale_out_cooldown_s=120)
    pool = CopyPool(settings, 8)
    ticks(pool, [1], [2, 0, 0, 0, 0, 0, 0, 0])
    ticks(pool, [2, 3], [5, 0, 0, 0, 0, 0, 0, 0])
    assert pool.events == [(60.0, 1, 2), (180.0, 2, 5)]
    assert pool.provisioned() == [0, 1, 2, 3, 4]
    assert pool.serving(180.0 + 300.0) == [0, 1, 2, 3, 4] and pool.serving(479.0) == [0, 1]


def test_target_tracking_stays_within_the_copy_bounds():
    settings = AutoscalingSettings(target_per_copy=2.0, min_copies=2, max_copies=3, initial_copies=2,
                                   scale_in_cooldown_s=0)
    pool = CopyPool(settings, 4)
    ticks(pool, [1], [20, 20, 0, 0])  # wants 20: max_copies is 3
    assert pool.events == [(60.0, 2, 3)]
    ticks(pool, range(2, 17), [0, 0, 0, 0])  # wants 0: min_copies is 2
    assert pool.events == [(60.0, 2, 3), (960.0, 3, 2)] and pool.provisioned() == [0, 1]


def test_a_whole_number_of_targets_wants_exactly_that_many_copies():
    # 8 in flight over a target of 4: ceil(2) = 2 copies, no third.
    pool = CopyPool(AutoscalingSettings(target_per_copy=4.0, max_copies=4, initial_copies=1), 4)
    ticks(pool, [1], [8, 0, 0, 0])
    assert pool.events == [(60.0, 1, 2)]


# ----------------------------------------------------------------------------- autoscaling: what it measures


def test_the_metric_is_time_averaged_over_the_period_and_normalized_by_provisioned_copies():
    # Copy 0 holds 0 requests for 30 s, then 4: an average of 2 over the minute; copy 1 holds 1.
    # Hot above 2.5 × 1: copy 0's 2 is not.
    settings = AutoscalingSettings(target_per_copy=1.0, max_copies=4, initial_copies=2, hotspot_factor=2.5)
    pool = CopyPool(settings, 4)
    pool.record(0, 30.0, 0)
    pool.tick(60.0, [4, 1, 0, 0])
    assert pool.history[0] == (60.0, 2, 2, 1.5, 2.0, False)  # (t, provisioned, serving, metric, busiest, hot)
    assert pool.events == [(60.0, 2, 3)]  # ceil(3 / 1) copies
    # Next minute: 4 and 1 all along; 3 copies provisioned (one starting): metric 5 / 3, copy 0 hot.
    pool.tick(120.0, [4, 1, 0, 0])
    assert pool.history[1][:3] == (120.0, 3, 2)
    assert pool.history[1][3] == pytest.approx(5 / 3) and pool.history[1][4:] == (4.0, True)
    assert pool.hotspot_seconds == 60.0
    assert pool.copy_seconds == 2 * 60 + 3 * 60


def test_next_start_is_the_soonest_copy_still_starting():
    pool = CopyPool(AutoscalingSettings(target_per_copy=1.0, max_copies=4, initial_copies=1, startup_s=300,
                                        scale_out_cooldown_s=60), 4)
    assert pool.next_start(0.0) == math.inf  # nothing starting
    ticks(pool, [1], [2, 0, 0, 0])  # copy 1 serves from 360
    ticks(pool, [2], [3, 0, 0, 0])  # copy 2 from 420
    assert pool.next_start(100.0) == 360.0
    assert pool.next_start(360.0) == 420.0  # serving from 360: no longer starting
    assert pool.next_start(420.0) == math.inf


def test_from_zero_a_request_that_found_no_copy_adds_one_even_within_the_cooldown():
    settings = AutoscalingSettings(target_per_copy=1.0, min_copies=0, max_copies=2, initial_copies=1,
                                   scale_in_cooldown_s=0, scale_out_cooldown_s=3600)
    pool = CopyPool(settings, 2)
    ticks(pool, [1], [2, 0])  # 1 -> 2 at 60
    ticks(pool, range(2, 17), [0, 0])  # 15 idle periods: to zero at 960
    assert pool.events[-1] == (960.0, 2, 0) and pool.provisioned() == []
    pool.no_capacity = 3
    pool.tick(17 * 60.0, [0, 0])  # within an hour of the last scale-out, yet one copy comes
    assert pool.events[-1] == (1020.0, 0, 1) and pool.no_capacity == 0
    assert pool.history[-1][1:] == (0, 0, 0.0, 0.0, False)  # no copy: metric and busiest 0, nothing hot


def test_summary_counts_hot_periods_after_the_last_scale_outs_copies_serve():
    settings = AutoscalingSettings(target_per_copy=1.0, max_copies=4, initial_copies=1, startup_s=120,
                                   hotspot_factor=2.0, scale_out_cooldown_s=60)
    pool = CopyPool(settings, 4)
    ticks(pool, [1, 2, 3, 4, 5], [3, 0, 0, 0])  # 3 > 2: hot every minute; 1 -> 3 at 60 (serve from 180)
    summary = pool.summary()
    assert summary["scale_events"] == [{"t_s": 60.0, "from": 1, "to": 3}]
    assert summary["hotspot_seconds"] == 300.0
    assert summary["hotspot_seconds_after_scaling"] == 120.0  # the periods ending at 240 and 300 (> 180)
    assert summary["hotspot_threshold"] == 2.0
    assert summary["copy_hours"] == pytest.approx((60 + 4 * 3 * 60) / 3600)
    first = summary["copies_over_time"][0]
    assert first == {"t_s": 60.0, "provisioned": 1, "serving": 1, "concurrency_per_copy": 3.0,
                     "busiest_copy": 3.0, "hot": True}


def test_without_a_scale_out_every_hot_period_counts_after_scaling():
    pool = CopyPool(AutoscalingSettings(target_per_copy=1.0, max_copies=1, initial_copies=1), 1)
    ticks(pool, [1, 2], [3])
    assert pool.summary()["hotspot_seconds_after_scaling"] == 120.0


def test_without_a_scale_out_the_first_one_second_period_counts_after_scaling_too():
    # One-second periods: the first evaluation is at t = 1 s, hot (3 > 2 × 1), and no scale-out ever.
    pool = CopyPool(AutoscalingSettings(target_per_copy=1.0, max_copies=1, initial_copies=1, period_s=1), 1)
    pool.tick(1.0, [3])
    assert pool.summary()["hotspot_seconds_after_scaling"] == 1.0


def test_the_hotspot_threshold_is_the_factor_times_the_target():
    pool = CopyPool(AutoscalingSettings(target_per_copy=4.0, hotspot_factor=3.0, max_copies=1), 1)
    assert pool.summary()["hotspot_threshold"] == 12.0
    ticks(pool, [1], [12])  # at the threshold: not above it
    ticks(pool, [2], [13])
    assert [h[-1] for h in pool.history] == [False, True]


@pytest.mark.parametrize("kwargs", [
    dict(target_per_copy=1024), dict(min_copies=0, max_copies=1), dict(min_copies=3, max_copies=3),
    dict(min_copies=0, max_copies=2, initial_copies=0), dict(min_copies=2, max_copies=5, initial_copies=5),
    dict(scale_out_cooldown_s=0, scale_in_cooldown_s=86_400, startup_s=0), dict(period_s=1), dict(period_s=3600),
])
def test_settings_at_their_bounds_are_accepted(kwargs):
    AutoscalingSettings(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(target_per_copy=1024.5), "target_per_copy=1024.5: must be more than 0, at most 1024"),
    (dict(target_per_copy=-1), "target_per_copy=-1"),
    (dict(target_per_copy="4"), "target_per_copy='4'"),
    (dict(min_copies=-1, max_copies=2), r"copies -1\.\.2: need 0 <= min <= max, max >= 1"),
    (dict(min_copies=0, max_copies=0), r"copies 0\.\.0"),
    (dict(min_copies=1.0, max_copies=2), r"copies 1.0\.\.2"),
    (dict(min_copies=2, max_copies=4, initial_copies=1), r"initial_copies=1: must be within 2\.\.4"),
    (dict(min_copies=2, max_copies=4, initial_copies=5), r"initial_copies=5: must be within 2\.\.4"),
    (dict(min_copies=0, max_copies=2, initial_copies=5), r"initial_copies=5: must be within 0\.\.2"),
    (dict(min_copies=0, max_copies=1, initial_copies=2), r"initial_copies=2: must be within 0\.\.1"),
    (dict(scale_out_cooldown_s=-1), "scale_out_cooldown_s=-1: seconds from 0 to 86400"),
    (dict(scale_in_cooldown_s=86_401), "scale_in_cooldown_s=86401"),
    (dict(startup_s=-0.5), "startup_s=-0.5"),
    (dict(period_s=0.5), "period_s=0.5: seconds from 1 to 3600"),
    (dict(period_s=3601), "period_s=3601"),
])
def test_settings_out_of_bounds_say_what_is_allowed(kwargs, message):
    with pytest.raises(UserError, match=message):
        AutoscalingSettings(**kwargs)


def test_the_start_is_the_minimum_and_at_least_one_copy():
    assert AutoscalingSettings(min_copies=0, max_copies=2).start_copies == 1
    assert AutoscalingSettings(min_copies=3, max_copies=5).start_copies == 3
    pool = CopyPool(AutoscalingSettings(min_copies=0, max_copies=2), 2)
    assert pool.provisioned() == [0] and pool.serving(0.0) == [0]


# ----------------------------------------------------------------------------- the misses ledger


def test_a_cached_request_marks_its_uncached_tail_as_seen():
    # Fully cached (200 of 200) yet one block past the cached two is new: seen from now on, so a
    # miss of it later is an eviction, not a first touch.
    ledger = MissLedger()
    ledger.book(["a", "b", "c"], 0, 2, 200, 200, 100, lambda g, rest: 0)
    assert ledger.as_dict() == {"last_block": 0, "first_touch": 0, "rekeyed": 0, "routed_away": 0, "evicted": 0}
    ledger.book(["c"], 1, 0, 100, 0, 100, lambda g, rest: 0)
    assert (ledger.first_touch, ledger.evicted) == (0, 100)


def test_the_cached_leading_blocks_are_not_asked_of_other_copies():
    # 3 blocks, the first cached here (m = 1): only b and c are looked up elsewhere; another copy
    # holds 1 of them: 100 routed away, 100 evicted.
    ledger = MissLedger()
    ledger.book(["a", "b", "c"], 0, 0, 300, 0, 100, lambda g, rest: 0)
    asked = []
    ledger.book(["a", "b", "c"], 1, 1, 300, 100, 100, lambda g, rest: asked.append(list(rest)) or 1)
    assert asked == [["b", "c"]]
    assert (ledger.routed_away, ledger.evicted) == (100, 100)


def test_routed_away_is_capped_by_the_uncached_tokens():
    # 50 uncached tokens (a partial last block) although another copy holds 2 blocks of 100.
    ledger = MissLedger()
    ledger.book(["a", "b"], 0, 0, 150, 0, 100, lambda g, rest: 0)
    ledger.book(["a", "b"], 1, 1, 150, 100, 100, lambda g, rest: 2)
    assert (ledger.routed_away, ledger.evicted) == (50, 0)


def test_first_touch_is_the_prompt_past_the_seen_blocks_and_capped_by_the_miss():
    ledger = MissLedger()
    ledger.book(["a"], 0, 0, 100, 0, 100, lambda g, rest: 0)
    # a seen (and cached here, 100 tokens); b and c new: 250 - 100 = 150 first-touch tokens.
    ledger.book(["a", "b", "c"], 0, 1, 250, 100, 100, lambda g, rest: 0)
    assert ledger.first_touch == 100 + 150 and ledger.evicted == 0
    # The engine cached more than the blocks say (10 tokens of c): the miss, 90, bounds first touch.
    ledger.book(["a", "b", "c", "d"], 0, 3, 400, 310, 100, lambda g, rest: 0)
    assert ledger.first_touch == 250 + 90


def test_a_block_seen_in_the_older_generation_is_still_seen():
    ledger = MissLedger(limit=2)
    ledger.book(["a", "b", "c"], 0, 0, 300, 0, 100, lambda g, rest: 0)  # 3 > 2: into the older generation
    assert ledger.older == {"a", "b", "c"} and ledger.seen == set()
    ledger.book(["a", "x"], 1, 0, 200, 0, 100, lambda g, rest: 0)
    assert (ledger.first_touch, ledger.evicted) == (300 + 100, 100)  # a: evicted; x: new
    assert ledger.seen == {"a", "x"}  # a generation holds what it saw, 2 is not above the limit


def test_a_rekeyed_miss_is_counted_whole_and_still_marks_the_blocks_seen():
    ledger = MissLedger()
    ledger.book(["a", "b"], 0, 0, 200, 50, 100, lambda g, rest: 0, rekeyed=True)
    assert ledger.as_dict() == {"last_block": 0, "first_touch": 0, "rekeyed": 150, "routed_away": 0, "evicted": 0}
    ledger.book(["a", "b"], 1, 0, 200, 0, 100, lambda g, rest: 0)
    assert ledger.evicted == 200 and ledger.first_touch == 0


def test_a_rest_known_partly_now_and_partly_from_the_older_generation():
    # Generation limit 2: a, b, c roll over into the older generation; then d is seen. The rest d, a, e
    # (300 tokens, none cached): d seen now, a seen before, e new: 100 first-touch, 200 evicted.
    ledger = MissLedger(limit=2)
    ledger.book(["a", "b", "c"], 0, 0, 300, 0, 100, lambda g, rest: 0)
    ledger.book(["d"], 0, 0, 100, 0, 100, lambda g, rest: 0)
    assert ledger.older == {"a", "b", "c"} and ledger.seen == {"d"}
    ledger.book(["d", "a", "e"], 0, 0, 300, 0, 100, lambda g, rest: 0)
    assert (ledger.first_touch, ledger.evicted) == (300 + 100 + 100, 200)


def test_rekeyed_misses_add_up():
    ledger = MissLedger()
    ledger.book(["a"], 0, 0, 100, 40, 100, lambda g, rest: 0, rekeyed=True)
    ledger.book(["b"], 0, 0, 100, 70, 100, lambda g, rest: 0, rekeyed=True)
    assert ledger.rekeyed == 60 + 30


def test_a_single_uncached_token_is_booked():
    ledger = MissLedger()
    ledger.book(["a"], 0, 0, 1, 0, 100, lambda g, rest: 0)  # a one-token prompt, new
    assert ledger.first_touch == 1
    ledger.book(["a"], 0, 0, 1, 0, 100, lambda g, rest: 0)  # seen, held nowhere: one token evicted
    assert ledger.as_dict() == {"last_block": 0, "first_touch": 1, "rekeyed": 0, "routed_away": 0, "evicted": 1}


def test_with_every_block_seen_nothing_is_a_first_touch_not_even_tokens_past_the_blocks():
    # First touch is new blocks only: the 50 tokens past a's and b's 200 belong to no block, and with
    # a and b seen (b cached nowhere) the whole 150-token miss is evicted.
    ledger = MissLedger()
    ledger.book(["a", "b"], 0, 0, 200, 0, 100, lambda g, rest: 0)
    ledger.book(["a", "b"], 0, 1, 250, 100, 100, lambda g, rest: 0)
    assert (ledger.first_touch, ledger.evicted) == (200, 150)


def test_a_new_partial_block_counts_the_tokens_it_holds_even_under_one():
    # Blocks of 2.4 tokens, a 5-token prompt in 3 blocks: a and b seen (4.8 tokens), c new with 0.2.
    # Only a is cached: of the 2.6 uncached tokens, 0.2 are a first touch and b's 2.4 evicted.
    ledger = MissLedger()
    ledger.book(["a", "b"], 0, 0, 4.8, 0, 2.4, lambda g, rest: 0)
    ledger.book(["a", "b", "c"], 0, 1, 5, 2.4, 2.4, lambda g, rest: 0)
    assert ledger.first_touch == pytest.approx(4.8 + 0.2) and ledger.evicted == pytest.approx(2.4)


# ----------------------------------------------------------------------------- overload and context


def test_overloaded_is_any_timeout_or_half_the_requests_waiting():
    assert is_overloaded(0.5, 0) and is_overloaded(0.0, 1)
    assert not is_overloaded(0.49, 0)


def test_a_prompt_of_a_slots_context_or_more_is_refused():
    assert prompts_beyond_context([100, 4095, 4096, 5000], 4096) == 2
    assert prompts_beyond_context([], 4096) == 0


# ----------------------------------------------------------------------------- ConcurrencyThreshold's spill


@pytest.mark.parametrize("out, home, copies, spill", [
    # The home's instance first, even when another instance is idle; in order from the home copy:
    ([3, 3, 1, 1, 0, 0, 0, 0], 1, 4, 2),  # 2 and 3 both at 1: 2 comes first after 1
    ([1, 2, 3, 1, 0, 0, 0, 0], 2, 4, 3),  # from copy 2: 3, then 0 (also 1, not less), then 1
    ([1, 3, 3, 3, 0, 0, 0, 0], 2, 4, 0),  # wraps round the instance to copy 0
    ([2, 1, 3, 0, 0, 0, 0, 0], 0, 4, 3),  # the least loaded of the instance, not the first below
])
def test_a_busy_home_spills_to_its_own_instance_first(out, home, copies, spill):
    assert spill_copy(out, home, 3, copies) == spill


@pytest.mark.parametrize("out, home, spill", [
    ([2, 2, 2, 2, 3, 3, 3, 3, 2, 2, 2, 2], 5, 8),  # the next instance's first copy on a tie
    ([2, 1, 2, 2, 3, 3, 3, 3, 2, 2, 2, 2], 5, 1),  # the least loaded of the other instances
    ([2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3], 9, 0),  # from the last instance, the next is the first
    ([3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2, 3], 1, 10),  # below the threshold anywhere
])
def test_a_full_instance_spills_to_the_next_instances(out, home, spill):
    assert spill_copy(out, home, 3, 4) == spill


@pytest.mark.parametrize("out, home, spill", [
    ([5, 2, 2, 3], 1, 1),  # every copy at the threshold (2): the home keeps it on a tie
    ([2, 9, 2, 9], 1, 2),  # else the least loaded, scanning from the home on
    ([2, 9, 2, 9], 3, 0),
    ([4, 4, 3, 2], 0, 3),
])
def test_when_every_copy_is_at_the_threshold_the_least_loaded_takes_it(out, home, spill):
    assert spill_copy(out, home, 2, 2) == spill


def test_one_copy_per_instance_spills_among_the_instances():
    assert spill_copy([5, 1, 0], 0, 2, 1) == 2
    assert spill_copy([5, 1, 1], 0, 2, 1) == 1
    assert spill_copy([3, 3], 0, 3, 2) == 0  # at the threshold (not below): nowhere to spill
    assert spill_copy([3, 2], 0, 3, 1) == 1
