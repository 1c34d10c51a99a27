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
