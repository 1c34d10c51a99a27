"""The routing advisor's run time and memory on a window of 100,000 request-log lines.

The window is the Mooncake trace (../shared/traces/conversation_trace.jsonl) written as the
normalizer's request log (the fields of ``rules.telemetry.LogField``: block hashes, lengths, cached
tokens, the routing id), replayed with fresh hashes and later times until it has ``--lines`` lines;
PrefixLength 1024 (inside the shared first block) is the deployed setting, so the advisor has
something to recommend. Each measurement runs in a fresh child process, so its peak resident
memory (``ru_maxrss``) is its own:

- **advisor**: read the file with the lab's log reader and run ``lab.advisor.advise`` on it (the
  function's work, without the FilterLogEvents pages: about 100 pages of 1 MB, network time);
- **baseline**: read the same file and ``json.loads`` every line (the floor of any reader).

Printed: seconds and peak MB of each, and the ratio of the times. Target: the advisor within
150 s and 700 MB here, so that it fits a 1,024 MB, 5-minute Lambda whose share of a vCPU at that
memory size is smaller than this machine's core. Exit status 1 if it is missed.

    python bench/bench_advisor.py [--lines N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
TARGET_S, TARGET_MB = 150.0, 700.0

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
started = time.perf_counter()
if {mode!r} == "baseline":
    with open({path!r}) as f:
        n = sum(1 for line in f if json.loads(line))
    summary = {{"lines": n}}
else:
    from prefix_routing.lab import advisor, traces
    from prefix_routing.lab.fleet_config import FleetConfig
    window = traces.read_request_log({path!r})
    config = FleetConfig(instances=8, prefix_length=1024, concurrency_threshold=1024,
                         block_tokens=window.block_tokens, block_bytes=window.block_bytes)
    advice = advisor.advise(window, config)
    summary = {{"lines": len(window), "best_prefix_length": advice["best"]["prefix_length"],
               "better": advice["better"], "gain_points": advice["gain_points"]}}
seconds = time.perf_counter() - started
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"seconds": seconds, "peak_mb": peak_mb, **summary}}))
"""


def write_window(path: Path, lines: int) -> None:
    from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LogField as F

    records = [json.loads(line) for line in TRACE.read_text().splitlines() if line.strip()]
    span = records[-1]["timestamp"] + 1000
    written, replay = 0, 0
    with path.open("w") as out:
        while written < lines:
            for r in records:
                if written >= lines:
                    break
                prompt = r["input_length"]
                out.write(json.dumps({
                    F.MESSAGE: REQUEST_LOG_MESSAGE, F.TIMESTAMP_MS: 1_796_032_800_000 + replay * span + r["timestamp"],
                    F.BLOCK_HASHES: [f"{replay}:{h}" for h in r["hash_ids"]], F.BLOCK_BYTES: 2048,
                    F.PROMPT_TOKENS: prompt, F.CACHED_TOKENS: prompt // 3, F.OUTPUT_TOKENS: r["output_length"],
                    F.ROUTING_ID: "pa-tenant", F.STATUS: 200,
                }) + "\n")
                written += 1
            replay += 1


def measure(mode: str, path: Path) -> dict:
    code = CHILD.format(root=str(ROOT), mode=mode, path=str(path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not TRACE.is_file():
        print(f"the Mooncake trace is not at {TRACE} (../shared beside the project)", file=sys.stderr)
        return 1
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "window.jsonl"
        write_window(path, args.lines)
        size_mb = os.path.getsize(path) / 1e6
        baseline = measure("baseline", path)
        run = measure("advisor", path)
    report = {"lines": args.lines, "file_mb": size_mb, "advisor": run, "baseline": baseline,
              "ratio_to_baseline": run["seconds"] / baseline["seconds"],
              "target_s": TARGET_S, "target_mb": TARGET_MB,
              "meets_target": run["seconds"] <= TARGET_S and run["peak_mb"] <= TARGET_MB}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"advisor on {args.lines:,} request-log lines ({size_mb:.0f} MB): {run['seconds']:.1f} s, "
              f"peak {run['peak_mb']:.0f} MB (target {TARGET_S:.0f} s, {TARGET_MB:.0f} MB); recommends "
              f"PrefixLength {run['best_prefix_length']} ({run['gain_points']:+.1f} points)")
        print(f"  baseline (read and json.loads every line): {baseline['seconds']:.2f} s, peak {baseline['peak_mb']:.0f} MB")
        print(f"  ratio to baseline: {report['ratio_to_baseline']:.0f}")
    return 0 if report["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
