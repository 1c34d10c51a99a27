"""Benchmark: what per-tenant limits add to a streamed request, as a client receives the bytes.

    python bench/bench_limiter.py [--requests 1000] [--json]

The same processes as ``bench_front_door.py`` (the emulated runtime over the echo backend, the
front door's web app, this client), plus dynalite (the limits' store) on 127.0.0.1: two front doors
over the same runtime, one without limits and one with all three (requests and tokens per minute,
concurrent streams: set high enough never to refuse, so that every request pays the store's calls:
a lease and a minute's count before the endpoint call, the lease given back and the tokens
corrected after the answer). The same SigV4-signed streamed body goes to each in turn, 1,000 each
after a warm-up; time to first byte and to last byte, P50 and P99, and the difference. The limited
front door's own ``limiter_ms`` (its log line) is printed beside.

Target: the limits add at most 5 ms at P50 of time to first byte against the local store. Exit
status 1 if missed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_front_door import _EMULATOR, _body, _percentile, _start, _timed_front_door  # noqa: E402

from prefix_routing.emulator.local_store import LocalDynamo  # noqa: E402

TARGET_P50_MS = 5.0
_FRONT_DOOR = """
import json, sys, time
from prefix_routing.frontdoor.local import LocalFrontDoor
from prefix_routing.rules.limits import LimitSettings, TenantLimits
from prefix_routing.stage.config import load_stage
from prefix_routing.stage.front_door_env import front_door_environment
environment = front_door_environment(load_stage("default"))
if {limited!r}:
    limits = TenantLimits(requests_per_minute=10**9, tokens_per_minute=10**9, concurrent_streams=100000)
    environment["LIMITS"] = LimitSettings(default=limits, store_timeout_ms=1000).to_json()
door = LocalFrontDoor({runtime_url!r}, environment, limits_store_url={store_url!r})
print(door.server.server_address[1], flush=True)
time.sleep(3600)
"""


def run(requests: int, warmup: int) -> dict:
    body = _body(8)
    with tempfile.TemporaryDirectory(prefix="bench-limiter-") as name, LocalDynamo() as store:
        folder = Path(name)
        emulator, runtime_port, _ = _start(_EMULATOR.format(tokens=8), folder, "emulator")
        processes = [emulator]
        try:
            doors = {}
            for label, limited in (("without limits", False), ("with limits", True)):
                snippet = _FRONT_DOOR.format(limited=limited, runtime_url=f"http://127.0.0.1:{runtime_port}",
                                             store_url=store.url)
                process, port, out = _start(snippet, folder, label.replace(" ", "_"))
                processes.append(process)
                doors[label] = (port, out)
            times: dict[str, list] = {label: [] for label in doors}
            connections = {label: http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                           for label, (port, _) in doors.items()}
            for index in range(warmup + requests):
                order = list(doors) if index % 2 else list(doors)[::-1]
                for label in order:
                    url = f"http://127.0.0.1:{doors[label][0]}/v1/chat/completions"
                    measured = _timed_front_door(connections[label], url, body)
                    if index >= warmup:
                        times[label].append(measured)
            for connection in connections.values():
                connection.close()
        finally:
            for process in processes:
                process.kill()
                process.wait(10)
        logged = doors["with limits"][1].read_text()
    lines = [json.loads(line) for line in logged.splitlines() if line.startswith('{"message"')]
    own = [line["limiter_ms"] for line in lines[warmup:] if line.get("limiter_ms") is not None]
    return _summary(times, own, requests)


def _summary(times: dict, own: list[float], requests: int) -> dict:
    out: dict = {"requests_each": requests}
    for label, pairs in times.items():
        ttfb, ttlb = [p[0] for p in pairs], [p[1] for p in pairs]
        out[label] = {"ttfb_p50_ms": _percentile(ttfb, 0.5), "ttfb_p99_ms": _percentile(ttfb, 0.99),
                      "ttlb_p50_ms": _percentile(ttlb, 0.5), "ttlb_p99_ms": _percentile(ttlb, 0.99)}
    base, limited = out["without limits"], out["with limits"]
    out["added_ms"] = {key: limited[key] - base[key] for key in base}
    out["limiter_ms_p50"] = statistics.median(own) if own else None
    out["target_met"] = out["added_ms"]["ttfb_p50_ms"] <= TARGET_P50_MS
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="timed requests per front door (default 1000)")
    parser.add_argument("--warmup", type=int, default=50, help="untimed requests per front door first (default 50)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if not 1 <= args.requests <= 100_000 or not 0 <= args.warmup <= 10_000:
        parser.error("--requests 1-100000, --warmup 0-10000")
    result = run(args.requests, args.warmup)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.requests} streamed requests per front door, interleaved; echo backend, dynalite on 127.0.0.1")
        print(f"{'':16} {'TTFB P50':>9} {'TTFB P99':>9} {'TTLB P50':>9} {'TTLB P99':>9}   (ms)")
        for label in ("without limits", "with limits"):
            row = result[label]
            print(f"{label:16} {row['ttfb_p50_ms']:9.2f} {row['ttfb_p99_ms']:9.2f} "
                  f"{row['ttlb_p50_ms']:9.2f} {row['ttlb_p99_ms']:9.2f}")
        added = result["added_ms"]
        print(f"{'added':16} {added['ttfb_p50_ms']:+9.2f} {added['ttfb_p99_ms']:+9.2f} "
              f"{added['ttlb_p50_ms']:+9.2f} {added['ttlb_p99_ms']:+9.2f}")
        if result["limiter_ms_p50"] is not None:
            print(f"the front door's own limiter_ms, P50: {result['limiter_ms_p50']:.2f}")
        print(f"target: limits add <= {TARGET_P50_MS:g} ms at P50 (TTFB): {'met' if result['target_met'] else 'MISSED'}")
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
