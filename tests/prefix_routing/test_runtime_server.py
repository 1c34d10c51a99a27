"""The local SageMaker runtime: boto3's own client, unmodified, against our server on 127.0.0.1."""

from __future__ import annotations

import http.client
import json
import threading
import time

import boto3
import pytest
import urllib3.exceptions
from botocore.config import Config
from botocore.exceptions import ClientError, EventStreamError
from botocore.retries.standard import ExponentialBackoff

from prefix_routing.emulator import eventstream
from prefix_routing.rules.errors import UserError
from prefix_routing.emulator.protocol import ERROR_STATUS, OP_CHAT_COMPLETIONS, OP_INVOKE, OP_INVOKE_STREAM
from prefix_routing.emulator.backend import BackendResponse, ErrorReply, StreamFailure
from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.faults import Faults
from prefix_routing.emulator.server import RuntimeServer, serve_runtime

CHAT = {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "alpha beta gamma"}]}
BODY = json.dumps(CHAT).encode()


_CLIENTS: list = []


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def client_for(server, attempts=1, mode="standard"):
    client = boto3.client(
        "sagemaker-runtime",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"total_max_attempts": attempts, "mode": mode}, read_timeout=10, connect_timeout=2),
    )
    _CLIENTS.append(client)
    return client


def sse_objects(text: str) -> list:
    """The JSON objects of an SSE text, with "[DONE]" kept as a string."""
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def content_of(objects: list) -> str:
    return "".join(o["choices"][0]["delta"].get("content", "") for o in objects if isinstance(o, dict) and o["choices"])


class Scripted:
    """A backend answering from a script: an ErrorReply, a chunk list, or chunks then a failure."""

    def __init__(self, result=None, chunks=(b"one", b"two"), fail=None, raise_in_handle=False):
        self.result, self.chunks, self.fail, self.raise_in_handle = result, chunks, fail, raise_in_handle
        self.closed = threading.Event()

    def handle(self, request):
        if self.raise_in_handle:
            raise RuntimeError("backend bug")
        if self.result is not None:
            return self.result
        return BackendResponse(chunks=self._gen(), content_type="application/x-test")

    def _gen(self):
        try:
            for chunk in self.chunks:
                if isinstance(chunk, float):
                    time.sleep(chunk)
                    continue
                yield chunk
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed.set()


# --------------------------------------------------------------------------- headers, both operations

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
        status = json.loads(_get(server, "/status"))
    assert [u["prompt_tokens"] for u in usages] == [41, 41, 41]
    assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages] == [0, 32, 0]
    assert status["outcomes"] == {"ok": 3} and status["backend"]["cached_tokens"] == 32


# --------------------------------------------------------------------------- errors


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


# --------------------------------------------------------------------------- stream faults


@pytest.mark.parametrize("kind, code", [("ModelStreamError", "StreamBroken"), ("InternalStreamFailure", None)])
def test_mid_stream_error_surfaces_through_botocore(kind, code):
    faults = Faults(stream_error_after=2, stream_error_kind=kind, stream_error_code=code or "unused")
    with serve_runtime(EchoBackend(max_tokens=5), faults=faults) as server:
        client = client_for(server)
        response = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        parts = []
        with pytest.raises(EventStreamError) as info:
            for event in response["Body"]:
                parts.append(event["PayloadPart"]["Bytes"])
        assert len(parts) == 2
        assert info.value.response["Error"] == {"Code": kind, "Message": "Injected mid-stream failure."}
        server.wait_until_idle()
        (record,) = server.requests
    assert (record.outcome, record.error_code, record.fault, record.chunks_sent) == (
        "stream_error",
        kind,
        "stream_error",
        2,
    )


def test_mid_stream_error_on_the_wire_carries_the_error_code():
    with serve_runtime(EchoBackend(max_tokens=5), faults=Faults(stream_error_after=1)) as server:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
        conn.request("POST", "/endpoints/ep/invocations-response-stream", body=BODY)
        response = conn.getresponse()
        assert response.getheader("Transfer-Encoding") == "chunked"
        messages = eventstream.decode_messages(response.read())
        conn.close()
    assert [m.event_type for m in messages] == ["PayloadPart", None]
    assert messages[-1].json() == {
        "Message": "Injected mid-stream failure.",
        "ErrorCode": "ModelInvocationTimeExceeded",
    }


