"""The routing advisor's run time and memory: on 100,000 request-log lines, and on an hour at 1,000 requests/s.

Each measurement runs in a fresh child process, so its peak resident memory (``ru_maxrss``) is its
own. Two windows:

- **100,000 lines** (default, ``--lines N``): the Mooncake conversation trace (Apache-2.0,
  github.com/kvcache-ai/Mooncake; read from ../shared/traces/conversation_trace.jsonl beside the clone)
  written as the normalizer's request log (the fields of ``rules.telemetry.LogField``: block hashes,
  lengths, cached tokens, the routing id), replayed with fresh hashes and later times until it has
  ``--lines`` lines; PrefixLength 1024 (inside the shared first block) is the deployed setting, so the
  advisor has something to recommend. Timed: **advisor** (read the file with the lab's log reader and
  run ``lab.advisor.advise``: the function's work without the FilterLogEvents pages, network time),
  **reader** (the lab's log reader alone: the time to read the window) and **baseline** (``json.loads``
  of every line: the floor of any reader). Target: the advisor within 10 × the reader's time, and
  within 150 s and 700 MB (a 1,024 MB, 5-minute Lambda gets a smaller share of a vCPU than this
  machine's core).
- **an hour at N requests/s** (``--hour-rps 1000``: 3.6 million lines): the long-context workload
  (lab/workloads.py) made at that rate (its prefixes and fleet scaled with it, as in
  bench_sampling.py), written as the front door logs it (each line's ``sample_bucket`` from its routing
  key, ``sample_hot`` from the replication rule run over the hour on the fleet's copies). The
  advisor's function picks its rate from the window's volume (``advisor.function.sample_rate``, with
  the default ``max_events``), and CloudWatch Logs would return the lines that
  ``rules.sampling.filter_pattern`` matches: that filtering, CloudWatch's work, is done here untimed
  (``rules.sampling.in_sample``, the same rule) and only the returned lines are written. Timed: the
  function's part, reading those lines and ``advise`` on the miniature. Target: 300 s and 1,024 MB,
  the function's limits. Printed with the rate, the lines read and the predicted hit rate's 95 %
  band; ``--check-full`` also simulates the whole hour at the current settings (minutes, several GB)
  and prints the sample's error against it.

Exit status 1 if a target is missed.

    python bench/bench_advisor.py [--lines N] [--json]
    python bench/bench_advisor.py --hour-rps 1000 [--check-full] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
TARGET_S, TARGET_MB, TARGET_READS = 150.0, 700.0, 10.0
HOUR_TARGET_S, HOUR_TARGET_MB = 300.0, 1024.0
ROUTING_ID = "pa-tenant"

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
job = json.loads({job!r})
started = time.perf_counter()
if job["mode"] == "baseline":
    with open(job["path"]) as f:
        n = sum(1 for line in f if json.loads(line))
    summary = {{"lines": n}}
else:
    from prefix_routing.lab import advisor, traces
    from prefix_routing.lab.fleet_config import FleetConfig
    rate = job.get("rate", 1.0)
    window = traces.read_request_log(job["path"], sample_rate=rate if rate < 1.0 else None)
    summary = {{"lines": len(window)}}
    if job["mode"] == "advisor":
        config = FleetConfig(**job["fleet"], block_tokens=window.block_tokens, block_bytes=window.block_bytes)
        sampled = {{"sample": rate, "presampled": True}} if rate < 1.0 else {{}}
        advice = advisor.advise(window, config, **sampled)
        summary.update(best_prefix_length=advice["best"]["prefix_length"],
                       best_threshold=advice["best"]["concurrency_threshold"], better=advice["better"],
                       gain_points=advice["gain_points"], predicted_hit_rate=advice["current"]["predicted_hit_rate"],
                       hit_rate_band=(advice["window"].get("sample") or {{}}).get("hit_rate_band", 0.0))
seconds = time.perf_counter() - started
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"seconds": seconds, "peak_mb": peak_mb, **summary}}))
"""


def measure(mode: str, path: Path, **job) -> dict:
    code = CHILD.format(root=str(ROOT), job=json.dumps({"mode": mode, "path": str(path), **job}))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the {mode} child failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- 100,000 lines


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
                    F.ROUTING_ID: ROUTING_ID, F.STATUS: 200,
                }) + "\n")
                written += 1
            replay += 1


