"""Benchmark: one tenant's flood, another tenant's latency, with and without per-tenant limits.

    python bench/bench_noisy_neighbour.py [--seconds 40] [--flood 16] [--limit 4] [--slots 4] [--json]

Real llama.cpp engines (two, ``--slots`` each), the SageMaker runtime emulated in front of them with
the default stage's routing, dynalite for the limits' counts, and the front door's own web app and
invoker (``prefix_routing.frontdoor.local``) twice: without limits and with
``concurrent_streams = --limit`` per tenant. Every request is SigV4-signed, streamed, with a prompt
of its own (about 600 tokens: no cache helps) and 24 output tokens; time to first token is measured
by the client, at its first content event.

Three phases of ``--seconds`` each:
1. **solo**: the quiet tenant alone, one request at a time;
2. **flood, no limits**: the noisy tenant with ``--flood`` clients in closed loop beside the quiet one;
3. **flood, limits**: the same through the limited front door; a refused noisy request waits its
   ``Retry-After`` and tries again.

Printed: the quiet tenant's P50/P90 TTFT and requests served in each phase, its P50 against solo,
and the noisy tenant's served and refused requests. Target: with limits, the quiet tenant's P50
TTFT within 1.5x of its solo P50, and the noisy tenant refused (429 with Retry-After). Exit status
1 if missed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from botocore.auth import SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402

TARGET = 1.5
WORDS = ("invoice", "ledger", "payment", "supplier", "order", "credit", "balance", "account", "tax", "receipt",
         "shipment", "customer", "discount", "contract", "refund", "currency")


def _body(rng: random.Random) -> bytes:
    text = " ".join(rng.choice(WORDS) for _ in range(450))  # about 600 tokens of its own
    return json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": 24, "stream": True}).encode()


class Client:
    """One tenant's caller: closed loop against a front door, counting what it gets."""

    def __init__(self, port: int, tenant: str, seed: int) -> None:
        self.port, self.tenant, self.rng = port, tenant, random.Random(seed)
        self.ttfts: list[float] = []
        self.refused = 0
        self.retry_after_seen: set[str] = set()
        self.errors = 0

    def one(self) -> None:
        body = _body(self.rng)
        url = f"http://127.0.0.1:{self.port}/v1/chat/completions"
        signed = AWSRequest(method="POST", url=url, data=body, headers={"content-type": "application/json"})
        SigV4Auth(Credentials(self.tenant, "not-checked-locally"), "lambda", "us-east-1").add_auth(signed)
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        started = time.perf_counter()
        try:
            connection.request("POST", "/v1/chat/completions", body=body, headers=dict(signed.headers.items()))
            response = connection.getresponse()
            if response.status == 429:
                self.refused += 1
                retry = response.getheader("retry-after") or "1"
                self.retry_after_seen.add(retry)
                response.read()
                time.sleep(float(retry))
                return
            if response.status != 200:
                self.errors += 1
                response.read()
                return
            first = None
            for line in response:
                if first is None and line.startswith(b"data: {") and b'"content":"' in line:
                    first = time.perf_counter() - started
            if first is not None:
                self.ttfts.append(first)
        except OSError:
            self.errors += 1
        finally:
            connection.close()

    def run_until(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.one()


def _phase(seconds: float, quiet_port: int, noisy_port: int | None, flood: int, seed: int) -> dict:
    stop = threading.Event()
    quiet = Client(quiet_port, "quiet-tenant", seed)
    noisy = [Client(noisy_port, "noisy-tenant", seed + 1 + i) for i in range(flood)] if noisy_port else []
    threads = [threading.Thread(target=c.run_until, args=(stop,)) for c in [*noisy, quiet]]
    for thread in threads[:-1]:
        thread.start()
    if noisy:
        time.sleep(min(5.0, seconds / 4))  # the flood is under way before the quiet tenant measures
    threads[-1].start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(300)
    ttfts = sorted(quiet.ttfts)
    return {
        "quiet_served": len(ttfts), "quiet_errors": quiet.errors, "quiet_refused": quiet.refused,
        "quiet_ttft_p50_s": statistics.median(ttfts) if ttfts else None,
        "quiet_ttft_p90_s": ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))] if ttfts else None,
        "noisy_served": sum(len(c.ttfts) for c in noisy), "noisy_refused": sum(c.refused for c in noisy),
        "noisy_retry_after": sorted(set().union(*(c.retry_after_seen for c in noisy))) if noisy else [],
        "noisy_errors": sum(c.errors for c in noisy),
    }


