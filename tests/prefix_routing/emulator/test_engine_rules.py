"""The engine backend's error mapping and relay, its health rule, and fault plans, one case at a time
(prefix_routing/emulator/engine_backend.py, engine_health.py, faults.py). Expected values come from
the modules' docstrings: an engine that cannot be reached or answers an error before streaming is a
ModelError (424) carrying the engine's status, a 4xx with the engine's own body; one that fails
mid-stream a ModelStreamError; an engine is down after ``unhealthy_after`` failed checks in a row
or at once when it refuses connections, and up after one passing check."""

from __future__ import annotations

import http.client
import io
import json
import random
import socket
import threading

import pytest

from prefix_routing.emulator import engine_backend as eb
from prefix_routing.emulator.backend import BackendResponse, ErrorReply, StreamFailure
from prefix_routing.emulator.engine_backend import EngineBackend, engine_body
from prefix_routing.emulator.engine_health import EngineHealth
from prefix_routing.emulator.faults import Faults, plan_faults
from prefix_routing.emulator.protocol import OP_CHAT_COMPLETIONS, OP_INVOKE, OP_INVOKE_STREAM, RequestHeaders, \
    RuntimeRequest
from prefix_routing.rules.errors import UserError

from .test_engine_backend import StandInEngine

ARN = "arn:aws:logs:us-east-1:000000000000:log-group:/aws/sagemaker/Endpoints/ep"


def request(body, *, operation=OP_INVOKE_STREAM, stream=True, **headers) -> RuntimeRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return RuntimeRequest(operation=operation, endpoint_name="ep", body=raw, headers=RequestHeaders(**headers),
                          raw_headers=(), arrival=0.0, arrival_wall=0.0, request_id="r-1", index=0, stream=stream,
                          path="/endpoints/ep/invocations-response-stream")


CHAT = {"messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture
def engine():
    started = StandInEngine()
    yield started
    started.stop()


@pytest.fixture
def backend(engine):
    made = EngineBackend([engine.url], strategy="RANDOM", component_name="ic", health_interval_s=None)
    yield made
    made.close()


# ----------------------------------------------------------------------------- the body sent on


def test_a_chat_body_is_streamed_with_usage_and_a_default_limit():
    path, body = engine_body({"messages": [], "temperature": 0})
    assert path == "/v1/chat/completions"
    assert body == {"messages": [], "temperature": 0, "max_tokens": 16, "stream": True,
                    "stream_options": {"include_usage": True}}
    assert eb.DEFAULT_MAX_TOKENS == 16


def test_the_bodys_model_is_left_out_for_the_engine_but_its_salt_is_kept():
    """vLLM answers 404 to a model it does not serve: each local engine answers as its own model."""
    _, chat = engine_body({"cache_salt": "s", "model": "meta-llama/Llama-3.1-8B-Instruct", "messages": []})
    _, completion = engine_body({"model": "m", "prompt": "p"})
    assert "model" not in chat and "model" not in completion and chat["cache_salt"] == "s"


def test_a_callers_own_limit_either_way_is_kept():
    assert engine_body({"messages": [], "max_completion_tokens": 5})[1].get("max_tokens") is None
    assert engine_body({"messages": [], "max_tokens": 0})[1]["max_tokens"] == 16  # 0: no limit given
    _, body = engine_body({"prompt": ["a", "b"], "max_tokens": 9, "stream": False})
    assert body["prompt"] == ["a", "b"] and body["max_tokens"] == 9 and body["stream"] is True


def test_an_lmi_body_becomes_a_completion_with_its_max_new_tokens():
    path, body = engine_body({"inputs": "hi", "parameters": {"max_new_tokens": 4, "temperature": 1}, "seed": 3})
    assert path == "/v1/completions"
    assert body == {"prompt": "hi", "seed": 3, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    _, body = engine_body({"inputs": "hi", "parameters": {"max_new_tokens": "4"}})
    assert body["max_tokens"] == 16  # not an integer: the default
    _, body = engine_body({"prompt": "p", "inputs": "i"})
    assert body["prompt"] == "p"  # prompt first


@pytest.mark.parametrize("data", [{"prompt": ""}, {"prompt": []}, {"inputs": 5}, {"messages": "text"}, {}])
def test_a_body_without_messages_or_a_prompt_is_refused(data):
    with pytest.raises(ValueError, match="body has no 'messages', 'prompt' or 'inputs'"):
        engine_body(data)


# ----------------------------------------------------------------------------- server-sent events


def test_events_are_split_at_blank_lines_and_a_last_event_without_one_is_kept():
    stream = io.BytesIO(b"data: 1\n\n: comment\r\n\r\ndata: 2\ndata: 3\n\n\n\ndata: 4")
    assert list(eb._sse_events(stream)) == [b"data: 1\n\n", b": comment\r\n\r\n", b"data: 2\ndata: 3\n\n",
                                            b"data: 4"]
    assert list(eb._sse_events(io.BytesIO(b"\n\n  \n"))) == []


def test_a_payload_is_the_data_of_an_event():
    assert eb._payload(b"data: {\"a\": 1}\n\n") == b'{"a": 1}'
    assert eb._payload(b"data:[DONE]\n\n") == b"[DONE]"
    assert eb._payload(b": keep-alive\n\n") == b"" and eb._payload(b"event: x\n\n") == b""


def test_text_is_a_chat_delta_or_a_completion_text():
    assert eb._has_text({"choices": [{"delta": {"content": "a"}}]})
    assert eb._has_text({"choices": [{"delta": {}}, {"text": "b"}]})
    assert not eb._has_text({"choices": [{"delta": {"content": ""}}, "x", {"delta": None}]})
    assert not eb._has_text({"choices": None}) and not eb._has_text({})


class Events:
    def __init__(self, events):
        self.events, self.closed = events, False

    def __iter__(self):
        return iter(self.events)

    def close(self):
        self.closed = True


def sse(*objects) -> list[bytes]:
    return [b"data: " + json.dumps(o).encode() + b"\n\n" for o in objects] + [b": c\n\n", b"data: [DONE]\n\n"]


def test_a_whole_answer_joins_the_text_keeps_the_last_finish_and_usage_and_closes_the_stream():
    events = Events(sse({"id": "c1", "created": 7, "model": "m", "choices": [{"delta": {"content": "he"}}]},
                        {"id": "c2", "choices": [{"delta": {"content": "llo"}, "finish_reason": "length"}]},
                        {"choices": [], "usage": {"prompt_tokens": 3}}))
    (answer,) = list(eb._whole(events, chat=True))
    assert json.loads(answer) == {"id": "c1", "created": 7, "model": "m", "object": "chat.completion",
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                                               "finish_reason": "length"}], "usage": {"prompt_tokens": 3}}
    assert b" " not in answer.split(b'"content"')[0]  # compact JSON
    assert events.closed


