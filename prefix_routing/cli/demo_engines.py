"""``demo --engines N [--engine-kind vllm]``: the demo's comparison on real engines instead of the fleet model.

The same question as :mod:`prefix_routing.cli.demo_run` (does prefix-aware routing pay, and does
normalization make it pay?), answered by engines with a real KV cache: each case runs on N engines
with cold caches (llama.cpp: started anew, its saved states cannot be emptied; vLLM: the same engines,
their prefix caches reset), puts the emulator's runtime protocol in front of them
(:mod:`prefix_routing.emulator.engine_backend`, one copy per engine, routed as the stage routes),
and replays a small long-context workload through the load tester and boto3, as careless clients
send it and normalized. TTFT is the client's own measurement; the hit rate is what the engines
report (``usage.prompt_tokens_details.cached_tokens``).

Sized for this 2-core machine: P prefixes of about 1,500 tokens, each engine one sequence at a time
with room for about half the prefixes (llama.cpp: ``--cache-ram``; vLLM: a KV cache of
``cache_tokens`` in blocks of ``block_size``), so that RANDOM (every engine sees every prefix) loses
what PREFIX_AWARE (each prefix stays on its engine) keeps.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace

from prefix_routing.cli.demo_run import CaseResult, case_result, demo_stage, workload_items
from prefix_routing.lab.workloads import LongContextSpec
from prefix_routing.loadtest import BodyPreparer, SageMakerTarget, WorkItem, run_load, summarize
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.settings import NormalizerSettings


@dataclass(frozen=True)
class EngineDemoSpec:
    engines: int = 2
    kind: str = "llama.cpp"
    prefixes: int = 8
    prefix_tokens: int = 1500
    suffix_tokens: tuple[int, int] = (50, 150)
    output_tokens: tuple[int, int] = (4, 8)
    requests: int = 120
    concurrency: int = 4
    cache_ram_mib: int = 40  # llama.cpp: about 6 saved states of ~1,600 tokens at 4 KiB per token
    # vLLM: the KV cache of each engine, about 4 of the prompts (its tokenizer, trained on a small word
    # list, makes ~3,200 tokens of each: a prefix of ~3,000), in blocks of its smallest size on CPUs
    cache_tokens: int = 12_288
    block_size: int = 32
    vllm_context: int = 4096  # vLLM: the longest sequence (the cache must hold one)
    prefix_length: int = 4096  # bytes: inside the ~6,000-byte shared prefix
    concurrency_threshold: int = 10
    seed: int = 0

    def engine_options(self) -> dict:
        """``local_engines``'s options: one sequence at a time, and a cache that holds about half the prefixes."""
        if self.kind == "vllm":
            return {"kind": "vllm", "slots": 1, "context": self.vllm_context, "cache_tokens": self.cache_tokens,
                    "block_size": self.block_size}
        return {"kind": self.kind, "slots": 1, "cache_ram_mib": self.cache_ram_mib}


def engine_items(spec: EngineDemoSpec) -> list[WorkItem]:
    """The workload: uniform prefix choice, a unique suffix per request (chat bodies, prompt first)."""
    workload = LongContextSpec(prefixes=spec.prefixes, prefix_tokens=spec.prefix_tokens,
                               suffix_tokens=spec.suffix_tokens, output_tokens=spec.output_tokens,
                               rate_rps=1.0, duration_s=math.ceil(spec.requests * 1.5), block_tokens=250)
    return workload_items(workload, spec.requests, spec.seed, "engines")


def preparer(client: str, spec: EngineDemoSpec) -> BodyPreparer:
    return BodyPreparer(vary=client == "varied", normalize=client == "normalized",
                        settings=NormalizerSettings(prefix_length=spec.prefix_length), seed=spec.seed)


