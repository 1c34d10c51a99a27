"""Benchmark: replica steering on real engines, through the front door, against the lab's prediction.

Four llama.cpp engines (the pinned build, the tiny model; one slot each, ``--cache-ram 40`` so a
prefix stays cached after its slot moves on) behind the emulated runtime (one copy per engine,
PREFIX_AWARE as the stage routes), the front door's own web app in front (``frontdoor.local``) with
hot-prefix replication and its steering on, the hot prefixes' state in dynalite on 127.0.0.1. One
tenant, every request SigV4-signed as its Function URL is called, one at a time.

The workload is skewed: ``--requests`` chat requests over six long system prompts (about 1,200
tokens each, each with a different start), the first of them in half of the requests, each with a
question of its own. The first prompt becomes hot; the front door gives it a replica per engine
and, when a replica's first answer finds the prompt already cached (the engine's own
``cached_tokens``), draws a fresh one.

The lab's prediction: the same requests, in the same order, at the same times, through the fleet
model (``lab.fleet.Fleet``: the same router and seed as the emulator, the same routing keys, the
same steering rule), four copies with unbounded caches.

Printed: per engine, the requests measured (the emulator's own counts) and predicted; the hot
prompt's replicas (ids) and the engines they landed on; the collisions the front door saw (from the
engines' cached tokens) and the lab's. Target: the hot prompt reaches every engine, at least one
collision is detected and redrawn, and each engine's request count is within 10 % of the requests
(or 3) of the prediction. Exit status 1 if missed.

    python bench/bench_steering_engines.py [--requests 96]
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prefix_routing.emulator.engine_backend import start_engine_emulator  # noqa: E402
from prefix_routing.emulator.local_store import LocalDynamo  # noqa: E402
from prefix_routing.engines import session  # noqa: E402
from prefix_routing.frontdoor.local import LocalFrontDoor  # noqa: E402
from prefix_routing.lab.fleet import Fleet, Request  # noqa: E402
from prefix_routing.lab.fleet_config import FleetConfig  # noqa: E402
from prefix_routing.lab.routing import Strategy  # noqa: E402
from prefix_routing.lab.stage_fleet import replication_for_stage  # noqa: E402
from prefix_routing.loadtest import LambdaUrlTarget  # noqa: E402
from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LogField, ReplicaLogField, SteeringLogField  # noqa: E402
from prefix_routing.stage.config import DEFAULT_STAGE_DATA, parse_stage  # noqa: E402
from prefix_routing.stage.front_door_env import front_door_environment  # noqa: E402

ENGINES = 4
PREFIXES = 6
HOT_SHARE = 0.5
TENANT = "tenant-a"


def stage():
    data = copy.deepcopy(DEFAULT_STAGE_DATA)
    data["name"] = "steering"
    data["endpoint"].update(instances_min=ENGINES, instances_max=ENGINES, copies_min=ENGINES, copies_max=ENGINES)
    data.setdefault("normalizer", {})["replication"] = {"enabled": True, "steering": True}
    return parse_stage(data, source="bench")


def body(prefix: int, question: int) -> bytes:
    system = f"Manual {prefix}. " + " ".join(f"Step {prefix}.{j}: check the valve and log it." for j in range(120))
    return json.dumps({"messages": [{"role": "system", "content": system},
                                    {"role": "user", "content": f"Question {question}: what comes after step {question}?"}],
                       "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}).encode()


def workload(requests: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [0 if rng.random() < HOT_SHARE else rng.randrange(1, PREFIXES) for _ in range(requests)]


def measure(config, prefixes: list[int]) -> dict:
    lines: list[dict] = []

    def emit(line: str) -> None:
        record = json.loads(line)
        if record.get(LogField.MESSAGE) == REQUEST_LOG_MESSAGE:
            lines.append(record)

    with session.local_engines(ENGINES, slots=1, cache_ram_mib=40, say=lambda text: None) as engines, \
            LocalDynamo() as store:
        server = start_engine_emulator(config, [e.url for e in engines])
        door = LocalFrontDoor(server.url, front_door_environment(config), emit=emit, limits_store_url=store.url)
        target = LambdaUrlTarget.local_caller(door.url + "/", TENANT)
        sent_at = []
        try:
            started = time.monotonic()
            for i, p in enumerate(prefixes):
                sent_at.append(time.monotonic() - started)
                attempt = target.send(body(p, i))
                if not attempt.ok:
                    raise SystemExit(f"request {i} failed: {attempt.kind}: {attempt.detail}")
            server.wait_until_idle()
            status = server.status()["backend"]
            records = list(server.requests)
        finally:
            target.close()
            door.stop()
            server.stop()
    return {"lines": lines, "status": status, "records": records, "sent_at": sent_at}


def engine_of(config, records) -> list[int]:
    """Each request's engine, as the emulator's router placed it (requests one at a time: no spills)."""
    from prefix_routing.lab.routing import Router

    router = Router(Strategy.PREFIX_AWARE, ENGINES, concurrency_threshold=config.routing.concurrency_threshold)
    placed = []
    for r in records:
        key = hashlib.sha256(r.body[: config.routing.prefix_length]).digest()
        rid = r.headers.prefix_aware_id or None
        placed.append(router.home(key if rid is None else (rid, key)))
    return placed


def predict(config, prefixes: list[int], records, sent_at: list[float], prompt_tokens: list[int], base_id: str) -> dict:
    """The fleet model over the same requests: the tenant's own id and the body's key, as sent."""
    fleet = Fleet(FleetConfig(instances=ENGINES, copies=1, strategy=Strategy.PREFIX_AWARE,
                              prefix_length=config.routing.prefix_length,
                              concurrency_threshold=config.routing.concurrency_threshold,
                              cache_tokens=float("inf"), block_tokens=64, replication=replication_for_stage(config)))
    counts = [0] * ENGINES
    for i, (p, record, at, tokens) in enumerate(zip(prefixes, records, sent_at, prompt_tokens)):
        digest = hashlib.sha256(record.body[: config.routing.prefix_length]).digest()
        # Blocks of 64 tokens: the system prompt's own chain, then the question's block.
        blocks = [("prefix", p, b) for b in range(tokens // 64)] + [("question", i)]
        fleet.advance(at)
        placed = fleet.submit(Request(prompt_tokens=tokens, output_tokens=4, blocks=blocks, routing_id=base_id,
                                      key=digest), at)
        counts[placed.instance] += 1
    summary = fleet.steering_summary().get("steering", {})
    return {"requests": counts, "collisions": summary.get("replica_collisions", 0)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=96)
    args = parser.parse_args(argv)
    if not 24 <= args.requests <= 1000:
        parser.error(f"--requests {args.requests}: must be from 24 to 1000")
    if not session.built():
        print("llama-server is not built: python -m prefix_routing engines build", file=sys.stderr)
        return 1
    config = stage()
    prefixes = workload(args.requests)
    run = measure(config, prefixes)
    lines, records = run["lines"], run["records"]
    measured = [e["requests"] for e in run["status"]["engines"]]
    placed = engine_of(config, records)
    hot_ids = {}
    for p, r, g in zip(prefixes, records, placed):
        if p == 0:
            hot_ids.setdefault(r.headers.prefix_aware_id, set()).add(g)
    collisions = sum(1 for line in lines if line.get(SteeringLogField.COLLISION))
    prompt_tokens = [line.get(LogField.PROMPT_TOKENS) or 1200 for line in lines][: len(prefixes)]
    prediction = predict(config, prefixes, records, run["sent_at"], prompt_tokens, lines[0][LogField.ROUTING_ID])
    tolerance = max(3, round(0.1 * len(prefixes)))
    hot_engines = set().union(*hot_ids.values()) if hot_ids else set()
    within = all(abs(m - p) <= tolerance for m, p in zip(measured, prediction["requests"]))
    print(f"{len(prefixes)} requests, {PREFIXES} prompts (the first in {prefixes.count(0)}), {ENGINES} llama.cpp "
          "engines, through the front door with replica steering (state in dynalite)")
    print("| engine | requests measured | predicted by the lab |")
    print("|---|---|---|")
    for g in range(ENGINES):
        print(f"| {g} | {measured[g]} | {prediction['requests'][g]} |")
    print("hot prompt's replicas (PrefixAwareId: engines): "
          + ", ".join(f"{rid}: {sorted(gs)}" for rid, gs in hot_ids.items()))
    steering = {}
    for line in lines:
        steering[line.get(SteeringLogField.STEERING)] = steering.get(line.get(SteeringLogField.STEERING), 0) + 1
    print(f"collisions seen by the front door (engines' cached tokens): {collisions}; by the lab: "
          f"{prediction['collisions']}; steering on the log lines: {steering}; replicas per line (max): "
          f"{max((line.get(ReplicaLogField.REPLICAS) or 1) for line in lines)}")
    met = len(hot_engines) == ENGINES and collisions >= 1 and within
    print(f"target: the hot prompt on all {ENGINES} engines ({len(hot_engines)}), at least one collision detected "
          f"({collisions}), every engine within {tolerance} requests of the prediction ({'yes' if within else 'no'}): "
          f"{'met' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
