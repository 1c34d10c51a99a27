"""The emulator in front of engines: routing, forwarding, the runtime's framing, failures, /status.

The engines here are stand-ins (an OpenAI-compatible server of the test's own on 127.0.0.1 with a
one-slot, word-exact prefix cache), so the tests are fast and exact; the real llama.cpp engines
are exercised in ``tests/prefix_routing/real_engines``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from botocore.exceptions import ClientError, EventStreamError

from prefix_routing.emulator.engine_backend import DEFAULT_MAX_TOKENS, EngineBackend, engine_body
from prefix_routing.emulator.server import RuntimeServer
from prefix_routing.lab.routing import Router, Strategy
from prefix_routing.rules.errors import UserError

from .conftest import client_for


class StandInEngine(ThreadingHTTPServer):
    """An OpenAI-compatible server: one slot that remembers the last prompt's words; cached = common prefix.

    ``mode``: "ok", "error" (500 before streaming), "reject" (400 as llama.cpp refuses a prompt over its
    context), "drop" (closes after the first chunk), "hold" (waits for ``release`` before answering).
    ``GET /health`` answers ``health_status`` (200; llama-server says 503 while it loads its model).
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int = 0):
        super().__init__(("127.0.0.1", port), _StandInHandler)
        self.mode = "ok"
        self.health_status = 200
        self.health_checks = 0
        self.bodies: list[dict] = []
        self.last: list[str] = []
        self.release = threading.Event()
        self.holding = threading.Event()
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self):
        self.release.set()
        self.shutdown()
        self.server_close()


class _StandInHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        engine: StandInEngine = self.server
        status = engine.health_status if self.path == "/health" else 404
        engine.health_checks += self.path == "/health"
        data = b'{"status":"ok"}' if status == 200 else b'{"error":{"code":503,"message":"Loading model"}}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        engine: StandInEngine = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        engine.bodies.append({"path": self.path, **body})
        if engine.mode in ("error", "reject"):
            status, data = 500, b'{"error": {"message": "engine broke", "code": 500}}'
            if engine.mode == "reject":  # llama-server's answer to a prompt longer than its context
                status, data = 400, json.dumps({"error": {
                    "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 9000, "n_ctx": 8192,
                    "message": "the request exceeds the available context size, try increasing it"}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if engine.mode == "hold":
            engine.holding.set()
            engine.release.wait(10)
        words = " ".join(m["content"] for m in body.get("messages", [])).split() or body.get("prompt", "").split()
        cached = 0
        while cached < min(len(words), len(engine.last)) and words[cached] == engine.last[cached]:
            cached += 1
        cached = min(cached, len(words) - 1)  # like llama.cpp: the last token is always computed
        engine.last = words
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(obj):
            data = b"data: " + json.dumps(obj).encode() + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        event({"id": "c1", "model": "stand-in", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]})
        if engine.mode == "drop":
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        event({"id": "c1", "model": "stand-in", "choices": [{"index": 0, "delta": {"content": " there"}, "finish_reason": "length"}]})
        event({"id": "c1", "model": "stand-in", "choices": [],
               "usage": {"prompt_tokens": len(words), "completion_tokens": 2, "total_tokens": len(words) + 2,
                         "prompt_tokens_details": {"cached_tokens": cached}}})
        data = b"data: [DONE]\n\n"
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))


@pytest.fixture
def engines():
    started = [StandInEngine(), StandInEngine()]
    yield started
    for engine in started:
        engine.stop()


@pytest.fixture
def emulate(engines):
    servers = []

    def make(**options):
        backend = EngineBackend([e.url for e in engines], **options)
        server = RuntimeServer(backend, endpoints=["ep"]).start()
        servers.append(server)
        return server, backend

    yield make
    for server in servers:
        server.stop()


