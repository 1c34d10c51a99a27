"""The advisor function's run: moto's CloudWatch Logs and SSM with a log the real front door wrote,
Stubber for CloudWatch, SageMaker and SNS (what it publishes, and when it notifies)."""

from __future__ import annotations

import json

import boto3
import moto
import pytest
from botocore.stub import ANY, Stubber

from prefix_routing.advisor import AdvisorConfig, Clients, run_once
from prefix_routing.advisor.function import ConfigurationError
from prefix_routing.rules import telemetry
from tests.conftest import MOONCAKE_SLICE
from tests.prefix_routing.lab.test_advisor import T0_MS, front_door_log

GROUP = "/aws/lambda/PrefixRouting-test-Normalizer"
TOPIC = "arn:aws:sns:us-east-1:111122223333:test-alarms"
ENV = {
    "REQUEST_LOG_GROUP": GROUP, "INFERENCE_COMPONENT_NAME": "test-prefix-llm-ic", "STAGE": "test",
    "INSTANCE_TYPE": "ml.p5.48xlarge", "MODEL": "meta-llama/Llama-3.1-70B-Instruct", "TENSOR_PARALLEL_DEGREE": "8",
    "COPIES_PER_INSTANCE": "1", "COPIES_MAX": "4", "PREFIX_LENGTH": "1024", "CONCURRENCY_THRESHOLD": "1024",
    "ALARM_TOPIC_ARN": TOPIC, "STATE_PARAMETER": "/prefix-routing/test/advisor-state", "WINDOW_S": "3600",
}


@pytest.fixture
def aws(monkeypatch, tmp_path):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    records = [json.loads(line) for line in MOONCAKE_SLICE.read_text().splitlines()[:300]]
    path = tmp_path / "log.jsonl"
    front_door_log(path, records, prefix_length=1024)
    with moto.mock_aws():
        logs = boto3.client("logs", region_name="us-east-1")
        logs.create_log_group(logGroupName=GROUP)
        logs.create_log_stream(logGroupName=GROUP, logStreamName="2026/12/01/[$LATEST]abc")
        lines = path.read_text().splitlines()
        events = [{"timestamp": json.loads(line)[telemetry.LogField.TIMESTAMP_MS], "message": line} for line in lines]
        logs.put_log_events(logGroupName=GROUP, logStreamName="2026/12/01/[$LATEST]abc", logEvents=events)
        yield logs, max(e["timestamp"] for e in events) + 1000


def stubbed(service: str):
    client = boto3.client(service, region_name="us-east-1")
    return client, Stubber(client)


def test_three_runs_publish_the_figures_and_notify_once(aws):
    logs, now_ms = aws
    cfg = AdvisorConfig.from_env(ENV)
    cloudwatch, cw_stub = stubbed("cloudwatch")
    sagemaker, sm_stub = stubbed("sagemaker")
    sns, sns_stub = stubbed("sns")
    published = []
    cloudwatch.meta.events.register("provide-client-params.cloudwatch.PutMetricData",
                                    lambda params, **_: published.append(params))
    clients = Clients(logs=logs, cloudwatch=cloudwatch, sagemaker=sagemaker, sns=sns,
                      ssm=boto3.client("ssm", region_name="us-east-1"))
    with cw_stub, sm_stub, sns_stub:
        for run in range(1, 5):
            sm_stub.add_response("describe_inference_component",
                                 {"InferenceComponentName": "test-prefix-llm-ic", "InferenceComponentArn": "arn:aws:sagemaker:us-east-1:111122223333:inference-component/x",
                                  "EndpointName": "e", "EndpointArn": "arn:aws:sagemaker:us-east-1:111122223333:endpoint/e", "CreationTime": 0, "LastModifiedTime": 0,
                                  "RuntimeConfig": {"CurrentCopyCount": 4, "DesiredCopyCount": 4}},
                                 {"InferenceComponentName": "test-prefix-llm-ic"})
            cw_stub.add_response("put_metric_data", {}, {"Namespace": telemetry.NAMESPACE, "MetricData": ANY})
            if run == 3:  # the third run in a row with the same recommendation, and only that one
                sns_stub.add_response("publish", {"MessageId": "m1"},
                                      {"TopicArn": TOPIC, "Subject": ANY, "Message": ANY})
            result = run_once(cfg, clients, now_ms)
            assert result["advised"] and result["better"] and result["notified"] is (run == 3)
            assert result["copies"] == 4 and result["requests"] == 300
        sns_stub.assert_no_pending_responses()
    names = {m["MetricName"] for m in published[0]["MetricData"]}
    assert names == {s.name for s in telemetry.ADVISOR_METRICS}  # the front door's log reports cached tokens
    values = {m["MetricName"]: m["Value"] for m in published[0]["MetricData"]}
    assert values["RecommendedPrefixLength"] > 2048 and values["BestPredictedHitRate"] >= values["PredictedHitRate"]
    assert all(m["Dimensions"] == [{"Name": telemetry.DIMENSION_COMPONENT, "Value": "test-prefix-llm-ic"}]
               for m in published[0]["MetricData"])
    state = json.loads(clients.ssm.get_parameter(Name=ENV["STATE_PARAMETER"])["Parameter"]["Value"])
    assert state["runs"] == 4 and state["notified"] == state["recommendation"]


