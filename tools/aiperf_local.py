"""``make aiperf``: NVIDIA AIPerf against the local emulator, its figures beside the emulator's and the lab's.

Starts ``python -m prefix_routing emulate`` (the stage's routing over the lab's fleet model, real time; with
``--engine-kind vllm`` or ``llama.cpp``, over real local engines instead: ``make aiperf AIPERF_ENGINE=vllm``) on
a free port of 127.0.0.1, runs AIPerf from its own virtualenv (``.venv-aiperf``, see
requirements-aiperf.txt) against the emulator's OpenAI-compatible chat path with a synthetic
shared-prefix workload, then prints AIPerf's P50 time to first token and request count beside the
emulator's ``/status`` (the server's own TTFT, measured from the request read to its first chunk
written, and the fleet model's scheduled one) and the lab's prediction for the same requests
(``simulate`` over the bodies AIPerf sent, a closed loop of as many users as AIPerf's concurrency).
Exit status 0 when AIPerf and ``/status`` agree within 10 % on both, 1 when they do not, 2 on an error
(on real engines: the same request count and hit rates within a point).
On real engines there is no model schedule and no lab column: the engines' own hit rate (their
``cached_tokens``) stands beside AIPerf's, and a vLLM engine's tokenizer is AIPerf's (the engine's
model folder), so that both count the same tokens. One engine and concurrency 2 by default. TTFT is
shown, not judged: AIPerf is itself several processes, and while a vLLM engine's prefill holds one of
a 2-core machine's cores its TTFT ran 4-260 % above the server's, while a plain client of ours, read
at its socket, agreed with the server within a millisecond (the client waiting for a core, not the
engine being slower).

AIPerf is never imported here: it runs as a subprocess. Every process started here is stopped by its
id at the end, also on an error or a signal: the emulator with SIGTERM, AIPerf (which runs its
services as child processes of its own session) with SIGTERM to its process group, then SIGKILL.

    .venv/bin/python tools/aiperf_local.py [--requests 160] [--concurrency 4] [--keep-artifacts]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from prefix_routing.engines.process import free_port  # noqa: E402

AIPERF_VENV = ROOT / ".venv-aiperf"
OUT = ROOT / "out" / "aiperf"
TOLERANCE = 0.10
API_KEY = "local"  # the emulator's OpenAI path wants a bearer token, any one


class _Stop(BaseException):
    """SIGTERM: unwind so that the ``finally`` blocks stop what was started."""


def _on_sigterm(signum, frame):
    raise _Stop()


def _get_json(url: str, *, token: str | None = None, timeout: float = 5.0):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def emulator(stage: str, speed: float, log_path: Path, engine_kind: str | None = None, engines: int = 2):
    """``emulate`` in its own process on a free port; yields its URL; stopped by its pid (SIGTERM), which
    stops the engines it started by theirs."""
    port = free_port()
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    model = ["--speed", str(speed)] if engine_kind is None else \
        ["--engines", str(engines), "--engine-kind", engine_kind]
    process = subprocess.Popen(
        [sys.executable, "-m", "prefix_routing", "emulate", "--stage", stage, "--port", str(port), *model,
         "--duration", "1800"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + (60 if engine_kind is None else 900)  # vLLM engines start in 25-120 s
        while True:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{url}/ping", timeout=1).read()
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the emulator did not start; its log: {log_path}\n{_tail(log_path)}")
            time.sleep(0.1)
        yield url
    finally:
        _stop(process, "emulator", group=False)
        log.close()


def _stop(process: subprocess.Popen, name: str, *, group: bool) -> None:
    """SIGTERM (to the process group of a session leader when ``group``), then SIGKILL after 20 s."""
    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)

    if process.poll() is None:
        send(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            print(f"{name} (pid {process.pid}) did not stop on SIGTERM: SIGKILL", file=sys.stderr)
            send(signal.SIGKILL)
            process.wait(10)
    if group:  # AIPerf's own services, should any outlive it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def tokenizer_dir(engine_kind: str | None = None) -> Path:
    """AIPerf's offline tokenizer: a vLLM engine's own model folder, else one written once per
    ``.venv-aiperf`` (tools/aiperf_tokenizer.py)."""
    if engine_kind == "vllm":
        from prefix_routing.engines import vllm

        return vllm.model_path()
    path = AIPERF_VENV / "local-tokenizer"
    if not (path / "tokenizer.json").exists():
        subprocess.run([str(AIPERF_VENV / "bin" / "python"), str(ROOT / "tools" / "aiperf_tokenizer.py"), str(path)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    return path


def run_aiperf(args, base_url: str, model: str, artifacts: Path, log_path: Path) -> None:
    command = [
        str(AIPERF_VENV / "bin" / "aiperf"), "profile",
        "--model", model, "--tokenizer", str(tokenizer_dir(args.engine_kind)),
        "--url", base_url, "--endpoint-type", "chat", "--streaming", "--api-key", API_KEY,
        "--wait-for-model-mode", "models", "--wait-for-model-timeout", "30",  # reads .../v1/models first
        "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
        "--num-prefix-prompts", str(args.prefixes), "--prefix-prompt-length", str(args.prefix_tokens),
        "--isl", str(args.question_tokens), "--isl-stddev", "0", "--osl", str(args.output_tokens),
        "--use-server-token-count", "--random-seed", str(args.seed),
        "--no-server-metrics", "--no-gpu-telemetry", "--ui-type", "none",
        "--artifact-dir", str(artifacts),
    ]
    # Nothing leaves 127.0.0.1: the tokenizer is a local folder (AIPerf's offline mode would look it up in the
    # Hugging Face cache instead, and fail), and any library that still tried the Hub goes through a
    # "proxy" on a closed loopback port and fails at once; AIPerf's own client talks to the emulator directly.
    nowhere = "http://127.0.0.1:9"
    env = dict(os.environ, HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1", HTTP_PROXY=nowhere, HTTPS_PROXY=nowhere,
               ALL_PROXY=nowhere, http_proxy=nowhere, https_proxy=nowhere, all_proxy=nowhere,
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(name, None)
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=OUT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            rc = process.wait(args.timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"AIPerf did not finish within {args.timeout} s; its log: {log_path}") from None
        finally:
            _stop(process, "AIPerf", group=True)
    if rc != 0:
        raise RuntimeError(f"AIPerf exited with status {rc}; its log: {log_path}\n{_tail(log_path)}")


def lab_prediction(args, artifacts: Path, strategy: str) -> dict:
    """``simulate`` over the very bodies AIPerf sent (its inputs.json), a closed loop of ``concurrency``
    users, hashed in 64-byte blocks as the emulator hashes prompt text."""
    inputs = json.loads((artifacts / "inputs.json").read_text())
    bodies = artifacts / "bodies.jsonl"
    with open(bodies, "w") as out:
        for session in inputs["data"]:
            for payload in session["payloads"]:
                out.write(json.dumps(payload) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "prefix_routing", "simulate", str(bodies), "--format", "bodies",
         "--stage", args.stage, "--strategy", strategy, "--users", str(args.concurrency), "--api", "openai",
         "--body-block-bytes", "64", "--json", "--no-plots", "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"simulate failed: {result.stderr.strip()[-500:]}")
    return json.loads(result.stdout)["results"][0]


def _delta(a: float, b: float) -> float:
    return abs(a - b) / b if b else (0.0 if a == b else float("inf"))


def report_engines(args, aiperf: dict, status: dict) -> bool:
    """AIPerf beside the emulator's /status on real engines: TTFT, requests and the engines' hit rate."""
    backend = status["backend"]
    a_ttft, s_ttft = aiperf["time_to_first_token"]["p50"], status["ttft_ms"]["p50"]
    a_count, s_count = int(aiperf["request_count"]["avg"]), status["requests"]
    a_hit = aiperf.get("overall_usage_prompt_cache_read_pct", {}).get("avg")
    print(f"AIPerf {aiperf.get('aiperf_version', '?')} against the emulator: stage {args.stage}, {backend['strategy']}, "
          f"{len(backend['engines'])} {args.engine_kind} engine(s)")
    print(f"workload: {args.requests} requests, {args.prefixes} shared prefixes of {args.prefix_tokens:,} tokens "
          f"+ {args.question_tokens}-token questions, {args.output_tokens} output tokens, streaming, "
          f"concurrency {args.concurrency}, seed {args.seed}")
    rows = [("", "AIPerf (client)", "/status (server)"), ("P50 TTFT (ms)", f"{a_ttft:.1f}", f"{s_ttft:.1f}"),
            ("requests", f"{a_count}", f"{s_count}"),
            ("KV hit rate", "-" if a_hit is None else f"{a_hit:.1f} %",
             "-" if backend["hit_rate"] is None else f"{backend['hit_rate'] * 100:.1f} % (engines)")]
    for row in rows:
        print(f"  {row[0]:<15}" + "".join(f"{cell:>24}" for cell in row[1:]))
    ttft_gap, count_gap = _delta(a_ttft, s_ttft), _delta(a_count, s_count)
    hit_gap = None if a_hit is None or backend["hit_rate"] is None else abs(a_hit - backend["hit_rate"] * 100)
    agree = count_gap == 0 and hit_gap is not None and hit_gap <= 1.0
    print(f"AIPerf vs /status: request count {count_gap * 100:.1f} % apart, hit rate "
          f"{'unknown' if hit_gap is None else f'{hit_gap:.1f} points'} apart: "
          + ("agree" if agree else "DO NOT agree"))
    print(f"P50 TTFT {ttft_gap * 100:.1f} % apart: on real engines AIPerf's processes wait for a core that the "
          "engine's prefill holds (a client of our own agrees with /status within a millisecond), so TTFT is "
          "compared on the fleet model only")
    return agree


def report(args, aiperf: dict, status: dict, lab: dict) -> bool:
    backend = status["backend"]
    a_ttft = aiperf["time_to_first_token"]["p50"]
    a_count = int(aiperf["request_count"]["avg"])
    s_ttft = status["ttft_ms"]["p50"]
    s_count = status["requests"]
    model_ttft = backend["ttft_p50_s"] * 1000 / backend["speed"]
    a_hit = aiperf.get("overall_usage_prompt_cache_read_pct", {}).get("avg")
    instances = len(backend["instances"])
    print(f"AIPerf {aiperf.get('aiperf_version', '?')} against the emulator: stage {args.stage}, {backend['strategy']}, "
          f"{instances} x {backend['preset']}, speed {backend['speed']:g}")
    print(f"workload: {args.requests} requests, {args.prefixes} shared prefixes of {args.prefix_tokens:,} tokens "
          f"+ {args.question_tokens}-token questions, {args.output_tokens} output tokens, streaming, "
          f"concurrency {args.concurrency}, seed {args.seed}")
    rows = [
        ("", "AIPerf (client)", "/status (server)", "/status (model)", "lab (simulate)"),
        ("P50 TTFT (ms)", f"{a_ttft:.1f}", f"{s_ttft:.1f}", f"{model_ttft:.1f}", f"{lab['ttft_p50_s'] * 1000:.1f}"),
        ("requests", f"{a_count}", f"{s_count}", f"{backend['requests']}", f"{lab['requests']}"),
        ("KV hit rate", "-" if a_hit is None else f"{a_hit:.1f} %", "", f"{backend['hit_rate'] * 100:.1f} %",
         f"{lab['hit_rate'] * 100:.1f} %"),
    ]
    for row in rows:
        print(f"  {row[0]:<15}" + "".join(f"{cell:>18}" for cell in row[1:]))
    ttft_gap, count_gap = _delta(a_ttft, s_ttft), _delta(a_count, s_count)
    agree = ttft_gap <= TOLERANCE and count_gap <= TOLERANCE
    print(f"AIPerf vs /status: P50 TTFT {ttft_gap * 100:.1f} % apart, request count {count_gap * 100:.1f} % apart: "
          + ("agree within 10 %" if agree else "DO NOT agree within 10 %"))
    print(f"(server: from the request read to its first chunk written; model: the fleet model's schedule; "
          f"AIPerf's hit rate is the emulator's usage.cached_tokens as AIPerf summed it)")
    return agree


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", default="default")
    parser.add_argument("--speed", type=float, default=1.0, help="emulator speed (1: TTFTs in real milliseconds)")
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--concurrency", type=int,
                        help="AIPerf's concurrency (default 4; 2 on real engines)")
    parser.add_argument("--prefixes", type=int, default=5, help="shared prefix prompts (AIPerf --num-prefix-prompts)")
    parser.add_argument("--prefix-tokens", type=int, default=2000)
    parser.add_argument("--question-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--timeout", type=int, default=600, help="seconds AIPerf may run")
    parser.add_argument("--keep-artifacts", action="store_true", help="keep earlier runs' out/aiperf/artifacts")
    parser.add_argument("--engine-kind", choices=("llama.cpp", "vllm"),
                        help="real local engines instead of the fleet model (engines build --kind KIND first)")
    parser.add_argument("--engines", type=int, default=1,
                        help="with --engine-kind: how many (default 1: with two, the engines' processes take both of "
                             "a 2-core machine's cores from AIPerf, whose own TTFT then runs 25-30 %% above the "
                             "server's)")
    args = parser.parse_args(argv)
    if args.concurrency is None:
        args.concurrency = 2 if args.engine_kind else 4
    if not (AIPERF_VENV / "bin" / "aiperf").exists():
        print(f"{AIPERF_VENV}/bin/aiperf not found: run `make aiperf` (it installs requirements-aiperf.txt there)",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _on_sigterm)
    OUT.mkdir(parents=True, exist_ok=True)
    artifacts = OUT / "artifacts"
    if artifacts.exists() and not args.keep_artifacts:
        shutil.rmtree(artifacts)
    started = time.monotonic()
    try:
        with emulator(args.stage, args.speed, OUT / "emulator.log", args.engine_kind, args.engines) as url:
            status = _get_json(f"{url}/status")
            endpoint = _endpoint_name(args.stage)
            base = f"{url}/endpoints/{endpoint}/openai"
            model = _get_json(f"{base}/v1/models", token=API_KEY)["data"][0]["id"]
            print(f"emulator at {url} ({status['backend']['strategy']}); AIPerf against {base}, model {model}",
                  flush=True)
            run_aiperf(args, base, model, artifacts, OUT / "aiperf.log")
            status = _get_json(f"{url}/status")
        aiperf = json.loads((artifacts / "profile_export_aiperf.json").read_text())
        if args.engine_kind:
            agree = report_engines(args, aiperf, status)
        else:
            lab = lab_prediction(args, artifacts, status["backend"]["strategy"])
            agree = report(args, aiperf, status, lab)
        print(f"artifacts: {artifacts.relative_to(ROOT)} (AIPerf's log: {(OUT / 'aiperf.log').relative_to(ROOT)}); "
              f"{time.monotonic() - started:.0f} s")
        return 0 if agree else 1
    except (RuntimeError, OSError, subprocess.SubprocessError, KeyError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, _Stop):
        print("stopped", file=sys.stderr)
        return 2


def _endpoint_name(stage: str) -> str:
    from prefix_routing.stage.config import load_stage

    return load_stage(stage).endpoint_name


if __name__ == "__main__":
    sys.exit(main())
