"""The OpenAI-compatible path (prefix_routing.emulator.openai_wire)."""

from __future__ import annotations

import http.client
import json

from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.faults import Faults
from prefix_routing.emulator.protocol import OP_CHAT_COMPLETIONS
from prefix_routing.emulator.server import serve_runtime
from tests.prefix_routing.emulator.conftest import CHAT, content_of, sse_objects


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


def _get(server, path, token="tok-123", method="GET"):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    conn.request(method, path, headers={"Authorization": f"Bearer {token}"} if token else {})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response, data


def test_model_list_names_the_served_model_and_refuses_bad_callers_in_json():
    models = "/endpoints/ep/openai/v1/models"
    with serve_runtime(EchoBackend(), bearer_token="tok-123", endpoints=["ep"], served_model="org/model-1") as server:
        response, data = _get(server, models)
        assert response.status == 200 and response.getheader("Content-Type") == "application/json"
        listing = json.loads(data)
        assert listing["object"] == "list" and [m["id"] for m in listing["data"]] == ["org/model-1"]
        assert listing["data"][0]["object"] == "model" and listing["data"][0]["max_model_len"] > 0
        for token in (None, "wrong"):
            response, data = _get(server, models, token=token)
            assert response.status == 401 and json.loads(data)["error"]["code"] == "invalid_api_key"
        response, data = _get(server, "/endpoints/other/openai/v1/models")
        assert response.status == 400 and json.loads(data)["error"]["message"] == "Endpoint other not found."
        for path, method in ((models + "/org/model-1", "GET"), ("/v1/models", "GET"), (models, "DELETE")):
            response, data = _get(server, path, method=method)
            assert response.status == 404 and json.loads(data)["message"]
        response, data = _get(server, models, method="POST")  # the runtime has no such operation
        assert response.status == 404 and response.getheader("X-Amzn-ErrorType") == "UnknownOperationException"
        assert server.request_count == 0  # reading the list is no invocation


def test_status_reports_the_servers_own_ttft_of_streamed_answers():
    with serve_runtime(EchoBackend(max_tokens=2, first_chunk_delay=0.05), bearer_token="tok-123") as server:
        for _ in range(3):
            assert _openai(server, {**CHAT, "stream": True})[0].status == 200
        assert _openai(server, CHAT)[0].status == 200  # whole answers have no first token of their own
        assert _openai(server, {**CHAT, "stream": True}, token="wrong")[0].status == 401
        server.wait_until_idle()
        conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
        conn.request("GET", "/status")
        status = json.loads(conn.getresponse().read())
        conn.close()
    assert status["requests"] == 5 and status["outcomes"] == {"ok": 4, "error": 1}
    ttft = status["ttft_ms"]
    assert ttft["samples"] == 3 and 50 <= ttft["p50"] <= ttft["p90"] < 1000


def test_status_ttft_is_empty_before_any_stream():
    with serve_runtime(EchoBackend()) as server:
        assert server.status()["ttft_ms"] == {"p50": None, "p90": None, "samples": 0}
