"""Fidelity: what the lab predicts against what real engines do, for one workload, per strategy.

One workload (``demo --engines``'s: P prefixes of ~1,500 tokens, a unique suffix per request,
normalized clients, U users in closed loop) runs twice per strategy:

1. measured: through the emulator's runtime protocol on N fresh llama.cpp engines (one slot each,
   ``--cache-ram`` as the demo sets it), TTFT by the client, hit rate as the engines report it;
2. predicted: through ``simulate`` with the preset ``calibrate`` measured on an engine of the same
   build a moment before, the llama.cpp slot cache policy, the same routing keys, users and seed.

The figure of merit is the ratio of each prediction to its measurement, in the same process and on
the same machine. Targets: hit rate within ±5 percentage points, P50 TTFT within ±25 %, the same
order of the strategies by hit rate and by P50. Exit status 1 if one is missed.

    python bench/bench_fidelity.py [--requests N] [--prefixes P] [--users U] [--engines N] [--json]

Needs ``make engines`` first. About 3-4 minutes on 2 cores (calibration ~25 s, then per strategy).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prefix_routing.cli.demo_engines import EngineDemoSpec, fidelity_rows  # noqa: E402
from prefix_routing.engines.session import built, local_engines  # noqa: E402
from prefix_routing.stage.preset_file import load_preset_file  # noqa: E402

STRATEGIES = ("RANDOM", "LEAST_OUTSTANDING_REQUESTS", "PREFIX_AWARE")
HIT_BAND_PP = 5.0
P50_BAND = 0.25


def calibrate(spec: EngineDemoSpec, out: Path, *, quick: bool = False) -> Path:
    """``calibrate`` on one engine started as the workload's are."""
    with local_engines(1, slots=1, cache_ram_mib=spec.cache_ram_mib, say=lambda text: None) as (engine,):
        command = [sys.executable, "-m", "prefix_routing", "calibrate", "--engine-url", engine.url, "--out", str(out)]
        subprocess.run(command + (["--quick"] if quick else []), check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return out


def verdicts(rows: list[dict]) -> dict[str, bool]:
    by_hit = lambda key: [r["strategy"] for r in sorted(rows, key=lambda r: r[key])]  # noqa: E731
    return {
        "hit rate within ±5 pp": all(abs(r["hit_measured"] - r["hit_predicted"]) * 100 <= HIT_BAND_PP for r in rows),
        "P50 TTFT within ±25 %": all(abs(r["p50_predicted_ms"] / r["p50_measured_ms"] - 1) <= P50_BAND for r in rows),
        "same order by hit rate": by_hit("hit_measured") == by_hit("hit_predicted"),
        "same order by P50 TTFT": by_hit("p50_measured_ms") == by_hit("p50_predicted_ms"),
    }


def render(rows: list[dict]) -> str:
    lines = ["| strategy | hit rate measured | predicted | Δ (pp) | P50 TTFT measured (ms) | predicted | ratio | "
             "P90 measured (ms) | predicted | ratio |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['strategy']} | {r['hit_measured']:.1%} | {r['hit_predicted']:.1%} | "
            f"{(r['hit_predicted'] - r['hit_measured']) * 100:+.1f} | {r['p50_measured_ms']:,.0f} | "
            f"{r['p50_predicted_ms']:,.0f} | {r['p50_predicted_ms'] / r['p50_measured_ms']:.2f} | "
            f"{r['p90_measured_ms']:,.0f} | {r['p90_predicted_ms']:,.0f} | "
            f"{r['p90_predicted_ms'] / r['p90_measured_ms']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--prefixes", type=int, default=8)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--preset-file", help="use this calibrated preset instead of calibrating now")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not built():
        print("llama-server is not built: run `make engines` first", file=sys.stderr)
        return 2
    spec = EngineDemoSpec(engines=args.engines, prefixes=args.prefixes, requests=args.requests,
                          concurrency=args.users)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.preset_file) if args.preset_file else calibrate(spec, Path(tmp) / "engine.json")
        preset = load_preset_file(path)
        calibrated_s = time.monotonic() - started
        rows = fidelity_rows(spec, preset, STRATEGIES)
    checks = verdicts(rows)
    if args.json:
        print(json.dumps({"spec": spec.__dict__, "rows": rows, "checks": checks}, indent=2, default=list))
    else:
        print(f"workload: {spec.prefixes} prefixes of {spec.prefix_tokens} tokens, {spec.requests} requests, "
              f"{spec.concurrency} users, {spec.engines} engines × 1 slot, --cache-ram {spec.cache_ram_mib} MiB")
        print(render(rows))
        for name, ok in checks.items():
            print(f"  {'ok  ' if ok else 'MISS'} {name}")
        print(f"calibration {calibrated_s:.0f} s, total {time.monotonic() - started:.0f} s")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
