"""The one-command demo: does prefix-aware routing pay, and does normalization make it pay?

For two workloads (a slice of the real Mooncake conversation trace, and AWS's long-context
benchmark rebuilt by the lab) it starts the emulator once per routing strategy and replays the
workload through the load tester: as careless clients send it (key order, whitespace, parameters
before the prompt, NFD text: ``bodies.vary``) and normalized by ``prefix_routing.rules``, both through
boto3's own sagemaker-runtime client to the emulator over 127.0.0.1; and, with PREFIX_AWARE, careless
clients through the front door (the normalizer function's own web app, SigV4-signed as its Function
URL is called), which normalizes for them and admits each stream against the demo's per-tenant limit
in a real DynamoDB-compatible store (dynalite) on 127.0.0.1.

The demo's fleets are smaller than the lab's so that caches fill within a couple of minutes of
wall time: the long-context workload uses 40 prefixes and a KV cache of about 15 prefixes per copy
(the blog's proportions: several times what one copy holds), the conversation slice the first
requests of the trace on 8 copies.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from prefix_routing.cli.trace_args import CONVERSATION_SLICE  # without ../shared: the trace's first 1,000 requests
from prefix_routing.engines.process import free_port
from prefix_routing.lab import bodies
from prefix_routing.lab.workloads import LongContextSpec, long_context_workload
from prefix_routing.loadtest import (
    BodyPreparer, LambdaUrlTarget, SageMakerTarget, WorkItem, run_load, summarize, trace_requests,
)
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.settings import NormalizerSettings
from prefix_routing.stage.config import DEFAULT_STAGE_DATA, StageConfig, parse_stage

CONVERSATION_TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "conversation_trace.jsonl"
STRATEGIES = ("RANDOM", "PREFIX_AWARE")
CLIENTS = ("varied", "normalized")
#: Careless clients through the front door: only where routing can use what it normalizes.
FRONT_DOOR = "front door"
#: The demo's only caller, as the local front door names a SigV4 access key id.
DEMO_TENANT = "demo-client"


@dataclass(frozen=True)
class Workload:
    name: str
    items: list[WorkItem]
    stage: StageConfig
    cache_tokens: float | None
    speed: float  # model time runs this many times faster than wall time


@dataclass(frozen=True)
class CaseResult:
    workload: str
    strategy: str
    client: str
    sent: int
    succeeded: int
    ttft_p50_ms: float  # model time: the emulator's schedule, what the GPUs would give
    ttft_p90_ms: float
    hit_rate: float | None
    max_mean_requests: float


def demo_stage(instance_type: str, instances: int, *, strategy: str, prefix_length: int, threshold: int) -> StageConfig:
    data = json.loads(json.dumps(DEFAULT_STAGE_DATA))
    data["name"] = "demo"
    data["model"].update(
        model_id="meta-llama/Llama-3.1-70B-Instruct", tensor_parallel_degree=8, accelerators_per_copy=8,
        memory_per_copy_mb=900 * 1024,
    )
    data["endpoint"].update(instance_type=instance_type, instances_min=1, instances_max=instances,
                            copies_min=1, copies_max=instances)
    data["routing"] = (
        {"strategy": strategy, "prefix_length": prefix_length, "concurrency_threshold": threshold}
        if strategy == "PREFIX_AWARE"
        else {"strategy": strategy}
    )
    return parse_stage(data, source="demo")


def conversation_trace(say=None) -> Path:
    """The conversation trace the demo replays: the whole one in ../shared/traces/, else the slice of
    it in tests/data/ (``say`` tells which, in one line)."""
    if CONVERSATION_TRACE.is_file():
        return CONVERSATION_TRACE
    if not CONVERSATION_SLICE.is_file():
        raise UserError(f"the conversation trace is not at {CONVERSATION_TRACE} (it lives in ../shared/traces/), "
                        f"nor its slice at {CONVERSATION_SLICE}")
    if say is not None:
        say(f"{CONVERSATION_TRACE} is absent: the conversation slice replays {CONVERSATION_SLICE} "
            "(the trace's first 1,000 requests)")
    return CONVERSATION_SLICE


def conversation_workload(requests: int, speed: float, strategy: str, trace: Path | None = None) -> Workload:
    items = []
    for item in trace_requests(str(trace or conversation_trace()), system_blocks=1):
        if len(items) == requests:
            break
        items.append(item)
    # 4096 bytes: past the trace's shared first block (2,048 bytes), as `tune` recommends.
    stage = demo_stage("ml.p5.48xlarge", 8, strategy=strategy, prefix_length=4096, threshold=10)
    return Workload("conversation slice", items, stage, None, speed)


def long_context_items(requests: int, seed: int) -> list[WorkItem]:
    spec = LongContextSpec(prefixes=40, rate_rps=3.0, duration_s=math.ceil(requests / 3.0 * 1.5))
    return workload_items(spec, requests, seed, "long-context")


def workload_items(spec: LongContextSpec, requests: int, seed: int, label: str) -> list[WorkItem]:
    """The first ``requests`` of a generated long-context workload as chat bodies (the shared
    prefix as the system prompt, the suffix as the user turn), sourced ``<label>:<i>``."""
    trace = long_context_workload(spec, seed=seed)
    prefix_blocks = spec.prefix_tokens // spec.block_tokens
    items = []
    for i in range(min(requests, len(trace))):
        record = {"hash_ids": trace.blocks[i], "input_length": trace.prompt_tokens[i],
                  "output_length": trace.output_tokens[i]}
        body = bodies.chat_body(record, prefix_blocks, block_tokens=spec.block_tokens)
        items.append(WorkItem(i, bodies.serialize(body), trace.arrivals[i], f"{label}:{i}"))
    return items


def long_context_workload_for_demo(requests: int, speed: float, strategy: str, seed: int) -> Workload:
    # ~15 of the 40 prefixes (8,000 + ~1,650 tokens each) fit one copy's cache.
    stage = demo_stage("ml.p5.48xlarge", 7, strategy=strategy, prefix_length=4096, threshold=10)
    return Workload("long context", long_context_items(requests, seed), stage, 15 * 9_650, speed)


def _toml(data: dict, prefix: str = "") -> str:
    """A stage as TOML (flat tables of strings, numbers, booleans and string lists: all a stage has)."""
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    lines = [f"[{prefix}]"] if prefix and scalars else []
    lines += [f"{key} = {json.dumps(value)}" for key, value in scalars.items() if value is not None]
    for key, value in tables.items():
        lines.append(_toml(value, f"{prefix}.{key}" if prefix else key))
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def emulator_process(stage: StageConfig, *, speed: float, cache_tokens: float | None, seed: int,
                     front_door: bool = False):
    """``python -m prefix_routing emulate`` in its own process, as a real endpoint is: the load
    tester's clock then measures the network path, not a shared interpreter lock. Yields its URL, or
    with ``front_door`` (``emulate --front-door``, which also starts the limits' store when the stage
    sets limits) the pair (runtime URL, front door URL)."""
    with tempfile.TemporaryDirectory() as config_dir:
        stage_file = Path(config_dir) / f"{stage.name}.toml"
        stage_file.write_text(_toml(stage.model_dump(mode="json", exclude_unset=True)))
        port = free_port()
        command = [sys.executable, "-m", "prefix_routing", "emulate", "--stage", stage.name, "--port", str(port),
                   "--speed", str(speed), "--duration", "3600"]
        if cache_tokens is not None:
            command += ["--cache-tokens", str(cache_tokens)]
        front_door_port = free_port() if front_door else None
        if front_door_port is not None:
            command += ["--front-door", str(front_door_port)]
        env = dict(os.environ, PREFIX_ROUTING_CONFIG_DIR=config_dir)
        # stdout: the front door's metric lines (EMF), not the demo's business.
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60  # dynalite's start is part of it
            while not (_answers(f"{url}/ping") and (front_door_port is None or _listens(front_door_port))):
                if process.poll() is not None or time.monotonic() > deadline:
                    process.terminate()
                    raise UserError(f"the emulator did not start: {process.communicate(timeout=10)[1].strip()[-500:]}")
                time.sleep(0.05)
            yield url if front_door_port is None else (url, f"http://127.0.0.1:{front_door_port}/")
        finally:
            process.terminate()  # SIGTERM: the emulator stops its front door and store itself
            process.wait(30)
            process.stderr.close()


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).read()
        return True
    except OSError:
        return False


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def run_case(workload: Workload, client: str, *, concurrency: int, seed: int) -> CaseResult:
    """One row: ``client`` is ``varied``, ``normalized`` or ``front door`` (careless bodies sent to the
    front door, with a per-tenant limit of ``concurrency`` streams counted in dynalite)."""
    through_front_door = client == FRONT_DOOR
    stage = workload.stage
    if through_front_door:
        data = stage.model_dump(mode="json", exclude_unset=True)
        data["limits"] = {"concurrent_streams": concurrency}
        stage = parse_stage(data, source="demo")
    with emulator_process(stage, speed=workload.speed, cache_tokens=workload.cache_tokens, seed=seed,
                          front_door=through_front_door) as urls:
        url, front_door_url = urls if through_front_door else (urls, None)
        if front_door_url is not None:
            target = LambdaUrlTarget.local_caller(front_door_url, DEMO_TENANT)
        else:
            target = SageMakerTarget(
                stage.endpoint_name,
                inference_component=stage.component_name,
                endpoint_url=url,
                region="us-east-1",
                concurrency=concurrency,
            )
        prepare = BodyPreparer(
            vary=client in ("varied", FRONT_DOOR),
            normalize=client == "normalized",
            settings=NormalizerSettings(prefix_length=workload.stage.routing.prefix_length or 4096),
            seed=seed,
        )
        # Bodies are varied or normalized before the clock starts: at speed 20 every millisecond of
        # client CPU would count twenty-fold against the emulated GPUs.
        items = [replace(item, body=prepare(item)) for item in workload.items]
        try:
            result = run_load(items, target, concurrency=concurrency, speed=workload.speed, progress=False, seed=seed)
        finally:
            target.close()
        status = json.loads(urllib.request.urlopen(f"{url}/status", timeout=10).read())["backend"]
    summary = summarize(result)
    return case_result(workload.name, workload.stage.routing.strategy, client, sent=summary["requests_sent"],
                       succeeded=summary["succeeded"], ttft_p50_s=status["ttft_p50_s"],
                       ttft_p90_s=status["ttft_p90_s"], hit_rate=summary["hit_rate"],
                       per_copy=[i["requests"] for i in status["instances"]])


def case_result(workload: str, strategy: str, client: str, *, sent: int, succeeded: int, ttft_p50_s: float | None,
                ttft_p90_s: float | None, hit_rate: float | None, per_copy: list[int]) -> CaseResult:
    """One row of the table; ``per_copy``: requests per instance or engine (for max/mean)."""
    mean = sum(per_copy) / len(per_copy) if per_copy else 0
    return CaseResult(workload, strategy, client, sent, succeeded, (ttft_p50_s or math.nan) * 1000,
                      (ttft_p90_s or math.nan) * 1000, hit_rate, max(per_copy) / mean if mean else math.nan)


def run_demo(*, conversation_requests: int = 1000, long_context_requests: int = 360, speed: float = 20.0,
             concurrency: int = 32, seed: int = 0, progress=None, say=None) -> list[CaseResult]:
    """Every case of the demo; ``say(line)`` tells which conversation trace it replays when it is not ../shared's."""
    results = []
    trace = conversation_trace(say)
    for make in (
        lambda strategy: conversation_workload(conversation_requests, speed, strategy, trace),
        lambda strategy: long_context_workload_for_demo(long_context_requests, speed, strategy, seed),
    ):
        for strategy in STRATEGIES:
            workload = make(strategy)
            for client in CLIENTS + ((FRONT_DOOR,) if strategy == "PREFIX_AWARE" else ()):
                results.append(run_case(workload, client, concurrency=concurrency, seed=seed))
                if progress:
                    progress(results[-1])
    return results


def render_table(results: list[CaseResult]) -> str:
    header = (
        "| workload | routing | clients | ok / sent | P50 TTFT (ms) | P90 TTFT (ms) | KV hit rate | max/mean requests |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    rows = [
        f"| {r.workload} | {r.strategy} | {r.client} | {r.succeeded} / {r.sent} | {r.ttft_p50_ms:,.0f} | "
        f"{r.ttft_p90_ms:,.0f} | "
        f"{'n/a' if r.hit_rate is None else f'{r.hit_rate:.1%}'} | {r.max_mean_requests:.2f} |"
        for r in results
    ]
    return header + "\n".join(rows) + "\n"


def as_json(results: list[CaseResult]) -> str:
    return json.dumps({"results": [asdict(r) for r in results]}, indent=2)
