"""The lab's fleet model behind the SageMaker runtime's wire protocol, in real time.

The emulator's server speaks the protocol (InvokeEndpoint, InvokeEndpointWithResponseStream, the
OpenAI-compatible path, fault injection); :class:`FleetBackend` plugs the lab's ``Fleet`` in as the model.
The fleet decides, when a request arrives, which copy serves it, how much of its prompt that copy
has cached, and when each token comes out (``Placement``); the backend then streams the
answer on that schedule, ``speed`` times faster than the modelled GPUs. One model, two clocks: the
lab runs it in simulated time.

Routing sees what SageMaker sees: the first ``PrefixLength`` bytes of the body as it arrives, plus
the ``X-Amzn-SageMaker-Prefix-Aware-Id`` header. The KV cache sees what the engine sees: the prompt
text (messages laid out in order, salted with the body's ``cache_salt``), in chained hashes of
64-byte blocks (16 tokens at 4 bytes per token, vLLM's block size). So JSON key order or
indentation scatter routing but do not change cached tokens, while CRLF, NFD or trailing spaces in
the text change both, as on a real endpoint.

Settings come from the same stage configuration the stacks deploy: strategy, PrefixLength,
ConcurrencyThreshold, instance type and the maximum instance count, copies per instance, and the
model (mapped to a lab preset).

A request longer than the model's context (prompt tokens plus ``max_completion_tokens``,
``max_tokens`` or ``parameters.max_new_tokens``; :func:`context_tokens` of the preset) gets vLLM's own
refusal as SageMaker passes it on (``ModelError`` 424, ``OriginalStatusCode`` 400), and a limit that
is no integer of at least 1 a 400 likewise: nothing the model does grows with a number from the body.
What the backend remembers per request (``served``) is the latest ``SERVED_LIMIT``; its totals are exact.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from prefix_routing.emulator.backend import BackendResponse, ErrorReply
from prefix_routing.emulator.chat import chat_response, parse_chat_request, within_context
from prefix_routing.emulator.protocol import OP_CHAT_COMPLETIONS, RuntimeRequest
from prefix_routing.lab.isolation_price import fleet_for_copies
from prefix_routing.lab.fleet import Fleet, Request
from prefix_routing.lab.fleet_config import FleetConfig
# Re-exported: the emulator's callers and tests know them from here.
from prefix_routing.lab.stage_fleet import autoscaling_for_stage, preset_for_stage, stage_fleet_values  # noqa: F401
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.identity import block_hashes
from prefix_routing.rules.openai_path import routing_id as openai_routing_id, routing_prefix
from prefix_routing.stage.config import StageConfig
from prefix_routing.stage.domain_checks import ComponentPlan
from prefix_routing.stage.presets import Preset

BYTES_PER_TOKEN = 4.0
BLOCK_BYTES = 64  # 16 tokens: vLLM's KV block (and the size of a SHA-512 digest, the salt block)
SERVED_LIMIT = 10_000  # requests remembered one by one (``served``); the totals count every request

#: The models' own context windows in tokens (``max_position_embeddings`` of their config.json).
#: (Belongs with the model shapes in ``stage/presets.py``; kept here until ``Model`` has the field.)
MODEL_CONTEXT_TOKENS = {"Llama 3.1 8B": 131_072, "Llama 3.1 70B": 131_072, "Qwen3-32B": 40_960}


def context_tokens(preset: Preset) -> int:
    """The longest request (prompt plus answer) one copy serves: vLLM's ``max_model_len``, the model's
    own window but no more than the copy's KV cache holds (vLLM refuses to start otherwise); for a
    preset measured on llama.cpp (its slots given), one slot's share of the context (``-c / -np``)."""
    kv = max(1, preset.kv_tokens)
    if preset.max_num_seqs_override is not None and preset.model.name not in MODEL_CONTEXT_TOKENS:
        return max(1, kv // preset.max_num_seqs_override)
    return min(MODEL_CONTEXT_TOKENS.get(preset.model.name, kv), kv)


def fleet_config_for_stage(
    config: StageConfig, *, preset: "str | Preset | None" = None, cache_tokens: float | None = None, seed: int = 0,
    autoscaling: bool = False,
) -> FleetConfig:
    """The endpoint at its maximum size, routed as the stage routes it; with ``autoscaling`` the
    copies scale within the stage's bounds as its target tracking would scale them."""
    values = stage_fleet_values(config)
    if preset is not None:  # another preset: its own copies per instance
        values.update(preset=preset, copies=None)
    return FleetConfig(
        **values,
        strategy=config.routing.strategy,
        cache_tokens=cache_tokens,
        bytes_per_token=BYTES_PER_TOKEN,
        block_tokens=BLOCK_BYTES / BYTES_PER_TOKEN,
        block_bytes=BLOCK_BYTES,
        seed=seed,
        autoscaling=autoscaling_for_stage(config) if autoscaling else None,
    )


@dataclass
class _Served:
    """What the emulator itself measured for one request (its own view of TTFT)."""

    request_id: str
    instance: int
    copy: int
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float  # wall seconds, as the emulator schedules them
    spilled: bool


class FleetBackend:
    """A ``Backend`` whose model is the lab's ``Fleet`` running ``speed`` × real time."""

    def __init__(
        self,
        fleet_config: FleetConfig,
        *,
        component_name: str | None = None,
        speed: float = 1.0,
        stream_format: str = "sse",
        clock=time.monotonic,
    ):
        if not speed > 0:
            raise UserError(f"speed={speed}: must be > 0")
        self.fleet = Fleet(fleet_config)
        self.config = fleet_config
        self.component_name = component_name
        self.speed = speed
        self.stream_format = stream_format
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.Lock()  # the fleet is not thread-safe; the server is threaded
        self.context_tokens = context_tokens(fleet_config.preset)
        #: The latest ``SERVED_LIMIT`` requests served, by request id (older ones: in the totals only).
        self.served: OrderedDict[str, _Served] = OrderedDict()
        self._totals = {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "spills": 0}

    def _now(self) -> float:
        """Model time: wall seconds since start × speed."""
        return (self._clock() - self._t0) * self.speed

    def _wall(self, model_time: float) -> float:
        return self._t0 + model_time / self.speed

    def _sleep_until(self, model_time: float) -> None:
        delay = self._wall(model_time) - self._clock()
        if delay > 0:
            time.sleep(delay)

    def set_slow_instance(self, instance: int, factor: float) -> None:
        """Fault injection: every copy of ``instance`` runs ``factor`` times slower."""
        with self._lock:
            self.fleet.set_slowdown(instance, factor)

    def handle(self, request: RuntimeRequest) -> BackendResponse | ErrorReply:
        component = request.headers.inference_component
        if self.component_name and component and component != self.component_name:
            return ErrorReply("ValidationError", f"Inference Component {component} does not exist.")
        chat = parse_chat_request(request, default_max_tokens=16)
        if isinstance(chat, ErrorReply):
            return chat
        prompt = chat.prompt_text.encode("utf-8")
        prompt_tokens = max(1, math.ceil(len(prompt) / BYTES_PER_TOKEN))
        chat = within_context(request, chat, prompt_tokens, self.context_tokens)
        if isinstance(chat, ErrorReply):
            return chat
        if request.operation == OP_CHAT_COMPLETIONS:
            # The OpenAI-compatible path routes on the messages' text and prompt_cache_key.
            key = hashlib.sha256(routing_prefix(chat.body, self.config.prefix_length).encode("utf-8")).digest()
            routing_id = openai_routing_id(chat.body)
        else:  # InvokeEndpoint(WithResponseStream): the body's first PrefixLength bytes and the header
            key = hashlib.sha256(request.body[: self.config.prefix_length]).digest()
            routing_id = request.headers.prefix_aware_id or None
        salt = hashlib.sha512(chat.cache_salt.encode("utf-8")).digest()  # 64 bytes: exactly one block
        fleet_request = Request(
            prompt_tokens=prompt_tokens,
            output_tokens=chat.n_out,
            blocks=block_hashes(salt + prompt, BLOCK_BYTES)[1:],  # the salt block only seeds the chain
            routing_id=routing_id,
            key=key,
        )
        with self._lock:
            now = self._now()
            self.fleet.advance(now)
            refused = self.fleet.no_capacity
            placement = self.fleet.submit(fleet_request, now)
            if self.fleet.no_capacity > refused:
                # Autoscaling at zero (or every copy still starting): SageMaker counts it in
                # NoCapacityInvocationFailures; the exact error body is unconfirmed (an assumption).
                return ErrorReply("ValidationError", "Inference Component has no capacity to process this request.")
            cached = int(min(placement.cached_tokens, prompt_tokens))
            self._remember(_Served(
                request.request_id,
                placement.instance,
                placement.copy,
                prompt_tokens,
                cached,
                placement.ttft_s / self.speed,
                placement.spilled,
            ))
        if placement.timed_out:
            self._release(placement)
            return ErrorReply(
                "ModelError",
                "Received server error (0) from primary: the model did not answer within 60 s.",
                original_status_code=0,
            )

        def wait(i: int) -> None:
            self._sleep_until(placement.first_token_s + i * placement.per_token_s)

        finished = {"done": False}

        def on_close() -> None:
            # A client that went away early frees its slot at once; one that read to the end
            # leaves at finish_s, which advance() retires.
            if self._clock() < self._wall(placement.finish_s) - 1e-3 and not finished["done"]:
                self._release(placement)
            finished["done"] = True

        return chat_response(
            request,
            chat,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            wait=wait,
            whole_delay=max(0.0, self._wall(placement.finish_s) - self._clock()),
            stream_format=self.stream_format,
            model=self.config.preset.model.name,
            variant="AllTraffic",
            on_close=on_close,
            # Tokens at least ~5 ms of wall time apart per chunk: a fast emulation would otherwise
            # spend its CPU on HTTP chunks, not on the model. Token times are unchanged.
            tokens_per_chunk=max(1, math.ceil(0.005 / max(placement.per_token_s / self.speed, 1e-9))),
        )

    def _remember(self, served: _Served) -> None:
        """(Under the lock.) Keep ``served`` in the window and in the totals."""
        self.served[served.request_id] = served
        while len(self.served) > SERVED_LIMIT:
            self.served.popitem(last=False)
        totals = self._totals
        totals["requests"] += 1
        totals["prompt_tokens"] += served.prompt_tokens
        totals["cached_tokens"] += served.cached_tokens
        totals["spills"] += served.spilled

    def _release(self, placement) -> None:
        with self._lock:
            self.fleet.release(placement, self._now())

    def status(self) -> dict[str, Any]:
        with self._lock:
            self.fleet.advance(self._now())
            instances = self.fleet.instance_totals()
            served = list(self.served.values())
            totals = dict(self._totals)
        prompt = totals["prompt_tokens"]
        ttfts = sorted(s.ttft_s * self.speed for s in served)  # model seconds, the latest SERVED_LIMIT requests
        return {
            "ttft_p50_s": _quantile(ttfts, 0.5),
            "ttft_p90_s": _quantile(ttfts, 0.9),
            "strategy": self.config.strategy.value,
            "prefix_length": self.config.prefix_length,
            "concurrency_threshold": self.config.concurrency_threshold,
            "preset": self.config.preset.name,
            "speed": self.speed,
            "context_tokens": self.context_tokens,
            "requests": totals["requests"],
            "hit_rate": (totals["cached_tokens"] / prompt) if prompt else None,
            "spills": totals["spills"],
            "instances": instances,
            **({"copies": self._copies_now()} if self.fleet.pool is not None else {}),
        }

    def _copies_now(self) -> dict[str, Any]:
        """Autoscaling: the copies provisioned and serving now (model time), and the scale events."""
        pool, now = self.fleet.pool, self._now()
        return {"provisioned": len(pool.provisioned()), "serving": len(pool.serving(now)),
                "events": [{"t_s": t, "from": a, "to": b} for t, a, b in pool.events],
                "hotspot_seconds": pool.hotspot_seconds, "no_capacity_failures": self.fleet.no_capacity}


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def start_emulator(
    config: StageConfig,
    *,
    port: int = 0,
    speed: float = 1.0,
    faults=None,
    preset: "str | Preset | None" = None,
    cache_tokens: float | None = None,
    slow_instance: tuple[int, float] | None = None,
    seed: int = 0,
    record_bodies: bool = True,
    autoscaling: bool = False,
):
    """A started ``RuntimeServer`` on 127.0.0.1 serving the stage's endpoint name with a fleet
    backend (with trust domains, one per domain's component: copies and caches of its own; the slow
    instance is the primary component's). Stop it with ``server.stop()``."""
    from prefix_routing.emulator.components import ComponentBackends, served_model
    from prefix_routing.emulator.server import RuntimeServer

    backends = {}
    for plan in config.components():
        fleet = fleet_config_for_stage(component_stage(config, plan), preset=preset, cache_tokens=cache_tokens,
                                       seed=seed, autoscaling=autoscaling)
        if config.domains:  # the domain's copies at most, on as few instances as hold them
            fleet = fleet_for_copies(fleet, plan.copies_max, config.copies_per_instance)
        backends[plan.name] = FleetBackend(fleet, component_name=plan.name, speed=speed)
    backend = next(iter(backends.values()))
    if slow_instance is not None:
        instance, factor = slow_instance
        if not 0 <= instance < backend.config.instances:
            raise UserError(f"slow instance {instance}: the fleet has instances 0..{backend.config.instances - 1}")
        backend.set_slow_instance(instance, factor)
    server = RuntimeServer(
        backend if len(backends) == 1 else ComponentBackends(backends), port=port, faults=faults,
        endpoints=[config.endpoint_name], record_bodies=record_bodies, require_component=True,
        served_model=served_model(config),
    )
    server.start()
    return server


def component_stage(config: StageConfig, plan: ComponentPlan) -> StageConfig:
    """The stage as one of its components sees it: the domain's copy bounds, no other domain."""
    if not config.domains:
        return config
    endpoint = config.endpoint.model_copy(update={"copies_min": plan.copies_min, "copies_max": plan.copies_max})
    return config.model_copy(update={"endpoint": endpoint, "domains": {}})