def test_backend_stream_failure_and_backend_crash_mid_stream():
    failure = StreamFailure("ModelStreamError", "model timed out", "ModelInvocationTimeExceeded")
    backend = Scripted(chunks=[b"a", b"b"], fail=failure)
    with serve_runtime(backend) as server:
        client = client_for(server)
        response = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        with pytest.raises(EventStreamError, match="model timed out"):
            list(response["Body"])
        # Not streamed: the same failure is a ModelError.
        with pytest.raises(client.exceptions.ModelError, match="model timed out"):
            client.invoke_endpoint(EndpointName="ep", Body=BODY)
    with serve_runtime(Scripted(fail=ZeroDivisionError("x"))) as server:
        response = client_for(server).invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        with pytest.raises(EventStreamError) as info:
            list(response["Body"])
        assert info.value.response["Error"]["Code"] == "InternalStreamFailure"


def test_slow_first_chunk_is_a_delay_before_the_first_payload_part():
    with serve_runtime(EchoBackend(max_tokens=3), faults=Faults(first_chunk_delay=0.2)) as server:
        client = client_for(server)
        start = time.monotonic()
        response = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        headers_at = time.monotonic()
        iterator = iter(response["Body"])
        next(iterator)
        first_at = time.monotonic()
        list(iterator)
        end_at = time.monotonic()
        server.wait_until_idle()
        (record,) = server.requests
    assert headers_at - start < 0.15  # the headers come at once; the wait is for the first part
    assert first_at - headers_at >= 0.18
    assert end_at - first_at < 0.15
    assert record.ttft >= 0.2 and record.fault == "slow_first_chunk"


def test_backend_latency_first_chunk_and_per_token():
    with serve_runtime(EchoBackend(first_chunk_delay=0.1, token_delay=0.02, max_tokens=5)) as server:
        client = client_for(server)
        response = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        start = time.monotonic()
        times = [time.monotonic() - start for _ in response["Body"]]
        server.wait_until_idle()
        (record,) = server.requests
    assert times[0] >= 0.09
    assert times[4] - times[0] >= 4 * 0.02 * 0.9
    assert 0.1 <= record.ttft < 0.3 and record.duration >= 0.18


def test_truncated_stream_ends_cleanly_without_usage():
    with serve_runtime(EchoBackend(max_tokens=5), faults=Faults(truncate_after=3)) as server:
        client = client_for(server)
        events = list(client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)["Body"])
        server.wait_until_idle()
        (record,) = server.requests
    objects = sse_objects(b"".join(e["PayloadPart"]["Bytes"] for e in events).decode())
    assert len(events) == 3 and "[DONE]" not in objects
    assert not any("usage" in o for o in objects)
    assert (record.outcome, record.fault, record.status) == ("truncated", "truncate", 200)


def test_dropped_connection_mid_stream():
    with serve_runtime(EchoBackend(max_tokens=5), faults=Faults(drop_after=2)) as server:
        client = client_for(server)
        response = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        parts = []
        with pytest.raises(urllib3.exceptions.ProtocolError):  # botocore does not wrap it
            for event in response["Body"]:
                parts.append(event)
        assert len(parts) == 2
        server.wait_until_idle()
        assert server.requests[0].outcome == "dropped"
        # The client goes on on a new connection (stream faults do not touch InvokeEndpoint).
        assert client.invoke_endpoint(EndpointName="ep", Body=BODY)["Body"].read()


def test_fragmented_payload_parts_reassemble():
    with serve_runtime(EchoBackend(max_tokens=4)) as server:
        whole = [
            e["PayloadPart"]["Bytes"]
            for e in client_for(server).invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)["Body"]
        ]
    with serve_runtime(EchoBackend(max_tokens=4), faults=Faults(fragment_bytes=7)) as server:
        parts = [
            e["PayloadPart"]["Bytes"]
            for e in client_for(server).invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)["Body"]
        ]
    assert len(parts) > len(whole) and max(len(p) for p in parts) == 7

    def strip(objs):
        return [o if o == "[DONE]" else {k: v for k, v in o.items() if k not in ("id", "created")} for o in objs]

    assert strip(sse_objects(b"".join(parts).decode())) == strip(sse_objects(b"".join(whole).decode()))


def test_client_disconnect_closes_the_backend_iterator():
    backend = Scripted(chunks=[b"x" * 1000, *([0.01, b"y" * 1000] * 200)])
    with serve_runtime(backend) as server:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
        conn.request("POST", "/endpoints/ep/invocations-response-stream", body=BODY)
        response = conn.getresponse()
        response.read(100)
        conn.close()
        assert backend.closed.wait(5)
        assert server.wait_until_idle(5)
        (record,) = server.requests
    assert record.outcome == "client_disconnected" and record.chunks_sent < 200


