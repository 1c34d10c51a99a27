"""How fast the lab simulates: at least 1,000,000 requests, on one core.

The Mooncake trace (../shared/traces/conversation_trace.jsonl, 12,031 requests) is replayed as
many times as needed, each replay with fresh block ids (shifted past the previous replay's) and
later arrival times, so the load is the trace's, repeated, and no replay warms another's caches.
Replays are generated one at a time and fed to one ``lab.Simulator`` (a million requests' block
lists would not fit comfortably in memory); generation is timed apart from simulation.

Printed: simulated requests per second, and the ratio to a baseline measured in the same process
(a plain loop that only reads each request's fields), so the figure can be compared across
machines. Target: >= 50,000 simulated requests per second for PREFIX_AWARE with LRU caches.

    python bench/bench_simulate.py [--requests N] [--strategy S] [--cache-tokens K|infinite] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prefix_routing import lab, traces  # noqa: E402
from prefix_routing.fleet import FleetConfig, Strategy  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
TARGET_RPS = 50_000


def replay(trace: traces.Trace, r: int, id_shift: int, span: float) -> traces.Trace:
    """Replay number r: ids shifted by r × id_shift, times by r × span."""
    off_id, off_t = r * id_shift, r * span
    return traces.Trace(
        [t + off_t for t in trace.arrivals],
        trace.prompt_tokens,
        trace.output_tokens,
        [[b + off_id for b in blocks] for blocks in trace.blocks],
        trace.block_tokens,
        source=f"{trace.source} replay {r}",
    )


def baseline(chunks_keys, inv: float) -> tuple[int, float]:
    """The floor: a loop that reads every request's fields and does nothing with them."""
    total, acc = 0, 0.0
    started = time.perf_counter()
    for chunk, keys in chunks_keys:
        arrivals, prompts, outputs, blocks = chunk.arrivals, chunk.prompt_tokens, chunk.output_tokens, chunk.blocks
        for i in range(len(chunk)):
            now = arrivals[i] * inv
            key = keys[i]
            acc += now + prompts[i] + outputs[i] + len(blocks[i]) + (key is None)
        total += len(chunk)
    return total, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--strategy", default="PREFIX_AWARE")
    parser.add_argument("--cache-tokens", type=lab.parse_cache_tokens, default=None, help="default: the preset's (LRU)")
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not TRACE.exists():
        print(f"bench_simulate: the trace is not at {TRACE}", file=sys.stderr)
        return 2

    trace = traces.read_mooncake(TRACE)
    config = lab.config_for_trace(
        FleetConfig(instances=args.instances, strategy=Strategy.parse(args.strategy), cache_tokens=args.cache_tokens),
        trace,
    )
    replays = math.ceil(args.requests / len(trace))
    id_shift = 1 + max(max(b) for b in trace.blocks if b)
    span = trace.duration_s + trace.duration_s / (len(trace) - 1)
    k = config.key_blocks

    # Baseline on a few replays (it is fast and steady), in the same process.
    sample = [(c, lab.trace_keys(c, k)) for c in (replay(trace, r, id_shift, span) for r in range(3))]
    base_n, base_s = baseline(sample, 1.0)
    base_n2, base_s2 = baseline(sample, 1.0)
    base_rps = max(base_n / base_s, base_n2 / base_s2)
    del sample

    sim = lab.Simulator(config)
    generate_s = 0.0
    gc.disable()  # the simulator allocates few cycles; the collector would only add noise
    try:
        for r in range(replays):
            t0 = time.perf_counter()
            chunk = replay(trace, r, id_shift, span)
            keys = lab.trace_keys(chunk, k) if config.strategy is Strategy.PREFIX_AWARE else None
            generate_s += time.perf_counter() - t0
            sim.feed(chunk, keys=keys)
            del chunk, keys
    finally:
        gc.enable()
    result = sim.result()
    n = result.requests
    rps = n / sim.wall_s
    report = {
        "requests": n,
        "replays": replays,
        "strategy": config.strategy.value,
        "instances": config.instances,
        "cache": "infinite" if math.isinf(config.capacity_tokens) else f"LRU {config.capacity_tokens:,.0f} tokens per copy",
        "simulate_s": sim.wall_s,
        "simulated_requests_per_s": rps,
        "baseline_requests_per_s": base_rps,
        "ratio_to_baseline": rps / base_rps,
        "generate_s": generate_s,
        "target_requests_per_s": TARGET_RPS,
        "meets_target": rps >= TARGET_RPS,
        "hit_rate": result.hit_rate,
        "ttft_p50_s": result.ttft_p50_s,
        "max_mean_requests": result.max_mean_requests,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"simulated {n:,} requests ({replays} replays of the trace) with {report['strategy']}, "
            f"{config.instances} instances, {report['cache']}"
        )
        print(f"  simulation: {sim.wall_s:.2f} s = {rps:,.0f} requests/s (target {TARGET_RPS:,})")
        print(f"  baseline (read the requests only): {base_rps:,.0f} requests/s; ratio {rps / base_rps:.3f}")
        print(f"  generating the replays: {generate_s:.2f} s (not counted)")
        print(f"  hit rate {result.hit_rate:.1%}, P50 TTFT {result.ttft_p50_s * 1000:.0f} ms, max/mean {result.max_mean_requests:.2f}")
    return 0 if rps >= TARGET_RPS else 1


if __name__ == "__main__":
    sys.exit(main())