class ColdEngines:
    """Engines with cold caches, case after case: ``fresh()`` resets the running engines' prefix caches
    where the kind can (vLLM), else stops them and starts new ones (llama.cpp). Every engine started is
    stopped (by its process ids) when the ``with`` block ends."""

    def __init__(self, spec: EngineDemoSpec, say=lambda text: None) -> None:
        from prefix_routing.engines.registry import engine_kind

        self.spec, self.say, self.kind = spec, say, engine_kind(spec.kind)
        self._block = None
        self.engines: list | None = None

    def fresh(self) -> list:
        from prefix_routing.engines.session import local_engines

        if self.engines is not None and all(self.kind.reset_cache(e.url) for e in self.engines):
            return self.engines
        self.close()
        self._block = local_engines(self.spec.engines, **self.spec.engine_options(), say=self.say)
        self.engines = self._block.__enter__()
        return self.engines

    def close(self) -> None:
        block, self._block, self.engines = self._block, None, None
        if block is not None:
            block.__exit__(None, None, None)

    def __enter__(self) -> ColdEngines:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def engine_run(items: list[WorkItem], strategy: str, client: str, spec: EngineDemoSpec, engines: list,
               say=lambda text: None) -> tuple[CaseResult, list]:
    """One case on ``engines`` (their caches cold): the stage's routing, the load tester in closed loop.
    Returns the case and the load tester's rows (one per request, in item order)."""
    from prefix_routing.emulator.engine_backend import start_engine_emulator

    stage = demo_stage("ml.p5.48xlarge", spec.engines, strategy=strategy, prefix_length=spec.prefix_length,
                   threshold=spec.concurrency_threshold)
    prepare = preparer(client, spec)
    prepared = [replace(item, body=prepare(item)) for item in items]
    server = start_engine_emulator(stage, [e.url for e in engines], seed=spec.seed, record_bodies=False)
    try:
        target = SageMakerTarget(stage.endpoint_name, inference_component=stage.component_name,
                                 endpoint_url=server.url, region="us-east-1", concurrency=spec.concurrency)
        try:
            result = run_load(prepared, target, concurrency=spec.concurrency, progress=False, seed=spec.seed)
        finally:
            target.close()
        server.wait_until_idle(30)
        status = server.backend.status()
    finally:
        server.stop()
    summary = summarize(result)
    case = case_result(f"engines ({spec.engines} × {spec.kind})", strategy, client, sent=summary["requests_sent"],
                       succeeded=summary["succeeded"], ttft_p50_s=summary["ttft_p50_s"],
                       ttft_p90_s=summary["ttft_p90_s"], hit_rate=status["hit_rate"],
                       per_copy=[e["requests"] for e in status["engines"]])
    return case, sorted(result.results, key=lambda row: row.index)


def run_engine_demo(spec: EngineDemoSpec = EngineDemoSpec(), *, strategies=("RANDOM", "PREFIX_AWARE"),
                    clients=("varied", "normalized"), progress=None, say=lambda text: None) -> list[CaseResult]:
    items = engine_items(spec)
    results = []
    with ColdEngines(spec, say) as cold:
        for strategy in strategies:
            for client in clients:
                results.append(engine_run(items, strategy, client, spec, cold.fresh(), say=say)[0])
                if progress:
                    progress(results[-1])
    return results


def predicted_case(items: list[WorkItem], strategy: str, client: str, spec: EngineDemoSpec, preset,
                   prompt_tokens: list[int]) -> CaseResult:
    """What the lab predicts for a llama.cpp case: the same bodies, routing keys, users and seed, on a
    fleet of ``spec.engines`` copies with the calibrated ``preset`` and llama.cpp's slot cache
    (``cache_policy="llamacpp-slots"``, the engines' ``--cache-ram``).

    The engines' KV cache sees the prompt text (messages laid out in order, as the chat template
    does): its chained hashes in 64-byte blocks are the cache's block ids, at the workload's own
    bytes per token (``prompt_tokens`` is the engines' count for each request: the tokenizer's, not
    the cache's, figure). The routing key is the body's first PrefixLength bytes, as the emulator's.
    """
    from prefix_routing.emulator.chat import prompt_texts as _prompt_text
    from prefix_routing.lab.fleet_config import FleetConfig
    from prefix_routing.lab.traces import Trace
    from prefix_routing.rules.identity import block_hashes

    block_bytes = 64
    bodies_sent = [preparer(client, spec)(item) for item in items]
    texts = [_prompt_text(json.loads(body))[0].encode("utf-8") for body in bodies_sent]
    bytes_per_token = sum(map(len, texts)) / sum(prompt_tokens)
    interned: dict = {}
    blocks = [[interned.setdefault(h, len(interned)) for h in block_hashes(text, block_bytes)] for text in texts]
    trace = Trace([item.at_s for item in items], list(prompt_tokens), _outputs(bodies_sent), blocks,
                  block_tokens=block_bytes / bytes_per_token, source="engine demo workload")
    config = FleetConfig(instances=spec.engines, copies=1, strategy=strategy, prefix_length=spec.prefix_length,
                         concurrency_threshold=spec.concurrency_threshold, preset=preset,
                         block_tokens=block_bytes / bytes_per_token, bytes_per_token=bytes_per_token,
                         cache_policy="llamacpp-slots", cache_ram_mib=spec.cache_ram_mib, seed=spec.seed,
                         request_overhead_s=0.0, routing_overhead_s=0.0)
    return _simulated(trace, config, strategy, client, spec, bodies_sent)