def chat(system: str, user: str, **extra) -> bytes:
    return json.dumps({"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                       **extra}).encode()


def stream(client, body: bytes, **kwargs) -> tuple[list[bytes], dict | None]:
    response = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=body, **kwargs)
    parts = [event["PayloadPart"]["Bytes"] for event in response["Body"]]
    usage = None
    for part in parts:
        for line in part.split(b"\n"):
            if line.startswith(b"data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    return parts, usage


SYSTEM = " ".join(f"w{i}" for i in range(200))


def test_boto3_streams_the_engines_events_with_its_usage_and_a_repeat_is_cached(emulate, engines):
    server, backend = emulate(strategy="PREFIX_AWARE", prefix_length=1024, concurrency_threshold=10)
    client = client_for(server)
    parts, first = stream(client, chat(SYSTEM, "one two"))
    _, second = stream(client, chat(SYSTEM, "one three"))
    # One PayloadPart per server-sent event: two text chunks, the usage chunk, [DONE].
    assert len(parts) == 4 and parts[-1] == b"data: [DONE]\n\n"
    assert first["prompt_tokens"] == 202 and first["prompt_tokens_details"]["cached_tokens"] == 0
    # 200 system words + "one" are shared: the engine (not the emulator) says 201 were cached.
    assert second["prompt_tokens_details"]["cached_tokens"] == 201
    status = backend.status()
    assert sorted(e["requests"] for e in status["engines"]) == [0, 2]
    assert status["hit_rate"] == pytest.approx(201 / 404)
    assert server.status()["backend"]["engines"][0]["url"] == engines[0].url


def test_the_forwarded_body_streams_asks_for_usage_and_has_a_token_limit(emulate, engines):
    server, _ = emulate(strategy="RANDOM")
    client_for(server).invoke_endpoint(EndpointName="ep", Body=chat("s", "u", temperature=0.5))
    (forwarded,) = [b for e in engines for b in e.bodies]
    assert forwarded["path"] == "/v1/chat/completions"
    assert forwarded["stream"] is True and forwarded["stream_options"] == {"include_usage": True}
    assert forwarded["max_tokens"] == DEFAULT_MAX_TOKENS and forwarded["temperature"] == 0.5


def test_engine_body_keeps_the_callers_limit_and_maps_lmi_bodies_to_completions():
    path, body = engine_body({"messages": [], "max_tokens": 3, "stream_options": {"continuous_usage_stats": True}})
    assert path == "/v1/chat/completions" and body["max_tokens"] == 3
    assert body["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}
    path, body = engine_body({"inputs": "hello", "parameters": {"max_new_tokens": 7}})
    assert path == "/v1/completions" and body == {
        "prompt": "hello", "max_tokens": 7, "stream": True, "stream_options": {"include_usage": True}}
    with pytest.raises(ValueError, match="messages"):
        engine_body({"text": "x"})


def test_invoke_endpoint_gets_one_chat_completion_with_the_engines_usage(emulate):
    server, _ = emulate(strategy="RANDOM")
    answer = json.loads(client_for(server).invoke_endpoint(EndpointName="ep", Body=chat("a b", "c"))["Body"].read())
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"] == "hi there"
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["prompt_tokens"] == 3


def test_prefix_aware_sends_a_prefix_to_its_home_engine_every_time(emulate, engines):
    server, backend = emulate(strategy="PREFIX_AWARE", prefix_length=1024, concurrency_threshold=10, seed=3)
    client = client_for(server)
    # Bodies longer than PrefixLength that differ only after it (the user's question).
    systems = [f"system prompt number {i} " + SYSTEM + SYSTEM for i in range(8)]
    router = Router(Strategy.PREFIX_AWARE, 2, concurrency_threshold=10, seed=3)
    for question in ("first question", "second question"):
        for system in systems:
            assert len(chat(system, question)) > 1024
            stream(client, chat(system, question))
    # Each prefix went to one engine both times: the one the lab's router names for its key.
    for body in (chat(system, "any") for system in systems):
        home = router.home(hashlib.sha256(body[:1024]).digest())
        seen = [e.bodies for e in engines]
        text = json.loads(body)["messages"][0]["content"]
        assert sum(b["messages"][0]["content"] == text for b in seen[home]) == 2
        assert all(b["messages"][0]["content"] != text for b in seen[1 - home])


def test_the_prefix_aware_id_separates_identical_prefixes(emulate, engines):
    server, _ = emulate(strategy="PREFIX_AWARE", prefix_length=1024, concurrency_threshold=10)
    client = client_for(server)
    body = chat(SYSTEM, "q")
    homes = set()
    for tenant in range(12):
        stream(client, body, PrefixAwareId=f"tenant-{tenant}")
        homes.add(tuple(len(e.bodies) for e in engines))
    assert all(len(e.bodies) > 0 for e in engines)  # 12 tenants: both engines used (p = 1 - 2^-11)


def test_a_busy_home_engine_spills_at_the_concurrency_threshold(emulate, engines):
    server, backend = emulate(strategy="PREFIX_AWARE", prefix_length=1024, concurrency_threshold=1)
    body = chat(SYSTEM, "q")
    home = Router(Strategy.PREFIX_AWARE, 2, concurrency_threshold=1).home(hashlib.sha256(body[:1024]).digest())
    engines[home].mode = "hold"
    held = threading.Thread(target=stream, args=(client_for(server), body))
    held.start()
    assert engines[home].holding.wait(5)
    stream(client_for(server), body)  # the home engine has 1 in flight = the threshold
    status = backend.status()["engines"]
    assert status[1 - home]["spills_in"] == 1 and status[1 - home]["requests"] == 1
    assert status[home]["in_flight"] == 1
    engines[home].release.set()
    held.join(5)
    assert backend.status()["engines"][home]["in_flight"] == 0


def test_least_outstanding_requests_avoids_the_busy_engine(emulate, engines):
    server, backend = emulate(strategy="LEAST_OUTSTANDING_REQUESTS")
    engines[0].mode = engines[1].mode = "hold"
    held = threading.Thread(target=stream, args=(client_for(server), chat("a", "b")))
    held.start()
    busy = 0 if engines[0].holding.wait(5) and not engines[1].holding.is_set() else 1
    engines[1 - busy].mode = "ok"
    for _ in range(5):
        stream(client_for(server), chat("c", "d"))
    assert backend.status()["engines"][1 - busy]["requests"] == 5
    engines[busy].release.set()
    held.join(5)


def test_an_engine_error_before_streaming_is_a_model_error_with_its_status(emulate, engines):
    server, backend = emulate(strategy="RANDOM")
    for engine in engines:
        engine.mode = "error"
    client = client_for(server)
    with pytest.raises(client.exceptions.ModelError) as caught:
        client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=chat("a", "b"))
    assert caught.value.response["OriginalStatusCode"] == 500
    assert "engine broke" in caught.value.response["OriginalMessage"]
    assert sum(e["errors"] for e in backend.status()["engines"]) == 1
    assert all(e["in_flight"] == 0 for e in backend.status()["engines"])


def test_an_engines_400_reaches_a_front_door_caller_as_a_400_with_the_engines_words(emulate, engines):
    from prefix_routing.frontdoor.local import LocalFrontDoor
    from tests.prefix_routing.frontdoor.conftest import Lines

    server, _ = emulate(strategy="RANDOM")
    for engine in engines:
        engine.mode = "reject"
    with pytest.raises(ClientError) as caught:  # the emulator: ModelError with the engine's status
        client_for(server).invoke_endpoint(EndpointName="ep", Body=chat("a", "b"))
    assert caught.value.response["OriginalStatusCode"] == 400
    environment = {"ENDPOINT_NAME": "ep", "TENANCY": "none"}
    with LocalFrontDoor(server.url, environment, emit=Lines()) as door:  # the front door: that 400
        request = urllib.request.Request(door.url, data=chat("a", "b"), method="POST", headers={
            "authorization": "AWS4-HMAC-SHA256 Credential=tenant-a/20261202/us-east-1/lambda/aws4_request, "
                             "SignedHeaders=host, Signature=0"})
        with pytest.raises(urllib.error.HTTPError) as answered:
            urllib.request.urlopen(request, timeout=10)
    error = json.loads(answered.value.read())["error"]
    assert answered.value.code == 400 and error["code"] == "model_rejected"
    assert error["message"] == ("the model rejected the request (400): the request exceeds the available context "
                                "size, try increasing it")


def test_an_engine_that_breaks_mid_stream_is_a_model_stream_error(emulate, engines):
    server, backend = emulate(strategy="RANDOM")
    for engine in engines:
        engine.mode = "drop"
    response = client_for(server).invoke_endpoint_with_response_stream(EndpointName="ep", Body=chat("a", "b"))
    with pytest.raises(EventStreamError) as caught:
        for _ in response["Body"]:
            pass
    assert caught.value.response["Error"]["Code"] == "ModelStreamError"
    server.wait_until_idle()
    assert sum(e["errors"] for e in backend.status()["engines"]) == 1


def test_an_unreachable_engine_is_a_model_error_502_then_out_of_routing():
    # No checking threads: the failed connect alone takes the engine out.
    backend = EngineBackend(["http://127.0.0.1:9"], strategy="RANDOM", health_interval_s=None)  # nothing listens
    with RuntimeServer(backend, endpoints=["ep"]) as server:
        client = client_for(server)
        with pytest.raises(ClientError) as caught:
            client.invoke_endpoint(EndpointName="ep", Body=chat("a", "b"))
        assert caught.value.response["Error"]["Code"] == "ModelError"
        assert caught.value.response["OriginalStatusCode"] == 502
        # The only copy is down: no capacity, as the fleet backend answers when no copy serves.
        with pytest.raises(client.exceptions.ValidationError, match="no capacity"):
            client.invoke_endpoint(EndpointName="ep", Body=chat("a", "b"))
        (engine,) = server.status()["backend"]["engines"]
    assert engine["healthy"] is False and engine["requests"] == 1
    assert "request could not connect: ConnectionRefusedError" in engine["health"]["last_error"]


def test_a_body_the_engine_cannot_serve_is_a_model_error_400_and_reaches_no_engine(emulate, engines):
    server, _ = emulate(strategy="RANDOM")
    with pytest.raises(ClientError) as caught:
        client_for(server).invoke_endpoint(EndpointName="ep", Body=b'{"text": "no prompt"}')
    assert caught.value.response["OriginalStatusCode"] == 400
    assert not engines[0].bodies and not engines[1].bodies


def test_bad_settings_are_refused_with_what_is_allowed():
    with pytest.raises(UserError, match="KV_AWARE.*allowed with engines: RANDOM"):
        EngineBackend(["http://127.0.0.1:1"], strategy="KV_AWARE")
    with pytest.raises(UserError, match="expected http://HOST:PORT"):
        EngineBackend(["ftp://x"], strategy="RANDOM")
    with pytest.raises(UserError, match="at least one"):
        EngineBackend([], strategy="RANDOM")


def _until(condition, timeout=10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_a_dead_engine_loses_its_share_and_gets_it_back_when_it_answers_again(emulate, engines):
    """The issue's case: one of two engines killed. SageMaker stops routing to an unhealthy copy; so does
    the emulator: every request goes to the live engine until the dead one answers its health check again."""
    server, backend = emulate(strategy="PREFIX_AWARE", prefix_length=1024, concurrency_threshold=10,
                              health_interval_s=0.05)
    client = client_for(server)
    systems = [f"system {i} " + SYSTEM + SYSTEM for i in range(8)]  # 8 prefixes: both engines are homes
    for system in systems:
        stream(client, chat(system, "q"))
    assert all(e["requests"] > 0 for e in backend.status()["engines"])
    port = int(engines[0].url.rsplit(":", 1)[1])
    engines[0].stop()  # killed: its port refuses connections
    assert _until(lambda: backend.health.healthy() == [1])
    before = backend.status()["engines"][1]["requests"]
    for system in systems:  # every prefix, the dead engine's homes included: none fails
        _, usage = stream(client, chat(system, "again"))
        assert usage is not None
    status = backend.status()
    assert status["engines"][1]["requests"] == before + 8 and status["engines_healthy"] == 1
    assert status["engines"][0]["healthy"] is False and status["engines"][0]["health"]["went_down"] == 1
    web = json.loads(urllib.request.urlopen(f"{server.url}/status", timeout=5).read())
    assert [e["healthy"] for e in web["backend"]["engines"]] == [False, True]
    # A new engine on the same port (SageMaker's replaced copy): back in routing, its homes back home.
    engines[0] = StandInEngine(port)
    assert _until(lambda: backend.health.healthy() == [0, 1])
    for system in systems:
        stream(client, chat(system, "third"))
    assert len(engines[0].bodies) > 0


def test_all_engines_down_is_no_capacity(emulate, engines):
    server, backend = emulate(strategy="LEAST_OUTSTANDING_REQUESTS", health_interval_s=None, unhealthy_after=1)
    for engine in engines:
        engine.health_status = 503  # llama-server while it loads its model
    assert backend.health.check_all() == []
    client = client_for(server)
    with pytest.raises(client.exceptions.ValidationError, match="Inference Component has no capacity"):
        client.invoke_endpoint(EndpointName="ep", Body=chat("a", "b"))
    assert not engines[0].bodies and not engines[1].bodies
    engines[1].health_status = 200
    assert backend.health.check_all() == [1]
    assert json.loads(client.invoke_endpoint(EndpointName="ep", Body=chat("a", "b"))["Body"].read())["usage"]
    assert len(engines[1].bodies) == 1


def test_a_failed_check_counts_only_in_a_row_and_one_pass_brings_an_engine_back(emulate, engines):
    _, backend = emulate(strategy="RANDOM", health_interval_s=None, unhealthy_after=3)
    health = backend.health
    engines[0].health_status = 503
    assert [health.check(0), health.check(0)] == [False, False] and health.is_healthy(0)  # 2 of 3
    engines[0].health_status = 200
    assert health.check(0) and health.status(0)["failures_in_a_row"] == 0
    engines[0].health_status = 503
    for _ in range(3):
        health.check(0)
    assert not health.is_healthy(0) and backend.router.active == [1]
    engines[0].health_status = 200
    assert health.check(0) and health.is_healthy(0) and backend.router.active is None
    assert health.status(0)["checks"] == 7 and health.status(0)["checks_failed"] == 5
    assert engines[0].health_checks == 7


def test_health_settings_are_bounded():
    for options, message in [({"health_interval_s": 0}, "health_interval_s=0: allowed a number of seconds"),
                             ({"health_timeout_s": 1e9}, "health_timeout_s=1000000000.0"),
                             ({"unhealthy_after": 0}, "unhealthy_after=0: allowed an integer from 1 to 100")]:
        with pytest.raises(UserError, match=message):
            EngineBackend(["http://127.0.0.1:9"], strategy="RANDOM", **options)
    with pytest.raises(UserError, match="65 engine URLs; allowed at most 64"):
        EngineBackend([f"http://127.0.0.1:{1000 + i}" for i in range(65)], strategy="RANDOM")
