"""Copy counts sampled once a minute and carried by the request metrics (prefix_routing.frontdoor.copies)."""

import datetime

import boto3
from botocore.stub import Stubber

from prefix_routing import frontdoor
from prefix_routing.frontdoor.copies import CopyCounts
from prefix_routing.rules import telemetry
from tests.prefix_routing.frontdoor.conftest import KEY, FakeRuntime, config, url_event

NOW = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)
ARN = "arn:aws:sagemaker:us-east-1:111122223333:"


def _described(desired, current):
    return {"InferenceComponentName": "ic", "InferenceComponentArn": ARN + "inference-component/ic", "EndpointName": "ep",
            "EndpointArn": ARN + "endpoint/ep", "CreationTime": NOW, "LastModifiedTime": NOW,
            "RuntimeConfig": {"DesiredCopyCount": desired, "CurrentCopyCount": current}}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _stubbed(*answers):
    client = boto3.client("sagemaker", region_name="us-east-1")
    stub = Stubber(client)
    for answer in answers:
        if isinstance(answer, str):
            stub.add_client_error("describe_inference_component", service_error_code=answer,
                                  expected_params={"InferenceComponentName": "ic"})
        else:
            stub.add_response("describe_inference_component", answer, {"InferenceComponentName": "ic"})
    stub.activate()
    return client, stub


def test_one_reading_per_interval_and_the_client_made_on_first_use():
    client, stub = _stubbed(_described(3, 2), _described(3, 3))
    made, clock = [], Clock()
    copies = CopyCounts(lambda: made.append(1) or client, "ic", interval_s=60, clock=clock)
    assert made == []  # nothing at construction: the cold start does not pay for the client
    assert copies.sample() == (3, 2) and made == [1]
    clock.now += 59.9
    assert copies.sample() is None  # not due
    clock.now += 0.1
    assert copies.sample() == (3, 3) and made == [1]
    stub.assert_no_pending_responses()


def test_a_failed_reading_is_tried_again_an_interval_later_and_never_raises():
    client, stub = _stubbed("AccessDeniedException", _described(2, 2))
    clock = Clock()
    copies = CopyCounts(lambda: client, "ic", interval_s=60, clock=clock)
    assert copies.sample() is None and copies.last_error == "ClientError"
    clock.now += 30
    assert copies.sample() is None  # backs off a whole interval
    clock.now += 30
    assert copies.sample() == (2, 2) and copies.last_error is None


def test_the_sampled_counts_ride_on_the_next_requests_metrics(lines):
    client, _ = _stubbed(_described(4, 3))
    clock = Clock()
    copies = CopyCounts(lambda: client, "ic", interval_s=60, clock=clock)
    invoker = frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=lines,
                                telemetry_sink=frontdoor.Telemetry(config(), lines, copies=copies))
    for _ in range(2):
        list(invoker.stream(frontdoor.request_from_event(url_event())))
    first, second = lines.emf
    assert first[telemetry.DESIRED_COPIES.name] == 4 and first[telemetry.CURRENT_COPIES.name] == 3
    names = {m["Name"] for m in first["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert {telemetry.DESIRED_COPIES.name, telemetry.CURRENT_COPIES.name} <= names
    assert telemetry.DESIRED_COPIES.name not in second  # within the minute: no second reading


def test_the_latest_current_copy_count_is_kept_for_replication():
    client, stub = _stubbed(_described(3, 2), "ThrottlingException", _described(4, 4))
    clock = Clock()
    copies = CopyCounts(lambda: client, "ic", interval_s=60, clock=clock)
    assert copies.current is None  # nothing read yet
    copies.sample()
    assert copies.current == 2
    clock.now += 60
    assert copies.sample() is None and copies.current == 2  # a failed reading keeps the last one
    clock.now += 60
    copies.sample()
    assert copies.current == 4
    stub.assert_no_pending_responses()