def test_a_whole_completion_answer_is_a_text_completion():
    (answer,) = list(eb._whole(Events(sse({"choices": [{"text": "ab", "finish_reason": "stop"}]})), chat=False))
    assert json.loads(answer) == {"object": "text_completion", "choices": [{"index": 0, "text": "ab",
                                                                             "finish_reason": "stop"}], "usage": None}


# ----------------------------------------------------------------------------- errors as SageMaker says them


def test_a_client_error_is_a_model_error_with_a_vllm_style_message_or_the_engines_own():
    made = eb._client_error(request(CHAT), "body is not a JSON object")
    message = json.dumps({"object": "error", "message": "body is not a JSON object", "type": "BadRequestError",
                          "code": 400})
    assert made == ErrorReply("ModelError", f'Received client error (400) from primary with message "{message}".',
                              original_status_code=400, original_message=message, log_stream_arn=ARN)
    own = eb._client_error(request(CHAT), "ignored", status=413, original="too big")
    assert own == ErrorReply("ModelError", 'Received client error (413) from primary with message "too big".',
                             original_status_code=413, original_message="too big", log_stream_arn=ARN)


def test_a_server_error_is_a_model_error_with_the_engines_status():
    assert eb._engine_error(request(CHAT), 503, "loading") == ErrorReply(
        "ModelError", 'Received server error (503) from primary with message "loading".', original_status_code=503,
        original_message="loading", log_stream_arn=ARN)


def test_another_component_than_the_stages_does_not_exist(backend, engine):
    reply = backend.handle(request(CHAT, inference_component="other"))
    assert reply == ErrorReply("ValidationError", "Inference Component other does not exist.")
    served = backend.handle(request(CHAT, inference_component="ic"))
    assert isinstance(served, BackendResponse) and list(served.chunks)[-1] == b"data: [DONE]\n\n"
    assert len(engine.bodies) == 1


@pytest.mark.parametrize("body, text", [(b"\xff\xfe", None), (b"[1, 2]", "body is not a JSON object"),
                                        (b"{not json", None), (b'{"text": 1}', "body has no 'messages'")])
def test_a_body_the_engines_cannot_take_is_a_400_model_error_that_reaches_no_engine(backend, engine, body, text):
    reply = backend.handle(request(body))
    assert (reply.code, reply.original_status_code, reply.log_stream_arn) == ("ModelError", 400, ARN)
    assert text is None or text in reply.original_message
    assert engine.bodies == [] and backend.status()["engines"][0]["requests"] == 0


def test_an_engines_4xx_is_its_own_body_cut_at_1000_characters(backend, engine):
    engine.mode = "reject"
    reply = backend.handle(request(CHAT))
    assert reply.code == "ModelError" and reply.original_status_code == 400
    assert "exceeds the available context size" in reply.original_message
    assert reply.message == f'Received client error (400) from primary with message "{reply.original_message}".'
    stats = backend.status()["engines"][0]
    assert (stats["errors"], stats["in_flight"], stats["requests"]) == (1, 0, 1)


def test_an_engines_5xx_is_a_server_model_error_with_its_status(backend, engine):
    engine.mode = "error"
    reply = backend.handle(request(CHAT))
    assert reply.code == "ModelError" and reply.original_status_code == 500
    assert reply.message.startswith("Received server error (500) from primary") and "engine broke" in reply.message


def test_an_engine_that_drops_the_request_is_a_502_and_stays_in_routing(backend, engine, monkeypatch):
    def broken(*args, **kwargs):
        raise http.client.RemoteDisconnected("closed")

    monkeypatch.setattr(backend, "_send", broken)
    reply = backend.handle(request(CHAT))
    assert reply.code == "ModelError" and reply.original_status_code == 502
    assert reply.original_message == f"engine {engine.url} failed: closed"
    assert backend.health.healthy() == [0]  # it answered the connection: only a failed connect takes it out
    assert backend.status()["engines"][0]["errors"] == 1 and backend.status()["engines"][0]["in_flight"] == 0


def test_an_unreachable_engine_is_a_502_and_out_of_routing_until_a_check_passes():
    backend = EngineBackend(["http://127.0.0.1:9"], strategy="RANDOM", health_interval_s=None)
    try:
        reply = backend.handle(request(CHAT))
        assert reply.code == "ModelError" and reply.original_status_code == 502
        assert reply.original_message.startswith("engine http://127.0.0.1:9 unreachable: ")
        assert backend.health.healthy() == [] and backend.status()["engines"][0]["errors"] == 1
        assert backend.handle(request(CHAT)) == ErrorReply("ValidationError", eb.NO_CAPACITY)
    finally:
        backend.close()


