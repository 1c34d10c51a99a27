"""Benchmark: what the front door adds to a streamed request, as a client receives the bytes.

    python bench/bench_front_door.py [--requests 1200] [--tokens 8] [--json]

Three processes on 127.0.0.1, as in production three machines: the SageMaker runtime emulated over
the echo backend (no model time: every millisecond of a difference is a client's or a server's own
work), the front door's web app in front of it (``prefix_routing.frontdoor.local``: the same app and
invoker the function runs, behind a stand-in for the Function URL's IAM auth), and this client. The
same streamed chat body goes, one path after the other in turn (so that a noisy machine slows all
alike), each over its own keep-alive connection, after a warm-up:

* **direct (boto3)**: ``InvokeEndpointWithResponseStream`` to the emulator with boto3, as an
  application calls SageMaker without the front door (the baseline the target applies to);
* **front door**: the same body POSTed to the web app with ``http.client``, signed with SigV4 as a
  Function URL caller signs it; the web app normalizes it, calls the emulator with boto3 and streams
  the answer back;
* **direct (raw)**, for information: the request boto3 would send, written with ``http.client``
  and unsigned: the emulator's own share, so that ``front door - raw`` is all of the front door's
  work (boto3's included) and ``boto3 - raw`` the client-side cost boto3 itself adds.

Each is timed from just before the call (signing included: both the boto3 and the front door
clients sign each request) to the first byte of the answer's body (TTFB: for boto3, the first
``PayloadPart``) and to its end (TTLB). Printed: P50 and P99 per path, the front door's differences
in ms and ratios against direct (boto3), and the front door's own ``ttft_ms`` (its log line) beside
the client's TTFB through it, which should agree within the loopback's share.

Target: against direct (boto3), the front door adds at most 2 ms at P50 and 5 ms at P99 of time to
first byte (the AWS router itself adds 1.3-1.9 ms). Exit status 1 if either is missed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_P50_MS = 2.0
TARGET_P99_MS = 5.0
ENDPOINT = "default-prefix-llm"
COMPONENT = "default-prefix-llm-ic"

_EMULATOR = """
import sys, time
from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.server import RuntimeServer
server = RuntimeServer(EchoBackend(max_tokens={tokens}), record_bodies=False).start()
print(server.port, flush=True)
time.sleep(3600)
"""
_FRONT_DOOR = """
import sys, time
from prefix_routing.frontdoor.local import LocalFrontDoor
from prefix_routing.stage.config import load_stage
from prefix_routing.stage.front_door_env import front_door_environment
door = LocalFrontDoor({runtime_url!r}, front_door_environment(load_stage("default")))
print(door.server.server_address[1], flush=True)
time.sleep(3600)
"""


def _start(snippet: str, folder: Path, name: str) -> tuple[subprocess.Popen, int, Path]:
    """Start a server process; its first line of output is its port (its log lines follow, in a file:
    a pipe left unread would fill and stall it)."""
    out = folder / f"{name}.out"
    with open(out, "w") as stdout, open(folder / f"{name}.err", "w") as stderr:
        process = subprocess.Popen([sys.executable, "-c", snippet], cwd=ROOT, stdout=stdout, stderr=stderr,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        first = out.read_text().split("\n", 1)
        if len(first) == 2 and first[0].strip().isdigit():
            return process, int(first[0]), out
        time.sleep(0.05)
    process.kill()
    raise SystemExit(f"{name} did not start: {(folder / f'{name}.err').read_text()[-2000:]}")


def _body(tokens: int) -> bytes:
    system = "You answer questions about invoices for Example Corp. " * 40  # ~2 KiB, a typical system prompt
    return json.dumps({"messages": [{"role": "system", "content": system.strip()},
                                    {"role": "user", "content": "What is a pro forma invoice? " * 2}],
                       "max_tokens": tokens, "stream": True, "stream_options": {"include_usage": True}},
                      separators=(",", ":")).encode()


def _direct_request(body: bytes) -> tuple[str, dict[str, str]]:
    return (f"/endpoints/{ENDPOINT}/invocations-response-stream",
            {"content-type": "application/json", "x-amzn-sagemaker-inference-component": COMPONENT,
             "x-amzn-sagemaker-prefix-aware-id": "pa-bench", "x-amzn-sagemaker-accept": "application/json"})


def _signed_headers(url: str, body: bytes) -> dict[str, str]:
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method="POST", url=url, data=body, headers={"content-type": "application/json"})
    SigV4Auth(Credentials("bench-tenant", "not-checked-locally"), "lambda", "us-east-1").add_auth(request)
    return dict(request.headers.items())


def _read_timed(response: http.client.HTTPResponse, path: str, started: float) -> tuple[float, float]:
    first = response.read1(65536)
    first_at = time.perf_counter()
    if response.status != 200 or not first:
        raise SystemExit(f"{path}: HTTP {response.status}: {first[:300]!r}")
    while response.read1(65536):
        pass
    return (first_at - started) * 1000.0, (time.perf_counter() - started) * 1000.0


def _timed_raw(connection: http.client.HTTPConnection, path: str, headers: dict[str, str],
               body: bytes) -> tuple[float, float]:
    started = time.perf_counter()
    connection.request("POST", path, body=body, headers=headers)
    return _read_timed(connection.getresponse(), path, started)


def _timed_front_door(connection: http.client.HTTPConnection, url: str, body: bytes) -> tuple[float, float]:
    started = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", body=body, headers=_signed_headers(url, body))
    return _read_timed(connection.getresponse(), url, started)


def _timed_boto3(client, body: bytes) -> tuple[float, float]:
    started = time.perf_counter()
    answer = client.invoke_endpoint_with_response_stream(
        EndpointName=ENDPOINT, InferenceComponentName=COMPONENT, PrefixAwareId="pa-bench",
        ContentType="application/json", Body=body)
    first_at = None
    for event in answer["Body"]:
        if first_at is None and event.get("PayloadPart", {}).get("Bytes"):
            first_at = time.perf_counter()
    if first_at is None:
        raise SystemExit("direct (boto3): no PayloadPart")
    return (first_at - started) * 1000.0, (time.perf_counter() - started) * 1000.0


def _boto3_client(port: int):
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "sagemaker-runtime", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
        aws_access_key_id="bench", aws_secret_access_key="bench",
        config=Config(retries={"total_max_attempts": 1}, read_timeout=30, tcp_keepalive=True))


def _measure(runtime_port: int, door_port: int, body: bytes, requests: int, warmup: int) -> dict[str, list]:
    boto3_client = _boto3_client(runtime_port)
    raw = http.client.HTTPConnection("127.0.0.1", runtime_port, timeout=30)
    front = http.client.HTTPConnection("127.0.0.1", door_port, timeout=30)
    raw_path, raw_headers = _direct_request(body)
    door_url = f"http://127.0.0.1:{door_port}/v1/chat/completions"
    paths = (("direct (boto3)", lambda: _timed_boto3(boto3_client, body)),
             ("front door", lambda: _timed_front_door(front, door_url, body)),
             ("direct (raw)", lambda: _timed_raw(raw, raw_path, raw_headers, body)))
    times: dict[str, list] = {name: [] for name, _ in paths}
    for index in range(warmup + requests):
        shift = index % len(paths)
        for name, call in paths[shift:] + paths[:shift]:  # each path goes first in turn
            measured = call()
            if index >= warmup:
                times[name].append(measured)
    raw.close()
    front.close()
    boto3_client.close()
    return times


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(requests: int, tokens: int, warmup: int) -> dict:
    body = _body(tokens)
    with tempfile.TemporaryDirectory(prefix="bench-front-door-") as name:
        folder = Path(name)
        emulator, runtime_port, _ = _start(_EMULATOR.format(tokens=tokens), folder, "emulator")
        try:
            door, door_port, door_out = _start(
                _FRONT_DOOR.format(runtime_url=f"http://127.0.0.1:{runtime_port}"), folder, "front_door")
            try:
                times = _measure(runtime_port, door_port, body, requests, warmup)
            finally:
                door.kill()
                door.wait(10)
            logged = door_out.read_text()
        finally:
            emulator.kill()
            emulator.wait(10)
    lines = [json.loads(line) for line in logged.splitlines() if line.startswith('{"message"')]
    own_ttft = [line["ttft_ms"] for line in lines[warmup:] if line.get("status") == 200]
    return _summary(times, own_ttft, requests, tokens, len(body))


def _summary(times: dict, own_ttft: list[float], requests: int, tokens: int, body_bytes: int) -> dict:
    out: dict = {"requests_each": requests, "tokens": tokens, "body_bytes": body_bytes}
    for name, pairs in times.items():
        ttfb, ttlb = [p[0] for p in pairs], [p[1] for p in pairs]
        out[name] = {"ttfb_p50_ms": _percentile(ttfb, 0.5), "ttfb_p99_ms": _percentile(ttfb, 0.99),
                     "ttlb_p50_ms": _percentile(ttlb, 0.5), "ttlb_p99_ms": _percentile(ttlb, 0.99)}
    direct, door, raw = out["direct (boto3)"], out["front door"], out["direct (raw)"]
    out["added_ms"] = {key: door[key] - direct[key] for key in direct}
    out["ratio"] = {key: door[key] / direct[key] for key in direct}
    out["front_door_work_ms"] = {key: door[key] - raw[key] for key in raw}  # for information
    if own_ttft:
        out["front_door_logged_ttft_p50_ms"] = statistics.median(own_ttft)
    out["target_met"] = (out["added_ms"]["ttfb_p50_ms"] <= TARGET_P50_MS
                         and out["added_ms"]["ttfb_p99_ms"] <= TARGET_P99_MS)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1200, help="timed requests per path (default 1200)")
    parser.add_argument("--tokens", type=int, default=8, help="tokens per answer (default 8)")
    parser.add_argument("--warmup", type=int, default=50, help="untimed requests per path first (default 50)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if not 1 <= args.requests <= 100_000 or not 1 <= args.tokens <= 1000 or not 0 <= args.warmup <= 10_000:
        parser.error("--requests 1-100000, --tokens 1-1000, --warmup 0-10000")
    result = run(args.requests, args.tokens, args.warmup)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.requests} streamed requests per path, interleaved; {result['body_bytes']}-byte chat body, "
              f"{args.tokens} tokens; echo backend (no model time)")
        print(f"{'':22} {'TTFB P50':>9} {'TTFB P99':>9} {'TTLB P50':>9} {'TTLB P99':>9}   (ms)")
        for name in ("direct (boto3)", "front door", "direct (raw)"):
            row = result[name]
            print(f"{name:22} {row['ttfb_p50_ms']:9.2f} {row['ttfb_p99_ms']:9.2f} "
                  f"{row['ttlb_p50_ms']:9.2f} {row['ttlb_p99_ms']:9.2f}")
        added, ratio, work = result["added_ms"], result["ratio"], result["front_door_work_ms"]
        print(f"{'added vs boto3':22} {added['ttfb_p50_ms']:+9.2f} {added['ttfb_p99_ms']:+9.2f} "
              f"{added['ttlb_p50_ms']:+9.2f} {added['ttlb_p99_ms']:+9.2f}")
        print(f"{'ratio vs boto3':22} {ratio['ttfb_p50_ms']:8.2f}x {ratio['ttfb_p99_ms']:8.2f}x "
              f"{ratio['ttlb_p50_ms']:8.2f}x {ratio['ttlb_p99_ms']:8.2f}x")
        print(f"{'front door - raw':22} {work['ttfb_p50_ms']:+9.2f} {work['ttfb_p99_ms']:+9.2f} "
              f"{work['ttlb_p50_ms']:+9.2f} {work['ttlb_p99_ms']:+9.2f}   (for information)")
        if "front_door_logged_ttft_p50_ms" in result:
            print(f"the front door's own ttft_ms, P50: {result['front_door_logged_ttft_p50_ms']:.2f} "
                  f"(the client's TTFB through it: {result['front door']['ttfb_p50_ms']:.2f})")
        print(f"target: added TTFB <= +{TARGET_P50_MS:g} ms at P50 and <= +{TARGET_P99_MS:g} ms at P99: "
              f"{'met' if result['target_met'] else 'MISSED'}")
    return 0 if result["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
