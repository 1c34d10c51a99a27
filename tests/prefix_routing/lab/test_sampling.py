"""Miniature simulation: a sample of the routing keys on caches and a clock scaled by the rate."""

from __future__ import annotations

import math

import pytest

from prefix_routing.lab import sampling, source_sample
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.simulate import simulate
from prefix_routing.lab.trace_data import Trace
from prefix_routing.lab.workloads import LongContextSpec, long_context_workload
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.replication import ReplicationSettings


def test_the_rate_is_a_share_a_percentage_or_auto():
    assert sampling.parse_rate("0.1") == 0.1 and sampling.parse_rate("10%") == pytest.approx(0.1)
    assert sampling.parse_rate("auto") == "auto" and sampling.parse_rate(None) is None
    for bad in ("0", "1.5", "x", "0.00001", "nan"):
        with pytest.raises(UserError, match=r"allowed: a rate from 0.0001 to 1"):
            sampling.parse_rate(bad)


def test_auto_keeps_a_small_trace_whole_and_samples_a_large_one_to_about_200000():
    assert sampling.auto_rate(200_000) == 1.0
    assert sampling.auto_rate(3_600_000) == 0.0555  # floor(10,000 × 200,000 / 3,600,000) = 555 basis points
    assert sampling.auto_rate(10**10) == 0.0001  # never below one basis point


def _trace(keys_and_ids):
    """One request per (key block, routing id); each prompt is its key block then one of its own."""
    blocks = [[key, 1000 + i] for i, (key, _) in enumerate(keys_and_ids)]
    ids = [rid for _, rid in keys_and_ids]
    n = len(blocks)
    return Trace([float(i) for i in range(n)], [200] * n, [10] * n, blocks, block_tokens=100,
                 routing_ids=ids if any(ids) else None, source="t")


def test_a_key_is_kept_or_dropped_with_all_its_requests():
    trace = _trace([(k % 50, None) for k in range(1000)])  # 50 keys, 20 requests each
    half = sampling.sample(trace, 0.5, key_blocks=1)
    for key in range(50):
        count = sum(1 for blocks in half.blocks if blocks[0] == key)
        assert count == (20 if sampling.key_bucket(key) < 5000 else 0)
    assert half.arrivals == sorted(half.arrivals) and "sampled at 0.5" in half.source
    assert sampling.sample(trace, 1.0, key_blocks=1) is trace


def test_the_routing_id_is_part_of_the_key():
    # The same key block under two PrefixAwareIds: two keys, each in or out by its own bucket.
    key = next(k for k in range(10**6) if (sampling.key_bucket(("a", k)) < 5000) != (sampling.key_bucket(("b", k)) < 5000))
    half = sampling.sample(_trace([(key, "a"), (key, "b")]), 0.5, key_blocks=1)
    assert half.routing_ids == ["a" if sampling.key_bucket(("a", key)) < 5000 else "b"]


def test_buckets_spread_keys_evenly():
    inside = sum(sampling.key_bucket(k) < 1000 for k in range(20_000))  # rate 0.1: 2,000 expected
    assert 1_800 <= inside <= 2_200  # within about 5 standard deviations (sqrt(20,000 × 0.1 × 0.9) = 42)
    assert all(0 <= sampling.key_bucket(("t", k)) < sampling.SAMPLE_BUCKETS for k in range(1000))


def test_a_sample_with_no_key_says_so():
    with pytest.raises(UserError, match=r"no request's routing key falls in a sample at rate 0.0001 \(1 keys\)"):
        sampling.sample(_trace([(k, None) for k in [next(k for k in range(10**6) if sampling.key_bucket(k) >= 1)]]),
                        0.0001, key_blocks=1)


def test_the_band_is_the_ratio_estimators_sampling_error_by_hand():
    # Two keys: 10 of 200 tokens cached and 30 of 200: h = 40/400 = 0.1; the squared residuals
    # (10 − 20)² + (30 − 20)² = 200; variance (1 − 0.5) × 2/1 × 200 / 400² = 0.00125.
    trace = _trace([(1, None), (2, None)])
    band = sampling.hit_rate_band(trace, [10.0, 30.0], [True, True], 0.5, key_blocks=1)
    assert band == pytest.approx(1.96 * math.sqrt(0.00125))
    assert sampling.hit_rate_band(trace, [10.0, 30.0], [True, True], 1.0, key_blocks=1) == 0.0
    assert sampling.hit_rate_band(trace, [10.0, 30.0], [True, False], 0.5, key_blocks=1) == 1.0  # one key served


