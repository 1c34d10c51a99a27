"""``demo --engines N``: the demo's comparison on real llama.cpp engines instead of the fleet model.

The same question as :mod:`prefix_routing.cli.demo_run` (does prefix-aware routing pay, and does
normalization make it pay?), answered by engines with a real KV cache: each case starts N fresh
engines (cold caches), puts the emulator's runtime protocol in front of them
(:mod:`prefix_routing.emulator.engine_backend`, one copy per engine, routed as the stage routes),
and replays a small long-context workload through the load tester and boto3, as careless clients
send it and normalized. TTFT is the client's own measurement; the hit rate is what the engines
report (``usage.prompt_tokens_details.cached_tokens``).

Sized for this 2-core machine: P prefixes of about 1,500 tokens (the tiny model's cold prefill of
~0.5 s), each engine one slot with ``--cache-ram`` room for about half the prefixes, so that RANDOM
(every engine sees every prefix) loses what PREFIX_AWARE (each prefix stays on its engine) keeps.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

from prefix_routing.cli.demo_run import CaseResult, _stage, case_result, workload_items
from prefix_routing.lab.workloads import LongContextSpec
from prefix_routing.loadtest import BodyPreparer, SageMakerTarget, WorkItem, run_load, summarize
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.settings import NormalizerSettings


@dataclass(frozen=True)
class EngineDemoSpec:
    engines: int = 2
    prefixes: int = 8
    prefix_tokens: int = 1500
    suffix_tokens: tuple[int, int] = (50, 150)
    output_tokens: tuple[int, int] = (4, 8)
    requests: int = 120
    concurrency: int = 4
    cache_ram_mib: int = 40  # about 6 saved states of ~1,600 tokens at 4 KiB per token
    prefix_length: int = 4096  # bytes: inside the ~6,000-byte shared prefix
    concurrency_threshold: int = 10
    seed: int = 0


def engine_items(spec: EngineDemoSpec) -> list[WorkItem]:
    """The workload: uniform prefix choice, a unique suffix per request (chat bodies, prompt first)."""
    workload = LongContextSpec(prefixes=spec.prefixes, prefix_tokens=spec.prefix_tokens,
                               suffix_tokens=spec.suffix_tokens, output_tokens=spec.output_tokens,
                               rate_rps=1.0, duration_s=math.ceil(spec.requests * 1.5), block_tokens=250)
    return workload_items(workload, spec.requests, spec.seed, "engines")


def run_engine_case(items: list[WorkItem], strategy: str, client: str, spec: EngineDemoSpec,
                    say=lambda text: None) -> CaseResult:
    """One case on fresh engines: cold caches, the stage's routing, the load tester in closed loop."""
    return engine_run(items, strategy, client, spec, say=say)[0]


def engine_run(items: list[WorkItem], strategy: str, client: str, spec: EngineDemoSpec,
               say=lambda text: None) -> tuple[CaseResult, list]:
    """:func:`run_engine_case` with the load tester's rows (one per request, in item order)."""
    from prefix_routing.emulator.engine_backend import start_engine_emulator
    from prefix_routing.engines.session import local_engines

    stage = _stage("ml.p5.48xlarge", spec.engines, strategy=strategy, prefix_length=spec.prefix_length,
                   threshold=spec.concurrency_threshold)
    prepare = BodyPreparer(vary=client == "varied", normalize=client == "normalized",
                           settings=NormalizerSettings(prefix_length=spec.prefix_length), seed=spec.seed)
    prepared = [replace(item, body=prepare(item)) for item in items]
    with local_engines(spec.engines, slots=1, cache_ram_mib=spec.cache_ram_mib, say=say) as engines:
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
    case = case_result(f"engines ({spec.engines} × llama.cpp)", strategy, client, sent=summary["requests_sent"],
                       succeeded=summary["succeeded"], ttft_p50_s=summary["ttft_p50_s"],
                       ttft_p90_s=summary["ttft_p90_s"], hit_rate=status["hit_rate"],
                       per_copy=[e["requests"] for e in status["engines"]])
    return case, sorted(result.results, key=lambda row: row.index)


def run_engine_demo(spec: EngineDemoSpec = EngineDemoSpec(), *, strategies=("RANDOM", "PREFIX_AWARE"),
                    clients=("varied", "normalized"), progress=None, say=lambda text: None) -> list[CaseResult]:
    items = engine_items(spec)
    results = []
    for strategy in strategies:
        for client in clients:
            results.append(run_engine_case(items, strategy, client, spec, say=say))
            if progress:
                progress(results[-1])
    return results