def test_stop_ends_streams_in_flight():
    backend = Scripted(chunks=[b"x", *([0.01, b"y"] * 500)])
    server = RuntimeServer(backend).start()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    conn.request("POST", "/endpoints/ep/invocations-response-stream", body=BODY)
    response = conn.getresponse()
    response.read(16)
    server.stop()
    assert backend.closed.wait(5) and server.wait_until_idle(5)
    assert server.requests[0].outcome == "client_disconnected"
    conn.close()


def test_concurrent_requests_are_all_recorded():
    with serve_runtime(EchoBackend(token_delay=0.005, max_tokens=5)) as server:
        client = client_for(server)
        results = []

        def call(i):
            events = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY, InferenceId=f"id-{i}")[
                "Body"
            ]
            results.append(len(list(events)))

        threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert server.wait_until_idle()
        records = server.requests
    assert results == [7] * 8
    assert sorted(r.request.index for r in records) == list(range(8))
    assert sorted(r.headers.inference_id for r in records) == sorted(f"id-{i}" for i in range(8))
    assert {r.outcome for r in records} == {"ok"}


# --------------------------------------------------------------------------- the OpenAI-compatible path


def _openai(server, body, token="tok-123", path="/endpoints/ep/openai/v1/chat/completions"):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response, data


def test_openai_streaming_and_json():
    with serve_runtime(EchoBackend(max_tokens=3), bearer_token="tok-123") as server:
        response, data = _openai(server, {**CHAT, "stream": True, "prompt_cache_key": "tenant-1"})
        assert response.status == 200 and response.getheader("Content-Type").startswith("text/event-stream")
        objects = sse_objects(data.decode())
        assert content_of(objects) == "alpha beta gamma" and objects[-1] == "[DONE]"
        assert objects[-2]["usage"]["completion_tokens"] == 3
        response, data = _openai(server, CHAT)
        assert response.status == 200 and response.getheader("Content-Type") == "application/json"
        assert json.loads(data)["choices"][0]["message"]["content"] == "alpha beta gamma"
        for token in (None, "wrong"):
            response, data = _openai(server, CHAT, token=token)
            assert response.status == 401 and json.loads(data)["error"]["code"] == "invalid_api_key"
        response, data = _openai(server, {"prompt": "no messages"})
        assert response.status == 400
        server.wait_until_idle()
        records = server.requests
    assert [r.operation for r in records] == [OP_CHAT_COMPLETIONS] * 5
    assert [r.request.stream for r in records] == [True, False, False, False, False]
    assert records[0].headers.bearer_token == "tok-123"
    assert [r.outcome for r in records] == ["ok", "ok", "error", "error", "error"]


def test_openai_faults():
    with serve_runtime(EchoBackend(max_tokens=4), faults=Faults(throttle_first=1, stream_error_after=2)) as server:
        response, data = _openai(server, {**CHAT, "stream": True})
        assert response.status == 429 and json.loads(data)["error"]["type"] == "rate_limit_error"
        response, data = _openai(server, {**CHAT, "stream": True})
        objects = sse_objects(data.decode())
        assert response.status == 200 and len(objects) == 3 and "[DONE]" not in objects
        assert objects[-1]["error"]["code"] == "ModelInvocationTimeExceeded"
        server.wait_until_idle()
        assert [r.outcome for r in server.requests] == ["error", "stream_error"]


# --------------------------------------------------------------------------- the server itself


def test_port_url_ping_and_loopback_only():
    backend = EchoBackend()
    with RuntimeServer(backend) as server:
        assert server.port > 0 and server.url == f"http://127.0.0.1:{server.port}"
        assert _get(server, "/ping") == b""
    with pytest.raises(UserError, match="loopback"):
        RuntimeServer(backend, host="0.0.0.0")
    with pytest.raises(TypeError):
        RuntimeServer(object())  # type: ignore[arg-type]


def test_fault_spec_parsing():
    faults = Faults.from_spec(
        "throttle_rate=0.25, stream-error-after=3,error_kind=InternalFailure,seed=9,drop_after=none"
    )
    assert (faults.throttle_rate, faults.stream_error_after, faults.error_kind, faults.seed, faults.drop_after) == (
        0.25,
        3,
        "InternalFailure",
        9,
        None,
    )
    assert Faults.from_spec("") == Faults()
    for bad, message in [
        ("nope=1", "NAME=VALUE"),
        ("throttle_rate=x", "not a number"),
        ("throttle_rate=2", "between 0 and 1"),
        ("error_kind=Teapot", "error_kind"),
        ("stream_error_kind=X", "stream_error_kind"),
        ("truncate_after=-1", ">= 0"),
    ]:
        with pytest.raises(UserError, match=message):
            Faults.from_spec(bad)