def test_a_streamed_answer_is_the_engines_events_with_the_variant_and_attributes(backend, engine):
    response = backend.handle(request(CHAT, target_variant="v1", custom_attributes="a=b"))
    assert (response.content_type, response.invoked_variant, response.custom_attributes) == (
        "text/event-stream", "v1", "a=b")
    events = list(response.chunks)
    assert events[-1] == b"data: [DONE]\n\n" and len(events) == 4
    stats = backend.status()["engines"][0]
    assert (stats["requests"], stats["in_flight"], stats["errors"], stats["prompt_tokens"]) == (1, 0, 0, 2)
    assert stats["ttft_p50_s"] is not None
    assert engine.bodies[0]["path"] == "/v1/chat/completions"


def test_an_unstreamed_answer_is_one_json_document(backend):
    response = backend.handle(request(CHAT, operation=OP_INVOKE, stream=False))
    assert response.content_type == "application/json" and response.invoked_variant is None
    (document,) = list(response.chunks)
    answer = json.loads(document)
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"] == "hi there"
    completion = backend.handle(request({"prompt": "a b"}, operation=OP_INVOKE, stream=False))
    assert json.loads(next(iter(completion.chunks)))["object"] == "text_completion"


def test_a_stream_cut_before_done_or_an_error_event_fails_mid_stream(backend):
    class Response:
        def __init__(self, lines):
            self.lines = list(lines)

        def readline(self):
            return self.lines.pop(0) if self.lines else b""

    class Connection:
        closed = False

        def close(self):
            Connection.closed = True

    backend._route(request(CHAT), CHAT)  # one in flight, as handle books it
    cut = backend._relay(0, Connection(), Response([b'data: {"choices": [{"delta": {"content": "a"}}]}\n', b"\n"]),
                         0.0)
    assert next(cut).startswith(b"data:")
    with pytest.raises(StreamFailure) as failed:
        next(cut)
    assert (failed.value.kind, failed.value.error_code, failed.value.message) == (
        "ModelStreamError", "StreamBroken", "engine stream ended before [DONE]")
    assert Connection.closed and backend.status()["engines"][0]["errors"] == 1
    backend._route(request(CHAT), CHAT)
    erred = backend._relay(0, Connection(), Response([b'data: {"error": {"message": "oom"}}\n', b"\n"]), 0.0)
    with pytest.raises(StreamFailure) as failed:
        list(erred)
    assert failed.value.error_code == "ModelError" and failed.value.message == 'engine error: {"message": "oom"}'
    stats = backend.status()["engines"][0]
    assert stats["errors"] == 2 and stats["in_flight"] == 0


def test_the_openai_path_routes_on_the_messages_and_the_cache_key(engine):
    backend = EngineBackend([engine.url, engine.url], strategy="PREFIX_AWARE", prefix_length=1024,
                            health_interval_s=None)
    try:
        body = {"messages": [{"role": "system", "content": "s" * 2000}], "prompt_cache_key": "tenant-1"}
        first = backend._route(request(body, operation=OP_CHAT_COMPLETIONS), body)
        again = backend._route(request(body, operation=OP_CHAT_COMPLETIONS), body)
        assert first == again and first[1] is False
        assert sum(e["in_flight"] for e in backend.status()["engines"]) == 2
    finally:
        backend.close()


def test_the_openai_paths_cache_key_separates_identical_messages():
    backend = EngineBackend(["http://127.0.0.1:9", "http://127.0.0.1:10"], strategy="PREFIX_AWARE",
                            prefix_length=1024, health_interval_s=None)
    try:
        messages = [{"role": "system", "content": "s" * 2000}]
        homes = set()
        for tenant in range(12):
            body = {"messages": messages, "prompt_cache_key": f"tenant-{tenant}"}
            first, _ = backend._route(request(body, operation=OP_CHAT_COMPLETIONS), body)
            again, _ = backend._route(request(body, operation=OP_CHAT_COMPLETIONS), body)
            assert first == again
            homes.add(first)
        assert homes == {0, 1}  # 12 keys: both engines (p = 1 - 2^-11)
    finally:
        backend.close()


def test_the_openai_path_routes_on_the_messages_first_prefix_length_characters():
    backend = EngineBackend(["http://127.0.0.1:9", "http://127.0.0.1:10"], strategy="PREFIX_AWARE",
                            prefix_length=1024, health_interval_s=None)
    try:
        def home(body):
            return backend._route(request(body, operation=OP_CHAT_COMPLETIONS), body)[0]

        shared = "s" * 2000
        # the same first 1024 characters, different questions: one engine
        assert len({home({"messages": [{"role": "system", "content": shared},
                                       {"role": "user", "content": f"question {i}"}]}) for i in range(12)}) == 1
        # different prefixes: both engines (p = 1 - 2^-11)
        homes = {home({"messages": [{"role": "system", "content": f"prompt {i} " + shared}]}) for i in range(12)}
        assert homes == {0, 1}
    finally:
        backend.close()


def test_an_openai_path_request_is_served_on_its_messages(backend, engine):
    response = backend.handle(request(CHAT, operation=OP_CHAT_COMPLETIONS))
    assert isinstance(response, BackendResponse) and list(response.chunks)[-1] == b"data: [DONE]\n\n"
    assert engine.bodies[0]["messages"] == CHAT["messages"]


def test_a_body_that_is_no_object_gets_a_vllm_style_400():
    backend = EngineBackend(["http://127.0.0.1:9"], strategy="RANDOM", health_interval_s=None)
    try:
        reply = backend.handle(request(b"[1, 2]"))
    finally:
        backend.close()
    assert reply.original_message == json.dumps({"object": "error", "message": "body is not a JSON object",
                                                 "type": "BadRequestError", "code": 400})


