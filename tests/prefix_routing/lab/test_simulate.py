"""The lab's acceptance figures on the real trace, and the hit-rate arithmetic (prefix_routing.lab.simulate)."""

from __future__ import annotations

import math

import pytest
from dataclasses import replace

from prefix_routing import lab
from prefix_routing.lab import traces
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.routing import Strategy


def test_random_and_least_outstanding_hit_about_13_percent(trace, eight_infinite):
    results = lab.simulate_many(trace, eight_infinite, [Strategy.RANDOM, Strategy.LEAST_OUTSTANDING_REQUESTS], progress=False)
    for r in results:
        assert 0.11 <= r.hit_rate <= 0.15, (r.strategy, r.hit_rate)
        assert r.spills == 0 and r.timeouts == 0
        assert r.max_mean_requests < 1.1


def test_prefix_aware_on_two_blocks_reaches_the_bound_evenly(trace, eight_infinite):
    r = lab.simulate(trace, replace(eight_infinite, strategy=Strategy.PREFIX_AWARE, prefix_length=4096))
    assert r.config.key_blocks == 2
    assert abs(r.hit_rate - 0.366) <= 0.02, r.hit_rate
    assert r.max_mean_requests <= 1.2
    assert r.spills == 0


def test_prefix_aware_within_the_first_block_uses_one_instance(trace, eight_infinite):
    r = lab.simulate(trace, replace(eight_infinite, strategy=Strategy.PREFIX_AWARE, prefix_length=1024))
    assert r.config.key_blocks == 1
    assert r.max_mean_requests == 8.0
    assert sorted(r.instance_requests)[:7] == [0] * 7
    # One instance cannot carry the whole trace: requests queue until the 60 s invocation timeout.
    assert r.timeouts > 1000 and r.ttft_p50_s > 10


def test_results_are_identical_for_the_same_seed(mooncake_slice):
    subset = mooncake_slice
    config = FleetConfig(instances=8, seed=7)

    def run(seed):
        return [
            {k: v for k, v in r.as_dict().items() if k != "wall_s"}
            for r in lab.simulate_many(subset, replace(config, seed=seed), list(Strategy), progress=False)
        ]

    first = run(7)
    assert first == run(7)
    assert first[0] != run(8)[0]  # RANDOM depends on the seed


def test_speed_compresses_time(mooncake_slice):
    subset = mooncake_slice
    slow = lab.simulate(subset, FleetConfig(instances=8, strategy=Strategy.RANDOM))
    fast = lab.simulate(subset, FleetConfig(instances=8, strategy=Strategy.RANDOM), speed=4.0)
    assert fast.throughput_req_s > 2 * slow.throughput_req_s  # queueing and the final drain dilute the 4×
    assert fast.ttft_p90_s >= slow.ttft_p90_s


