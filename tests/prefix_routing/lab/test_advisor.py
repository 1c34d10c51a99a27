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