def predicted_case(items: list[WorkItem], strategy: str, client: str, spec: EngineDemoSpec, preset,
                   prompt_tokens: list[int]) -> CaseResult:
    """What the lab predicts for :func:`engine_run`'s case: the same bodies, routing keys, users and
    seed, on a fleet of ``spec.engines`` copies with the calibrated ``preset`` and llama.cpp's slot
    cache (``cache_policy="llamacpp-slots"``, the engines' ``--cache-ram``).

    The engines' KV cache sees the prompt text (messages laid out in order, as the chat template
    does): its chained hashes in 64-byte blocks are the cache's block ids, at the workload's own
    bytes per token (``prompt_tokens`` is the engines' count for each request: the tokenizer's, not
    the cache's, figure). The routing key is the body's first PrefixLength bytes, as the emulator's.
    """
    import hashlib

    from prefix_routing.emulator.chat import _prompt_text
    from prefix_routing.lab.fleet_config import FleetConfig
    from prefix_routing.lab.simulate import simulate
    from prefix_routing.lab.traces import Trace
    from prefix_routing.rules.identity import block_hashes

    block_bytes = 64
    prepare = BodyPreparer(vary=client == "varied", normalize=client == "normalized",
                           settings=NormalizerSettings(prefix_length=spec.prefix_length), seed=spec.seed)
    bodies_sent = [prepare(item) for item in items]
    texts = [_prompt_text(json.loads(body))[0].encode("utf-8") for body in bodies_sent]
    bytes_per_token = sum(map(len, texts)) / sum(prompt_tokens)
    interned: dict = {}
    blocks = [[interned.setdefault(h, len(interned)) for h in block_hashes(text, block_bytes)] for text in texts]
    outputs = [json.loads(body).get("max_tokens") or 16 for body in bodies_sent]
    trace = Trace([item.at_s for item in items], list(prompt_tokens), outputs, blocks,
                  block_tokens=block_bytes / bytes_per_token, source="engine demo workload")
    keys = [hashlib.sha256(body[: spec.prefix_length]).digest() for body in bodies_sent]
    config = FleetConfig(instances=spec.engines, copies=1, strategy=strategy, prefix_length=spec.prefix_length,
                         concurrency_threshold=spec.concurrency_threshold, preset=preset,
                         block_tokens=block_bytes / bytes_per_token, bytes_per_token=bytes_per_token,
                         cache_policy="llamacpp-slots", cache_ram_mib=spec.cache_ram_mib, seed=spec.seed,
                         request_overhead_s=0.0, routing_overhead_s=0.0)
    result = simulate(trace, config, users=spec.concurrency, keys=keys if strategy == "PREFIX_AWARE" else None)
    return case_result("lab prediction", strategy, client, sent=result.requests,
                       succeeded=result.requests - result.timeouts, ttft_p50_s=result.ttft_p50_s,
                       ttft_p90_s=result.ttft_p90_s, hit_rate=result.hit_rate, per_copy=result.instance_requests)


def fidelity_rows(spec: EngineDemoSpec, preset, strategies=("RANDOM", "PREFIX_AWARE")) -> list[dict]:
    """Per strategy: the engines' measured hit rate and TTFT beside the lab's prediction (normalized clients)."""
    items = engine_items(spec)
    rows = []
    for strategy in strategies:
        measured, results = engine_run(items, strategy, "normalized", spec)
        prompt_tokens = [r.prompt_tokens for r in results]
        if None in prompt_tokens:
            raise UserError(f"{strategy}: {prompt_tokens.count(None)} requests came back without usage")
        predicted = predicted_case(items, strategy, "normalized", spec, preset, prompt_tokens)
        rows.append({"strategy": strategy, "requests": measured.sent, "succeeded": measured.succeeded,
                     "hit_measured": measured.hit_rate, "hit_predicted": predicted.hit_rate,
                     "p50_measured_ms": measured.ttft_p50_ms, "p50_predicted_ms": predicted.ttft_p50_ms,
                     "p90_measured_ms": measured.ttft_p90_ms, "p90_predicted_ms": predicted.ttft_p90_ms,
                     "max_mean_measured": measured.max_mean_requests, "max_mean_predicted": predicted.max_mean_requests})
    return rows