def test_what_a_miniature_does_not_model_is_refused_by_name():
    base = FleetConfig(instances=2)
    cases = [
        (dict(config=FleetConfig(instances=2, replication=ReplicationSettings(enabled=True))), "hot-prefix replication"),
        (dict(config=FleetConfig(instances=2, cache_policy="llamacpp-slots")), "cache policy llamacpp-slots"),
        (dict(config=base, users=4), "a closed loop"),
        (dict(config=base, domains=2), "trust domains"),
    ]
    for kwargs, what in cases:
        config = kwargs.pop("config")
        with pytest.raises(UserError, match=f"--sample: a sampled run does not model {what}"):
            sampling.check_sampling(config, **kwargs)
    sampling.check_sampling(base)  # nothing to refuse


@pytest.mark.parametrize("strategy", [Strategy.PREFIX_AWARE, Strategy.RANDOM])
def test_a_ten_percent_miniature_of_the_long_context_workload_is_close_to_the_whole(strategy):
    # RANDOM is the cache-bound case: every copy sees every prefix, so only a cache scaled with the
    # sample keeps the miniature's hit rate near the whole's (a whole cache would hold all of it).
    spec = LongContextSpec(duration_s=1800)
    trace = long_context_workload(spec, seed=1)
    config = spec.fleet_config(strategy=strategy)
    whole = simulate(trace, config)
    part = sampling.sample(trace, 0.1, config.key_blocks)
    fleet, share = sampling.miniature(config, 0.1)
    assert (fleet.instances, fleet.cache_scale, share) == (7, 0.1, 0.1)  # 0.7 instances: too few to shrink
    mini = sampling.scale_back(simulate(part, fleet, speed=10.0), part, 0.1, len(trace), config.key_blocks, share)
    band = mini.extra["sample"]["hit_rate_band"]
    assert mini.extra["sample"]["rate"] == 0.1 and mini.extra["sample"]["of_requests"] == len(trace)
    assert 0 < band < 0.1
    assert abs(mini.hit_rate - whole.hit_rate) <= band + 0.01
    assert mini.copy_hours == pytest.approx(whole.copy_hours, rel=0.05)  # scaled back to the whole span
    assert mini.ttft_p50_s == pytest.approx(whole.ttft_p50_s, rel=0.1)  # the same load per copy


def test_the_cache_scale_is_a_share_of_the_cache():
    for bad in (0, 1.5, "half", -0.1):
        with pytest.raises(UserError, match=r"cache_scale=.*: must be a number above 0, at most 1"):
            FleetConfig(cache_scale=bad)


def test_a_large_fleet_shrinks_with_the_sample_and_keeps_each_copy_whole():
    fleet, share = sampling.miniature(FleetConfig(instances=100), 0.1)
    assert (fleet.instances, fleet.cache_scale, share) == (10, 1.0, 1.0)
    # 7.5 instances round to 8: each of them carries 7.5/8 of a whole copy's traffic.
    fleet, share = sampling.miniature(FleetConfig(instances=75), 0.1)
    assert (fleet.instances, share) == (8, 0.9375) and fleet.cache_scale == 0.9375
    fleet, share = sampling.miniature(FleetConfig(instances=70), 0.1)  # 7: too few, the copies scale
    assert (fleet.instances, fleet.cache_scale, share) == (70, 0.1, 0.1)
    # RANDOM spreads a key over every copy: it needs them all, so each copy scales instead.
    for strategies in ([Strategy.RANDOM], [Strategy.PREFIX_AWARE, Strategy.RANDOM]):
        fleet, share = sampling.miniature(FleetConfig(instances=100), 0.1, strategies)
        assert (fleet.instances, fleet.cache_scale, share) == (100, 0.1, 0.1)