def test_an_engine_url_keeps_its_path_without_the_last_slash():
    assert eb._check_url("http://127.0.0.1:8080/proxyX/") == "http://127.0.0.1:8080/proxyX"
    assert eb._check_url("http://127.0.0.1:8080//") == "http://127.0.0.1:8080"


def test_a_body_with_nothing_to_send_says_so_exactly():
    with pytest.raises(ValueError) as refused:
        engine_body({"temperature": 0})
    assert str(refused.value) == "body has no 'messages', 'prompt' or 'inputs'"


def test_the_status_adds_up_the_engines_and_weighs_the_hit_rate_by_tokens():
    backend = EngineBackend(["http://127.0.0.1:9", "http://127.0.0.1:10"], strategy="LEAST_OUTSTANDING_REQUESTS",
                            prefix_length=512, concurrency_threshold=7, health_interval_s=None)
    try:
        empty = backend.status()
        assert (empty["requests"], empty["engines_healthy"], empty["hit_rate"]) == (0, 2, None)
        assert [e["hit_rate"] for e in empty["engines"]] == [None, None]
        assert [e["ttft_p50_s"] for e in empty["engines"]] == [None, None]
        for g, ttft in ((0, 0.3), (0, 0.1), (0, 0.2), (1, 0.4)):
            with backend._lock:  # booked as _route books the engine it chose
                backend.stats[g].requests += 1
                backend.stats[g].in_flight += 1
            backend._done(g, usage={"prompt_tokens": 100 if g == 0 else 300,
                                    "prompt_tokens_details": {"cached_tokens": 50 if g == 0 else 0}}, ttft_s=ttft)
        backend.health.connect_failed(1, "refused")
        status = backend.status()
        assert (status["strategy"], status["prefix_length"], status["concurrency_threshold"]) == (
            "LEAST_OUTSTANDING_REQUESTS", 512, 7)
        # 150 cached of 600 prompt tokens over both engines: 0.25 (not the mean of 0.5 and 0.0)
        assert (status["requests"], status["engines_healthy"], status["hit_rate"]) == (4, 1, 0.25)
        first, second = status["engines"]
        assert (first["url"], first["requests"], first["prompt_tokens"], first["cached_tokens"], first["hit_rate"]) == (
            "http://127.0.0.1:9", 3, 300, 150, 0.5)
        assert (first["ttft_p50_s"], second["ttft_p50_s"]) == (0.2, 0.4)
        assert (first["healthy"], second["healthy"]) == (True, False)
        assert second["health"]["last_error"] == "request could not connect: refused" and first["health"]["healthy"]
        assert (first["errors"], first["spills_in"], first["in_flight"], second["in_flight"]) == (0, 0, 0, 0)
    finally:
        backend.close()


def test_the_median_ttft_of_an_even_count_is_the_mean_of_the_middle_two():
    stats = eb.EngineStats("http://e")
    stats.ttfts_s.extend([0.4, 0.1, 0.3, 0.2])
    assert stats.as_dict()["ttft_p50_s"] == pytest.approx(0.25)


def test_engine_urls_must_be_plain_http_with_a_host():
    assert eb._check_url("http://127.0.0.1:8080/") == "http://127.0.0.1:8080"
    for url in ("https://127.0.0.1:8080", "127.0.0.1:8080", "http://", "http:///v1"):
        with pytest.raises(UserError, match="expected http://HOST:PORT"):
            eb._check_url(url)


def test_a_backend_without_a_component_serves_any_and_one_with_a_component_serves_requests_naming_none(engine):
    anyone = EngineBackend([engine.url], strategy="RANDOM", health_interval_s=None)
    try:
        assert isinstance(anyone.handle(request(CHAT, inference_component="whatever")), BackendResponse)
    finally:
        anyone.close()
    named = EngineBackend([engine.url], strategy="RANDOM", component_name="ic", health_interval_s=None)
    try:
        assert isinstance(named.handle(request(CHAT)), BackendResponse)
    finally:
        named.close()
    assert len(engine.bodies) == 2


def test_an_unstreamed_answer_carries_the_variant_and_the_custom_attributes(backend):
    response = backend.handle(request(CHAT, operation=OP_INVOKE, stream=False, target_variant="v2",
                                      custom_attributes="k=v"))
    assert (response.content_type, response.invoked_variant, response.custom_attributes) == (
        "application/json", "v2", "k=v")
    assert json.loads(b"".join(response.chunks))["choices"][0]["message"]["content"] == "hi there"


class FakeResponse:
    """What ``_send`` returns: a status and a body read at once, or lines read one by one (an exception
    in ``lines`` is raised when its turn comes)."""

    def __init__(self, status=200, body=b"", lines=()):
        self.status, self.body, self.lines = status, body, list(lines)

    def read(self):
        return self.body

    def readline(self):
        if not self.lines:
            return b""
        line = self.lines.pop(0)
        if isinstance(line, BaseException):
            raise line
        return line


class FakeConnection:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def test_an_engines_error_body_is_decoded_leniently_and_cut_at_1000_characters(backend, monkeypatch):
    monkeypatch.setattr(backend, "_send", lambda *args: FakeResponse(500, b"\xff" + b"e" * 1500))
    reply = backend.handle(request(CHAT))
    assert reply.original_status_code == 500 and reply.original_message == "\ufffd" + "e" * 999
    monkeypatch.setattr(backend, "_send", lambda *args: FakeResponse(404, b"x" * 1200 + b"\xfe"))
    reply = backend.handle(request(CHAT))
    assert reply.original_status_code == 404 and reply.original_message == "x" * 1000
    stats = backend.status()["engines"][0]
    assert (stats["requests"], stats["errors"], stats["in_flight"]) == (2, 2, 0)