def test_an_empty_window_advises_nothing_and_publishes_nothing(aws):
    logs, now_ms = aws
    cfg = AdvisorConfig.from_env(ENV)
    cloudwatch, cw_stub = stubbed("cloudwatch")
    with cw_stub:  # no response queued: a call would fail the test
        result = run_once(cfg, Clients(logs=logs, cloudwatch=cloudwatch, sagemaker=None), T0_MS - 10_000_000)
    assert result["advised"] is False and "no requests found" in result["reason"]


@pytest.mark.parametrize(("change", "message"), [
    ({"REQUEST_LOG_GROUP": ""}, "REQUEST_LOG_GROUP: missing"),
    ({"PREFIX_LENGTH": "512"}, "PREFIX_LENGTH: '512'; allowed: from 1024 to 65536"),
    ({"COPIES_MAX": "many"}, "COPIES_MAX: 'many' is not an integer"),
    ({"NOTIFY_AFTER_RUNS": "0"}, "NOTIFY_AFTER_RUNS: '0'; allowed: from 1 to 1000"),
])
def test_configuration_errors_name_the_variable(change, message):
    with pytest.raises(ConfigurationError, match=message):
        AdvisorConfig.from_env({**ENV, **change})


class _Deadline:
    """Fail, instead of hanging, if the block runs longer than ``seconds`` (SIGALRM, main thread)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __enter__(self):
        import signal

        def expired(signum, frame):
            raise TimeoutError(f"still running after {self.seconds:g} s")

        self._previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        import signal

        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._previous)


def test_a_hostile_log_line_is_skipped_by_name_and_the_run_finishes(monkeypatch):
    # One line anyone who can call the front door could cause to be written: output_tokens 10**12.
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    F = telemetry.LogField
    lines = [{F.MESSAGE: telemetry.REQUEST_LOG_MESSAGE, F.TIMESTAMP_MS: T0_MS + 1000 * i, F.STATUS: 200,
              F.BLOCK_HASHES: ["00aa", f"{i:04x}"], F.BLOCK_BYTES: 2048, F.PROMPT_TOKENS: 1024,
              F.OUTPUT_TOKENS: 10**12 if i == 7 else 100} for i in range(40)]
    with moto.mock_aws():
        logs = boto3.client("logs", region_name="us-east-1")
        logs.create_log_group(logGroupName=GROUP)
        logs.create_log_stream(logGroupName=GROUP, logStreamName="s")
        logs.put_log_events(logGroupName=GROUP, logStreamName="s", logEvents=[
            {"timestamp": line[F.TIMESTAMP_MS], "message": json.dumps(line)} for line in lines])
        cloudwatch, cw_stub = stubbed("cloudwatch")
        cw_stub.add_response("put_metric_data", {}, {"Namespace": telemetry.NAMESPACE, "MetricData": ANY})
        with cw_stub, _Deadline(120):
            result = run_once(AdvisorConfig.from_env({**ENV, "ALARM_TOPIC_ARN": "", "STATE_PARAMETER": ""}),
                              Clients(logs=logs, cloudwatch=cloudwatch, sagemaker=None), T0_MS + 60_000)
    assert result["advised"] and result["requests"] == 39
    assert result["skipped"]["reasons"] == {"'output_tokens' above 1,000,000": 1}
