"""Errors as the runtime answers them: validation, unknown endpoints, modelled error shapes (prefix_routing.emulator.handler)."""

from __future__ import annotations

import http.client
import json

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.retries.standard import ExponentialBackoff

from prefix_routing.emulator.backend import ErrorReply
from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.faults import Faults
from prefix_routing.emulator.protocol import ERROR_STATUS, OP_INVOKE, OP_INVOKE_STREAM
from prefix_routing.emulator.server import serve_runtime
from tests.prefix_routing.emulator.conftest import BODY, Scripted, client_for


def _get(server, path):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    conn.request("GET", path)
    data = conn.getresponse().read()
    conn.close()
    return data


def test_error_statuses_match_the_service_model():
    model = boto3.client("sagemaker-runtime", region_name="us-east-1").meta.service_model
    modelled = {}
    for operation in (OP_INVOKE, OP_INVOKE_STREAM):
        for shape in model.operation_model(operation).error_shapes:
            if "error" in shape.metadata:
                modelled[shape.name] = shape.metadata["error"]["httpStatusCode"]
    assert modelled == {k: v for k, v in ERROR_STATUS.items() if k != "ThrottlingException"}
    assert "ThrottlingException" not in {s.name for s in model.operation_model(OP_INVOKE).error_shapes}


@pytest.mark.parametrize(
    "kind",
    [
        "ValidationError",
        "ModelError",
        "InternalFailure",
        "ServiceUnavailable",
        "ModelNotReadyException",
        "InternalDependencyException",
    ],
)
def test_each_error_kind_raises_the_modelled_exception(kind):
    with serve_runtime(EchoBackend(), faults=Faults(error_first=2, error_kind=kind)) as server:
        client = client_for(server)
        with pytest.raises(getattr(client.exceptions, kind)) as info:
            client.invoke_endpoint(EndpointName="ep", Body=BODY)
        error = info.value.response
        assert error["Error"]["Code"] == kind
        assert error["ResponseMetadata"]["HTTPStatusCode"] == ERROR_STATUS[kind]
        if kind == "ModelError":
            assert error["OriginalStatusCode"] == 500
            assert json.loads(error["OriginalMessage"])["message"] == "injected fault"
            assert error["LogStreamArn"].startswith("arn:aws:logs:")
        stream_errors = {s.name for s in client.meta.service_model.operation_model(OP_INVOKE_STREAM).error_shapes}
        expected = getattr(client.exceptions, kind) if kind in stream_errors else ClientError
        with pytest.raises(expected) as info:
            client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        assert info.value.response["Error"]["Code"] == kind
        server.wait_until_idle()
        assert [(r.outcome, r.error_code, r.fault) for r in server.requests] == [("error", kind, "error")] * 2


def test_backend_errors_and_bugs():
    reply = ErrorReply(
        "ModelError",
        "bad body",
        original_status_code=400,
        original_message="no prompt",
        log_stream_arn="arn:aws:logs:us-east-1:1:log-group:x",
    )
    with serve_runtime(Scripted(result=reply)) as server:
        client = client_for(server)
        with pytest.raises(client.exceptions.ModelError) as info:
            client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        assert (info.value.response["OriginalStatusCode"], info.value.response["OriginalMessage"]) == (400, "no prompt")
    with serve_runtime(Scripted(raise_in_handle=True)) as server:
        client = client_for(server)
        with pytest.raises(client.exceptions.InternalFailure, match="backend bug"):
            client.invoke_endpoint(EndpointName="ep", Body=BODY)
    with serve_runtime(EchoBackend()) as server:  # the echo model rejects a body without a prompt
        client = client_for(server)
        with pytest.raises(client.exceptions.ModelError) as info:
            client.invoke_endpoint(EndpointName="ep", Body=b'{"foo": 1}')
        assert info.value.response["OriginalStatusCode"] == 400


