"""Miniature simulation: a sample of the routing keys on R × the instances, run only where its error is bounded."""

from __future__ import annotations

import math

import pytest

from prefix_routing.lab import sample_bands, sampling, source_sample
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
    # Two clusters: 10 of 200 tokens cached and 30 of 200: h = 40/400 = 0.1; the squared residuals
    # (10 − 20)² + (30 − 20)² = 200; variance (1 − 0.5) × 2/1 × 200 / 400² = 0.00125; t at 1 df: 12.706.
    assert sample_bands.ratio_band([(10.0, 200.0), (30.0, 200.0)], 0.5) == pytest.approx(12.706 * math.sqrt(0.00125))
    assert sample_bands.ratio_band([(10.0, 200.0), (30.0, 200.0)], 0.0) == 0.0  # the whole population
    assert sample_bands.ratio_band([(10.0, 200.0)], 0.5) == math.inf  # one cluster: nothing to say about others
    assert sample_bands.ratio_band([(1.0, 0.0), (2.0, 0.0)], 0.5) == math.inf


def test_the_t_factor_is_students_for_the_clusters_number():
    # Tables of t at 97.5 %: 7 df 2.365, 30 df 2.042; above 30 df, 1.96 + 2.5 / df (40 df: 2.0225, table 2.021).
    assert sample_bands.t_975(8) == 2.365 and sample_bands.t_975(31) == 2.042
    assert sample_bands.t_975(41) == pytest.approx(2.0225) and sample_bands.t_975(1) == math.inf


def test_clusters_sum_their_requests():
    assert sample_bands.cluster_sums(["a", "b", "a"], [1.0, 2.0, 3.0], [10.0, 20.0, 30.0]) == [(4.0, 40.0), (2.0, 20.0)]


