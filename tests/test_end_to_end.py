"""The parts together on 127.0.0.1: the emulator (stage config -> fleet model -> runtime protocol),
the load tester, and the normalizer's invoker (the Lambda's logic) with boto3's own client.

Issue 5's acceptance: the load tester's P50 TTFT agrees with the emulator's own within 5 %; under
each injected fault kind every request is accounted exactly once, as succeeded or as failed with
its reason, by the load tester and by the handler alike.
"""

from __future__ import annotations

import statistics

import boto3
import pytest
from botocore.config import Config

from prefix_routing import frontdoor
from prefix_routing.cli.demo_run import long_context_items
from prefix_routing.emulator.faults import Faults
from prefix_routing.emulator.fleet_backend import start_emulator
from prefix_routing.loadtest import SageMakerTarget, run_load, summarize
from prefix_routing.rules.settings import NormalizerSettings
from prefix_routing.stage.config import load_stage
from tests.prefix_routing.frontdoor.conftest import Lines, url_event

FAULTS = {
    # fault spec -> the kinds a request failed by it may be reported as
    "throttle_rate=0.4": {"throttled"},
    "error_rate=0.4,error_kind=ServiceUnavailable": {"http_503", "model_error"},
    "stream_error_after=2,stream_error_rate=0.4": {"stream_error"},
    "truncate_after=2,truncate_rate=0.4": {"truncated"},
    "drop_after=2,drop_rate=0.4": {"connection", "stream_error", "truncated"},
}
HANDLER_STATUS = {  # what the front door answers a caller for each fault
    "throttle_rate=0.4": {429},
    "error_rate=0.4,error_kind=ServiceUnavailable": {503},
    "stream_error_after=2,stream_error_rate=0.4": {502},
    "truncate_after=2,truncate_rate=0.4": {502},
    "drop_after=2,drop_rate=0.4": {502, 504},
}


def test_load_tester_p50_ttft_agrees_with_the_emulators_own_within_5_percent():
    config = load_stage("llama70b-p5")
    items = long_context_items(40, seed=2)  # 8,000-token prompts: TTFTs of 100-500 ms at speed 1
    server = start_emulator(config, speed=1.0, seed=2)
    try:
        target = SageMakerTarget(config.endpoint_name, inference_component=config.component_name,
                                 endpoint_url=server.url, region="us-east-1", concurrency=4)
        try:
            result = run_load(items, target, concurrency=4, rate=8.0, progress=False)
        finally:
            target.close()
        server.wait_until_idle(30)
        emulator_ttfts = [s.ttft_s for s in server.backend.served.values()]
    finally:
        server.stop()
    summary = summarize(result)
    assert summary["succeeded"] == len(items) == len(emulator_ttfts)
    client, own = summary["ttft_p50_s"], statistics.median(emulator_ttfts)
    assert own > 0.05
    assert abs(client - own) / own <= 0.05, (client, own)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_load_tester_accounts_for_every_request_once_under(fault):
    config = load_stage()
    server = start_emulator(config, speed=50.0, faults=Faults.from_spec(f"{fault},seed=7"))
    items = long_context_items(25, seed=1)
    try:
        target = SageMakerTarget(config.endpoint_name, inference_component=config.component_name,
                                 endpoint_url=server.url, region="us-east-1", concurrency=4)
        try:
            result = run_load(items, target, concurrency=4, rate=50.0, progress=False)
        finally:
            target.close()
        server.wait_until_idle(30)
        records = server.requests
    finally:
        server.stop()
    summary = summarize(result)
    assert summary["requests_sent"] == summary["succeeded"] + summary["failed"] == len(items) == len(records)
    assert summary["failed"] > 0
    failures = [r for r in result.results if not r.ok]
    assert {r.error_kind for r in failures} <= FAULTS[fault], {r.error_kind for r in failures}
    assert all(r.error_detail for r in failures)
    faulted = sum(1 for record in records if record.fault)
    assert faulted == summary["failed"]


@pytest.mark.parametrize("fault", sorted(HANDLER_STATUS))
def test_handler_accounts_for_every_request_once_under(fault):
    config = load_stage()
    server = start_emulator(config, speed=50.0, faults=Faults.from_spec(f"{fault},seed=3"))
    lines = Lines()
    client = boto3.client(
        "sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1", aws_access_key_id="t",
        aws_secret_access_key="t", config=Config(retries={"total_max_attempts": 1}, read_timeout=10),
    )
    invoker = frontdoor.Invoker(
        client,
        frontdoor.InvokeConfig(endpoint_name=config.endpoint_name, component_name=config.component_name,
                            tenancy="iam", settings=NormalizerSettings(prefix_length=config.routing.prefix_length)),
        b"0123456789abcdef-end-to-end-key",
        emit=lines,
        sleep=lambda seconds: None,
        jitter=lambda: 0.0,
    )
    bodies = [item.body for item in long_context_items(20, seed=4)]
    try:
        answers = [invoker.buffered(frontdoor.request_from_event(url_event(body))) for body in bodies]
        server.wait_until_idle(30)
        records = server.requests
    finally:
        server.stop()
        client.close()
    ok = [a for a in answers if a.status == 200]
    failed = [a for a in answers if a.status != 200]
    assert failed and ok
    # Every attempt reached the emulator once (the calls are sequential, so its records are in order):
    # a caller's answer is a success exactly when its last attempt met no fault.
    attempts = [log["attempts"] for log in lines.requests]
    assert len(attempts) == len(bodies) and sum(attempts) == len(records)
    last_attempts = [records[sum(attempts[:i + 1]) - 1] for i in range(len(bodies))]
    assert [a.status == 200 for a in answers] == [r.fault in (None, "slow_first_chunk") for r in last_attempts]
    assert {a.status for a in failed} <= HANDLER_STATUS[fault], {a.status for a in failed}
    assert all(a.body["error"]["message"] for a in failed)
    # No truncated or failed answer passes as complete: every 200 carries the model's final usage.
    assert all(a.body.get("usage", {}).get("prompt_tokens", 0) > 0 for a in ok)
    # One log line per caller request, whatever the retries, with the status the caller got.
    logged = sorted(r["status"] for r in lines.requests)
    assert logged == sorted(a.status for a in answers)
