"""Copy autoscaling in the fleet model: target tracking, cooldowns, start-up, scale to and from zero,
rendezvous routing over the serving copies, and what simulate reports."""

from __future__ import annotations

import math

import pytest

from prefix_routing.lab.autoscaling import AutoscalingSettings, CopyPool
from prefix_routing.lab.routing import Router, Strategy
from prefix_routing.lab.simulate import simulate
from prefix_routing.lab.workloads import LongContextSpec, long_context_workload
from prefix_routing.rules.errors import UserError

SETTINGS = AutoscalingSettings(target_per_copy=4.0, min_copies=1, max_copies=8, initial_copies=2,
                               scale_out_cooldown_s=60, scale_in_cooldown_s=300, startup_s=300)


def steady(pool: CopyPool, t: float, in_flight: list[int]) -> list[int]:
    """A period at constant in-flight counts ending at t (the counts held since the last tick)."""
    return pool.tick(t, in_flight)


def test_target_tracking_adds_ceil_of_concurrency_over_target_and_they_serve_after_start_up():
    pool = CopyPool(SETTINGS, 8)
    assert pool.serving(0) == [0, 1]
    # 10 + 10 requests in flight for the first minute: ceil(20 / 4) = 5 copies wanted.
    steady(pool, 60.0, [10, 10, 0, 0, 0, 0, 0, 0])
    assert pool.events == [(60.0, 2, 5)] and pool.provisioned() == [0, 1, 2, 3, 4]
    assert pool.serving(359.0) == [0, 1] and pool.serving(360.0) == [0, 1, 2, 3, 4]
    # Still 20 in flight a minute later: 5 are provisioned, ceil(20/4) = 5: nothing to add.
    steady(pool, 120.0, [10, 10, 0, 0, 0, 0, 0, 0])
    assert len(pool.events) == 1
    assert pool.copy_seconds == 2 * 60 + 5 * 60  # start-up time is paid for


def test_scale_in_waits_for_fifteen_quiet_periods_and_the_cooldown():
    pool = CopyPool(AutoscalingSettings(target_per_copy=4.0, min_copies=1, max_copies=8, initial_copies=4,
                                        scale_in_cooldown_s=300), 8)
    for minute in range(1, 15):
        steady(pool, minute * 60.0, [1, 0, 0, 0, 0, 0, 0, 0])
    assert pool.events == []  # 14 quiet periods: the low alarm has not fired yet
    removed = steady(pool, 15 * 60.0, [1, 0, 0, 0, 0, 0, 0, 0])
    assert pool.events == [(900.0, 4, 1)] and removed == [1, 2, 3]  # the highest slots go first


def test_the_scale_out_cooldown_holds_a_second_scale_out():
    pool = CopyPool(AutoscalingSettings(target_per_copy=1.0, max_copies=8, initial_copies=1,
                                        scale_out_cooldown_s=120), 8)
    steady(pool, 60.0, [2, 0, 0, 0, 0, 0, 0, 0])
    steady(pool, 120.0, [6, 0, 0, 0, 0, 0, 0, 0])  # wants 6, but 60 s < 120 s since the last
    steady(pool, 180.0, [6, 0, 0, 0, 0, 0, 0, 0])
    assert pool.events == [(60.0, 1, 2), (180.0, 2, 6)]


def test_a_copy_above_the_hotspot_threshold_counts_its_periods():
    pool = CopyPool(SETTINGS, 8)
    steady(pool, 60.0, [9, 0, 0, 0, 0, 0, 0, 0])  # 9 > 2 × 4
    steady(pool, 120.0, [8, 1, 0, 0, 0, 0, 0, 0])  # 8 is not above 8
    assert pool.hotspot_seconds == 60.0


def test_scale_to_zero_and_back_on_the_first_request_that_finds_no_copy():
    pool = CopyPool(AutoscalingSettings(target_per_copy=4.0, min_copies=0, max_copies=4, initial_copies=1,
                                        scale_in_cooldown_s=0, startup_s=120), 4)
    for minute in range(1, 16):
        steady(pool, minute * 60.0, [0, 0, 0, 0])
    assert pool.provisioned() == []
    steady(pool, 16 * 60.0, [0, 0, 0, 0])
    assert pool.provisioned() == []  # nobody asked
    pool.no_capacity = 1  # a request found no copy (NoCapacityInvocationFailures)
    steady(pool, 17 * 60.0, [0, 0, 0, 0])
    assert pool.provisioned() == [0] and pool.serving(17 * 60.0 + 120) == [0]


def test_rendezvous_routing_moves_only_the_keys_of_the_copy_added_or_removed():
    router = Router(Strategy.PREFIX_AWARE, 8, concurrency_threshold=1000, seed=2)
    keys = [bytes([i % 256, i // 256]) * 8 for i in range(4000)]
    out = [0] * 8
    router.set_active([0, 1, 2, 3])
    before = [router.choose(k, out)[0] for k in keys]
    router.set_active([0, 1, 2, 3, 4])
    after = [router.choose(k, out)[0] for k in keys]
    moved = [(a, b) for a, b in zip(before, after) if a != b]
    assert all(b == 4 for _, b in moved)  # only to the new copy
    assert 0.15 < len(moved) / len(keys) < 0.25  # about 1/5 of the keys
    router.set_active([0, 1, 3, 4])
    removed = [router.choose(k, out)[0] for k in keys]
    assert all(r == a for a, r in zip(after, removed) if a != 2)  # only copy 2's keys moved
    router.set_active([])
    assert router.choose(keys[0], out) == (-1, False)  # nothing serves


def test_bad_settings_say_what_is_allowed():
    with pytest.raises(UserError, match="need 0 <= min <= max"):
        AutoscalingSettings(min_copies=5, max_copies=2)
    with pytest.raises(UserError, match="target_per_copy=0"):
        AutoscalingSettings(target_per_copy=0)
    with pytest.raises(UserError, match="max_copies=9: the fleet has 8"):
        CopyPool(AutoscalingSettings(max_copies=9), 8)


def test_after_a_3x_load_step_the_copies_follow_and_no_copy_stays_hot():
    spec = LongContextSpec(duration_s=3600, load_step=(1800.0, 3.0), instances=14)
    trace = long_context_workload(spec, seed=0)
    scaling = AutoscalingSettings(target_per_copy=4.0, min_copies=2, max_copies=14)
    result = simulate(trace, spec.fleet_config(autoscaling=scaling)).as_dict()
    rows = result["autoscaling"]["copies_over_time"]
    before = max(r["provisioned"] for r in rows if r["t_s"] <= 1800)
    after = max(r["provisioned"] for r in rows if r["t_s"] > 1800)
    assert after >= 2 * before  # three times the load: the copies follow
    assert result["hotspot_seconds"] > 0  # the step does make a hot spell while copies start
    assert result["autoscaling"]["hotspot_seconds_after_scaling"] <= 300  # and scaling ends it
    served = sum(r["provisioned"] for r in rows) * 60 / 3600
    assert result["copy_hours"] == pytest.approx(served)
    assert not math.isnan(result["autoscaling"]["hit_rate_10min_after_scale_out"])