def test_a_stream_that_breaks_mid_way_is_a_stream_broken_error_booked_once(backend):
    backend._route(request(CHAT), CHAT)
    connection = FakeConnection()
    events = backend._relay(0, connection, FakeResponse(lines=[
        b'data: {"choices": [{"delta": {"content": "a"}}]}\n', b"\n", ConnectionResetError("reset by peer")]), 0.0)
    assert next(events) == b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
    with pytest.raises(StreamFailure) as failed:
        next(events)
    assert (failed.value.kind, failed.value.message, failed.value.error_code) == (
        "ModelStreamError", "engine stream broke: reset by peer", "StreamBroken")
    stats = backend.status()["engines"][0]
    assert connection.closed and (stats["errors"], stats["in_flight"], stats["requests"]) == (1, 0, 1)


def test_an_engines_error_event_is_cut_at_500_characters(backend):
    backend._route(request(CHAT), CHAT)
    error = {"message": "m" * 600}
    events = backend._relay(0, FakeConnection(), FakeResponse(lines=[
        b"data: " + json.dumps({"error": error}).encode() + b"\n", b"\n"]), 0.0)
    with pytest.raises(StreamFailure) as failed:
        list(events)
    assert failed.value.message == "engine error: " + json.dumps(error)[:500]
    assert len(failed.value.message) == len("engine error: ") + 500


def test_the_ttft_is_the_time_to_the_first_event_with_text(backend, monkeypatch):
    class Clock:
        def __init__(self, times):
            self.times = list(times)

        def monotonic(self):
            return self.times.pop(0)

    monkeypatch.setattr(eb, "time", Clock([11.5, 15.0, 20.0]))
    backend._route(request(CHAT), CHAT)
    lines = [b'data: {"choices": [{"delta": {"role": "assistant"}}]}\n', b"\n",
             b'data: {"choices": [{"delta": {"content": "a"}}]}\n', b"\n",
             b'data: {"choices": [{"delta": {"content": "b"}}]}\n', b"\n",
             b'data: {"choices": [], "usage": {"prompt_tokens": 7}}\n', b"\n", b"data: [DONE]\n", b"\n"]
    assert len(list(backend._relay(0, FakeConnection(), FakeResponse(lines=lines), 10.0))) == 5
    stats = backend.status()["engines"][0]
    assert stats["ttft_p50_s"] == 1.5 and stats["prompt_tokens"] == 7 and stats["errors"] == 0


