"""Headers and both SageMaker operations through boto3's own client (prefix_routing.emulator.sagemaker_wire)."""

from __future__ import annotations

import json

import boto3

from prefix_routing.emulator import eventstream
from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.protocol import OP_INVOKE, OP_INVOKE_STREAM
from prefix_routing.emulator.server import serve_runtime
from tests.prefix_routing.emulator.conftest import BODY, client_for, content_of, sse_objects
from tests.prefix_routing.emulator.test_handler import _get

ALL_PARAMS = dict(
    ContentType="application/json",
    CustomAttributes="trace=abc;tenant=t1",
    TargetVariant="variant-b",
    TargetContainerHostname="container-1",
    InferenceId="inf-0001",
    InferenceComponentName="llama-ic-1",
    PrefixAwareId="tenant-1:app-a",
)


def test_invoke_endpoint_with_every_header():
    with serve_runtime(EchoBackend(max_tokens=3)) as server:
        client = client_for(server)
        response = client.invoke_endpoint(
            EndpointName="my-endpoint",
            Body=BODY,
            Accept="application/json",
            TargetModel="model-a.tar.gz",
            EnableExplanations="`true`",
            SessionId="NEW_SESSION",
            **ALL_PARAMS,
        )
        answer = json.loads(response["Body"].read())
        assert response["ContentType"] == "application/json"
        assert response["InvokedProductionVariant"] == "variant-b"
        assert response["CustomAttributes"] == "trace=abc;tenant=t1"
        assert "; Expires=" in response["NewSessionId"]
        request_id = response["ResponseMetadata"]["RequestId"]
        assert answer["object"] == "chat.completion"
        assert answer["choices"][0]["message"]["content"] == "alpha beta gamma"
        assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        server.wait_until_idle()
        (record,) = server.requests
    h = record.headers
    assert record.operation == OP_INVOKE and record.endpoint_name == "my-endpoint" and record.body == BODY
    assert (h.content_type, h.accept, h.custom_attributes) == (
        "application/json",
        "application/json",
        "trace=abc;tenant=t1",
    )
    assert (h.target_model, h.target_variant, h.target_container_hostname) == (
        "model-a.tar.gz",
        "variant-b",
        "container-1",
    )
    assert (h.inference_id, h.enable_explanations, h.inference_component) == ("inf-0001", "`true`", "llama-ic-1")
    assert (h.session_id, h.prefix_aware_id) == ("NEW_SESSION", "tenant-1:app-a")
    assert h.authorization.startswith("AWS4-HMAC-SHA256 Credential=test/")
    assert "/us-east-1/sagemaker/aws4_request" in h.authorization
    assert (record.outcome, record.status, record.fault) == ("ok", 200, None)
    assert record.request.request_id == request_id  # x-amzn-RequestId: client and server records join


def test_invoke_endpoint_with_response_stream_with_every_header():
    with serve_runtime(EchoBackend(max_tokens=4)) as server:
        client = client_for(server)
        response = client.invoke_endpoint_with_response_stream(
            EndpointName="my-endpoint", Body=BODY, Accept="text/event-stream", SessionId="sess-42", **ALL_PARAMS
        )
        assert response["ContentType"] == "text/event-stream"  # from X-Amzn-SageMaker-Content-Type
        assert response["InvokedProductionVariant"] == "variant-b"
        assert response["CustomAttributes"] == "trace=abc;tenant=t1"
        assert response["ResponseMetadata"]["HTTPHeaders"]["content-type"] == eventstream.CONTENT_TYPE
        events = list(response["Body"])
        server.wait_until_idle()
        (record,) = server.requests
    assert all(set(e) == {"PayloadPart"} for e in events)
    objects = sse_objects(b"".join(e["PayloadPart"]["Bytes"] for e in events).decode())
    assert content_of(objects) == "alpha beta gamma alpha"
    assert objects[-1] == "[DONE]"
    assert objects[-2]["usage"] == {
        "prompt_tokens": 8,  # words, role markers included: "system: You are terse. user: alpha beta gamma"
        "completion_tokens": 4,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    h = record.headers
    assert record.operation == OP_INVOKE_STREAM and record.endpoint_name == "my-endpoint"
    assert (h.content_type, h.accept, h.custom_attributes) == (
        "application/json",
        "text/event-stream",
        "trace=abc;tenant=t1",
    )
    assert (h.target_variant, h.target_container_hostname, h.inference_id) == ("variant-b", "container-1", "inf-0001")
    assert (h.inference_component, h.session_id, h.prefix_aware_id) == ("llama-ic-1", "sess-42", "tenant-1:app-a")
    assert (h.target_model, h.enable_explanations) == (None, None)  # not in the streaming operation
    assert ("X-Amzn-SageMaker-Accept", "text/event-stream") in record.request.raw_headers
    assert record.outcome == "ok" and record.chunks_sent == len(events) == 4 + 2


def test_the_header_names_are_those_of_the_service_model():
    from prefix_routing.emulator.protocol import RequestHeaders

    model = boto3.client("sagemaker-runtime", region_name="us-east-1").meta.service_model
    for operation, accept in ((OP_INVOKE, "Accept"), (OP_INVOKE_STREAM, "X-Amzn-SageMaker-Accept")):
        members = model.operation_model(operation).input_shape.members
        header_names = {
            m.serialization["name"].lower() for m in members.values() if m.serialization.get("location") == "header"
        }
        ours = {v.lower() for v in RequestHeaders.HTTP_NAMES.values()} | {accept.lower()}
        assert header_names <= ours, header_names - ours


def test_jsonl_stream_format_and_cached_tokens():
    words = " ".join(f"w{i}" for i in range(40))
    body = json.dumps({"messages": [{"role": "user", "content": words}]}).encode()
    salted = json.dumps({"messages": [{"role": "user", "content": words}], "cache_salt": "tenant-2"}).encode()
    with serve_runtime(EchoBackend(stream_format="jsonl", block_tokens=16, max_tokens=2)) as server:
        client = client_for(server)
        usages = []
        for payload in (body, body, salted):
            response = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=payload)
            assert response["ContentType"] == "application/jsonlines"
            lines = b"".join(e["PayloadPart"]["Bytes"] for e in response["Body"]).splitlines()
            usages.append(json.loads(lines[-1])["usage"])
        server.wait_until_idle()  # the last outcome is booked just after its last byte is sent
        status = json.loads(_get(server, "/status"))
    assert [u["prompt_tokens"] for u in usages] == [41, 41, 41]
    assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages] == [0, 32, 0]
    assert status["outcomes"] == {"ok": 3} and status["backend"]["cached_tokens"] == 32
