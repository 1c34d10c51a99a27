"""The routing advisor on a request log written by the real front door code for a known workload.

The workload is the Mooncake slice (tests/data): every request starts with the same block, so a
PrefixLength inside that block keys all of them alike and PREFIX_AWARE sends everything to one copy.
"""

from __future__ import annotations

import json

import pytest

from prefix_routing import frontdoor
from prefix_routing.lab import advisor, traces
from prefix_routing.lab.bodies import chat_body
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.traces import Trace
from prefix_routing.rules import NormalizerSettings
from prefix_routing.rules.telemetry import LogField
from tests.conftest import MOONCAKE_SLICE
from tests.prefix_routing.frontdoor.conftest import KEY, FakeRuntime, Lines, config, sse_chunks, url_event

T0_MS = 1_796_032_800_000


def front_door_log(path, records, *, prefix_length: int) -> None:
    """Each record through the front door (FakeRuntime answers with usage), its request log line
    kept, with the record's arrival time as the line's timestamp (the fake answers at once)."""
    cfg = config(settings=NormalizerSettings(prefix_length=prefix_length))
    out = []
    for record in records:
        usage = {"prompt_tokens": record["input_length"], "completion_tokens": 1,
                 "total_tokens": record["input_length"] + 1,
                 "prompt_tokens_details": {"cached_tokens": record["input_length"] // 4}}
        lines = Lines()  # one per request: Lines.requests parses all it holds
        invoker = frontdoor.Invoker(FakeRuntime(sse_chunks(usage=usage)), cfg, KEY, emit=lines)
        body = json.dumps(chat_body(record, max_tokens=record["output_length"]))
        assert invoker.buffered(frontdoor.request_from_event(url_event(body))).status == 200
        (line,) = lines.requests
        line[LogField.TIMESTAMP_MS] = T0_MS + int(record["timestamp"])
        out.append(json.dumps(line))
    path.write_text("\n".join(out) + "\n")


@pytest.fixture(scope="module")
def slice_records():
    return [json.loads(line) for line in MOONCAKE_SLICE.read_text().splitlines()[:600]]


@pytest.fixture(scope="module")
def window(tmp_path_factory, slice_records):
    path = tmp_path_factory.mktemp("advisor") / "log.jsonl"
    front_door_log(path, slice_records, prefix_length=1024)
    return traces.read_request_log(path)


def fleet(prefix_length: int) -> FleetConfig:
    return FleetConfig(instances=4, prefix_length=prefix_length, concurrency_threshold=1024,
                       block_tokens=512, block_bytes=2048)


def test_the_log_is_the_front_doors_and_every_request_shares_the_first_block(window):
    assert len(window) == 600 and window.block_bytes == 2048
    assert len({blocks[0] for blocks in window.blocks}) == 1
    # The fake reported a quarter of each prompt as cached: the measured hit rate is that.
    assert window.measured_hit_rate() == pytest.approx(0.25, abs=0.01)


def test_a_prefix_length_inside_the_shared_block_gets_a_longer_one_recommended(window):
    advice = advisor.advise(window, fleet(1024), thresholds=(1024,))
    assert advice["current"]["prefix_length"] == 1024
    assert advice["best"]["prefix_length"] > 2048  # beyond the shared first block (2,048 bytes)
    assert advice["better"] is True
    # At 1024 all 600 requests go to one copy: it queues, and the best setting spreads them.
    assert advice["ttft_gain"] > 0.2 or advice["gain_points"] > 5
    assert advice["measured_hit_rate"] == pytest.approx(0.25, abs=0.01)
    assert 0 < advice["current"]["predicted_hit_rate"] <= advice["hit_rate_bound"] + 1e-9
    assert f"prefix_length = {advice['best']['prefix_length']}" in advice["snippet"]
    assert "change the stage file" in advisor.render(advice)


def test_with_the_good_setting_there_is_nothing_to_change(window):
    best = advisor.advise(window, fleet(1024), thresholds=(1024,))["best"]["prefix_length"]
    advice = advisor.advise(window, fleet(best), thresholds=(1024,))
    assert advice["better"] is False and "no change" in advisor.render(advice)


def test_a_sampled_advice_on_a_small_fleet_runs_the_whole_window_and_says_why(window):
    # 4 instances at 0.5 leave 2, fewer than the 8 whole copies a miniature needs.
    whole = advisor.advise(window, fleet(8192), thresholds=(1024,))
    advice = advisor.advise(window, fleet(8192), thresholds=(1024,), sample=0.5)
    sampled = advice["window"]["sample"]
    assert (sampled["rate"], sampled["asked"], sampled["requests"]) == (1.0, 0.5, len(window))
    assert advice["current"] == whole["current"] and advice["best"] == whole["best"]
    assert (advice["hit_rate_bound"], advice["measured_hit_rate"]) == (whole["hit_rate_bound"], whole["measured_hit_rate"])
    text = advisor.render(advice)
    assert "sample: --sample 0.5: ran the whole trace instead: 4 instances at rate 0.5 leave 2" in text
    assert "simulated on a sample" not in text and "±" not in text
    assert "sample" not in whole["window"]


def test_a_notification_comes_once_after_the_runs_and_not_again_for_the_same_advice():
    better = {"better": True, "best": {"prefix_length": 8192, "concurrency_threshold": 16}}
    other = {"better": True, "best": {"prefix_length": 4096, "concurrency_threshold": 16}}
    fine = {"better": False, "best": {"prefix_length": 1024, "concurrency_threshold": 16}}
    state, sent = None, []
    for advice in [better] * 5 + [other] * 3 + [fine] + [other] * 3:
        due, state = advisor.notify(advice, state, after_runs=3)
        sent.append(due)
    assert sent == [False, False, True, False, False,  # the third run in a row, then not again
                    False, False, True,  # a new recommendation counts its own runs
                    False,  # the settings are fine: everything clears
                    False, False, True]  # so a relapse to the same advice is news again
    assert state == {"recommendation": [4096, 16], "runs": 3, "notified": [4096, 16]}
    assert json.loads(json.dumps(state)) == state  # plain JSON: the function keeps it between runs


def test_an_interrupted_streak_starts_over():
    better = {"better": True, "best": {"prefix_length": 8192, "concurrency_threshold": 16}}
    fine = {"better": False, "best": {"prefix_length": 1024, "concurrency_threshold": 16}}
    state, sent = None, []
    for advice in (better, better, fine, better, better, better):
        due, state = advisor.notify(advice, state, after_runs=3)
        sent.append(due)
    assert sent == [False, False, False, False, False, True]


def test_notify_settings_name_the_field_and_what_is_allowed():
    from prefix_routing.rules.errors import UserError

    with pytest.raises(UserError, match=r"advisor.notify_after_runs=0: allowed: an integer from 1 to 1000"):
        advisor.NotifySettings(after_runs=0)
    with pytest.raises(UserError, match=r"advisor.notify_gain_points=-1: allowed"):
        advisor.NotifySettings(gain_points=-1)


def test_a_run_publishes_the_advisor_metrics_from_its_advice():
    from prefix_routing.rules import telemetry as t

    advice = {"hit_rate_bound": 0.37, "prefix_reuse_share": 0.446, "measured_hit_rate": None,
              "current": {"predicted_hit_rate": 0.09, "prefix_length": 1024, "concurrency_threshold": 1024},
              "best": {"predicted_hit_rate": 0.29, "prefix_length": 8192, "concurrency_threshold": 8}}
    values = dict((spec.name, v) for spec, v in advisor.metric_values(advice))
    assert values == {"HitRateBound": 0.37, "PredictedHitRate": 0.09, "BestPredictedHitRate": 0.29,
                      "PrefixReuseShare": 0.446, "RecommendedPrefixLength": 8192.0,
                      "RecommendedConcurrencyThreshold": 8.0}  # no measured hit rate: none reported
    values = dict((spec, v) for spec, v in advisor.metric_values({**advice, "measured_hit_rate": 0.31}))
    assert values[t.MEASURED_HIT_RATE] == 0.31 and set(values) == set(t.ADVISOR_METRICS)


def test_no_threshold_below_the_scaling_target_is_recommended(window):
    # The stage file refuses a ConcurrencyThreshold below scaling.target_concurrent_requests_per_copy.
    advice = advisor.advise(window, fleet(1024), prefix_lengths=(1024, 4096), thresholds=(1, 2, 4, 8, 1024),
                            min_threshold=4)
    assert advice["best"]["concurrency_threshold"] >= 4


def test_an_overloaded_fleet_is_said_before_its_hit_rates(window):
    # At PrefixLength 1024 all 600 requests go to one of the four copies: they queue, and some time out.
    advice = advisor.advise(window, fleet(1024), thresholds=(1024,))
    assert advice["overloaded"].startswith("the modelled fleet is overloaded: ")
    assert "of 600 timed out after 60 s" in advice["overloaded"]
    text = advisor.render(advice)
    assert f"warning: {advice['overloaded']}" in text
    assert text.index("warning: the modelled fleet") < text.index("best:")
    # Spread over the four copies, fewer than half the requests wait and none times out.
    assert advisor.advise(window, fleet(8192), thresholds=(1024,))["overloaded"] is None


def chain_window() -> Trace:
    """49 requests, each a chain of 1 to 5 shared blocks: every PrefixLength caches about the same,
    and the tune rule's pick (the least imbalanced, none being under 1.2) caches less than now."""
    n = 49
    return Trace([float(i) for i in range(n)], [(i % 5 + 1) * 512 for i in range(n)], [100] * n,
                 [list(range(i % 5 + 1)) for i in range(n)], block_tokens=512, block_bytes=2048, source="chain")


def test_settings_predicted_worse_than_now_are_never_recommended():
    config = FleetConfig(instances=3, preset="g6e.xlarge-llama3.1-8b", prefix_length=4096, concurrency_threshold=10,
                         block_tokens=512, block_bytes=2048)
    window = chain_window()
    # What the tune rule alone would pick here: PrefixLength 8192, 2 points of hit rate below now.
    from prefix_routing.lab.tune import tune

    picked = tune(window, config, prefix_lengths=(4096, 8192), thresholds=(10,), baselines=())["recommendation"]
    assert picked["prefix_length"] == 8192
    assert picked["hit_rate"] < advisor.advise(window, config, min_threshold=4)["current"]["predicted_hit_rate"] - 0.01
    advice = advisor.advise(window, config, min_threshold=4)
    assert advice["kept_current"] is True and advice["better"] is False
    assert (advice["best"]["prefix_length"], advice["best"]["concurrency_threshold"]) == (4096, 10)
    assert advice["gain_points"] == 0.0 and advice["ttft_gain"] == 0.0
    assert "best: keep the current settings" in advisor.render(advice)
    values = {spec.name: v for spec, v in advisor.metric_values(advice)}
    assert values["RecommendedPrefixLength"] == 4096.0 and values["BestPredictedHitRate"] == values["PredictedHitRate"]


def test_a_worse_pick_gives_way_to_a_tried_setting_that_beats_now():
    def point(pl, hit, p50):
        return {"prefix_length": pl, "concurrency_threshold": 10, "hit_rate": hit, "ttft_p50_s": p50}

    now = point(4096, 0.50, 1.0)
    worse = point(8192, 0.47, 0.9)  # 3 points below now
    better = point(16384, 0.52, 0.7)  # 30 % lower P50, hit rate up
    slightly = point(2048, 0.505, 0.98)  # no worse, but not by the bar
    assert advisor._choose(worse, now, [now, worse, slightly, better], advisor.NotifySettings()) is better
    assert advisor._choose(worse, now, [now, worse, slightly], advisor.NotifySettings()) is now
    assert advisor._choose(slightly, now, [now, worse, slightly], advisor.NotifySettings()) is slightly


def measured_window(cached_share: float) -> Trace:
    """Ten unique prompts (nothing to reuse: the bound is 0) whose log reports cached tokens."""
    n = 10
    return Trace([float(i) for i in range(n)], [1024] * n, [10] * n, [[2 * i, 2 * i + 1] for i in range(n)],
                 block_tokens=512, block_bytes=2048, cached_tokens=[int(1024 * cached_share)] * n, source="w")


def test_a_measured_hit_rate_above_the_bound_says_whether_the_bound_or_the_window_is_off():
    config = FleetConfig(instances=2, prefix_length=4096, concurrency_threshold=1024, block_tokens=512,
                         block_bytes=2048)
    advice = advisor.advise(measured_window(0.5), config, thresholds=(1024,))
    assert advice["hit_rate_bound"] == 0.0 and advice["measured_hit_rate"] == 0.5
    above = advice["measured_above_bound"]
    assert above["cause"] == "bound" and "the model's bound is too low for this log" in above["text"]
    assert f"warning: {above['text']}" in advisor.render(advice)
    sampled = measured_window(0.5)
    sampled.sampled = "read the first 10 events only"
    above = advisor.advise(sampled, config, thresholds=(1024,))["measured_above_bound"]
    assert above["cause"] == "sampled" and "the log is sampled (read the first 10 events only)" in above["text"]
    skipped = measured_window(0.5)
    skipped.skipped.add("w:3", "bad 'prompt_tokens'")
    assert "1 line skipped" in advisor.advise(skipped, config, thresholds=(1024,))["measured_above_bound"]["text"]
    assert advisor.advise(measured_window(0.005), config, thresholds=(1024,))["measured_above_bound"] is None
