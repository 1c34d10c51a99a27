"""Benchmark: per-tenant limits that hold under pressure and faults, as the clients count.

    python bench/bench_limits_faults.py tokens [--clients 12] [--max-tokens 1000] [--limit 3000] [--minutes 2]
    python bench/bench_limits_faults.py freeze [--clients 3] [--freeze 8] [--after 60]
    python bench/bench_limits_faults.py            (both, with their defaults: about 4 minutes)
    (any with --json)

Three kinds of process on 127.0.0.1, as in production: the SageMaker runtime emulated over the echo
backend (which answers exactly ``max_tokens`` tokens, with their usage), the front door's own web app
and invoker (``prefix_routing.frontdoor.local``, the default stage's environment with the limits
below, the local store timeout) and dynalite for the limits' counts; SigV4-signed clients of one
tenant, each in closed loop, streaming, reading each answer to its end.

**tokens**: ``--clients`` clients ask ``max_tokens = --max-tokens`` each against ``tokens_per_minute
= --limit``; a refused client waits its ``Retry-After``. Each answer's usage (prompt + completion, from
its last chunk) is added to the minute its request was admitted in (the limit's own minute: the
answer's head time plus its ``x-ratelimit-reset-tokens`` ends that minute), and, for information, to
the minute the answer ended in. Target: no minute of admissions uses more than 1.1× the limit (the
ratio printed per minute).

**freeze**: ``--clients`` clients against ``concurrent_streams = --clients``: the tenant is within its
limit, so every 429 is a false refusal. After 10 s the store is paused by its process id (SIGSTOP) for
``--freeze`` seconds, then resumed; admissions and releases that time out meanwhile may leave leases
behind. Printed: refusals before, during and after the freeze, and when the last false refusal came
after the store resumed. Target: none later than one lease (``limits.lease_s``) after it resumed.

Exit status 1 if the target is missed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_front_door import _signed_headers, _start  # noqa: E402

TOKEN_TARGET = 1.1
WORDS = ("invoice", "ledger", "payment", "supplier", "order", "credit", "balance", "account")
_EMULATOR = """
import sys, time
from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.server import RuntimeServer
server = RuntimeServer(EchoBackend(first_chunk_delay={first!r}, token_delay={per_token!r}), record_bodies=False).start()
print(server.port, flush=True)
time.sleep(3600)
"""
_FRONT_DOOR = """
import sys, time
from prefix_routing.frontdoor.local import LOCAL_STORE_TIMEOUT_MS, LocalFrontDoor
from prefix_routing.stage.config import load_stage
from prefix_routing.stage.front_door_env import front_door_environment
stage = load_stage("default")
stage = stage.model_copy(update={{"limits": stage.limits.model_validate({limits!r})}})
door = LocalFrontDoor({runtime_url!r}, front_door_environment(stage), limits_store_url={store_url!r},
                      store_timeout_ms=LOCAL_STORE_TIMEOUT_MS, emit=lambda line: None)