def test_usage_figures_add_up_and_missing_ones_count_zero(backend):
    for _ in range(5):
        backend._route(request(CHAT), CHAT)
    backend._done(0, usage={"completion_tokens": 3})
    stats = backend.status()["engines"][0]
    assert (stats["prompt_tokens"], stats["cached_tokens"], stats["hit_rate"]) == (0, 0, None)
    backend._done(0, usage={"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}}, ttft_s=0.25)
    backend._done(0, usage={"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}})
    backend._done(0, usage={"prompt_tokens": 5, "prompt_tokens_details": None}, error=True)
    backend._done(0, error=True)
    stats = backend.status()["engines"][0]
    assert (stats["prompt_tokens"], stats["cached_tokens"], stats["hit_rate"]) == (25, 8, 0.32)
    assert (stats["in_flight"], stats["errors"], stats["requests"], stats["ttft_p50_s"]) == (0, 2, 5, 0.25)


def test_spills_are_counted_on_the_engine_they_spill_to():
    # Two engines, a threshold of 2: one prefix's home takes two, the next two spill to the other engine.
    backend = EngineBackend(["http://127.0.0.1:9", "http://127.0.0.1:10"], strategy="PREFIX_AWARE",
                            concurrency_threshold=2, health_interval_s=None)
    try:
        routed = [backend._route(request(CHAT), CHAT) for _ in range(4)]
        home = routed[0][0]
        assert routed == [(home, False), (home, False), (1 - home, True), (1 - home, True)]
        engines = backend.status()["engines"]
        assert (engines[home]["spills_in"], engines[1 - home]["spills_in"]) == (0, 2)
        assert [e["in_flight"] for e in engines] == [2, 2] and [e["requests"] for e in engines] == [2, 2]
    finally:
        backend.close()


def test_with_every_engine_down_nothing_is_chosen_or_booked():
    backend = EngineBackend(["http://127.0.0.1:9"], strategy="RANDOM", health_interval_s=None)
    try:
        backend.health.connect_failed(0, "refused")
        assert backend._route(request(CHAT), CHAT) == (-1, False)
        assert backend.status()["engines"][0]["requests"] == 0
    finally:
        backend.close()


def test_a_whole_answer_skips_comments_anywhere_and_a_choice_without_text_adds_none():
    events = Events([b": keep-alive\n\n"] + sse({"choices": [{"delta": {"role": "assistant"}}]},
                                                {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}))
    (answer,) = list(eb._whole(events, chat=True))
    assert json.loads(answer)["choices"][0]["message"]["content"] == "ok"
    assert json.loads(answer)["choices"][0]["finish_reason"] == "stop"



# ----------------------------------------------------------------------------- health


def test_failed_checks_take_an_engine_out_only_in_a_row_and_changes_are_announced():
    changes = []
    health = EngineHealth(["http://a", "http://b"], unhealthy_after=2, on_change=changes.append)
    health._book(0, False, "HTTP 503")
    assert health.healthy() == [0, 1] and changes == []
    health._book(0, True, None)
    health._book(0, False, "HTTP 503")
    assert health.healthy() == [0, 1]  # one in a row again
    health._book(0, False, "HTTP 503")
    assert health.healthy() == [1] and changes == [[1]]
    state = health.status(0)
    assert (state["checks"], state["checks_failed"], state["failures_in_a_row"], state["went_down"],
            state["last_error"], state["healthy"]) == (4, 3, 2, 1, "HTTP 503", False)
    health._book(0, True, None)
    assert health.healthy() == [0, 1] and changes == [[1], [0, 1]]
    assert health.status(0)["went_down"] == 1 and health.status(0)["failures_in_a_row"] == 0


def test_a_refused_connection_or_a_failed_request_takes_an_engine_out_at_once():
    changes = []
    health = EngineHealth(["http://a", "http://b"], unhealthy_after=5, on_change=changes.append)
    health._book(1, False, "ConnectionRefusedError", down_now=True)
    assert health.healthy() == [0] and changes == [[0]]
    health.connect_failed(0, "OSError: no route")
    assert health.healthy() == [] and changes == [[0], []]
    state = health.status(0)
    assert (state["checks"], state["checks_failed"], state["last_error"]) == (
        0, 0, "request could not connect: OSError: no route")  # a request is no check
    health.connect_failed(0, "again")
    assert changes == [[0], []] and health.status(0)["went_down"] == 1  # already down: no news


def test_a_check_asks_health_and_books_the_answer(engine):
    health = EngineHealth([engine.url], unhealthy_after=1)
    assert health.check(0) is True and engine.health_checks == 1
    engine.health_status = 503
    assert health.check(0) is False and health.status(0)["last_error"] == "HTTP 503" and not health.is_healthy(0)
    engine.health_status = 200
    assert health.check_all() == [0]


def test_a_port_that_refuses_is_down_after_one_check():
    health = EngineHealth(["http://127.0.0.1:9"], unhealthy_after=3)
    assert health.check(0) is False and health.healthy() == []
    assert health.status(0)["last_error"].startswith("ConnectionRefusedError")


@pytest.mark.parametrize("kwargs, message", [
    (dict(interval_s=0.04), r"health_interval_s=0.04: allowed a number of seconds from 0.05 to 300"),
    (dict(interval_s=300.5), r"health_interval_s=300.5"),
    (dict(timeout_s=60.5), r"health_timeout_s=60.5: allowed a number of seconds from 0.05 to 60"),
    (dict(timeout_s=True), r"health_timeout_s=True"),
    (dict(unhealthy_after=101), r"unhealthy_after=101: allowed an integer from 1 to 100"),
    (dict(unhealthy_after=2.0), r"unhealthy_after=2.0"),
])
def test_health_settings_out_of_bounds(kwargs, message):
    with pytest.raises(UserError, match=message):
        EngineHealth(["http://a"], **kwargs)
    EngineHealth(["http://a"], interval_s=0.05, timeout_s=60, unhealthy_after=100)
    EngineHealth(["http://a"], interval_s=300, timeout_s=0.05, unhealthy_after=1)


class HeldServer:
    """A 127.0.0.1 port that reads the request and then ``answer``s it (or says nothing) and holds the
    connection open until the test ends: an engine that hangs."""

    def __init__(self, answer: bytes = b""):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.answer, self.done, self.held = answer, threading.Event(), []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            connection, _ = self.sock.accept()
        except OSError:
            return
        self.held.append(connection)
        connection.recv(65536)
        if self.answer:
            connection.sendall(self.answer)
        self.done.wait(10)

    def stop(self):
        self.done.set()
        self.sock.close()
        self.thread.join(5)
        for connection in self.held:
            connection.close()


@pytest.fixture
def held():
    servers = []

    def make(answer: bytes = b""):
        servers.append(HeldServer(answer))
        return servers[-1]

    yield make
    for server in servers:
        server.stop()


def test_a_check_that_gets_no_answer_fails_within_its_timeout_and_counts_in_a_row(held):
    server = held()
    health = EngineHealth([server.url], timeout_s=0.05, unhealthy_after=2)
    assert health.check(0) is False
    state = health.status(0)
    assert state["last_error"] == "TimeoutError: timed out" and state["healthy"] is True  # 1 of 2: still up


def test_a_check_reads_at_most_4_kib_of_the_answer(held):
    # 200 with a body far longer than the 4 KiB sent: the check must not wait for the rest.
    server = held(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 4096)
    health = EngineHealth([server.url], timeout_s=2.0, unhealthy_after=1)
    assert health.check(0) is True and health.status(0)["last_error"] is None


def test_a_check_passes_on_200_only(engine):
    health = EngineHealth([engine.url], unhealthy_after=1)
    engine.health_status = 201
    assert health.check(0) is False and health.status(0)["last_error"] == "HTTP 201" and health.healthy() == []
    engine.health_status = 200
    assert health.check(0) is True and health.healthy() == [0]


def test_a_503_is_a_failed_check_not_a_refusal(engine):
    health = EngineHealth([engine.url], unhealthy_after=2)
    engine.health_status = 503
    assert health.check(0) is False and health.healthy() == [0]  # 1 of 2 in a row: still up
    assert health.check(0) is False and health.healthy() == []


# ----------------------------------------------------------------------------- faults


@pytest.mark.parametrize("spec, expected", [
    ("throttle_rate=0.1,seed=7", Faults(throttle_rate=0.1, seed=7)),
    (" error-first = 2 , error_kind=InternalFailure ", Faults(error_first=2, error_kind="InternalFailure")),
    ("stream_error_after=none,truncate_after=3", Faults(truncate_after=3)),
    ("", Faults()),
    ("drop_rate=0.5", Faults(drop_rate=0.5, drop_after=0)),
])
def test_a_fault_spec_is_name_value_pairs(spec, expected):
    assert Faults.from_spec(spec) == expected


@pytest.mark.parametrize("spec, message", [
    ("throttle", "fault 'throttle': expected NAME=VALUE"), ("speed=2", "fault 'speed=2': expected NAME=VALUE"),
    ("throttle_rate=lots", "fault 'throttle_rate=lots': 'lots' is not a number"),
    ("error_first=1.5", "'1.5' is not a number"),
    ("throttle_rate=2", "fault throttle_rate=2.0: must be between 0 and 1"),
    ("truncate_after=-1", "fault truncate_after=-1: must be >= 0"),
    ("fragment_bytes=-1", "fault fragment_bytes=-1: must be >= 0"),
    ("first_chunk_delay=3601", "fault first_chunk_delay=3601.0: allowed 0 to 3600 seconds"),
    ("first_chunk_delay=nan", "first_chunk_delay=nan"),
    ("error_kind=Oops", "fault error_kind='Oops': one of ValidationError"),
    ("stream_error_kind=ModelError", "fault stream_error_kind='ModelError': one of ModelStreamError"),
])
def test_a_bad_fault_names_the_item(spec, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Faults.from_spec(spec)


def test_a_stream_faults_rate_alone_starts_at_the_first_chunk_and_its_count_alone_always_applies():
    faults = Faults(stream_error_rate=0.5)
    assert (faults.stream_error_after, faults.stream_error_rate) == (0, 0.5)
    faults = Faults(truncate_after=4)
    assert (faults.truncate_after, faults.truncate_rate, faults.drop_after, faults.drop_rate) == (4, 1.0, None, 1.0)
    Faults(first_chunk_delay=3600, throttle_rate=1.0, error_rate=0.0)


def test_plans_count_requests_in_order_then_draw_by_rate():
    faults = Faults(throttle_first=2, error_first=1)
    rng = random.Random(0)
    plans = [plan_faults(faults, i, rng) for i in range(4)]
    assert [(p.throttle, p.error) for p in plans] == [(True, False), (True, False), (False, True), (False, False)]


def test_every_plan_draws_six_numbers_whatever_is_enabled():
    rng, reference = random.Random(5), random.Random(5)
    plan_faults(Faults(), 0, rng)
    for _ in range(6):
        reference.random()
    assert rng.random() == reference.random()


def test_truncate_wins_over_a_stream_error_over_a_drop():
    rng = random.Random(1)
    everything = Faults(truncate_after=1, stream_error_after=2, drop_after=3, first_chunk_delay=0.5)
    plan = plan_faults(everything, 0, rng)
    assert (plan.truncate_after, plan.stream_error_after, plan.drop_after, plan.first_chunk_delay) == (1, None, None, 0.5)
    plan = plan_faults(Faults(stream_error_after=2, drop_after=3), 0, rng)
    assert (plan.truncate_after, plan.stream_error_after, plan.drop_after) == (None, 2, None)
    plan = plan_faults(Faults(drop_after=3), 0, rng)
    assert plan.drop_after == 3 and not plan.throttle and not plan.error


def test_rates_are_compared_with_the_draws():
    class Draws:
        def __init__(self, value):
            self.value = value

        def random(self):
            return self.value

    half = Faults(throttle_rate=0.5, error_rate=0.5, truncate_after=0, truncate_rate=0.5, first_chunk_delay=1.0,
                  first_chunk_delay_rate=0.5)
    low = plan_faults(half, 0, Draws(0.49))
    assert low.throttle and not low.error  # a throttled request is not also an error
    assert low.truncate_after == 0 and low.first_chunk_delay == 1.0
    high = plan_faults(half, 0, Draws(0.5))
    assert not high.throttle and not high.error and high.truncate_after is None and high.first_chunk_delay == 0.0
    errors = plan_faults(Faults(error_rate=0.5), 0, Draws(0.2))
    assert errors.error and not errors.throttle


def test_a_spec_item_with_two_equals_signs_splits_at_the_first():
    with pytest.raises(UserError, match=r"fault error_kind='a=b': one of "):
        Faults.from_spec("error_kind=a=b")


def test_a_known_name_without_a_value_is_no_item_and_the_message_lists_every_name():
    names = "throttle_first, throttle_rate, throttle_status, error_first, error_rate, error_kind, " \
            "stream_error_after, stream_error_rate, stream_error_kind, stream_error_code, truncate_after, " \
            "truncate_rate, drop_after, drop_rate, first_chunk_delay, first_chunk_delay_rate, fragment_bytes, seed"
    with pytest.raises(UserError) as refused:
        Faults.from_spec("seed")
    assert str(refused.value) == f"fault 'seed': expected NAME=VALUE with NAME one of {names}"


def test_a_spec_gives_ints_floats_and_text_their_types():
    faults = Faults.from_spec("throttle_status=429,error_rate=0.25,stream_error_code=Boom,drop_after=NONE,seed=3")
    assert faults == Faults(throttle_status=429, error_rate=0.25, stream_error_code="Boom", seed=3)
    assert type(faults.throttle_status) is int and type(faults.error_rate) is float
    assert Faults.from_spec("truncate_after=None").truncate_after is None


def test_the_kinds_refused_are_listed_in_full():
    with pytest.raises(UserError) as refused:
        Faults(error_kind="Oops")
    assert str(refused.value) == ("fault error_kind='Oops': one of ValidationError, ModelError, "
                                  "ModelNotReadyException, InternalFailure, ServiceUnavailable, "
                                  "InternalDependencyException, ThrottlingException")
    with pytest.raises(UserError) as refused:
        Faults(stream_error_kind="Oops")
    assert str(refused.value) == "fault stream_error_kind='Oops': one of ModelStreamError, InternalStreamFailure"
    for kind in ("ValidationError", "ThrottlingException"):
        assert Faults(error_kind=kind).error_kind == kind
    assert Faults(stream_error_kind="InternalStreamFailure").stream_error_kind == "InternalStreamFailure"


@pytest.mark.parametrize("kind", ["stream_error", "truncate", "drop"])
def test_each_stream_fault_alone_by_rate_or_by_count(kind):
    by_rate = Faults(**{f"{kind}_rate": 0.25})
    assert (getattr(by_rate, f"{kind}_after"), getattr(by_rate, f"{kind}_rate")) == (0, 0.25)
    by_count = Faults(**{f"{kind}_after": 3})
    assert (getattr(by_count, f"{kind}_after"), getattr(by_count, f"{kind}_rate")) == (3, 1.0)
    both = Faults(**{f"{kind}_after": 2, f"{kind}_rate": 0.5})
    assert (getattr(both, f"{kind}_after"), getattr(both, f"{kind}_rate")) == (2, 0.5)
    neither = Faults()
    assert (getattr(neither, f"{kind}_after"), getattr(neither, f"{kind}_rate")) == (None, 1.0)


@pytest.mark.parametrize("name", ["throttle_rate", "error_rate", "stream_error_rate", "truncate_rate", "drop_rate",
                                  "first_chunk_delay_rate"])
def test_every_rate_is_a_fraction_from_0_to_1(name):
    assert getattr(Faults(**{name: 0.0}), name) == 0.0 and getattr(Faults(**{name: 1.0}), name) == 1.0
    for value in (-0.01, 1.01, 1.5):
        with pytest.raises(UserError) as refused:
            Faults(**{name: value})
        assert str(refused.value) == f"fault {name}={value}: must be between 0 and 1"


@pytest.mark.parametrize("name", ["throttle_first", "error_first", "stream_error_after", "truncate_after",
                                  "drop_after", "fragment_bytes"])
def test_every_count_is_0_or_more(name):
    assert getattr(Faults(**{name: 0}), name) == 0
    with pytest.raises(UserError) as refused:
        Faults(**{name: -1})
    assert str(refused.value) == f"fault {name}=-1: must be >= 0"


def test_a_first_chunk_delay_is_0_to_3600_seconds():
    assert Faults(first_chunk_delay=0).first_chunk_delay == 0
    assert Faults(first_chunk_delay=3600).first_chunk_delay == 3600
    for value in (-0.5, 3600.5):
        with pytest.raises(UserError) as refused:
            Faults(first_chunk_delay=value)
        assert str(refused.value) == f"fault first_chunk_delay={value}: allowed 0 to 3600 seconds"


class Scripted:
    """A random source that answers the draws it is given, in order (and says how many were taken)."""

    def __init__(self, draws):
        self.draws, self.taken = list(draws), 0

    def random(self):
        self.taken += 1
        return self.draws.pop(0)


#: Every fault on, each at rate 0.5: a draw of 0.1 applies it, 0.9 does not.
ALL_AT_HALF = Faults(throttle_rate=0.5, error_rate=0.5, stream_error_after=2, stream_error_rate=0.5, truncate_after=3,
                     truncate_rate=0.5, drop_after=4, drop_rate=0.5, first_chunk_delay=1.5, first_chunk_delay_rate=0.5)


NO_FAULT = dict(throttle=False, error=False, stream_error_after=None, truncate_after=None, drop_after=None,
                first_chunk_delay=0.0)


@pytest.mark.parametrize("low, expected", [
    # The order of draws: throttle, error, stream error, truncate, drop, first-chunk delay.
    (0, dict(NO_FAULT, throttle=True)),
    (1, dict(NO_FAULT, error=True)),
    (2, dict(NO_FAULT, stream_error_after=2)),
    (3, dict(NO_FAULT, truncate_after=3)),
    (4, dict(NO_FAULT, drop_after=4)),
    (5, dict(NO_FAULT, first_chunk_delay=1.5)),
])
def test_each_fault_has_its_own_draw(low, expected):
    draws = [0.9] * 6
    draws[low] = 0.1
    rng = Scripted(draws + [0.0])
    plan = plan_faults(ALL_AT_HALF, 10, rng)
    assert rng.taken == 6
    assert {name: getattr(plan, name) for name in expected} == expected


def test_a_draw_equal_to_the_rate_applies_nothing_and_all_low_draws_apply_by_precedence():
    rng = Scripted([0.5] * 6 + [0.0])
    plan = plan_faults(ALL_AT_HALF, 10, rng)
    assert rng.taken == 6
    assert (plan.throttle, plan.error, plan.stream_error_after, plan.truncate_after, plan.drop_after,
            plan.first_chunk_delay) == (False, False, None, None, None, 0.0)
    plan = plan_faults(ALL_AT_HALF, 10, Scripted([0.1] * 6))
    # throttled, so no error; truncate wins over the stream error and the drop; the delay applies
    assert (plan.throttle, plan.error, plan.stream_error_after, plan.truncate_after, plan.drop_after,
            plan.first_chunk_delay) == (True, False, None, 3, None, 1.5)
    no_truncate = Faults(stream_error_after=2, drop_after=4)
    plan = plan_faults(no_truncate, 0, Scripted([0.1] * 6))
    assert (plan.stream_error_after, plan.drop_after) == (2, None)  # the stream error wins over the drop
    plan = plan_faults(Faults(drop_after=4, drop_rate=0.5), 0, Scripted([0.1] * 6))
    assert (plan.truncate_after, plan.stream_error_after, plan.drop_after) == (None, None, 4)


@pytest.mark.parametrize("index, throttle, error", [(0, True, False), (1, True, False), (2, False, True),
                                                    (3, False, True), (4, False, False), (5, False, False)])
def test_counts_throttle_the_first_k_then_error_the_next_k(index, throttle, error):
    plan = plan_faults(Faults(throttle_first=2, error_first=2), index, Scripted([0.9] * 6))
    assert (plan.throttle, plan.error) == (throttle, error)
