"""Hot prefixes on every seed: replicas in turn against replicas steered by load and collisions.

AWS's long-context workload with Zipf popularity (``lab.workloads.long_context_workload``: 450
prefixes, 7 × p5 copies, an hour at 3 requests/s), for each seed the same trace and router seed
simulated three ways with PREFIX_AWARE:

- **off**: no replication;
- **in turn**: replication as the front door did it before steering (each execution environment
  uses a hot prefix's replicas in turn; factor 0.1 fair shares, 8 recent requests);
- **steered**: the defaults (``rules/steering.py``: the replica with the fewest in flight, a
  replica whose first answer finds the key cached redrawn; factor 0.05, 12 recent requests).

Printed per Zipf exponent: max/mean requests per instance (median and worst over the seeds), the
hit rate, and P90 TTFT (median over the seeds, and the worst seed's ratio to off). Targets, on Zipf
1.1: steered max/mean <= 1.25 on every seed and median <= 1.15, hit rate >= 98 % of off's on every
seed, median P90 TTFT no worse than off's; on uniform traffic (Zipf 0) steered equals off. Exit
status 1 if one is missed.

    python bench/bench_replication.py [--seeds N] [--zipf S ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prefix_routing.lab.routing import Strategy  # noqa: E402
from prefix_routing.lab.simulate import simulate  # noqa: E402
from prefix_routing.lab.workloads import LongContextSpec, long_context_workload  # noqa: E402
from prefix_routing.rules.replication import ReplicationSettings  # noqa: E402

STEERED = ReplicationSettings(enabled=True)
IN_TURN = replace(STEERED, steering=False, target_share_factor=0.1, min_requests=8.0)
MODES = {"off": None, "in turn": IN_TURN, "steered": STEERED}
TARGET_WORST, TARGET_MEDIAN, TARGET_HIT_SHARE = 1.25, 1.15, 0.98


def run(zipf: float, seeds: int) -> dict:
    """Per mode, per seed: (max/mean requests, hit rate, P90 TTFT s, replicated requests)."""
    spec = LongContextSpec(zipf=zipf)
    rows: dict[str, list[tuple]] = {mode: [] for mode in MODES}
    for seed in range(seeds):
        trace = long_context_workload(spec, seed=seed)
        for mode, replication in MODES.items():
            r = simulate(trace, spec.fleet_config(strategy=Strategy.PREFIX_AWARE, seed=seed, replication=replication))
            rows[mode].append((r.max_mean_requests, r.hit_rate, r.ttft_p90_s, r.replicated_requests))
    summary = {}
    off = rows["off"]
    for mode, values in rows.items():
        mm = [v[0] for v in values]
        summary[mode] = {
            "max_mean_median": statistics.median(mm),
            "max_mean_worst": max(mm),
            "max_mean_by_seed": mm,
            "hit_rate_mean": statistics.mean(v[1] for v in values),
            "hit_share_of_off_worst": min(v[1] / o[1] for v, o in zip(values, off)),
            "p90_ttft_median_s": statistics.median(v[2] for v in values),
            "p90_ratio_to_off_worst": max(v[2] / o[2] for v, o in zip(values, off)),
            "replicated_requests_mean": statistics.mean(v[3] for v in values),
        }
    return summary


def verdicts(zipf: float, summary: dict) -> list[str]:
    """The targets this exponent missed (empty: met)."""
    steered, off = summary["steered"], summary["off"]
    missed = []
    if zipf == 1.1:
        if steered["max_mean_worst"] > TARGET_WORST:
            missed.append(f"zipf 1.1: worst max/mean {steered['max_mean_worst']:.3f} > {TARGET_WORST}")
        if steered["max_mean_median"] > TARGET_MEDIAN:
            missed.append(f"zipf 1.1: median max/mean {steered['max_mean_median']:.3f} > {TARGET_MEDIAN}")
        if steered["hit_share_of_off_worst"] < TARGET_HIT_SHARE:
            missed.append(f"zipf 1.1: hit rate {steered['hit_share_of_off_worst']:.1%} of off's < {TARGET_HIT_SHARE:.0%}")
        if steered["p90_ttft_median_s"] > off["p90_ttft_median_s"]:
            missed.append("zipf 1.1: median P90 TTFT worse than without replication")
    if zipf == 0 and (steered["max_mean_by_seed"] != off["max_mean_by_seed"] or steered["replicated_requests_mean"]):
        missed.append("uniform traffic: steered differs from off")
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="seeds 0..N-1 (default 20)")
    parser.add_argument("--zipf", type=float, action="append", help="Zipf exponents (default 0, 0.8, 1.1, 1.3)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 1 <= args.seeds <= 1000:
        parser.error(f"--seeds {args.seeds}: must be from 1 to 1000")
    exponents = args.zipf or [0.0, 0.8, 1.1, 1.3]
    report, missed = {}, []
    for zipf in exponents:
        report[str(zipf)] = summary = run(zipf, args.seeds)
        missed += verdicts(zipf, summary)
    if args.json:
        print(json.dumps({"seeds": args.seeds, "by_zipf": report, "missed": missed}, indent=2))
    else:
        print(f"long-context workload, 7 copies, seeds 0-{args.seeds - 1}, PREFIX_AWARE")
        print("| Zipf | replication | max/mean median | worst | hit rate | worst hit vs off | P90 TTFT median (ms) "
              "| worst P90 vs off | replicated requests |")
        print("|---|---|---|---|---|---|---|---|---|")
        for zipf, summary in report.items():
            for mode, s in summary.items():
                print(f"| {zipf} | {mode} | {s['max_mean_median']:.3f} | {s['max_mean_worst']:.3f} | "
                      f"{s['hit_rate_mean']:.2%} | {s['hit_share_of_off_worst']:.1%} | "
                      f"{s['p90_ttft_median_s'] * 1000:.1f} | {s['p90_ratio_to_off_worst']:.3f} | "
                      f"{s['replicated_requests_mean']:,.0f} |")
        print("targets: " + ("met" if not missed else "MISSED: " + "; ".join(missed)))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
