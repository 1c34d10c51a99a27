"""Real engines behind the SageMaker runtime's wire protocol: SageMaker's routing, the engines' own KV caches.

:class:`EngineBackend` is the emulator's backend when the model is not the lab's fleet model but
real OpenAI-compatible servers (llama.cpp's ``llama-server`` or vLLM, started by ``engines start``,
or any other). Each engine is one inference-component copy. Routing is the lab's own
(:class:`prefix_routing.lab.routing.Router`): ``PREFIX_AWARE`` hashes the first PrefixLength bytes of
the body as it arrives plus the ``X-Amzn-SageMaker-Prefix-Aware-Id`` header, and spills past the
ConcurrencyThreshold with the live in-flight count of every engine; ``RANDOM`` and
``LEAST_OUTSTANDING_REQUESTS`` as the lab draws them. The OpenAI-compatible path routes on the
messages' text and ``prompt_cache_key``, as the fleet backend does.

The chosen engine gets the body as JSON, always streamed and with ``stream_options.include_usage``
(so that it reports its prompt and cached tokens, :mod:`prefix_routing.rules.stream_usage`), and
``max_tokens`` = 16 when the body sets no limit (a random-weight model would otherwise talk until
its context is full), and without its ``model`` (each engine serves its own). Chat bodies go to ``/v1/chat/completions``; ``prompt``/``inputs`` bodies to
``/v1/completions``. The answer goes back as the engine sent it: one ``PayloadPart`` per server-sent
event on the streaming call, one chat-completion JSON (with the engine's usage) on
``InvokeEndpoint``. An engine that cannot be reached or answers an error before streaming is a
``ModelError`` (424, with its status as ``OriginalStatusCode``); one that fails mid-stream is a
``ModelStreamError`` event. ``status()`` gives per-engine requests, in flight, prompt and cached tokens,
and health.

Each engine is health-checked (:mod:`prefix_routing.emulator.engine_health`: ``GET /health``, and every
request that cannot connect): the router routes among the engines up only, as SageMaker stops routing
to a copy that fails its checks, and takes an engine back once it answers again. With every engine down
a request gets the no-capacity ``ValidationError`` the fleet backend answers when no copy serves.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import statistics
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefix_routing.emulator.backend import BackendResponse, ErrorReply, StreamFailure
from prefix_routing.emulator.engine_health import EngineHealth
from prefix_routing.emulator.protocol import OP_CHAT_COMPLETIONS, RuntimeRequest, log_stream_arn
from prefix_routing.lab.routing import Router, Strategy
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.openai_path import routing_id as openai_routing_id, routing_prefix
from prefix_routing.rules.stream_usage import with_include_usage

DEFAULT_MAX_TOKENS = 16
FIRST_BYTE_TIMEOUT_S = 60.0  # aws-facts.md: the container must answer within 60 s
MAX_ENGINES = 64
TTFT_WINDOW = 10_000  # TTFTs kept per engine (the latest) for its median
#: What the fleet backend answers when no copy serves (its exact body on SageMaker is unconfirmed).
NO_CAPACITY = "Inference Component has no capacity to process this request."


@dataclass
class EngineStats:
    """What the emulator saw of one engine (its own usage figures, the emulator's TTFT)."""

    url: str
    requests: int = 0
    in_flight: int = 0
    errors: int = 0
    spills_in: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttfts_s: deque[float] = field(default_factory=lambda: deque(maxlen=TTFT_WINDOW))

    def as_dict(self) -> dict[str, Any]:
        ttfts = sorted(self.ttfts_s)
        return {
            "url": self.url,
            "requests": self.requests,
            "in_flight": self.in_flight,
            "errors": self.errors,
            "spills_in": self.spills_in,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None,
            "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
        }


def engine_body(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(engine path, body) for a request body: streamed, usage asked, a token limit set."""
    if isinstance(data.get("messages"), list):
        path, body = "/v1/chat/completions", dict(data)
    else:
        prompt = data.get("prompt", data.get("inputs"))
        if not isinstance(prompt, (str, list)) or not prompt:
            raise ValueError("body has no 'messages', 'prompt' or 'inputs'")
        body = {k: v for k, v in data.items() if k not in ("inputs", "parameters")}
        body["prompt"] = prompt
        parameters = data.get("parameters")
        if isinstance(parameters, dict) and isinstance(parameters.get("max_new_tokens"), int):
            body.setdefault("max_tokens", parameters["max_new_tokens"])
        path = "/v1/completions"
    if not body.get("max_tokens") and not body.get("max_completion_tokens"):
        body["max_tokens"] = DEFAULT_MAX_TOKENS
    # The body's ``model`` names the endpoint's model (its Hugging Face id); a local engine serves its own
    # tiny model under its own name, and vLLM refuses any other (404): each engine answers as its model.
    body.pop("model", None)
    body["stream"] = True
    return path, with_include_usage(body)


class EngineBackend:
    """A ``Backend`` that routes each request to one of ``engine_urls`` and relays its answer."""

    def __init__(
        self,
        engine_urls: Sequence[str],
        *,
        strategy: Strategy | str = Strategy.PREFIX_AWARE,
        prefix_length: int = 4096,
        concurrency_threshold: int = 1024,
        component_name: str | None = None,
        seed: int = 0,
        timeout_s: float = FIRST_BYTE_TIMEOUT_S,
        health_interval_s: float | None = 1.0,
        health_timeout_s: float = 2.0,
        unhealthy_after: int = 2,
    ):
        if not engine_urls:
            raise UserError("engines: at least one engine URL is needed")
        if len(engine_urls) > MAX_ENGINES:
            raise UserError(f"engines: {len(engine_urls)} engine URLs; allowed at most {MAX_ENGINES}")
        self.urls = [_check_url(url) for url in engine_urls]
        self.router = Router(strategy, len(self.urls), concurrency_threshold=concurrency_threshold, seed=seed)
        if self.router.strategy is Strategy.KV_AWARE:
            raise UserError("strategy KV_AWARE: real engines do not tell the router what they cache; "
                            "allowed with engines: RANDOM, LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE")
        self.prefix_length = prefix_length
        self.component_name = component_name
        self.timeout_s = timeout_s
        self.stats = [EngineStats(url) for url in self.urls]
        self._lock = threading.Lock()
        #: ``health_interval_s=None``: no checking threads (a failed connect still takes an engine out;
        #: ``health.check_all()`` brings it back).
        self.health = EngineHealth(self.urls, interval_s=1.0 if health_interval_s is None else health_interval_s,
                                   timeout_s=health_timeout_s,
                                   unhealthy_after=unhealthy_after, on_change=self._route_among)
        if health_interval_s is not None:
            self.health.start()

    def _route_among(self, up: list[int]) -> None:
        """The router sees the engines up only (all of them: its plain choice, the lab's homes)."""
        with self._lock:
            # A dead engine's keys move to the others; every other key keeps its engine (and its cache).
            self.router.set_active(None if len(up) == len(self.urls) else up, keep_homes=True)

    def close(self) -> None:
        """Stop the health checks (the server calls it when it stops)."""
        self.health.close()

    def _route(self, request: RuntimeRequest, data: dict[str, Any]) -> tuple[int, bool]:
        if request.operation == OP_CHAT_COMPLETIONS:
            key = hashlib.sha256(routing_prefix(data, self.prefix_length).encode("utf-8")).digest()
            routing_id = openai_routing_id(data)
        else:
            key = hashlib.sha256(request.body[: self.prefix_length]).digest()
            routing_id = request.headers.prefix_aware_id or None
        key = key if routing_id is None else (routing_id, key)
        with self._lock:
            g, spilled = self.router.choose(key, [s.in_flight for s in self.stats])
            if g < 0:  # every engine down
                return g, False
            stats = self.stats[g]
            stats.requests += 1
            stats.in_flight += 1
            stats.spills_in += spilled
        return g, spilled

    def _done(self, g: int, *, usage: dict | None = None, ttft_s: float | None = None, error: bool = False) -> None:
        with self._lock:
            stats = self.stats[g]
            stats.in_flight -= 1
            stats.errors += error
            if usage:
                stats.prompt_tokens += int(usage.get("prompt_tokens") or 0)
                details = usage.get("prompt_tokens_details") or {}
                stats.cached_tokens += int(details.get("cached_tokens") or 0)
            if ttft_s is not None:
                stats.ttfts_s.append(ttft_s)

    def handle(self, request: RuntimeRequest) -> BackendResponse | ErrorReply:
        component = request.headers.inference_component
        if self.component_name and component and component != self.component_name:
            return ErrorReply("ValidationError", f"Inference Component {component} does not exist.")
        try:
            data = request.json()
            if not isinstance(data, dict):
                raise ValueError("body is not a JSON object")
            path, body = engine_body(data)
        except (ValueError, UnicodeDecodeError) as exc:
            return _client_error(request, str(exc))
        g, _ = self._route(request, data)
        if g < 0:
            return ErrorReply("ValidationError", NO_CAPACITY)
        try:
            connection = self._connect(self.urls[g])
        except OSError as exc:
            self._done(g, error=True)
            self.health.connect_failed(g, f"{type(exc).__name__}: {exc}")
            return _engine_error(request, 502, f"engine {self.urls[g]} unreachable: {exc}")
        try:
            response = self._send(connection, self.urls[g], path, body)
        except (OSError, http.client.HTTPException) as exc:
            self._done(g, error=True)
            return _engine_error(request, 502, f"engine {self.urls[g]} failed: {exc}")
        if response.status != 200:
            text = response.read().decode("utf-8", "replace")[:1000]
            connection.close()
            self._done(g, error=True)
            if 400 <= response.status < 500:  # the engine's own refusal: its body is the original message
                return _client_error(request, text, status=response.status, original=text)
            return _engine_error(request, response.status, text)
        events = self._relay(g, connection, response, time.monotonic())
        if request.stream:
            return BackendResponse(chunks=events, content_type="text/event-stream",
                                   invoked_variant=request.headers.target_variant or None,
                                   custom_attributes=request.headers.custom_attributes)
        return BackendResponse(chunks=_whole(events, chat="messages" in data), content_type="application/json",
                               invoked_variant=request.headers.target_variant or None,
                               custom_attributes=request.headers.custom_attributes)

    def _connect(self, url: str) -> http.client.HTTPConnection:
        parts = urllib.parse.urlsplit(url)
        connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=self.timeout_s)
        try:
            connection.connect()
        except BaseException:
            connection.close()
            raise
        return connection

    def _send(self, connection: http.client.HTTPConnection, url: str, path: str,
              body: dict) -> http.client.HTTPResponse:
        try:
            connection.request("POST", urllib.parse.urlsplit(url).path.rstrip("/") + path,
                               json.dumps(body).encode("utf-8"),
                               {"Content-Type": "application/json", "Accept": "text/event-stream"})
            return connection.getresponse()
        except BaseException:
            connection.close()
            raise

    def _relay(self, g: int, connection, response, sent_at: float) -> Iterator[bytes]:
        """The engine's server-sent events, one by one; books usage and TTFT when the stream ends."""
        usage, ttft, failed, done = None, None, False, False
        try:
            for event in _sse_events(response):
                payload = _payload(event)
                done = done or payload == b"[DONE]"
                if payload and payload != b"[DONE]":
                    try:
                        obj = json.loads(payload)
                    except ValueError:
                        obj = {}
                    if isinstance(obj, dict):
                        if "error" in obj:
                            failed = True
                            raise StreamFailure("ModelStreamError", f"engine error: {json.dumps(obj['error'])[:500]}",
                                                "ModelError")
                        if ttft is None and _has_text(obj):
                            ttft = time.monotonic() - sent_at
                        if obj.get("usage"):
                            usage = obj["usage"]
                yield event
            if not done:  # OpenAI-compatible servers end every stream with [DONE]; this one was cut
                failed = True
                raise StreamFailure("ModelStreamError", "engine stream ended before [DONE]", "StreamBroken")
        except (OSError, http.client.HTTPException) as exc:
            failed = True
            raise StreamFailure("ModelStreamError", f"engine stream broke: {exc}", "StreamBroken") from None
        finally:
            connection.close()
            self._done(g, usage=usage, ttft_s=ttft, error=failed)

    def status(self) -> dict[str, Any]:
        with self._lock:
            engines = [s.as_dict() for s in self.stats]
        for g, engine in enumerate(engines):
            engine["health"] = self.health.status(g)
            engine["healthy"] = engine["health"]["healthy"]
        prompt = sum(e["prompt_tokens"] for e in engines)
        return {
            "strategy": self.router.strategy.value,
            "prefix_length": self.prefix_length,
            "concurrency_threshold": self.router.threshold,
            "requests": sum(e["requests"] for e in engines),
            "engines_healthy": sum(e["healthy"] for e in engines),
            "hit_rate": sum(e["cached_tokens"] for e in engines) / prompt if prompt else None,
            "engines": engines,
        }


def _sse_events(response) -> Iterator[bytes]:
    """Server-sent events (``data: ...`` plus the blank line) as the engine flushes them."""
    pending = b""
    while True:
        line = response.readline()
        if not line:
            if pending.strip():
                yield pending
            return
        pending += line
        if line in (b"\n", b"\r\n"):
            if pending.strip():
                yield pending
            pending = b""


def _payload(event: bytes) -> bytes:
    """The data of one server-sent event (b"" for a comment or an event without data)."""
    return event[len(b"data:"):].strip() if event.startswith(b"data:") else b""


def _has_text(obj: dict) -> bool:
    for choice in obj.get("choices") or ():
        if isinstance(choice, dict) and ((choice.get("delta") or {}).get("content") or choice.get("text")):
            return True
    return False


def _whole(events: Iterator[bytes], *, chat: bool) -> Iterator[bytes]:
    """One OpenAI answer from the engine's stream (``InvokeEndpoint`` is not streamed)."""
    text, head, usage, finish = [], {}, None, None
    try:
        for event in events:
            payload = _payload(event)
            if not payload or payload == b"[DONE]":
                continue
            obj = json.loads(payload)
            head = head or {k: obj[k] for k in ("id", "created", "model") if k in obj}
            usage = obj.get("usage") or usage
            for choice in obj.get("choices") or ():
                text.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
                finish = choice.get("finish_reason") or finish
    finally:
        events.close()
    content = "".join(text)
    choice = ({"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish} if chat
              else {"index": 0, "text": content, "finish_reason": finish})
    yield json.dumps({**head, "object": "chat.completion" if chat else "text_completion", "choices": [choice],
                      "usage": usage}, separators=(",", ":")).encode("utf-8")


def _check_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise UserError(f"engine URL {url!r}: expected http://HOST:PORT (an OpenAI-compatible server)")
    return url.rstrip("/")


def _client_error(request: RuntimeRequest, text: str, status: int = 400, original: str | None = None) -> ErrorReply:
    """``ModelError`` for a request the container refuses: ``original`` is the container's own body
    (as SageMaker passes it on in ``OriginalMessage``), else a vLLM-style error made of ``text``."""
    message = original if original is not None else json.dumps(
        {"object": "error", "message": text, "type": "BadRequestError", "code": status})
    return ErrorReply("ModelError", f'Received client error ({status}) from primary with message "{message}".',
                      original_status_code=status, original_message=message,
                      log_stream_arn=log_stream_arn(request.endpoint_name))


def _engine_error(request: RuntimeRequest, status: int, text: str) -> ErrorReply:
    return ErrorReply("ModelError", f'Received server error ({status}) from primary with message "{text}".',
                      original_status_code=status, original_message=text,
                      log_stream_arn=log_stream_arn(request.endpoint_name))


def start_engine_emulator(config, engine_urls: Sequence[str], *, port: int = 0, faults=None, seed: int = 0,
                          record_bodies: bool = True):
    """A started ``RuntimeServer`` on 127.0.0.1 serving the stage's endpoint name, routed as the stage
    routes, with one copy per engine. With trust domains, the engines are dealt out in order, an equal
    share to each domain's component (the primary's first): no engine serves two domains. Stop it
    with ``server.stop()``."""
    from prefix_routing.emulator.components import ComponentBackends, served_model
    from prefix_routing.emulator.server import RuntimeServer

    routing = config.routing
    plans = config.components()
    if len(engine_urls) % len(plans):
        raise UserError(f"{len(engine_urls)} engines for {len(plans)} components (trust domains): give each the "
                        "same number")
    share = len(engine_urls) // len(plans)
    backends = {
        plan.name: EngineBackend(
            engine_urls[index * share:(index + 1) * share],
            strategy=routing.strategy,
            # RANDOM and LEAST_OUTSTANDING_REQUESTS ignore these; the router still wants values.
            prefix_length=routing.prefix_length or 4096,
            concurrency_threshold=routing.concurrency_threshold or 1024,
            component_name=plan.name,
            seed=seed,
        )
        for index, plan in enumerate(plans)
    }
    backend = next(iter(backends.values())) if len(backends) == 1 else ComponentBackends(backends)
    try:
        server = RuntimeServer(backend, port=port, faults=faults, endpoints=[config.endpoint_name],
                               record_bodies=record_bodies, require_component=True,
                               served_model=served_model(config))
    except BaseException:
        backend.close()
        raise
    server.start()
    return server
