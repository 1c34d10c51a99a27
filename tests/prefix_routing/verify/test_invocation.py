"""verify --invoke against the real front door web app over the emulator, on 127.0.0.1.

The requests are SigV4-signed by the load tester's lambda-url target, as verify sends them; the
front door's own log line (what the Lambda writes) is what the stubbed log group returns.
"""

from __future__ import annotations

import json
import re
import sys
import threading

import boto3
import pytest
from botocore.config import Config
from botocore.credentials import Credentials

from prefix_routing import frontdoor
from prefix_routing.emulator.fleet_backend import start_emulator
from prefix_routing.loadtest.http_targets import LambdaUrlTarget
from prefix_routing.stage.config import load_stage
from prefix_routing.verify.function import QUERIED_FIELDS, check_invocation
from tests.prefix_routing.frontdoor.conftest import KEY, Lines, config, iam_context
from tests.stacks.conftest import ROOT

sys.path.insert(0, str(ROOT / "lambda" / "normalizer"))
import server as web_app  # noqa: E402

LOG_GROUP = "/aws/lambda/normalizer"


@pytest.fixture
def front_door_over_the_emulator():
    lines = Lines()
    stage = load_stage()
    emulator = start_emulator(stage, speed=50.0)
    runtime = boto3.client("sagemaker-runtime", endpoint_url=emulator.url, region_name="us-east-1",
                           config=Config(retries={"total_max_attempts": 1}, read_timeout=20))
    invoker = frontdoor.Invoker(runtime, config(endpoint_name=stage.endpoint_name, component_name=stage.component_name),
                                KEY, emit=lines, jitter=lambda: 0.0)
    app = web_app.make_server("127.0.0.1", 0, get_invoker=lambda: invoker)
    thread = threading.Thread(target=app.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{app.server_address[1]}/", lines
    finally:
        app.shutdown()
        app.server_close()
        thread.join(5)
        runtime.close()
        emulator.stop()


def _sender(url: str):
    # The adapter passes the caller's IAM identity and Lambda's request id in these headers.
    headers = {"x-amzn-request-context": json.dumps(iam_context()),
               "x-amzn-lambda-context": json.dumps({"request_id": "verify-req-1"})}
    target = LambdaUrlTarget(url, region="us-east-1", credentials=Credentials("testing", "testing"), headers=headers,
                             timeout=30)
    return target.send


class LogGroupOf:
    """The normalizer's log group as CloudWatch Logs would answer FilterLogEvents: the front door's own
    request lines, matched on the request id the filter pattern names (the only field verify filters on)."""

    def __init__(self, lines: Lines):
        self.lines, self.calls = lines, []

    def filter_log_events(self, *, logGroupName, filterPattern, startTime):
        self.calls.append((logGroupName, filterPattern))
        wanted = re.search(r'\$\.request_id = "([^"]+)"', filterPattern).group(1)
        assert '$.message = "prefix_routing.request"' in filterPattern
        return {"events": [{"message": json.dumps(line)} for line in self.lines.requests
                           if line.get("request_id") == wanted]}


def test_two_identical_requests_stream_the_second_is_cached_and_the_log_line_is_found(front_door_over_the_emulator):
    url, lines = front_door_over_the_emulator
    logs = LogGroupOf(lines)
    checks = check_invocation(_sender(url), logs, LOG_GROUP, log_wait_s=0)
    titles = {c.title: c for c in checks}
    assert [c.status for c in checks] == ["ok", "ok", "ok"], checks
    assert "tokens streamed" in titles["invocation: streaming"].detail
    assert "prefix caching works end to end" in titles["invocation: cached tokens"].detail
    log = titles[f"request log line in {LOG_GROUP}"]
    assert "verify-req-1" in log.detail and all(field in log.detail for field in QUERIED_FIELDS)
    assert [group for group, _ in logs.calls] == [LOG_GROUP]


def test_a_line_without_the_queried_fields_is_a_failure(front_door_over_the_emulator):
    url, lines = front_door_over_the_emulator

    class OldFrontDoor(LogGroupOf):
        def filter_log_events(self, **kwargs):
            answer = super().filter_log_events(**kwargs)
            for event in answer["events"]:
                line = json.loads(event["message"])
                line.pop("prefix_fingerprint")
                event["message"] = json.dumps(line)
            return answer

    checks = check_invocation(_sender(url), OldFrontDoor(lines), LOG_GROUP, log_wait_s=0)
    (log,) = [c for c in checks if c.title.startswith("request log line")]
    assert log.status == "fail" and "lacks prefix_fingerprint" in log.detail and "redeploy" in log.fix