def lines_report(lines: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "window.jsonl"
        write_window(path, lines)
        size_mb = os.path.getsize(path) / 1e6
        baseline = measure("baseline", path)
        reader = measure("reader", path)
        run = measure("advisor", path, fleet={"instances": 8, "prefix_length": 1024, "concurrency_threshold": 1024})
    reads = run["seconds"] / reader["seconds"]
    return {"lines": lines, "file_mb": size_mb, "advisor": run, "reader": reader, "baseline": baseline,
            "ratio_to_reader": reads, "ratio_to_baseline": run["seconds"] / baseline["seconds"],
            "target_s": TARGET_S, "target_mb": TARGET_MB, "target_ratio_to_reader": TARGET_READS,
            "meets_target": run["seconds"] <= TARGET_S and run["peak_mb"] <= TARGET_MB and reads <= TARGET_READS}


def print_lines(report: dict) -> None:
    run, reader, baseline = report["advisor"], report["reader"], report["baseline"]
    print(f"advisor on {report['lines']:,} request-log lines ({report['file_mb']:.0f} MB): {run['seconds']:.1f} s, "
          f"peak {run['peak_mb']:.0f} MB (target {TARGET_S:.0f} s, {TARGET_MB:.0f} MB); recommends "
          f"PrefixLength {run['best_prefix_length']} ({run['gain_points']:+.1f} points)")
    print(f"  the lab's reader alone: {reader['seconds']:.2f} s, peak {reader['peak_mb']:.0f} MB; advisor / reader: "
          f"{report['ratio_to_reader']:.1f} (target at most {TARGET_READS:g})")
    print(f"  baseline (read and json.loads every line): {baseline['seconds']:.2f} s; advisor / baseline: "
          f"{report['ratio_to_baseline']:.0f}")


# --------------------------------------------------------------------------- an hour at N requests/s


def write_hour(path: Path, spec, block_bytes: int, rate_for) -> dict:
    """Write the hour's lines that CloudWatch would return at the rate ``rate_for(volume)`` picks.

    The volume is the hour's request count, which the function reads from the Requests metric:
    counted in a first pass of the generator (deterministic), so the rate is known before writing."""
    from prefix_routing.lab.workloads import long_context_requests
    from prefix_routing.rules import sampling
    from prefix_routing.rules.replication import HotPrefixes, ReplicationSettings
    from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LogField as F

    volume = sum(1 for _ in long_context_requests(spec))
    rate = rate_for(volume)
    limit = sampling.bucket_limit(rate)
    config = spec.fleet_config(block_bytes=float(block_bytes))
    key_at, copies = config.key_blocks - 1, config.total_copies
    hot_rule = HotPrefixes(ReplicationSettings())  # the front door's defaults, as if one environment saw it all
    t0 = 1_796_032_800_000
    returned = hot = 0
    with path.open("w") as out:
        for t, prompt, output, ids in long_context_requests(spec):
            fingerprint = f"{ids[min(key_at, len(ids) - 1)]:x}"
            bucket = sampling.sample_bucket(ROUTING_ID, fingerprint)
            is_hot = hot_rule.assign(fingerprint, t, copies)[1] > 1
            hot += is_hot
            if bucket >= limit and not is_hot:
                continue  # not returned by FilterLogEvents (rules.sampling.in_sample says the same)
            line = {F.MESSAGE: REQUEST_LOG_MESSAGE, F.TIMESTAMP_MS: t0 + int(t * 1000), F.ROUTING_ID: ROUTING_ID,
                    F.PREFIX_FINGERPRINT: fingerprint, F.BLOCK_HASHES: [f"{i:x}" for i in ids],
                    F.BLOCK_BYTES: block_bytes, F.PROMPT_TOKENS: prompt, F.OUTPUT_TOKENS: output,
                    F.STATUS: 200, F.SAMPLE_BUCKET: bucket, F.SAMPLE_HOT: is_hot}
            assert sampling.in_sample(line, rate)
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
            returned += 1
    return {"volume": volume, "rate": rate, "returned": returned, "hot_lines": hot}


def full_hit_rate(spec) -> float:
    """The whole hour simulated at the current settings (``--check-full``)."""
    from prefix_routing import lab
    from prefix_routing.lab.workloads import long_context_workload

    return lab.simulate(long_context_workload(spec), spec.fleet_config()).hit_rate


def hour_report(rps: float, check_full: bool) -> dict:
    from prefix_routing.advisor.function import AdvisorConfig, sample_rate
    from prefix_routing.lab.workloads import LongContextSpec

    spec = LongContextSpec.at_rate(rps)
    block_bytes = round(spec.block_tokens * 4)  # the reader's 4 bytes per token: the lab's blocks again
    cfg = AdvisorConfig(log_group="g", component_name="c", stage="s", instance_type="ml.p5.48xlarge", model="70B",
                        tensor_parallel_degree=8, copies_per_instance=1, copies_max=spec.instances,
                        prefix_length=spec.prefix_length, concurrency_threshold=spec.concurrency_threshold)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "returned.jsonl"
        started = time.perf_counter()
        written = write_hour(path, spec, block_bytes, lambda volume: sample_rate(cfg, volume))
        generated_s = time.perf_counter() - started
        fleet = {"instances": spec.instances, "preset": spec.preset, "prefix_length": spec.prefix_length,
                 "concurrency_threshold": spec.concurrency_threshold}
        run = measure("advisor", path, rate=written["rate"], fleet=fleet)
        file_mb = os.path.getsize(path) / 1e6
    report = {"requests_per_s": rps, **written, "max_events": cfg.max_events, "returned_mb": file_mb,
              "generated_s": generated_s, "advisor": run, "target_s": HOUR_TARGET_S, "target_mb": HOUR_TARGET_MB,
              "meets_target": run["seconds"] <= HOUR_TARGET_S and run["peak_mb"] <= HOUR_TARGET_MB}
    if check_full:
        full = full_hit_rate(spec)
        report["full_hit_rate"] = full
        report["hit_rate_error_points"] = 100.0 * (run["predicted_hit_rate"] - full)
    return report


def print_hour(report: dict) -> None:
    run = report["advisor"]
    print(f"advisor on an hour at {report['requests_per_s']:g} requests/s ({report['volume']:,} request-log lines): "
          f"rate {report['rate']:g} from the volume (max_events {report['max_events']:,}), "
          f"{report['returned']:,} lines returned by the filter ({report['returned_mb']:.0f} MB, "
          f"{report['hot_lines']:,} of the hour's lines hot), {run['lines']:,} kept")
    print(f"  read and advised: {run['seconds']:.1f} s, peak {run['peak_mb']:.0f} MB (the function's limits: "
          f"{HOUR_TARGET_S:.0f} s, {HOUR_TARGET_MB:.0f} MB); predicted hit rate now {run['predicted_hit_rate']:.2%} "
          f"± {100 * run['hit_rate_band']:.2f} points (95 %); recommends PrefixLength {run['best_prefix_length']}, "
          f"ConcurrencyThreshold {run['best_threshold']}")
    if "full_hit_rate" in report:
        print(f"  the whole hour simulated: {report['full_hit_rate']:.2%}; the sample's error "
              f"{report['hit_rate_error_points']:+.2f} points")
    print(f"  (writing the hour and CloudWatch's filtering, untimed: {report['generated_s']:.0f} s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--hour-rps", type=float, default=None, metavar="N",
                        help="instead: an hour of the long-context workload at N requests/s (1000: 3.6 million lines)")
    parser.add_argument("--check-full", action="store_true", help="--hour-rps: simulate the whole hour too")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.hour_rps is not None:
        if not 3 <= args.hour_rps <= 2000:
            parser.error(f"--hour-rps {args.hour_rps:g}: must be from 3 to 2000")
        report = hour_report(args.hour_rps, args.check_full)
        print(json.dumps(report, indent=2)) if args.json else print_hour(report)
        return 0 if report["meets_target"] else 1
    if not TRACE.is_file():
        print(f"the Mooncake conversation trace is not at {TRACE}: put conversation_trace.jsonl from "
              "github.com/kvcache-ai/Mooncake (Apache-2.0) there", file=sys.stderr)
        return 1
    report = lines_report(args.lines)
    print(json.dumps(report, indent=2)) if args.json else print_lines(report)
    return 0 if report["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
