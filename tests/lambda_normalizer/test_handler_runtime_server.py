"""The handler against the local SageMaker runtime (prefix_routing.emulator) on 127.0.0.1.

boto3's own client, unmodified, parses the real event-stream framing: successes with usage and TTFT,
mid-stream errors, slow first chunks, throttling, 5xx, truncated and dropped streams. The last tests
drive the web app behind the Lambda Web Adapter (``server.py``) over HTTP, as the adapter does.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time

import boto3
import pytest
import server as web_app
from botocore.config import Config

from prefix_routing import frontdoor
from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.faults import Faults
from prefix_routing.emulator.server import serve_runtime
from prefix_routing.rules.identity import routing_identity
from tests.prefix_routing.frontdoor.conftest import CHAT, KEY, ROLE_TENANT, Lines, config, iam_context, url_event

STREAMING = json.dumps(dict(CHAT, stream=True)).encode()
_CLIENTS: list = []


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def runtime_client(server, read_timeout: float = 10.0):
    client = boto3.client(
        "sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1",
        aws_access_key_id="test", aws_secret_access_key="test",
        config=Config(retries={"total_max_attempts": 1}, read_timeout=read_timeout, connect_timeout=2),
    )
    _CLIENTS.append(client)
    return client


def invoker_for(server, lines, *, read_timeout: float = 10.0, sleeps=None, **overrides) -> frontdoor.Invoker:
    sleep = sleeps.append if sleeps is not None else (lambda seconds: None)
    return frontdoor.Invoker(runtime_client(server, read_timeout), config(**overrides), KEY, emit=lines,
                          sleep=sleep, jitter=lambda: 0.0)


def request(body: bytes = STREAMING, **kwargs) -> frontdoor.FrontRequest:
    return frontdoor.request_from_event(url_event(body, **kwargs))


def sse_objects(data: bytes) -> list:
    out = []
    for block in data.split(b"\n\n"):
        block = block.strip()
        if block.startswith(b"data: ") and block != b"data: [DONE]":
            out.append(json.loads(block[6:]))
    return out


# --------------------------------------------------------------------------- through boto3


def test_success_streams_with_usage_ttft_and_the_right_headers(lines):
    with serve_runtime(EchoBackend(first_chunk_delay=0.05, max_tokens=5)) as server:
        invoker = invoker_for(server, lines)
        items = list(invoker.stream(request()))
        server.wait_until_idle()
        recorded = server.requests[-1]
    head, *chunks, outcome = items
    assert head.status == 200 and head.headers["content-type"].startswith("text/event-stream")
    assert outcome.status == 200 and len(chunks) >= 7  # five tokens, usage, [DONE]
    assert chunks[-1] == b"data: [DONE]\n\n"
    text = "".join(o["choices"][0]["delta"]["content"] for o in sse_objects(b"".join(chunks)) if o["choices"])
    assert text.split() == ["alpha", "beta", "gamma", "delta", "alpha"]
    identity = routing_identity(ROLE_TENANT, None, KEY)
    assert recorded.outcome == "ok" and recorded.headers.prefix_aware_id == identity.prefix_aware_id
    assert recorded.headers.inference_component == "test-prefix-llm-ic"
    assert recorded.headers.content_type == "application/json"
    sent = json.loads(recorded.body)
    assert sent["cache_salt"] == identity.cache_salt and sent["stream_options"] == {"include_usage": True}
    (emf,) = lines.emf
    (log,) = lines.requests
    assert emf["TimeToFirstToken"] >= 50 and emf["EndToEndLatency"] >= emf["TimeToFirstToken"]
    assert emf["PromptTokens"] == log["prompt_tokens"] > 0 and emf["CachedTokens"] == log["cached_tokens"] == 0
    assert log["output_tokens"] == 5 and log["status"] == 200 and log["ttft_ms"] == pytest.approx(
        emf["TimeToFirstToken"], abs=0.01)


def test_repeated_prefix_reports_cached_tokens(lines):
    long_system = " ".join(f"rule{i}" for i in range(64))
    body = json.dumps({"stream": True, "messages": [{"role": "system", "content": long_system},
                                                    {"role": "user", "content": "one two"}]}).encode()
    with serve_runtime(EchoBackend(max_tokens=2, block_tokens=16)) as server:
        invoker = invoker_for(server, lines)
        for _ in range(2):
            assert invoker.buffered(request(body)).status == 200
    first, second = lines.requests
    assert first["cached_tokens"] == 0 and second["cached_tokens"] >= 64
    assert first["prefix_fingerprint"] == second["prefix_fingerprint"]
    assert [doc["CachedTokens"] for doc in lines.emf] == [0, second["cached_tokens"]]


def test_slow_first_chunk_is_measured_in_ttft(lines):
    with serve_runtime(EchoBackend(max_tokens=3), faults=Faults(first_chunk_delay=0.4)) as server:
        answer = invoker_for(server, lines).buffered(request())
    assert answer.status == 200
    (log,) = lines.requests
    assert 400 <= log["ttft_ms"] < 400 + 2000 and log["total_ms"] >= log["ttft_ms"]
    assert lines.emf[0]["TimeToFirstToken"] >= 400


def test_first_chunk_slower_than_the_read_timeout_is_504(lines):
    with serve_runtime(EchoBackend(first_chunk_delay=1.5, max_tokens=2)) as server:
        answer = invoker_for(server, lines, read_timeout=0.3).buffered(request())
    assert answer.status == 504 and answer.body["error"]["code"] == "timeout"
    assert "in time" in answer.body["error"]["message"]
    assert lines.requests[0]["attempts"] == 1 and lines.emf[0]["UpstreamErrors"] == 1


def test_answer_longer_than_the_request_budget_is_cut_with_an_in_band_504(lines):
    with serve_runtime(EchoBackend(token_delay=0.1, max_tokens=30)) as server:
        invoker = invoker_for(server, lines, request_timeout_s=0.35)
        items = list(invoker.stream(request()))
    assert items[0].status == 200 and items[-1].status == 504
    assert json.loads(items[-2].strip()[6:])["error"]["type"] == "timeout"
    assert lines.requests[0]["status"] == 504


def test_mid_stream_model_error_is_502_and_never_done(lines):
    with serve_runtime(EchoBackend(max_tokens=6), faults=Faults(stream_error_after=3)) as server:
        invoker = invoker_for(server, lines)
        items = list(invoker.stream(request()))
        answer = invoker.buffered(request())
    assert items[0].status == 200 and items[-1].status == 502
    body = b"".join(i for i in items if isinstance(i, bytes))
    assert b"[DONE]" not in body
    assert sse_objects(body)[-1]["error"]["type"] == "model_stream_error"
    assert answer.status == 502 and answer.body["error"]["upstream_code"] == "ModelStreamError"
    assert answer.body["partial"]["choices"][0]["text"].split() == ["alpha", "beta", "gamma"]
    assert [log["status"] for log in lines.requests] == [502, 502]
    assert all(doc["UpstreamErrors"] == 1 for doc in lines.emf)


def test_stream_error_before_any_token_is_retried(lines):
    faults = Faults(stream_error_after=0, stream_error_kind="InternalStreamFailure", stream_error_rate=0.5, seed=3)
    with serve_runtime(EchoBackend(max_tokens=2), faults=faults) as server:
        invoker = invoker_for(server, lines, max_attempts=6)
        answers = [invoker.buffered(request()) for _ in range(4)]
        assert server.wait_until_idle()
        outcomes = [r.outcome for r in server.requests]
    assert all(a.status == 200 for a in answers)
    assert "stream_error" in outcomes  # some attempts failed before the first token and were retried


def test_throttling_retried_then_success(lines):
    sleeps = []
    with serve_runtime(EchoBackend(max_tokens=2), faults=Faults(throttle_first=2)) as server:
        answer = invoker_for(server, lines, sleeps=sleeps).buffered(request())
        assert server.wait_until_idle()
        outcomes = [r.error_code for r in server.requests]
    assert answer.status == 200 and answer.body["choices"][0]["text"] == "alpha beta"
    assert outcomes == ["ThrottlingException", "ThrottlingException", None]
    assert len(sleeps) == 2 and lines.requests[0]["attempts"] == 3


def test_persistent_throttling_is_429_with_json_error(lines):
    with serve_runtime(EchoBackend(), faults=Faults(throttle_first=10)) as server:
        invoker = invoker_for(server, lines)
        items = list(invoker.stream(request()))
        answer = invoker.buffered(request())
    head, body, outcome = items
    assert head.status == 429 and head.headers["content-type"] == "application/json" and "retry-after" in head.headers
    assert json.loads(body)["error"]["code"] == "throttled" and outcome.status == 429
    assert answer.status == 429 and answer.body["error"]["attempts"] == 3


def test_truncated_stream_is_502_not_200(lines):
    # Five tokens (the last with finish_reason), then the usage chunk and [DONE] never come.
    with serve_runtime(EchoBackend(max_tokens=5), faults=Faults(truncate_after=5)) as server:
        invoker = invoker_for(server, lines)
        items = list(invoker.stream(request()))
        answer = invoker.buffered(request())
        assert server.wait_until_idle()
        assert {r.outcome for r in server.requests} == {"truncated"}
    assert items[-1].status == 502 and items[-1].error["code"] == "truncated"
    assert sse_objects(b"".join(i for i in items if isinstance(i, bytes)))[-1]["error"]["type"] == "truncated"
    assert answer.status == 502 and answer.body["error"]["code"] == "truncated"
    assert [log["status"] for log in lines.requests] == [502, 502]
    assert [log["error_kind"] for log in lines.requests] == ["truncated", "truncated"]


@pytest.mark.parametrize(
    ("kind", "status", "code"),
    [("ServiceUnavailable", 503, "upstream_unavailable"), ("InternalFailure", 502, "upstream_error"),
     ("ModelError", 502, "model_error")],
)
def test_persistent_5xx(lines, kind, status, code):
    with serve_runtime(EchoBackend(), faults=Faults(error_first=10, error_kind=kind)) as server:
        answer = invoker_for(server, lines).buffered(request())
        calls = len(server.requests)
    assert answer.status == status and answer.body["error"]["code"] == code
    assert calls == (1 if kind == "ModelError" else 3)


def test_one_5xx_then_success(lines):
    with serve_runtime(EchoBackend(max_tokens=2), faults=Faults(error_first=1)) as server:
        answer = invoker_for(server, lines).buffered(request())
    assert answer.status == 200 and lines.requests[0]["attempts"] == 2


def test_dropped_connection_mid_stream_is_502_in_band(lines):
    with serve_runtime(EchoBackend(max_tokens=6), faults=Faults(drop_after=2)) as server:
        items = list(invoker_for(server, lines).stream(request()))
    assert items[0].status == 200 and items[-1].status == 502
    assert items[-1].error["code"] == "upstream_connection"


def test_fragmented_payload_parts_and_json_lines(lines):
    with serve_runtime(EchoBackend(max_tokens=4, stream_format="jsonl"), faults=Faults(fragment_bytes=7)) as server:
        answer = invoker_for(server, lines).buffered(request())
    assert answer.status == 200 and answer.body["choices"][0]["text"] == "alpha beta gamma delta"
    assert lines.requests[0]["prompt_tokens"] > 0


def test_truncated_json_lines_without_usage_is_502(lines):
    with serve_runtime(EchoBackend(max_tokens=3, stream_format="jsonl"), faults=Faults(truncate_after=3)) as server:
        answer = invoker_for(server, lines).buffered(request())
    assert answer.status == 502 and answer.body["error"]["code"] == "truncated"


def test_non_streaming_body_still_streams_back_and_is_complete(lines):
    body = json.dumps(CHAT).encode()  # no "stream": the runtime still answers with SSE chunks here
    with serve_runtime(EchoBackend(max_tokens=2)) as server:
        answer = invoker_for(server, lines).buffered(request(body))
        sent = json.loads(server.requests[-1].body)
    assert "stream_options" not in sent and answer.status == 200


# --------------------------------------------------------------------------- the web app behind LWA


@contextlib.contextmanager
def _web_app(**overrides):
    """(web app port, runtime server, collected lines) with an invoker of ``config(**overrides)``."""
    lines = Lines()
    with serve_runtime(EchoBackend(token_delay=0.08, max_tokens=8)) as runtime:
        invoker = invoker_for(runtime, lines, **overrides)
        app = web_app.make_server("127.0.0.1", 0, get_invoker=lambda: invoker)
        thread = threading.Thread(target=app.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            yield app.server_address[1], runtime, lines
        finally:
            app.shutdown()
            app.server_close()
            thread.join(5)


@pytest.fixture
def front_door():
    with _web_app() as served:
        yield served


def _post(port: int, body: bytes, headers: dict, path: str = "/"):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", path, body=body, headers=headers)
    return connection, connection.getresponse()


def test_web_app_streams_tokens_as_they_arrive(front_door):
    port, runtime, lines = front_door
    headers = {"content-type": "application/json", "x-amzn-request-context": json.dumps(iam_context()),
               "x-amzn-lambda-context": json.dumps({"request_id": "lambda-req-1",
                                                    "deadline": int(time.time() * 1000) + 60_000})}
    started = time.monotonic()
    connection, response = _post(port, STREAMING, headers)
    assert response.status == 200 and response.getheader("transfer-encoding") == "chunked"
    first = response.read1(65536)
    first_at = time.monotonic() - started
    rest = response.read()
    total = time.monotonic() - started
    connection.close()
    assert first.startswith(b"data: ") and rest.endswith(b"data: [DONE]\n\n")
    assert total - first_at > 0.3  # the first token was forwarded long before the last one existed
    (log,) = lines.requests
    assert log["request_id"] == "lambda-req-1" and log["tenant"] == ROLE_TENANT and log["status"] == 200
    assert runtime.requests[-1].headers.prefix_aware_id == routing_identity(ROLE_TENANT, None, KEY).prefix_aware_id


def test_web_app_errors_are_json_with_their_status(front_door):
    port, _, lines = front_door
    headers = {"x-amzn-request-context": json.dumps(iam_context())}
    connection, response = _post(port, b'{"messages": 3}', headers)
    payload = json.loads(response.read())
    connection.close()
    assert response.status == 400 and payload["error"] == {
        "code": "invalid_field", "field": "messages", "status": 400, "message": payload["error"]["message"]}
    connection, response = _post(port, STREAMING, {})  # no request context: no IAM identity
    assert response.status == 401 and json.loads(response.read())["error"]["code"] == "unauthenticated"
    connection.close()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/healthz")
    assert connection.getresponse().status == 200
    connection.close()


DIRECT_HEADERS = {"x-amzn-request-context": "null", "content-type": "application/json",
                  "x-amzn-lambda-context": json.dumps({"request_id": "direct-7"})}


def test_web_app_refuses_a_direct_invocation_naming_another_tenant(front_door):
    port, runtime, lines = front_door
    # A caller that may invoke the function names the Function URL caller's tenant in its event.
    event = {"body": dict(CHAT, stream=True), "tenant": ROLE_TENANT}
    connection, response = _post(port, json.dumps(event).encode(), DIRECT_HEADERS, path="/events")
    result = json.loads(response.read())
    connection.close()
    assert response.status == 200 and result["statusCode"] == 403  # the invocation itself succeeds
    assert result["body"]["error"]["code"] == "direct_invocation_refused"
    assert runtime.requests == []  # nothing reached the endpoint: no routing id, no salt, no cache
    assert lines.requests[-1]["tenant"] is None and lines.emf[-1]["RefusedDirectInvocations"] == 1
    # The Function URL path still gets the caller's own identity.
    headers = {"x-amzn-request-context": json.dumps(iam_context())}
    connection, response = _post(port, STREAMING, headers)
    assert response.status == 200 and response.read().endswith(b"data: [DONE]\n\n")
    connection.close()
    assert runtime.requests[-1].headers.prefix_aware_id == routing_identity(ROLE_TENANT, None, KEY).prefix_aware_id
    assert lines.requests[-1]["tenant"] == ROLE_TENANT


def test_web_app_pass_through_event_is_a_direct_invocation_when_allowed():
    with _web_app(allow_direct_invoke=True) as (port, runtime, lines):
        event = {"body": dict(CHAT, stream=True), "tenant": "acme", "application": "bot"}
        connection, response = _post(port, json.dumps(event).encode(), DIRECT_HEADERS, path="/events")
        raw = response.read()
        connection.close()
    assert response.status == 200
    # What lambda:Invoke returns in response_stream mode: the adapter's prelude, 8 zero bytes, the body.
    prelude = json.dumps({"statusCode": 200, "headers": {"content-type": "application/json"}}).encode()
    result = frontdoor.decode_direct_payload(prelude + b"\x00" * 8 + raw)
    assert result == json.loads(raw)
    assert result["statusCode"] == 200 and result["body"]["choices"][0]["finish_reason"] is not None
    assert runtime.requests[-1].headers.prefix_aware_id == routing_identity("acme", "bot", KEY).prefix_aware_id
    assert lines.requests[-1]["request_id"] == "direct-7" and lines.requests[-1]["tenant"] == "acme"


def test_web_app_a_caller_cannot_pose_as_a_direct_invocation(front_door):
    port, runtime, _ = front_door
    # Through the Function URL the adapter always sets the request context: a body shaped like an
    # event is just a (bad) request body, and its "tenant" is never read.
    event = {"body": dict(CHAT, stream=True), "tenant": "someone-else"}
    headers = {"x-amzn-request-context": json.dumps(iam_context())}
    connection, response = _post(port, json.dumps(event).encode(), headers, path="/events")
    assert response.status == 400 and json.loads(response.read())["error"]["code"] == "missing_field"
    connection.close()
    assert runtime.requests == []


def test_web_app_caller_going_away_is_logged_499(front_door):
    port, runtime, lines = front_door
    headers = {"x-amzn-request-context": json.dumps(iam_context())}
    body = json.dumps(dict(CHAT, stream=True, max_tokens=60)).encode()
    connection, response = _post(port, body, headers)
    assert response.status == 200 and response.read1(65536)
    connection.sock.close()
    connection.close()
    deadline = time.monotonic() + 10
    while not lines.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lines.requests and lines.requests[0]["status"] == 499
    assert lines.requests[0]["error_kind"] == "client_closed"
    assert runtime.wait_until_idle(5) and runtime.requests[-1].outcome in ("client_disconnected", "ok")


def test_web_app_reads_chunked_bodies_and_refuses_oversized_ones(front_door):
    port, runtime, _ = front_door
    context = json.dumps(iam_context())
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.putrequest("POST", "/")
    connection.putheader("x-amzn-request-context", context)
    connection.putheader("transfer-encoding", "chunked")
    connection.endheaders()
    for start in range(0, len(STREAMING), 50):
        piece = STREAMING[start:start + 50]
        connection.send(b"%x\r\n%s\r\n" % (len(piece), piece))
    connection.send(b"0\r\n\r\n")
    response = connection.getresponse()
    assert response.status == 200 and response.read().endswith(b"data: [DONE]\n\n")
    connection.close()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.putrequest("POST", "/")
    connection.putheader("x-amzn-request-context", context)
    connection.putheader("content-length", str(web_app.MAX_READ_BYTES + 1))
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 400 and json.loads(response.read())["error"]["code"] == "too_large"
    connection.close()
    assert len(runtime.requests) == 1