def predicted_vllm_case(items: list[WorkItem], strategy: str, client: str, spec: EngineDemoSpec, preset,
                        token_ids: list[list[int]]) -> CaseResult:
    """What the lab predicts for a vLLM case: the same bodies, routing keys, users and seed, on a fleet of
    ``spec.engines`` copies with the calibrated ``preset`` and vLLM's block cache of the engines' size:
    the prompts' own token ids (``token_ids``, as the engine tokenizes each body) in whole blocks of the
    engines' block size, chained (:mod:`prefix_routing.lab.token_blocks`)."""
    from prefix_routing.lab.fleet_config import FleetConfig
    from prefix_routing.lab.slot_cache import VLLM_BLOCKS
    from prefix_routing.lab.token_blocks import token_block_ids
    from prefix_routing.lab.traces import Trace

    bodies_sent = [preparer(client, spec)(item) for item in items]
    interned: dict = {}
    blocks = [token_block_ids(ids, spec.block_size, interned) for ids in token_ids]
    trace = Trace([item.at_s for item in items], [len(ids) for ids in token_ids], _outputs(bodies_sent), blocks,
                  block_tokens=spec.block_size, source="engine demo workload")
    config = FleetConfig(instances=spec.engines, copies=1, strategy=strategy, prefix_length=spec.prefix_length,
                         concurrency_threshold=spec.concurrency_threshold, preset=preset,
                         block_tokens=spec.block_size, engine_block_tokens=spec.block_size,
                         cache_tokens=spec.cache_tokens, cache_policy=VLLM_BLOCKS, seed=spec.seed,
                         request_overhead_s=0.0, routing_overhead_s=0.0)
    return _simulated(trace, config, strategy, client, spec, bodies_sent)


def _outputs(bodies_sent: list[bytes]) -> list[int]:
    return [json.loads(body).get("max_tokens") or 16 for body in bodies_sent]


def _simulated(trace, config, strategy: str, client: str, spec: EngineDemoSpec, bodies_sent: list[bytes]) -> CaseResult:
    from prefix_routing.lab.simulate import simulate

    keys = [hashlib.sha256(body[: spec.prefix_length]).digest() for body in bodies_sent]
    result = simulate(trace, config, users=spec.concurrency, keys=keys if strategy == "PREFIX_AWARE" else None)
    return case_result("lab prediction", strategy, client, sent=result.requests,
                       succeeded=result.requests - result.timeouts, ttft_p50_s=result.ttft_p50_s,
                       ttft_p90_s=result.ttft_p90_s, hit_rate=result.hit_rate, per_copy=result.instance_requests)


def fidelity_rows(spec: EngineDemoSpec, preset, strategies=("RANDOM", "PREFIX_AWARE"), say=lambda text: None) -> list[dict]:
    """Per strategy: the engines' measured hit rate and TTFT beside the lab's prediction (normalized clients)."""
    items = engine_items(spec)
    rows, token_ids = [], None
    with ColdEngines(spec, say) as cold:
        for strategy in strategies:
            engines = cold.fresh()
            measured, results = engine_run(items, strategy, "normalized", spec, engines, say=say)
            prompt_tokens = [r.prompt_tokens for r in results]
            if None in prompt_tokens:
                raise UserError(f"{strategy}: {prompt_tokens.count(None)} requests came back without usage")
            if spec.kind == "vllm":
                if token_ids is None:  # as the engine tokenizes each body (the same on every engine)
                    token_ids = _token_ids(engines[0].url, items, spec)
                if [len(ids) for ids in token_ids] != prompt_tokens:
                    raise UserError(f"{strategy}: the engine's /tokenize disagrees with its usage.prompt_tokens")
                predicted = predicted_vllm_case(items, strategy, "normalized", spec, preset, token_ids)
            else:
                predicted = predicted_case(items, strategy, "normalized", spec, preset, prompt_tokens)
            rows.append({"strategy": strategy, "requests": measured.sent, "succeeded": measured.succeeded,
                         "hit_measured": measured.hit_rate, "hit_predicted": predicted.hit_rate,
                         "p50_measured_ms": measured.ttft_p50_ms, "p50_predicted_ms": predicted.ttft_p50_ms,
                         "p90_measured_ms": measured.ttft_p90_ms, "p90_predicted_ms": predicted.ttft_p90_ms,
                         "max_mean_measured": measured.max_mean_requests,
                         "max_mean_predicted": predicted.max_mean_requests})
    return rows


def _token_ids(url: str, items: list[WorkItem], spec: EngineDemoSpec) -> list[list[int]]:
    from prefix_routing.engines.vllm import prompt_token_ids

    prepare = preparer("normalized", spec)
    return [prompt_token_ids(url, json.loads(prepare(item))["messages"]) for item in items]
