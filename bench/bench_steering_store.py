"""Benchmark: what replica steering's shared store costs per request, in store calls and in time.

    python bench/bench_steering_store.py [--requests 500] [--json]

Against a real DynamoDB-compatible store on 127.0.0.1 (dynalite, as the tests use), the front door's
own :class:`Replicas` with its :class:`Steering` over the same bounded clients the function uses
(``SEND_TIMEOUT_MS`` at the send, ``ANSWER_TIMEOUT_MS`` at the answer's end), and beside it, in the
same run, the same ``Replicas`` without steering (replicas in turn: the baseline). botocore's
``before-call`` events count every DynamoDB call.

- cold: requests of prefixes the tracker does not call hot (each a new fingerprint): calls per request;
- hot: one prefix, hot from its first request (factor 0.1 on 4 copies): per request the send's calls
  (``route``: before the endpoint call, on the path to the first token) and the answer's
  (``answered``: after the answer's end marker is handed on); its first answers report the key
  cached, so the collisions' slow path (read + write) shows too, and the time of ``route`` with
  and without steering: median and P90, the difference and the ratio.

dynalite is a Node.js server over LevelDB on the local machine: its round trip is slower than DynamoDB's
from a Lambda in the same region (single-digit milliseconds), and it has no network in between; read
the times as an order of magnitude, the calls as exact.

Targets: 0 store calls per cold request; per hot request 1 read + 1 conditional write at the send and
1 conditional update at the answer (collisions aside); the send adds at most ``SEND_BUDGET_MS`` at P90; at most 1 % of the sends fall back to turns (a
call past its 50 ms bound). The call counts are those of most requests (a fallback's differ).
Exit status 1 if one is missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from prefix_routing.emulator.local_store import LocalDynamo  # noqa: E402
from prefix_routing.frontdoor.config import InvokeConfig  # noqa: E402
from prefix_routing.frontdoor.local import create_limits_table, limits_client  # noqa: E402
from prefix_routing.frontdoor.record import RequestRecord  # noqa: E402
from prefix_routing.frontdoor.replicas import Replicas  # noqa: E402
from prefix_routing.frontdoor.steering_store import (  # noqa: E402
    ANSWER_TIMEOUT_MS,
    SEND_BUDGET_MS,
    SEND_TIMEOUT_MS,
    DynamoSteeringStore,
    Steering,
)
from prefix_routing.rules.replication import ReplicationSettings  # noqa: E402

from bench_front_door import _percentile  # noqa: E402  (bench/, beside this script)


#: Sends that may fall back to turns (a store call past its 50 ms bound on a busy machine): 1 %.
MAX_FALLBACK_SHARE = 0.01


def _counted(client, calls: Counter):
    client.meta.events.register("before-call.dynamodb", lambda model, **_: calls.update([model.name]))
    return client


def _record(fingerprint: str) -> RequestRecord:
    return RequestRecord(arrival_ms=0, fingerprint=fingerprint, body_bytes=8192, status=200)


def run(requests: int, warmup: int) -> dict:
    settings = ReplicationSettings(enabled=True, max_replicas=4, target_share_factor=0.1, min_requests=1.0)
    config = InvokeConfig(endpoint_name="bench", component_name="bench-ic", replication=settings,
                          copies_min=4, copies_max=4, steering_table="bench-steering")
    calls: Counter = Counter()
    with LocalDynamo() as store:
        table = f"bench-{uuid.uuid4().hex[:8]}"
        create_limits_table(limits_client(store.url, 5000), table)
        steering_store = DynamoSteeringStore(_counted(limits_client(store.url, SEND_TIMEOUT_MS), calls), table,
                                             answer_client=_counted(limits_client(store.url, ANSWER_TIMEOUT_MS), calls))
        steered = Replicas(config, clock=lambda: 0.0, steering=Steering(steering_store, settings))
        baseline = Replicas(config, clock=lambda: 0.0)  # steering off: replicas in turn, no store

        # Cold: each request a new prefix, on a tracker that calls nothing hot (factor 1000 on 4 copies).
        cold_config = dataclasses.replace(config, replication=dataclasses.replace(settings, target_share_factor=1000.0))
        cold_replicas = Replicas(cold_config, clock=lambda: 0.0, steering=Steering(steering_store, settings))
        cold_calls = []
        for index in range(requests):
            record = _record(f"cold-{index}")
            before = sum(calls.values())
            cold_replicas.route("tenant", record)
            record.prompt_tokens, record.cached_tokens = 1000, 0
            cold_replicas.answered(record)
            cold_calls.append(sum(calls.values()) - before)

        send_ms, base_ms, answer_ms, send_calls, answer_calls, fallbacks, collisions = [], [], [], Counter(), Counter(), 0, 0
        for index in range(warmup + requests):
            timed = index >= warmup
            base = _record("hot")
            started = time.perf_counter()
            baseline.route("tenant", base)
            elapsed = (time.perf_counter() - started) * 1000.0
            record = _record("hot")
            before = Counter(calls)
            started = time.perf_counter()
            steered.route("tenant", record)
            took = (time.perf_counter() - started) * 1000.0
            sent = Counter(calls)
            sent.subtract(before)
            # Each replica's first answer finds the key cached (a collision, then a fresh number) for the
            # first 8 requests; later answers report 10 % cached.
            record.prompt_tokens, record.cached_tokens = 1000, 1000 if index < 8 else 100
            started = time.perf_counter()
            steered.answered(record)
            released = (time.perf_counter() - started) * 1000.0
            ended = Counter(calls)
            ended.subtract(before)
            ended.subtract(sent)
            collisions += bool(record.replica_collision)
            if timed:
                base_ms.append(elapsed)
                send_ms.append(took)
                answer_ms.append(released)
                fallbacks += record.steering != "least_loaded"
                send_calls[tuple(sorted((+sent).items()))] += 1
                answer_calls[tuple(sorted((+ended).items()))] += 1
    p50, p90 = statistics.median(send_ms), _percentile(send_ms, 0.9)
    b50, b90 = statistics.median(base_ms), _percentile(base_ms, 0.9)
    hot_send = dict(send_calls.most_common(1)[0][0]) if send_calls else {}
    hot_answer = dict(answer_calls.most_common(1)[0][0]) if answer_calls else {}
    out = {
        "requests": requests,
        "cold_calls_per_request": max(cold_calls),
        "hot_send_calls": hot_send,
        "hot_answer_calls": hot_answer,
        "send_call_mix": {" + ".join(f"{n} {op}" for op, n in k) or "none": v for k, v in send_calls.items()},
        "answer_call_mix": {" + ".join(f"{n} {op}" for op, n in k) or "none": v for k, v in answer_calls.items()},
        "collisions_in_warmup_and_run": collisions,
        "fallbacks": fallbacks,
        "route_ms": {"steered_p50": p50, "steered_p90": p90, "baseline_p50": b50, "baseline_p90": b90,
                     "added_p50": p50 - b50, "added_p90": p90 - b90, "ratio_p50": p50 / b50 if b50 else None,
                     "answered_p50": statistics.median(answer_ms), "answered_p90": _percentile(answer_ms, 0.9)},
    }
    out["target_met"] = (out["cold_calls_per_request"] == 0 and hot_send == {"GetItem": 1, "PutItem": 1}
                         and hot_answer == {"UpdateItem": 1} and p90 - b90 <= SEND_BUDGET_MS
                         and fallbacks <= MAX_FALLBACK_SHARE * requests)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500, help="timed hot requests, and cold ones (default 500)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed hot requests first (default 20)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if not 1 <= args.requests <= 100_000 or not 0 <= args.warmup <= 10_000:
        parser.error("--requests 1-100000, --warmup 0-10000")
    result = run(args.requests, args.warmup)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        timing = result["route_ms"]
        print(f"{args.requests} cold and {args.requests} hot requests; dynalite on 127.0.0.1 (slower than DynamoDB)")
        print(f"store calls per cold request: {result['cold_calls_per_request']}")
        print(f"per hot request, at the send:   {result['send_call_mix']}")
        print(f"per hot request, at the answer: {result['answer_call_mix']} "
              f"({result['collisions_in_warmup_and_run']} collisions, in the first answers)")
        print(f"Replicas.route, ms: steered P50 {timing['steered_p50']:.2f} P90 {timing['steered_p90']:.2f}; "
              f"in turn P50 {timing['baseline_p50']:.3f} P90 {timing['baseline_p90']:.3f}; "
              f"added P50 {timing['added_p50']:.2f} P90 {timing['added_p90']:.2f}"
              + (f"; ratio P50 {timing['ratio_p50']:.0f}x" if timing["ratio_p50"] else ""))
        print(f"Replicas.answered (after the end marker, off the first token's path), ms: "
              f"P50 {timing['answered_p50']:.2f} P90 {timing['answered_p90']:.2f}")
        print(f"fallbacks to turns: {result['fallbacks']}")
        print("target: 0 calls cold; hot 1 GetItem + 1 PutItem at the send, 1 UpdateItem at the answer; "
              f"added P90 <= {SEND_BUDGET_MS} ms; fallbacks <= {MAX_FALLBACK_SHARE:.0%}: "
              f"{'met' if result['target_met'] else 'MISSED'}")
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