def run(seconds: float, flood: int, limit: int, slots: int, seed: int) -> dict:
    from prefix_routing.emulator.engine_backend import start_engine_emulator
    from prefix_routing.emulator.local_store import LocalDynamo
    from prefix_routing.engines.session import local_engines
    from prefix_routing.frontdoor.local import LocalFrontDoor
    from prefix_routing.rules.limits import LimitSettings, TenantLimits
    from prefix_routing.stage.config import load_stage
    from prefix_routing.stage.front_door_env import front_door_environment

    stage = load_stage("default")
    lines: list[str] = []  # the front doors' log lines and metrics: kept out of the output
    with LocalDynamo() as store, local_engines(2, slots=slots, context=2048 * slots,
                                               say=lambda text: print(text, file=sys.stderr)) as engines:
        server = start_engine_emulator(stage, [e.url for e in engines], seed=seed, record_bodies=False)
        environment = front_door_environment(stage)
        limited_environment = dict(environment, LIMITS=LimitSettings(
            default=TenantLimits(concurrent_streams=limit), store_timeout_ms=1000).to_json())
        open_door = LocalFrontDoor(server.url, environment, emit=lines.append)
        limited_door = LocalFrontDoor(server.url, limited_environment, emit=lines.append,
                                      limits_store_url=store.url)
        try:
            open_port = open_door.server.server_address[1]
            limited_port = limited_door.server.server_address[1]
            _phase(min(8.0, seconds / 4), open_port, None, 0, seed)  # warm-up: model load, first connections
            phases = {
                "solo": _phase(seconds, open_port, None, 0, seed),
                "flood, no limits": _phase(seconds, open_port, open_port, flood, seed),
                "flood, limits": _phase(seconds, limited_port, limited_port, flood, seed),
            }
        finally:
            limited_door.stop()
            open_door.stop()
            server.stop()
    solo = phases["solo"]["quiet_ttft_p50_s"]
    for phase in phases.values():
        p50 = phase["quiet_ttft_p50_s"]
        phase["quiet_p50_vs_solo"] = p50 / solo if p50 and solo else None
    limited = phases["flood, limits"]
    met = (limited["quiet_p50_vs_solo"] is not None and limited["quiet_p50_vs_solo"] <= TARGET
           and limited["noisy_refused"] > 0 and limited["noisy_retry_after"] == ["1"])
    return {"seconds": seconds, "flood": flood, "limit": limit, "slots": slots, "phases": phases, "target_met": met}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="length of each phase (default 40)")
    parser.add_argument("--flood", type=int, default=16, help="the noisy tenant's concurrent clients (default 16)")
    parser.add_argument("--limit", type=int, default=4, help="concurrent_streams per tenant (default 4)")
    parser.add_argument("--slots", type=int, default=4, help="slots per engine (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if not 5 <= args.seconds <= 3600 or not 1 <= args.flood <= 64 or not 1 <= args.limit <= 64 \
            or not 1 <= args.slots <= 16:
        parser.error("--seconds 5-3600, --flood 1-64, --limit 1-64, --slots 1-16")
    result = run(args.seconds, args.flood, args.limit, args.slots, args.seed)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"2 engines x {args.slots} slots; the noisy tenant: {args.flood} clients; limit: {args.limit} "
              f"streams per tenant; {args.seconds:g} s per phase")
        print(f"{'phase':18} {'quiet P50':>10} {'quiet P90':>10} {'x solo':>7} {'quiet n':>8} {'noisy n':>8} "
              f"{'noisy 429':>9}")
        for name, phase in result["phases"].items():
            p50, p90 = phase["quiet_ttft_p50_s"], phase["quiet_ttft_p90_s"]
            ratio = phase["quiet_p50_vs_solo"]
            print(f"{name:18} {p50 if p50 is not None else float('nan'):9.2f}s {p90 if p90 is not None else float('nan'):9.2f}s "
                  f"{ratio if ratio is not None else float('nan'):6.2f}x {phase['quiet_served']:8d} "
                  f"{phase['noisy_served']:8d} {phase['noisy_refused']:9d}")
        print(f"target: with limits, the quiet tenant within {TARGET:g}x of solo and the noisy tenant refused "
              f"with Retry-After: {'met' if result['target_met'] else 'MISSED'}")
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
