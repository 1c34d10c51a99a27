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
from prefix_routing.rules import sampling, telemetry
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
    yield from _logged(monkeypatch, tmp_path, 1024)


@pytest.fixture
def aws_many_keys(monkeypatch, tmp_path):
    """The same requests logged at PrefixLength 4096: 278 routing keys (at 1024 they share one)."""
    yield from _logged(monkeypatch, tmp_path, 4096)


def _logged(monkeypatch, tmp_path, prefix_length: int):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    records = [json.loads(line) for line in MOONCAKE_SLICE.read_text().splitlines()[:300]]
    path = tmp_path / "log.jsonl"
    front_door_log(path, records, prefix_length=prefix_length)
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


def _describe_copies(sm_stub, copies: int = 4) -> None:
    sm_stub.add_response("describe_inference_component",
                         {"InferenceComponentName": "test-prefix-llm-ic", "InferenceComponentArn": "arn:aws:sagemaker:us-east-1:111122223333:inference-component/x",
                          "EndpointName": "e", "EndpointArn": "arn:aws:sagemaker:us-east-1:111122223333:endpoint/e", "CreationTime": 0, "LastModifiedTime": 0,
                          "RuntimeConfig": {"CurrentCopyCount": copies, "DesiredCopyCount": copies}},
                         {"InferenceComponentName": "test-prefix-llm-ic"})


def test_a_busy_window_is_read_as_a_sample_at_the_rate_its_volume_calls_for(aws_many_keys):
    # The Requests metric says 300 (two datapoints); MAX_EVENTS 300 leaves half, 150, for keyed lines:
    # rate floor(10,000 x 150 / 300) / 10,000 = 0.5, so FilterLogEvents asks for buckets below 5,000.
    logs, now_ms = aws_many_keys
    cfg = AdvisorConfig.from_env({**ENV, "MAX_EVENTS": "300", "PREFIX_LENGTH": "4096"})
    cloudwatch, cw_stub = stubbed("cloudwatch")
    sagemaker, sm_stub = stubbed("sagemaker")
    patterns = []
    logs.meta.events.register("provide-client-params.logs.FilterLogEvents",
                              lambda params, **_: patterns.append(params.get("filterPattern")))
    with cw_stub, sm_stub:
        cw_stub.add_response("get_metric_statistics", {"Datapoints": [{"Sum": 120.0}, {"Sum": 180.0}]}, {
            "Namespace": telemetry.NAMESPACE, "MetricName": "Requests", "Statistics": ["Sum"], "Period": 3600,
            "Dimensions": [{"Name": "InferenceComponent", "Value": "test-prefix-llm-ic"}],
            "StartTime": (now_ms - 3_600_000) / 1000.0, "EndTime": now_ms / 1000.0})
        _describe_copies(sm_stub)
        cw_stub.add_response("put_metric_data", {}, {"Namespace": telemetry.NAMESPACE, "MetricData": ANY})
        result = run_once(cfg, Clients(logs=logs, cloudwatch=cloudwatch, sagemaker=sagemaker), now_ms)
        cw_stub.assert_no_pending_responses()
    assert set(patterns) == {'{ ($.message = "prefix_routing.request") && '
                             '(($.sample_bucket < 5000) || ($.sample_hot IS TRUE)) }'}
    lines = [json.loads(e["message"]) for e in logs.filter_log_events(logGroupName=GROUP)["events"]]
    in_sample = [line for line in lines if line[telemetry.LogField.SAMPLE_BUCKET] < 5000]
    assert 0 < len(in_sample) < len(lines) == 300
    assert result["advised"] and result["sample_rate"] == 0.5 and result["requests"] == len(in_sample)
    window = result["advice"]["window"]
    assert window["volume"] == 300.0 and window["sample"]["rate"] == 0.5 and window["sample"]["at_source"]
    assert 0 < window["sample"]["hit_rate_band"] < 1


def _run_stubbed(logs, now_ms, env: dict, volume: dict | None = None) -> dict:
    """One run with the window's volume answered by ``volume`` (None: must not be asked), the copies
    described, one publication expected."""
    cloudwatch, cw_stub = stubbed("cloudwatch")
    sagemaker, sm_stub = stubbed("sagemaker")
    asked = []
    cloudwatch.meta.events.register("provide-client-params.cloudwatch.GetMetricStatistics",
                                    lambda params, **_: asked.append(params))
    with cw_stub, sm_stub:  # a call without a queued response fails the test
        if volume is not None:
            cw_stub.add_response("get_metric_statistics", volume)
        _describe_copies(sm_stub)
        cw_stub.add_response("put_metric_data", {}, {"Namespace": telemetry.NAMESPACE, "MetricData": ANY})
        result = run_once(AdvisorConfig.from_env({**ENV, **env}),
                          Clients(logs=logs, cloudwatch=cloudwatch, sagemaker=sagemaker), now_ms)
        cw_stub.assert_no_pending_responses()
    assert len(asked) == (volume is not None)
    return result