print(door.server.server_address[1], flush=True)
time.sleep(3600)
"""


class Client:
    """One caller of the tenant in closed loop: what it was served and refused, and when."""

    def __init__(self, port: int, max_tokens: int, index: int) -> None:
        self.port = port
        content = " ".join(WORDS[(index + i) % len(WORDS)] for i in range(40))
        self.body = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                                "stream": True, "stream_options": {"include_usage": True}}).encode()
        self.served: list[dict] = []  # admitted minute, usage, ended at
        self.refused: list[float] = []  # when each 429 came
        self.errors = 0

    def one(self, deadline: float) -> None:
        url = f"http://127.0.0.1:{self.port}/"
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            connection.request("POST", "/", body=self.body, headers=_signed_headers(url, self.body))
            response = connection.getresponse()
            head_at = time.time()
            if response.status == 429:
                self.refused.append(head_at)
                response.read()
                wait = min(float(response.getheader("retry-after") or "1"), 60.0)
                time.sleep(max(0.0, min(wait, deadline - time.time())))
                return
            if response.status != 200:
                self.errors += 1
                response.read()
                return
            reset = response.getheader("x-ratelimit-reset-tokens")
            usage = None
            for line in response:
                if line.startswith(b"data: {") and b'"usage"' in line:
                    found = json.loads(line[6:]).get("usage")
                    usage = found or usage
            ended = time.time()
            used = (usage or {}).get("prompt_tokens", 0) + (usage or {}).get("completion_tokens", 0)
            # The admission's minute ends reset seconds after it (rounded up): head time + reset is in [end, end + 1).
            minute = math.floor((head_at + float(reset.rstrip("s"))) / 60) - 1 if reset else None
            self.served.append({"minute": minute, "used": used, "ended": ended})
        except OSError:
            self.errors += 1
        finally:
            connection.close()

    def run_until(self, deadline: float) -> None:
        while time.time() < deadline:
            self.one(deadline)


def _processes(folder: Path, limits: dict, first: float, per_token: float, store) -> tuple[list, int]:
    emulator, runtime_port, _ = _start(_EMULATOR.format(first=first, per_token=per_token), folder, "emulator")
    try:
        door, port, _ = _start(_FRONT_DOOR.format(limits=limits, runtime_url=f"http://127.0.0.1:{runtime_port}",
                                                  store_url=store.url), folder, "front_door")
    except BaseException:
        emulator.kill()
        raise
    return [emulator, door], port


def _stop(processes: list) -> None:
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)


def run_tokens(clients: int, max_tokens: int, limit: int, minutes: float) -> dict:
    from prefix_routing.emulator.local_store import LocalDynamo

    with tempfile.TemporaryDirectory(prefix="bench-limits-") as name, LocalDynamo() as store:
        processes, port = _processes(Path(name), {"tokens_per_minute": limit}, 0.05, 0.004, store)
        try:
            callers = [Client(port, max_tokens, i) for i in range(clients)]
            deadline = time.time() + minutes * 60
            threads = [threading.Thread(target=c.run_until, args=(deadline,)) for c in callers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(minutes * 60 + 300)
        finally:
            _stop(processes)
    by_admission, by_end, admitted = defaultdict(int), defaultdict(int), defaultdict(int)
    for caller in callers:
        for answer in caller.served:
            by_admission[answer["minute"]] += answer["used"]
            by_end[math.floor(answer["ended"] / 60)] += answer["used"]
            admitted[answer["minute"]] += 1
    rows = [{"minute": m, "admitted": admitted[m], "tokens": by_admission[m], "ratio": by_admission[m] / limit,
             "tokens_by_end": by_end.get(m, 0)} for m in sorted(by_admission)]
    worst = max((row["ratio"] for row in rows), default=0.0)
    return {"scenario": "tokens", "clients": clients, "max_tokens": max_tokens, "limit": limit, "minutes": rows,
            "worst_ratio": worst, "worst_by_end_ratio": max((v / limit for v in by_end.values()), default=0.0),
            "served": sum(len(c.served) for c in callers), "refused": sum(len(c.refused) for c in callers),
            "errors": sum(c.errors for c in callers), "target_met": bool(rows) and worst <= TOKEN_TARGET}


def run_freeze(clients: int, freeze_s: float, after_s: float, warm_s: float = 10.0) -> dict:
    from prefix_routing.emulator.local_store import LocalDynamo
    from prefix_routing.rules.limits import LEASE_S

    with tempfile.TemporaryDirectory(prefix="bench-limits-") as name, LocalDynamo() as store:
        processes, port = _processes(Path(name), {"concurrent_streams": clients}, 0.05, 0.02, store)
        try:
            callers = [Client(port, 40, i) for i in range(clients)]  # about a second per answer
            started = time.time()
            deadline = started + warm_s + freeze_s + after_s
            threads = [threading.Thread(target=c.run_until, args=(deadline,)) for c in callers]
            for thread in threads:
                thread.start()
            time.sleep(warm_s)
            frozen_at = time.time()
            os.kill(store.pid, signal.SIGSTOP)  # the store, by its own process id
            try:
                time.sleep(freeze_s)
            finally:
                os.kill(store.pid, signal.SIGCONT)
            resumed_at = time.time()
            for thread in threads:
                thread.join(warm_s + freeze_s + after_s + 300)
        finally:
            _stop(processes)
    refused = sorted(t for c in callers for t in c.refused)
    after = [t - resumed_at for t in refused if t >= resumed_at]
    last = max(after, default=None)
    return {"scenario": "freeze", "clients": clients, "concurrent_streams": clients, "lease_s": LEASE_S,
            "freeze_s": freeze_s, "observed_after_s": after_s,
            "refused_before": sum(1 for t in refused if t < frozen_at),
            "refused_during": sum(1 for t in refused if frozen_at <= t < resumed_at),
            "refused_after": len(after), "last_refusal_after_resume_s": last,
            "served": sum(len(c.served) for c in callers), "errors": sum(c.errors for c in callers),
            "target_met": last is None or last <= LEASE_S}


def _print_tokens(result: dict) -> None:
    print(f"{result['clients']} clients of one tenant, max_tokens {result['max_tokens']:,}, tokens_per_minute "
          f"{result['limit']:,}; served {result['served']}, refused {result['refused']}, errors {result['errors']}")
    print(f"{'minute':>10} {'admitted':>9} {'tokens':>8} {'x limit':>8}   {'tokens by end':>13}")
    for row in result["minutes"]:
        print(f"{row['minute']:>10} {row['admitted']:>9} {row['tokens']:>8,} {row['ratio']:>8.2f}   "
              f"{row['tokens_by_end']:>13,}")
    print(f"worst minute: {result['worst_ratio']:.2f}x the limit (by the minute an answer ended: "
          f"{result['worst_by_end_ratio']:.2f}x)")
    print(f"target: every minute <= {TOKEN_TARGET:g}x: {'met' if result['target_met'] else 'MISSED'}")


def _print_freeze(result: dict) -> None:
    print(f"{result['clients']} clients of one tenant, concurrent_streams {result['concurrent_streams']} (every 429 is "
          f"false); store frozen {result['freeze_s']:g} s; leases of {result['lease_s']} s")
    print(f"refused: before the freeze {result['refused_before']}, during {result['refused_during']}, after "
          f"{result['refused_after']}; served {result['served']}, errors {result['errors']}")
    last = result["last_refusal_after_resume_s"]
    print("last false refusal: " + ("none after the store resumed" if last is None else
                                    f"{last:.1f} s after the store resumed"))
    print(f"target: none later than {result['lease_s']} s after: {'met' if result['target_met'] else 'MISSED'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", nargs="?", choices=("tokens", "freeze", "both"), default="both",
                        help="which fault to press (default: both, one after the other)")
    parser.add_argument("--clients", type=int, help="clients of the tenant (tokens: 12; freeze: 3, its stream limit)")
    parser.add_argument("--max-tokens", type=int, default=1000, help="tokens: max_tokens of each request")
    parser.add_argument("--limit", type=int, default=3000, help="tokens: the tenant's tokens_per_minute")
    parser.add_argument("--minutes", type=float, default=2.0, help="tokens: how long the clients press")
    parser.add_argument("--freeze", type=float, default=8.0, help="freeze: seconds the store is paused")
    parser.add_argument("--after", type=float, default=60.0, help="freeze: seconds observed after it resumes")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.clients is not None and not 1 <= args.clients <= 64:
        parser.error(f"--clients: got {args.clients}; allowed: 1 to 64")
    if not 1 <= args.max_tokens <= 100_000 or not 1 <= args.limit <= 10**9:
        parser.error("--max-tokens: allowed 1 to 100000; --limit: allowed 1 to 1000000000")
    if not 0.5 <= args.minutes <= 30 or not 1 <= args.freeze <= 120 or not 10 <= args.after <= 600:
        parser.error("--minutes: allowed 0.5 to 30; --freeze: allowed 1 to 120; --after: allowed 10 to 600")
    results = []
    if args.scenario in ("tokens", "both"):
        results.append(run_tokens(args.clients or 12, args.max_tokens, args.limit, args.minutes))
    if args.scenario in ("freeze", "both"):
        results.append(run_freeze(args.clients or 3, args.freeze, args.after))
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    else:
        for result in results:
            (_print_tokens if result["scenario"] == "tokens" else _print_freeze)(result)
    return 0 if all(result["target_met"] for result in results) else 1

if __name__ == "__main__":
    sys.exit(main())