@pytest.mark.parametrize("strategy", [Strategy.PREFIX_AWARE, Strategy.RANDOM])
def test_a_ten_percent_miniature_of_a_large_fleet_is_close_to_the_whole(strategy):
    # 20 times the long-context workload (9,000 prefixes at 60 requests/s on 140 p5s) for 5 minutes.
    spec = LongContextSpec(prefixes=9000, rate_rps=60.0, instances=140, duration_s=300)
    trace = long_context_workload(spec, seed=2)
    config = spec.fleet_config(strategy=strategy)
    whole = simulate(trace, config)
    part = sampling.sample(trace, 0.1, config.key_blocks)
    fleet, share = sampling.miniature(config, 0.1)
    mini = sampling.scale_back(simulate(part, fleet, speed=1.0 / share), part, 0.1, len(trace), config.key_blocks, share)
    assert mini.extra["sample"]["instances"] == (14 if strategy is Strategy.PREFIX_AWARE else 140)
    assert abs(mini.hit_rate - whole.hit_rate) <= mini.extra["sample"]["hit_rate_band"] + 0.01
    assert mini.copy_hours == pytest.approx(whole.copy_hours, rel=0.05)
    assert mini.ttft_p50_s == pytest.approx(whole.ttft_p50_s, rel=0.1)


# --------------------------------------------------------------------------- a log sampled at the source


def _log_line(bucket, hot=False, fingerprint="f1", routing_id="pa-a") -> dict:
    from prefix_routing.rules.telemetry import LogField as F

    return {F.SAMPLE_BUCKET: bucket, F.SAMPLE_HOT: hot, F.PREFIX_FINGERPRINT: fingerprint, F.ROUTING_ID: routing_id}


def test_a_source_sample_keeps_its_keys_and_one_in_1_over_r_of_a_hot_key_outside_it():
    # Rate 0.25: buckets below 2,500; a hot key outside keeps lines 1, 5, 9 of its 10 (one in 4, the first).
    keep = source_sample.SourceSample(0.25)
    assert [keep.keep(_log_line(b)) for b in (2499, 0, 2499)] == [True] * 3
    assert [keep.keep(_log_line(2500, hot=True)) for _ in range(10)] == [True, False, False, False] * 2 + [True, False]
    # Each hot key counts its own lines: a second one starts with a kept line.
    assert keep.keep(_log_line(7000, hot=True, fingerprint="f2")) is True
    assert keep.keep(_log_line(2500)) is False and keep.keep(_log_line(None)) is False
    assert keep.keep(_log_line(True)) is False  # a boolean is not a bucket
    assert (keep.keyed, keep.hot_kept, keep.hot_thinned, keep.outside) == (3, 4, 7, 3)
    assert "their 11 lines thinned to 4 (one in 4)" in keep.note()
    # Two tenants' hot keys with one fingerprint count apart.
    keep = source_sample.SourceSample(0.5)
    assert [keep.keep(_log_line(9000, hot=True, routing_id=r)) for r in ("pa-a", "pa-b", "pa-a", "pa-b")] == [
        True, True, False, False]
    # At 0.8 a hot key outside the sample keeps every line (round(1 / 0.8) = 1).
    keep = source_sample.SourceSample(0.8)
    assert [keep.keep(_log_line(9000, hot=True)) for _ in range(3)] == [True] * 3


def test_hot_keys_counted_are_bounded(monkeypatch):
    monkeypatch.setattr(source_sample, "MAX_HOT_KEYS", 2)
    keep = source_sample.SourceSample(0.5)
    assert [keep.keep(_log_line(9000, hot=True, fingerprint=f)) for f in "abc"] == [True] * 3
    assert [keep.keep(_log_line(9000, hot=True, fingerprint="c")) for _ in range(3)] == [True] * 3  # past the bound: all
    assert [keep.keep(_log_line(9000, hot=True, fingerprint="a")) for _ in range(3)] == [False, True, False]
    assert (keep.hot_kept, keep.hot_thinned) == (7, 2)


@pytest.mark.parametrize(("timeout_s", "served"), [(1.0, [True, False, False, True]), (None, [True] * 4)])
def test_a_results_band_counts_a_request_at_its_timeout_as_failed(timeout_s, served):
    # TTFTs 0.5, 1.0 (exactly the timeout: it failed there), 3.0 and 0.2 s.
    from types import SimpleNamespace

    trace = _trace([(k, None) for k in (1, 2, 3, 4)])
    result = SimpleNamespace(config=SimpleNamespace(timeout_s=timeout_s), ttft=[0.5, 1.0, 3.0, 0.2],
                             cached_tokens=[10.0, 0.0, 30.0, 5.0])
    expected = sampling.hit_rate_band(trace, result.cached_tokens, served, 0.5, 1)
    assert sampling.result_band(result, trace, 0.5, 1) == expected