def test_without_the_volume_the_window_is_read_whole_and_says_so(aws):
    logs, now_ms = aws
    result = _run_stubbed(logs, now_ms, {"MAX_EVENTS": "300"}, volume={"Datapoints": []})  # no data yet
    assert result["sample_rate"] == 1.0 and result["requests"] == 300
    assert any("Requests count was not available" in note for note in result["notes"])


def test_a_set_rate_of_1_reads_whole_without_asking_the_volume(aws):
    logs, now_ms = aws
    result = _run_stubbed(logs, now_ms, {"SAMPLE": "1"})
    assert result["sample_rate"] == 1.0 and result["requests"] == 300
    assert not any("Requests count" in note for note in result["notes"])


@pytest.mark.parametrize(("max_events", "volume", "rate"), [
    (3, 10_000, 0.0001),  # a budget of 1 line: floor(10,000 x 1 / 10,000) = 1 bucket
    (301, 5_000, 0.03),  # 150 lines (max_events // 2): floor(10,000 x 150 / 5,000) = 300 buckets
])
def test_the_auto_rate_keeps_half_of_max_events(max_events, volume, rate):
    from prefix_routing.advisor.function import sample_rate

    cfg = AdvisorConfig.from_env({**ENV, "MAX_EVENTS": str(max_events)})
    assert sample_rate(cfg, volume) == rate and sample_rate(cfg, None) == 1.0


def test_a_set_rate_needs_no_volume(aws_many_keys):
    logs, now_ms = aws_many_keys
    result = _run_stubbed(logs, now_ms, {"SAMPLE": "0.25", "PREFIX_LENGTH": "4096"})
    lines = [json.loads(e["message"]) for e in logs.filter_log_events(logGroupName=GROUP)["events"]]
    assert result["sample_rate"] == 0.25
    assert result["requests"] == sum(line[telemetry.LogField.SAMPLE_BUCKET] < 2500 for line in lines)
    assert sampling.bucket_limit(0.25) == 2500


def test_a_sample_without_lines_is_read_again_whole(aws):
    # At PrefixLength 1024 the 300 requests share one key, bucket 3145 (outside a 0.25 sample): as a
    # log written before the front door logged buckets, the run reads the window whole and says so.
    logs, now_ms = aws
    lines = [json.loads(e["message"]) for e in logs.filter_log_events(logGroupName=GROUP)["events"]]
    assert {line[telemetry.LogField.SAMPLE_BUCKET] for line in lines} == {3145}
    result = _run_stubbed(logs, now_ms, {"SAMPLE": "0.25"})
    assert result["sample_rate"] == 1.0 and result["requests"] == 300
    assert any("no line matched the sample at rate 0.25" in note for note in result["notes"])


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
    ({"SAMPLE": "10 percent"}, "SAMPLE: '10 percent'; allowed: auto, or a rate from 0.0001 to 1"),
    ({"SAMPLE": "0"}, "SAMPLE: '0'; allowed: auto, or a rate from 0.0001 to 1"),
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


@pytest.mark.parametrize(("window_s", "period"), [("60", 60), ("60.001", 120), ("3600", 3600)])
def test_the_volume_is_one_datapoint_of_the_window_rounded_up_to_a_minute(window_s, period):
    from prefix_routing.advisor.function import window_requests

    cfg = AdvisorConfig.from_env({**ENV, "WINDOW_S": window_s})
    cloudwatch, cw_stub = stubbed("cloudwatch")
    end = 1_800_000_000_000
    start = end - int(cfg.window_s * 1000)
    with cw_stub:
        cw_stub.add_response("get_metric_statistics", {"Datapoints": [{"Sum": 7.0}]}, {
            "Namespace": telemetry.NAMESPACE, "MetricName": "Requests", "Statistics": ["Sum"], "Period": period,
            "Dimensions": [{"Name": "InferenceComponent", "Value": "test-prefix-llm-ic"}],
            "StartTime": start / 1000.0, "EndTime": end / 1000.0})
        assert window_requests(cfg, cloudwatch, start, end) == 7.0
