"""How fast the lab simulates: 1,000,000 requests by default, on one core, repeated.

The Mooncake conversation trace (Apache-2.0, github.com/kvcache-ai/Mooncake; read from
../shared/traces/conversation_trace.jsonl beside the clone, 12,031 requests) is replayed as
many times as needed, each replay with fresh block ids (shifted past the previous replay's) and
later arrival times, so the load is the trace's, repeated, and no replay warms another's caches;
the last replay is cut so that exactly ``--requests`` requests are simulated. Replays are generated
one at a time and fed to one ``lab.Simulator`` (a million requests' block lists would not fit
comfortably in memory), each said to be chained with the ones before (fresh ids: it shares none);
generating a replay is the only untimed work.

The timed part is what ``lab.simulate`` does for a trace: the routing keys (``lab.trace_keys``,
PREFIX_AWARE only; other strategies route without keys) and ``Simulator.feed``. Timed apart, for
information: the same without the misses ledger (``explain_misses=False``, as ``tune`` and the
advisor run their many simulations), which must give the same hit rate and TTFT. The baseline is a
plain loop, in the same process and on the same replays, that only reads each request's fields
(arrival, prompt and output tokens, its block list) and does nothing with them: the floor for any
per-request Python loop, so that the ratio can be compared across machines.

The whole measurement (a fresh ``Simulator`` over all the requests, with its baseline) is repeated
``--repeats`` times (default 3); printed are the min and the median over the repeats of the
simulated requests per second, of the baseline's, and of the ratio of the two (min to min, median
to median). Every repeat must give the same simulation result (it is deterministic). For
information, the same over the process's CPU time (``time.process_time``), which a shared machine's
other work inflates less than wall-clock time.

The yardstick: a minimal PREFIX_AWARE + LRU simulation of the same replays, written for the
benchmark and independent of the lab (``bench/minimal_prefix_sim.py``), timed in the same process
on each replay. Targets, on the medians of wall-clock figures: >= 50,000 simulated requests per
second for PREFIX_AWARE with LRU caches, and the lab (as ``simulate`` runs it, with the misses
by cause) at least as fast as the minimal simulation (ratio >= 1.0). Exit status 1 if one is missed.

    python bench/bench_simulate.py [--requests N] [--repeats R] [--strategy S] [--cache-tokens K|infinite] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prefix_routing import lab
from prefix_routing.cli import lab_args
from prefix_routing.lab import traces  # noqa: E402
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.routing import Strategy  # noqa: E402

from minimal_prefix_sim import MinimalPrefixSim  # noqa: E402  (bench/, beside this script)

TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
TARGET_RPS = 50_000
TARGET_RATIO_TO_MINIMAL = 1.0


def replay(trace: traces.Trace, r: int, id_shift: int, span: float, limit: int) -> traces.Trace:
    """Replay number r, its first ``limit`` requests: ids shifted by r × id_shift, times by r × span."""
    off_id, off_t = r * id_shift, r * span
    n = min(limit, len(trace))
    return traces.Trace(
        [t + off_t for t in trace.arrivals[:n]],
        trace.prompt_tokens[:n],
        trace.output_tokens[:n],
        [[b + off_id for b in blocks] for blocks in trace.blocks[:n]],
        trace.block_tokens,
        trace.block_bytes,
        trace.routing_ids[:n] if trace.routing_ids else None,
        source=f"{trace.source} replay {r}",
        chained=trace.chained,
    )


def baseline(chunk: traces.Trace) -> float:
    """The floor: seconds of a loop that reads every request's fields and does nothing with them."""
    acc = 0.0
    started = time.perf_counter()
    arrivals, prompts, outputs, blocks = chunk.arrivals, chunk.prompt_tokens, chunk.output_tokens, chunk.blocks
    for i in range(len(chunk)):
        now = arrivals[i] * 1.0
        acc += now + prompts[i] + outputs[i] + len(blocks[i])
    return time.perf_counter() - started