def test_plots_are_written(mooncake_slice, tmp_path):
    results = lab.simulate_many(mooncake_slice, FleetConfig(instances=4), [Strategy.RANDOM, Strategy.PREFIX_AWARE], progress=False)
    paths = lab.plot_simulation(results, tmp_path)
    assert [p.name for p in paths] == ["ttft_cdf.png", "load_per_instance.png", "hit_rate_over_time.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_hit_rate_counts_only_the_prompt_tokens_of_served_requests():
    # Three requests on one copy with an unbounded cache and a 5 s invocation timeout:
    #   1. 2,048 tokens, blocks 1 2 3 4 (cold): 0 cached;
    #   2. 2,048 tokens, blocks 1 2 3 5: three 512-token blocks cached = 1,536;
    #   3. 1,000,000 tokens of new blocks: its prefill takes far longer than 5 s, so it times out,
    #      is never served and must not count in the denominator.
    # Hit rate = 1,536 / (2,048 + 2,048) = 0.375 (with the timed-out prompt counted: about 0.0015).
    big = list(range(100, 100 + 1_000_000 // 512 + 1))
    trace = traces.Trace([0.0, 0.5, 1.0], [2048, 2048, 1_000_000], [10, 10, 10], [[1, 2, 3, 4], [1, 2, 3, 5], big])
    config = FleetConfig(instances=1, cache_tokens=math.inf, timeout_s=5.0, strategy=Strategy.PREFIX_AWARE)
    result = lab.simulate(trace, config)
    assert result.timeouts == 1
    assert result.hit_rate == 0.375
    assert result.ttft[2] == 5.0  # a timed-out request's TTFT is the timeout
    assert result.instance_hit_rates == [0.375]
    assert result.hit_over_time[0][1] == 0.375  # the over-time figure has the same denominator


def test_one_user_closed_loop_is_the_trace_sent_one_request_at_a_time(mooncake_slice):
    """Spec: a user sends its next request when its last one has finished. With one user nothing
    overlaps, so it must equal an open-loop replay whose arrivals are so far apart that nothing does."""
    trace = mooncake_slice.head(60)
    config = FleetConfig(instances=2, strategy=Strategy.PREFIX_AWARE)
    closed = lab.simulate(trace, config, users=1)
    apart = replace(trace, arrivals=[i * 3600.0 for i in range(len(trace))])  # an hour apart: no overlap
    open_loop = lab.simulate(apart, config)
    assert closed.hit_rate == open_loop.hit_rate
    # the same cold/warm latencies, no queueing in either (to rounding: the clocks differ by hours)
    assert closed.ttft == pytest.approx(open_loop.ttft, rel=1e-9, abs=1e-12)
    assert closed.spills == open_loop.spills == 0


def test_users_start_together_and_the_next_waits_for_a_finish(mooncake_slice):
    trace = mooncake_slice.head(40)
    sim = lab.Simulator(FleetConfig(instances=4, strategy=Strategy.RANDOM), users=4)
    sim.feed(trace)
    arrivals = list(sim.arrivals)
    assert arrivals[:4] == [0.0] * 4 and arrivals[4] > 0.0  # four users at t=0; the fifth request waits
    assert arrivals == sorted(arrivals)
    more_users = lab.simulate(trace, FleetConfig(instances=4, strategy=Strategy.RANDOM), users=16)
    assert more_users.throughput_req_s > sim.result().throughput_req_s  # more clients, more load sustained


def test_closed_loop_rejects_a_speed_and_a_bad_user_count(mooncake_slice):
    from prefix_routing.rules.errors import UserError

    with pytest.raises(UserError, match="a closed loop .* ignores the trace's timing"):
        lab.Simulator(FleetConfig(), speed=2.0, users=4)
    with pytest.raises(UserError, match="users=0: must be an integer from 1 to 100000"):
        lab.Simulator(FleetConfig(), users=0)


def test_hotspot_seconds_of_a_fixed_fleet_count_the_minutes_a_copy_is_above_the_threshold():
    from prefix_routing.lab.autoscaling import AutoscalingSettings
    from prefix_routing.lab.simulate import Simulator, _hotspot_seconds
    from prefix_routing.lab.workloads import LongContextSpec, long_context_workload

    spec = LongContextSpec(duration_s=1800, load_step=(900.0, 3.0), instances=14)
    trace = long_context_workload(spec, seed=0)
    light = lab.simulate(trace.head(300), spec.fleet_config()).as_dict()
    assert light["hotspot_seconds"] == 0  # a few requests on 14 copies: nobody near 8 in flight
    overloaded = lab.simulate(trace, spec.fleet_config(instances=3)).as_dict()
    assert overloaded["hotspot_seconds"] >= 600  # 3 copies after a 3x step: hot for the rest of the run
    # The same measure as the autoscaler's own bookkeeping, computed afterwards from the requests.
    config = lab.config_for_trace(spec.fleet_config(autoscaling=AutoscalingSettings(min_copies=2, max_copies=14)),
                                  trace)
    sim = Simulator(config)
    sim.feed(trace)
    result = sim.result()
    assert result.hotspot_seconds == _hotspot_seconds(sim, list(sim.arrivals), config) > 0


def test_hotspot_seconds_by_hand():
    # One copy, threshold 2 × 4 = 8 in flight, 60 s periods. 10 requests in flight over 0–150 s:
    # periods 0 and 1 average 10 (hot), period 2 averages 10 × 30/60 = 5 (not hot). Then 20
    # requests over 200–230 s: period 3 averages 20 × 30/60 = 10 (hot): 180 hot seconds in all.
    from array import array
    from types import SimpleNamespace

    from prefix_routing.lab.simulate import _hotspot_seconds

    starts = [0.0] * 10 + [200.0] * 20
    ends = [150.0] * 10 + [230.0] * 20
    sim = SimpleNamespace(copy_of=array("l", [0] * 30), ends=array("d", ends))
    assert _hotspot_seconds(sim, starts, lab.FleetConfig(instances=1)) == 180.0


def test_percentiles_interpolate_between_ranks_by_hand():
    from prefix_routing.lab.percentiles import distribution, percentiles

    # 11 values 0..10: P50 is the 6th, P90 the 10th (9.0), P99 at rank 9.9: 9 + 0.9 × (10 − 9).
    assert percentiles([float(v) for v in range(10, -1, -1)]) == {"p50": 5.0, "p90": 9.0, "p99": pytest.approx(9.9)}
    assert percentiles([3.0, 1.0]) == {"p50": 2.0, "p90": pytest.approx(2.8), "p99": pytest.approx(2.98)}
    assert distribution([1, 2, 3, 10]) == {"mean": 4.0, "p50": 2.5, "p90": pytest.approx(7.9), "p99": pytest.approx(9.79), "max": 10.0}