def test_validation_by_the_server():
    with serve_runtime(EchoBackend(), endpoints={"known"}) as server:
        client = client_for(server)
        with pytest.raises(client.exceptions.ValidationError, match="Endpoint other of account"):
            client.invoke_endpoint(EndpointName="other", Body=BODY)
        with pytest.raises(client.exceptions.ValidationError, match="exceeds the maximum"):
            client.invoke_endpoint(EndpointName="known", Body=b" " * (6 * 1024 * 1024 + 1))
        # botocore checks lengths itself: send a 65-character PrefixAwareId by hand.
        conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
        conn.request(
            "POST",
            "/endpoints/known/invocations",
            body=BODY,
            headers={"X-Amzn-SageMaker-Prefix-Aware-Id": "x" * 65, "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        assert response.status == 400 and response.getheader("X-Amzn-ErrorType") == "ValidationError"
        assert "prefixAwareId" in json.loads(response.read())["Message"]
        conn.request("POST", "/endpoints/known/unknown-op", body=b"")  # same connection: keep-alive works
        response = conn.getresponse()
        assert response.status == 404 and response.read()
        conn.close()
        assert client.invoke_endpoint(EndpointName="known", Body=BODY)["Body"].read()


def test_throttling_is_the_common_throttling_error_and_botocore_retries_it_as_such(monkeypatch):
    scales = []

    def no_sleep(self, context):
        scales.append(self._get_base_scale(context))
        return 0.0

    monkeypatch.setattr(ExponentialBackoff, "delay_amount", no_sleep)
    with serve_runtime(EchoBackend(), faults=Faults(throttle_first=1, error_first=1)) as server:
        client = client_for(server)
        with pytest.raises(ClientError) as info:  # not modelled: a plain ClientError
            client.invoke_endpoint(EndpointName="ep", Body=BODY)
        assert info.value.response["Error"] == {"Code": "ThrottlingException", "Message": "Rate exceeded"}
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        with pytest.raises(client.exceptions.ServiceUnavailable):
            client.invoke_endpoint(EndpointName="ep", Body=BODY)
        server.clear_requests()
    with serve_runtime(EchoBackend(), faults=Faults(throttle_first=1, error_first=1)) as server:
        retrying = client_for(server, attempts=3)
        assert retrying.invoke_endpoint(EndpointName="ep", Body=BODY)["Body"].read()
        server.wait_until_idle()
        assert [(r.outcome, r.error_code) for r in server.requests] == [
            ("error", "ThrottlingException"),
            ("error", "ServiceUnavailable"),
            ("ok", None),
        ]
    assert scales == [1, 0.05]  # botocore's standard mode: throttling backoff, then the 5xx one


def test_throttle_status_429_and_seeded_fractions():
    def throttled(seed):
        with serve_runtime(
            EchoBackend(max_tokens=1), faults=Faults(throttle_rate=0.5, seed=seed, throttle_status=429)
        ) as server:
            conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
            statuses = []
            for _ in range(20):
                conn.request("POST", "/endpoints/ep/invocations", body=BODY)
                response = conn.getresponse()
                response.read()
                statuses.append(response.status)
            conn.close()
            return [i for i, s in enumerate(statuses) if s == 429], set(statuses)

    first, statuses = throttled(7)
    assert statuses == {200, 429} and 3 <= len(first) <= 17
    assert throttled(7)[0] == first
    assert throttled(8)[0] != first


def test_an_inference_component_endpoint_requires_the_component_as_sagemaker_does():
    from prefix_routing.emulator.handler import COMPONENT_REQUIRED

    # SageMaker's words (ValidationError 400), as callers quote them.
    assert COMPONENT_REQUIRED == (
        "Inference Component Name header is required for endpoints to which you plan to deploy inference "
        "components. Please include Inference Component Name header or consider using SageMaker models.")
    with serve_runtime(EchoBackend(max_tokens=1), require_component=True) as server:
        client = client_for(server)
        for call in (client.invoke_endpoint, client.invoke_endpoint_with_response_stream):
            with pytest.raises(client.exceptions.ValidationError) as caught:
                call(EndpointName="ep", Body=BODY)
            assert caught.value.response["Error"]["Message"] == COMPONENT_REQUIRED
            assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        assert client.invoke_endpoint(EndpointName="ep", InferenceComponentName="ic", Body=BODY)["Body"].read()
        server.wait_until_idle()
        assert server.outcome_counts() == {"error": 2, "ok": 1}
    with serve_runtime(EchoBackend(max_tokens=1)) as server:  # a server without a component: accepted
        assert client_for(server).invoke_endpoint(EndpointName="ep", Body=BODY)["Body"].read()


def test_the_stage_emulators_are_inference_component_endpoints():
    from prefix_routing.emulator.engine_backend import start_engine_emulator
    from prefix_routing.emulator.fleet_backend import start_emulator
    from prefix_routing.stage.config import load_stage

    config = load_stage()
    for server in (start_emulator(config, speed=50.0),
                   start_engine_emulator(config, ["http://127.0.0.1:9"])):  # refused before any engine is asked
        try:
            client = client_for(server)
            with pytest.raises(client.exceptions.ValidationError, match="Inference Component Name header is required"):
                client.invoke_endpoint_with_response_stream(EndpointName=config.endpoint_name, Body=BODY)
        finally:
            server.stop()