def run_once(trace: traces.Trace, config: FleetConfig, requests: int, id_shift: int, span: float) -> dict:
    """One measurement: a fresh Simulator over ``requests`` requests, and the baselines on the same replays."""
    keyed = config.strategy is Strategy.PREFIX_AWARE
    k = config.key_blocks
    sim = lab.Simulator(config)
    bare = lab.Simulator(config, explain_misses=False)  # as tune and the advisor run it: no misses by cause
    minimal = MinimalPrefixSim(config.total_copies, k, config.concurrency_threshold, int(config.block_tokens),
                               int(config.capacity_tokens // config.block_tokens)) \
        if keyed and not math.isinf(config.capacity_tokens) else None
    generate_s = baseline_s = keys_s = simulate_s = simulate_cpu_s = minimal_s = bare_s = 0.0
    remaining, r = requests, 0
    collecting = gc.isenabled()
    gc.disable()  # the simulator allocates few cycles; the collector would only add noise
    try:
        while remaining > 0:
            t0 = time.perf_counter()
            chunk = replay(trace, r, id_shift, span, remaining)
            t1 = time.perf_counter()
            baseline_s += baseline(chunk)
            if minimal is not None:
                m0 = time.perf_counter()
                minimal.feed(chunk.arrivals, chunk.prompt_tokens, chunk.output_tokens, chunk.blocks)
                minimal_s += time.perf_counter() - m0
            t2, c2 = time.perf_counter(), time.process_time()
            keys = lab.trace_keys(chunk, k) if keyed else None  # timed: the keys are part of the work
            t3 = time.perf_counter()
            sim.feed(chunk, keys=keys, chained_with_earlier=True)
            t4, c4 = time.perf_counter(), time.process_time()
            b0 = time.perf_counter()
            bare.feed(chunk, keys=lab.trace_keys(chunk, k) if keyed else None, chained_with_earlier=True)
            bare_s += time.perf_counter() - b0
            generate_s += t1 - t0
            keys_s += t3 - t2
            simulate_s += t4 - t2
            simulate_cpu_s += c4 - c2
            remaining -= len(chunk)
            r += 1
            del chunk, keys
    finally:
        if collecting:
            gc.enable()
    result = sim.result()
    bare_result = bare.result()
    if (bare_result.hit_rate, bare_result.ttft_p50_s) != (result.hit_rate, result.ttft_p50_s):
        raise SystemExit("bench_simulate: the run without misses by cause differs (it must not)")
    return {
        "bare_requests_per_s": result.requests / bare_s,
        "result": result,
        "replays": r,
        "generate_s": generate_s,
        "baseline_s": baseline_s,
        "keys_s": keys_s,
        "loop_s": sim.wall_s,
        "simulate_s": simulate_s,
        "simulate_cpu_s": simulate_cpu_s,
        "requests_per_s": result.requests / simulate_s,
        "requests_per_cpu_s": result.requests / simulate_cpu_s,
        "baseline_requests_per_s": result.requests / baseline_s,
        "minimal_requests_per_s": result.requests / minimal_s if minimal is not None else None,
        "minimal_hit_rate": minimal.hit_rate if minimal is not None else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000,
                        help="requests simulated per repeat (default 1,000,000; fewer for a quick run)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements; min and median reported (default 3)")
    parser.add_argument("--strategy", default="PREFIX_AWARE")
    parser.add_argument("--cache-tokens", type=lab_args.parse_cache_tokens, default=None, help="default: the preset's (LRU)")
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error(f"--requests {args.requests}: must be >= 1")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: must be >= 1")
    if not TRACE.exists():
        print(f"bench_simulate: the trace is not at {TRACE}", file=sys.stderr)
        return 2

    trace = traces.read_mooncake(TRACE)
    config = lab.config_for_trace(
        FleetConfig(instances=args.instances, strategy=Strategy.parse(args.strategy), cache_tokens=args.cache_tokens),
        trace,
    )
    id_shift = 1 + max(max(b) for b in trace.blocks if b)
    span = trace.duration_s + trace.duration_s / (len(trace) - 1)

    runs = []
    for _ in range(args.repeats):
        runs.append(run_once(trace, config, args.requests, id_shift, span))
        gc.collect()
    first = runs[0]["result"]
    for run in runs[1:]:
        res = run["result"]
        if (res.requests, res.hit_rate, res.ttft_p50_s, res.max_mean_requests) != (
                first.requests, first.hit_rate, first.ttft_p50_s, first.max_mean_requests):
            print("bench_simulate: the repeats disagree (the simulation should be deterministic)", file=sys.stderr)
            return 3

    def stats(key: str) -> tuple[float, float]:
        values = [run[key] for run in runs]
        return min(values), statistics.median(values)

    n = first.requests
    rps_min, rps_med = stats("requests_per_s")
    base_min, base_med = stats("baseline_requests_per_s")
    cpu_min, cpu_med = stats("requests_per_cpu_s")
    report = {
        "requests": n,
        "replays": runs[0]["replays"],
        "repeats": args.repeats,
        "strategy": config.strategy.value,
        "instances": config.instances,
        "cache": ("infinite" if math.isinf(config.capacity_tokens)
                  else f"LRU {config.capacity_tokens:,.0f} tokens per copy"),
        "timed": "routing keys + Simulator.feed" if config.strategy is Strategy.PREFIX_AWARE else "Simulator.feed",
        "simulate_s": statistics.median(run["simulate_s"] for run in runs),
        "keys_s": statistics.median(run["keys_s"] for run in runs),
        "loop_s": statistics.median(run["loop_s"] for run in runs),
        "simulated_requests_per_s": rps_med,
        "simulated_requests_per_s_min": rps_min,
        "simulated_requests_per_s_median": rps_med,
        "simulated_requests_per_s_runs": [run["requests_per_s"] for run in runs],
        "simulated_requests_per_cpu_s_min": cpu_min,
        "simulated_requests_per_cpu_s_median": cpu_med,
        "baseline_requests_per_s": base_med,
        "baseline_requests_per_s_min": base_min,
        "baseline_requests_per_s_median": base_med,
        "baseline_requests_per_s_runs": [run["baseline_requests_per_s"] for run in runs],
        "ratio_to_baseline": rps_med / base_med,
        "ratio_to_baseline_min": rps_min / base_min,
        "ratio_to_baseline_median": rps_med / base_med,
        "minimal_requests_per_s_median": statistics.median(run["minimal_requests_per_s"] for run in runs)
        if runs[0]["minimal_requests_per_s"] else None,
        "ratio_to_minimal_median": statistics.median(run["requests_per_s"] / run["minimal_requests_per_s"]
                                                     for run in runs) if runs[0]["minimal_requests_per_s"] else None,
        "minimal_hit_rate": runs[0]["minimal_hit_rate"],
        "without_causes_requests_per_s_median": statistics.median(run["bare_requests_per_s"] for run in runs),
        "without_causes_ratio_to_minimal_median": statistics.median(
            run["bare_requests_per_s"] / run["minimal_requests_per_s"] for run in runs)
        if runs[0]["minimal_requests_per_s"] else None,
        "generate_s": statistics.median(run["generate_s"] for run in runs),
        "target_requests_per_s": TARGET_RPS,
        "target_on": "median",
        "target_ratio_to_minimal": TARGET_RATIO_TO_MINIMAL,
        "meets_target": rps_med >= TARGET_RPS and (
            runs[0]["minimal_requests_per_s"] is None
            or statistics.median(run["requests_per_s"] / run["minimal_requests_per_s"] for run in runs)
            >= TARGET_RATIO_TO_MINIMAL),
        "hit_rate": first.hit_rate,
        "ttft_p50_s": first.ttft_p50_s,
        "max_mean_requests": first.max_mean_requests,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"simulated {n:,} requests ({report['replays']} replay{'s' * (report['replays'] != 1)} of the trace) "
            f"with {report['strategy']}, "
            f"{config.instances} instances, {report['cache']}; {args.repeats} repeat{'s' * (args.repeats != 1)}"
        )
        print(f"  simulation ({report['timed']}): min {rps_min:,.0f}, median {rps_med:,.0f} requests/s "
              f"(target {TARGET_RPS:,} on the median); median {report['simulate_s']:.2f} s, "
              f"of which keys {report['keys_s']:.2f} s, the simulator's loop {report['loop_s']:.2f} s")
        print(f"  per CPU second of this process (for information; less sensitive to neighbours' load): "
              f"min {cpu_min:,.0f}, median {cpu_med:,.0f} requests/s")
        print(f"  baseline (read the requests only): min {base_min:,.0f}, median {base_med:,.0f} requests/s")
        print(f"  ratio to baseline: min {rps_min / base_min:.3f}, median {rps_med / base_med:.3f}")
        if report["ratio_to_minimal_median"] is not None:
            print(f"  a minimal PREFIX_AWARE + LRU simulation of the same replays (bench/minimal_prefix_sim.py): median "
                  f"{report['minimal_requests_per_s_median']:,.0f} requests/s, hit rate {report['minimal_hit_rate']:.1%}; "
                  f"the lab's speed relative to it: median {report['ratio_to_minimal_median']:.2f} "
                  f"(target >= {TARGET_RATIO_TO_MINIMAL:.1f})")
            print(f"  the lab without misses by cause (as tune and the advisor run it): median "
                  f"{report['without_causes_requests_per_s_median']:,.0f} requests/s, relative to the minimal one "
                  f"{report['without_causes_ratio_to_minimal_median']:.2f}")
        print(f"  generating the replays: median {report['generate_s']:.2f} s per repeat (not counted)")
        print(f"  hit rate {first.hit_rate:.1%}, P50 TTFT {first.ttft_p50_s * 1000:.0f} ms, "
              f"max/mean {first.max_mean_requests:.2f}")
    return 0 if report["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