def test_a_percentiles_band_is_woodruffs_by_hand():
    # 10 values 1..10 in clusters of two (1,2), (3,4), ...: P50 = 5.5; at or under it 5 of 10, by
    # cluster (2,2,1,0,0) of 2 each: residuals (2−1)², (2−1)², 0, (0−1)², (0−1)² = 4; variance
    # (1 − 0.5) × 5/4 × 4 / 10² = 0.025, t at 4 df 2.776: share 0.5 ± 0.4389 → percentiles 6.11 and
    # 94.39 of the values: 1 + 9 × 0.0611 = 1.550 and 1 + 9 × 0.9439 = 9.495.
    values = [float(v) for v in range(1, 11)]
    clusters = [v // 2 for v in range(0, 10)]
    low, high = sample_bands.percentile_band(values, clusters, 50, 0.5)
    half = 2.776 * math.sqrt(0.025)
    assert low == pytest.approx(1 + 9 * (0.5 - half)) and high == pytest.approx(1 + 9 * (0.5 + half))
    assert sample_bands.percentile_band([], [], 50, 0.5) == (0.0, 0.0)
    assert sample_bands.percentile_band([1.0, 2.0], ["a", "a"], 50, 0.5) == (-math.inf, math.inf)


def test_every_band_carries_the_miniatures_bias():
    # Clusters that agree exactly: no sampling error, only the bias allowed (0.25 points, 2 % of a percentile).
    found = sample_bands.bands(cached=[50.0, 50.0, 50.0, 50.0], prompts=[100.0] * 4, ttft=[1.0] * 4,
                               served=[True] * 4, clusters=[1, 1, 2, 2], fpc=0.9)
    assert found["hit_rate"] == pytest.approx(0.0025) and found["clusters"] == 2
    assert found["ttft_p50_s"] == (pytest.approx(0.98), pytest.approx(1.02))
    # An unserved request's tokens are out of the hit rate.
    found = sample_bands.bands(cached=[50.0, 0.0, 50.0], prompts=[100.0, 100.0, 100.0], ttft=[1.0, 9.0, 1.0],
                               served=[True, False, True], clusters=[1, 2, 2], fpc=0.9)
    assert found["hit_rate"] == pytest.approx(0.0025)


def test_the_wider_band_is_taken_figure_by_figure():
    first = {"hit_rate": 0.01, "clusters": 8, "ttft_p50_s": (1.0, 2.0), "ttft_p90_s": (3.0, 4.0), "ttft_p99_s": (5.0, 9.0)}
    second = {"hit_rate": 0.02, "clusters": 100, "ttft_p50_s": (0.5, 1.5), "ttft_p90_s": (3.5, 4.5), "ttft_p99_s": (6.0, 7.0)}
    assert sample_bands.wider(first, second) == {"hit_rate": 0.02, "clusters": 8, "ttft_p50_s": (0.5, 2.0),
                                                 "ttft_p90_s": (3.0, 4.5), "ttft_p99_s": (5.0, 9.0)}


def test_effective_keys_are_kishs_by_hand():
    # Keys 1, 2, 3 with 200, 200 and 400 prompt tokens: 800² / (200² + 200² + 400²) = 640,000 / 240,000.
    trace = _trace([(1, None), (2, None), (3, None), (3, None)])
    assert sampling.effective_keys(trace, key_blocks=1) == pytest.approx(640_000 / 240_000)
    assert sampling.effective_keys(_trace([(k, None) for k in range(50)]), key_blocks=1) == pytest.approx(50)


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


def test_a_small_fleet_runs_the_whole_trace_and_says_why():
    # The long-context workload at 6 requests/s for two hours on 7 p5s: 10 % of 7 instances is 0.7.
    spec = LongContextSpec(rate_rps=6.0, duration_s=7200.0)
    trace = long_context_workload(spec, seed=0)
    plan = sampling.plan(trace, spec.fleet_config(), 0.1)
    assert (plan.asked, plan.rate, plan.bounded) == (0.1, 1.0, True)
    assert plan.note() == ("--sample 0.1: ran the whole trace instead: 7 instances at rate 0.1 leave 1, fewer than the 8 "
                           "a miniature needs to keep each copy's share of the keys and the load (at this rate it "
                           "takes 71 instances or more)")


def test_a_sample_of_too_few_effective_keys_runs_the_whole_trace():
    trace = _trace([(k, None) for k in range(500)])  # 500 keys alike: 50 effective keys at 10 %
    plan = sampling.plan(trace, FleetConfig(instances=100), 0.1)
    assert plan.rate == 1.0 and plan.reason == (
        "the sample keeps about 50 effective routing keys, fewer than 100: a few keys carry most prompt tokens, and "
        "whether they fall in the sample decides the figures (500 effective keys in the whole trace)")
    many = _trace([(k, None) for k in range(1000)])  # 100 effective keys at 10 %: sampled
    assert sampling.plan(many, FleetConfig(instances=100), 0.1) == sampling.SamplePlan(0.1, 0.1)
    assert sampling.plan(many, FleetConfig(instances=100), 1.0) == sampling.SamplePlan(1.0, 1.0)


def test_a_sample_that_leaves_too_few_requests_per_copy_to_a_spreading_strategy_runs_the_whole_trace():
    trace = _trace([(k, None) for k in range(4000)])  # 400 requests at 10 %: 40 a copy on 10 copies
    plan = sampling.plan(trace, FleetConfig(instances=10), 0.1, (Strategy.RANDOM,))
    assert plan.rate == 1.0 and plan.reason == (
        "the sample leaves about 40 requests per copy to the strategies that spread a key over every copy, fewer "
        "than 50: their queues would not settle")
    assert sampling.plan(trace, FleetConfig(instances=8), 0.1, (Strategy.RANDOM,)).rate == 0.1  # 50 a copy


def test_a_window_sampled_at_the_source_is_judged_as_it_is_and_kept_when_not_bounded():
    sample = _trace([(k, None) for k in range(99)])  # the sample itself: 99 effective keys
    plan = sampling.plan(sample, FleetConfig(instances=100), 0.1, presampled=True)
    assert (plan.rate, plan.bounded) == (0.1, False)
    assert plan.note().startswith("sampled at 0.1 at the source, and not bounded: the sample keeps about 99 effective "
                                  "routing keys, fewer than 100") and plan.note().endswith("decides the figures")
    small = sampling.plan(sample, FleetConfig(instances=70), 0.1, presampled=True)
    assert (small.rate, small.bounded) == (0.1, False) and "70 instances at rate 0.1 leave 7" in small.reason
    assert sampling.plan(_trace([(k, None) for k in range(100)]), FleetConfig(instances=80), 0.1,
                         presampled=True) == sampling.SamplePlan(0.1, 0.1)


def test_the_cache_scale_is_a_share_of_the_cache():
    for bad in (0, 1.5, "half", -0.1):
        with pytest.raises(UserError, match=r"cache_scale=.*: must be a number above 0, at most 1"):
            FleetConfig(cache_scale=bad)


def test_a_large_fleet_shrinks_with_the_sample_and_keeps_each_copy_whole():
    fleet, share = sampling.miniature(FleetConfig(instances=100), 0.1)
    assert (fleet.instances, fleet.cache_scale, share) == (10, 1.0, 1.0)
    # 7.5 instances round up to 8: each of them carries 7.5/8 of a whole copy's traffic.
    fleet, share = sampling.miniature(FleetConfig(instances=75), 0.1)
    assert (fleet.instances, share) == (8, 0.9375) and fleet.cache_scale == 0.9375
    assert sampling.miniature_instances(70, 0.1) == 7  # 0.1 × 70 is 7.000000000000001 in floating point
    # 7: too few (only a window sampled at the source gets here): every copy, each scaled.
    fleet, share = sampling.miniature(FleetConfig(instances=70), 0.1)
    assert (fleet.instances, fleet.cache_scale, share) == (70, 0.1, 0.1)
    # RANDOM spreads a key over every copy: every copy, each seeing R of the keys in R of its cache.
    fleet, share = sampling.miniature(FleetConfig(instances=100), 0.1, Strategy.RANDOM)
    assert (fleet.instances, fleet.cache_scale, share) == (100, 0.1, 0.1)
    fleet, share = sampling.miniature(FleetConfig(instances=100, strategy=Strategy.KV_AWARE), 0.1)
    assert (fleet.instances, fleet.cache_scale, share) == (10, 1.0, 1.0)  # KV_AWARE keeps a key where it is cached


@pytest.mark.parametrize("strategy", [Strategy.PREFIX_AWARE, Strategy.RANDOM])
def test_a_ten_percent_miniature_of_a_large_fleet_holds_the_whole_inside_its_bands(strategy):
    # 20 times the long-context workload (9,000 prefixes at 60 requests/s on 140 p5s) for 30 minutes:
    # 10,800 requests at 10 %, 77 a copy for RANDOM.
    spec = LongContextSpec(prefixes=9000, rate_rps=60.0, instances=140, duration_s=1800)
    trace = long_context_workload(spec, seed=2)
    config = spec.fleet_config(strategy=strategy)
    whole = simulate(trace, config)
    assert sampling.plan(trace, config, 0.1).rate == 0.1
    part = sampling.sample(trace, 0.1, config.key_blocks)
    mini = sampling.simulate_miniature(part, config, strategy, 0.1, len(trace))
    sample = mini.extra["sample"]
    assert (sample["instances"], sample["rate"], sample["of_requests"]) == (
        14 if strategy is Strategy.PREFIX_AWARE else 140, 0.1, len(trace))
    assert abs(mini.hit_rate - whole.hit_rate) <= sample["hit_rate_band"] < 0.05
    for q in (50, 90, 99):
        low, high = sample["bands"][f"ttft_p{q}_s"]
        assert low <= getattr(whole, f"ttft_p{q}_s") <= high
    assert mini.copy_hours == pytest.approx(whole.copy_hours, rel=0.05)


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
def test_a_results_bands_count_a_request_at_its_timeout_as_failed_and_take_the_wider_clustering(timeout_s, served):
    # TTFTs 0.5, 1.0 (exactly the timeout: it failed there), 3.0 and 0.2 s; keys 1..4 on copies 0, 0, 1, 1.
    from types import SimpleNamespace

    trace = _trace([(k, None) for k in (1, 2, 3, 4)])
    result = SimpleNamespace(config=SimpleNamespace(timeout_s=timeout_s), ttft=[0.5, 1.0, 3.0, 0.2],
                             cached_tokens=[10.0, 0.0, 30.0, 5.0], copy_of=[0, 0, 1, 1])
    common = dict(cached=result.cached_tokens, prompts=trace.prompt_tokens, ttft=result.ttft, served=served, fpc=0.5)
    expected = sample_bands.wider(sample_bands.bands(clusters=[0, 0, 1, 1], **common),
                                  sample_bands.bands(clusters=[1, 2, 3, 4], **common))
    assert sampling.result_bands(result, trace, 0.5, 1) == expected


def _miniature_result(copy_hours: float, **extra):
    from types import SimpleNamespace

    return SimpleNamespace(config=SimpleNamespace(total_copies=10, instances=10, timeout_s=None), copy_hours=copy_hours,
                           hotspot_seconds=30.0, hit_over_time=[(10.0, 0.5)], ttft=[0.1, 0.2, 0.3, 0.4],
                           cached_tokens=[100.0, 0.0, 100.0, 50.0], copy_of=[0, 1, 2, 3], extra=dict(extra))


def test_scale_back_puts_a_miniature_in_the_whole_traces_units_by_hand():
    # Share 0.5 of a copy's traffic at rate 0.1, a 100 s trace: the miniature's clock ran twice as fast,
    # so its 10 copies ran 60 s (1/6 copy-hour): 50 s of arrivals and a 10 s tail. Scaled back:
    # 10 × 0.5/0.1 copies × (100 + 10) s = 5,500 copy-seconds; hot seconds and times × 2.
    trace = _trace([(k, None) for k in (1, 2, 3, 4)])
    trace.arrivals = [0.0, 30.0, 60.0, 100.0]
    result = sampling.scale_back(_miniature_result(10 * 60 / 3600), trace, 0.1, 40, 1, 0.5)
    assert result.copy_hours == pytest.approx(5500 / 3600)
    assert result.hotspot_seconds == 60.0 and result.hit_over_time == [(20.0, 0.5)]
    sample = result.extra["sample"]
    assert set(sample) == {"rate", "requests", "of_requests", "instances", "hit_rate_band", "bands"}
    assert (sample["rate"], sample["requests"], sample["of_requests"], sample["instances"]) == (0.1, 4, 40, 10)
    assert sample["hit_rate_band"] > sample_bands.BIAS_HIT_RATE and sample["bands"]["ttft_p50_s"][0] < 0.25
    # A run shorter than the trace's arrivals (40 s against 50 s) has no tail: 10 × 5 × 100 s.
    short = sampling.scale_back(_miniature_result(10 * 40 / 3600), trace, 0.1, 40, 1, 0.5)
    assert short.copy_hours == pytest.approx(5000 / 3600)
    # The whole trace is returned as it is.
    whole = _miniature_result(1.0)
    assert sampling.scale_back(whole, trace, 1.0, 4, 1, 1.0) is whole and whole.copy_hours == 1.0
    assert "sample" not in whole.extra


def test_a_miniature_runs_the_strategy_asked_for_and_routes_as_sent_only_raw_bodies():
    trace = _trace([(k, None) for k in range(100)])
    config = FleetConfig(instances=80, block_tokens=100, strategy=Strategy.PREFIX_AWARE)
    part = sampling.sample(trace, 0.1, config.key_blocks)
    result = sampling.simulate_miniature(part, config, Strategy.RANDOM, 0.1, len(trace))
    assert result.strategy == "RANDOM" and result.config.instances == 80  # RANDOM keeps every copy
    with pytest.raises(UserError, match="routing as sent needs raw request bodies"):
        sampling.simulate_miniature(part, config, Strategy.PREFIX_AWARE, 0.1, len(trace), as_sent=True)


def test_a_trace_without_tokens_has_no_effective_keys():
    assert sampling.effective_keys(Trace([], [], [], [], block_tokens=100, source="t"), key_blocks=1) == 0.0


def test_the_whole_trace_asked_for_is_never_judged():
    trace = _trace([(1, None)])  # one key on 2 instances: every rule would refuse a sample
    assert sampling.plan(trace, FleetConfig(instances=2), 1.0) == sampling.SamplePlan(1.0, 1.0)


def test_a_ratio_of_small_denominators_still_has_a_band():
    # Σ 0.3 of 0.6: h = 0.5, residuals (0.1 − 0.15)² + (0.2 − 0.15)² = 0.005; × (1 − 0.5) × 2 / 0.36.
    band = sample_bands.ratio_band([(0.1, 0.3), (0.2, 0.3)], 0.5)
    assert band == pytest.approx(12.706 * math.sqrt(0.5 * 2 * 0.005 / 0.36))


def test_a_percentile_band_counts_the_values_at_the_percentile_as_under_it():
    # 1, 2, 2, 3 in clusters (1, 2) and (2, 3): P50 = 2; at or under it 3 of 4, (2, 1) per cluster:
    # residuals (2 − 1.5)² + (1 − 1.5)² = 0.5; at R = 0.99 the variance is 0.01 × 2 × 0.5 / 16, so
    # 0.75 ± 12.706 × 0.025 = 0.43 to 1: the percentiles 43 and 100, at positions 1.3 and 3 of the
    # sorted values: 2 and 3 (counting only the values under 2 would give 0.25 ± 0.32: 1 to 2).
    low, high = sample_bands.percentile_band([1.0, 2.0, 2.0, 3.0], ["a", "a", "b", "b"], 50, 0.01)
    assert (low, high) == (2.0, 3.0)
    # At R = 0.5 the band is the whole range.
    assert sample_bands.percentile_band([1.0, 2.0, 2.0, 3.0], ["a", "a", "b", "b"], 50, 0.5) == (1.0, 3.0)


def test_a_figure_and_its_band_read_as_the_lab_prints_them():
    assert sample_bands.share_text(0.737, 0.005) == "73.7% ±0.5%"
    assert sample_bands.ms_text(0.107, (0.105, 0.1104)) == "107 (105–110)"
    assert sample_bands.ms_text(1.5, (1.2345, 2.0)) == "1,500 (1,234–2,000)"


def test_the_grids_miniature_is_prefix_awares_whatever_the_fleet_is_deployed_with():
    # 100 instances deployed with RANDOM at 0.1: the PREFIX_AWARE grid on 10 whole instances at the
    # trace's speed × 2; its RANDOM baseline on all 100, each cache × 0.1, the clock × 10 × 2.
    fleet, speed, (base, base_speed) = sampling.grid_miniatures(FleetConfig(instances=100, strategy=Strategy.RANDOM),
                                                                0.1, speed=2.0)
    assert (fleet.instances, fleet.cache_scale, speed) == (10, 1.0, 2.0)
    assert (base.instances, base.cache_scale, base_speed) == (100, 0.1, pytest.approx(20.0))
