"""Fidelity: what the lab predicts against what real engines do, for one workload, per strategy.

One workload (``demo --engines``'s: P prefixes of ~1,500 tokens, a unique suffix per request,
normalized clients, U users in closed loop) runs twice per strategy:

1. measured: through the emulator's runtime protocol on N engines with cold caches, one sequence at a
   time each, with room for about half the prefixes (llama.cpp: fresh engines, ``--cache-ram`` as the
   demo sets it; vLLM: the same engines, their prefix caches reset, a KV cache of 12,288 tokens in
   blocks of 32), TTFT by the client, hit rate as the engines report it;
2. predicted: through ``simulate`` with the preset ``calibrate`` measured on an engine started the same
   way a moment before, the engine's cache policy (llama.cpp's slots; vLLM's blocks, of the prompts'
   own token ids), the same routing keys, users and seed.

The figure of merit is the ratio of each prediction to its measurement, in the same process and on
the same machine. Targets: hit rate within ±5 percentage points (±3 on vLLM, whose cache the lab
models block for block), P50 TTFT within ±25 %, the same order of the strategies by hit rate and by
P50. Exit status 1 if one is missed.

    python bench/bench_fidelity.py [--engine-kind vllm] [--requests N] [--prefixes P] [--users U] [--engines N] [--json]

Needs ``make engines`` first. About 3-4 minutes on 2 cores for llama.cpp (calibration ~25 s, then per
strategy); about as long for vLLM (its engines start in 25-90 s, once).
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

STRATEGIES = {"llama.cpp": ("RANDOM", "LEAST_OUTSTANDING_REQUESTS", "PREFIX_AWARE"),
              "vllm": ("RANDOM", "PREFIX_AWARE")}
HIT_BAND_PP = {"llama.cpp": 5.0, "vllm": 3.0}
P50_BAND = 0.25


def calibrate(spec: EngineDemoSpec, out: Path, *, quick: bool = False) -> Path:
    """``calibrate`` on one engine started as the workload's are."""
    with local_engines(1, **spec.engine_options(), say=lambda text: None) as (engine,):
        command = [sys.executable, "-m", "prefix_routing", "calibrate", "--engine-url", engine.url, "--out", str(out),
                   "--slots", "1"]
        subprocess.run(command + (["--quick"] if quick else []), check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return out


def verdicts(rows: list[dict], kind: str = "llama.cpp") -> dict[str, bool]:
    by_hit = lambda key: [r["strategy"] for r in sorted(rows, key=lambda r: r[key])]  # noqa: E731
    band = HIT_BAND_PP[kind]
    return {
        f"hit rate within ±{band:g} pp": all(abs(r["hit_measured"] - r["hit_predicted"]) * 100 <= band for r in rows),
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
    parser.add_argument("--users", type=int,
                        help="clients in closed loop (default 4 on llama.cpp; 2 on vLLM, whose engines' API servers "
                             "share a 2-core machine's cores with the clients, the emulator and each other)")
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--engine-kind", choices=tuple(STRATEGIES), default="llama.cpp")
    parser.add_argument("--preset-file", help="use this calibrated preset instead of calibrating now")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not built(args.engine_kind):
        print(f"{args.engine_kind} is not built or installed: run `make engines` first", file=sys.stderr)
        return 2
    users = args.users or (2 if args.engine_kind == "vllm" else 4)
    spec = EngineDemoSpec(engines=args.engines, kind=args.engine_kind, prefixes=args.prefixes, requests=args.requests,
                          concurrency=users)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.preset_file) if args.preset_file else calibrate(spec, Path(tmp) / "engine.json")
        preset = load_preset_file(path)
        calibrated_s = time.monotonic() - started
        rows = fidelity_rows(spec, preset, STRATEGIES[spec.kind])
    checks = verdicts(rows, spec.kind)
    if args.json:
        print(json.dumps({"spec": spec.__dict__, "rows": rows, "checks": checks}, indent=2, default=list))
    else:
        cache = (f"a KV cache of {spec.cache_tokens:,} tokens in blocks of {spec.block_size}" if spec.kind == "vllm"
                 else f"--cache-ram {spec.cache_ram_mib} MiB")
        print(f"workload: {spec.prefixes} prefixes of {spec.prefix_tokens} tokens, {spec.requests} requests, "
              f"{spec.concurrency} users, {spec.engines} {spec.kind} engines × 1 sequence, {cache}")
        print(render(rows))
        for name, ok in checks.items():
            print(f"  {'ok  ' if ok else 'MISS'} {name}")
        print(f"calibration {calibrated_s:.0f} s, total {time.monotonic() - started:.0f} s")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
