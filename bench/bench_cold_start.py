"""Benchmark: the normalizer's cold start as Lambda runs it, with and without bytecode, at the CPU
share of a memory size.

    make synth && python bench/bench_cold_start.py [--runs 7] [--memory 512 1024 1769] [--no-runtime-python]

What is measured. The synthesized asset in ``cdk.out`` alone (no site-packages, no bytecode cache of
the machine that runs it): each run is a fresh ``python -E -S -B -u server.py`` in a copy of the asset, as
``run.sh`` starts it (``-B``: ``/var/task`` is read-only, nothing compiled is kept), with the
function's environment from the synthesized template, fake credentials, and Secrets Manager answered
by a stub on 127.0.0.1 (``AWS_ENDPOINT_URL_SECRETS_MANAGER``; one ``GetSecretValue`` per run, checked).
The clock runs from the process's start to the first ``200`` of ``GET /healthz``, the Lambda Web
Adapter's readiness check (the end of the init phase: modules imported, boto3 session and clients
built, tenant key read, server listening). Not measured: Lambda's own start of the microVM, the
runtime and the adapter, the download of the code, and the first invocation's own work (first TLS
connection to SageMaker, normalizing the request). CPU time is the child's (``wait4``).

Two copies of the asset are timed, alternately, in the same run:

* ``no bytecode``: the asset without any ``.pyc``: every module compiled at import, as on every cold
  start before the asset carried its runtime's bytecode (the baseline);
* ``bytecode``: the same files with checked-hash ``.pyc`` for *this* interpreter, compiled the way the
  bundler compiles the shipped ones for the runtime's Python 3.14 (``stacks/constructs/lambda_assets.py``;
  no CPython 3.14 runs natively here, so what bytecode saves is measured with the Python that is here).

The CPU share of a memory size (Lambda allocates CPU in proportion to memory; 1,769 MB is one vCPU)
is simulated: the child is pinned to one core and, below 1,769 MB, stopped and continued in 20 ms
periods so that it runs ``memory / 1769`` of each (SIGSTOP/SIGCONT from this process; the real
throttle's period is not documented). Whether Lambda throttles the init phase like an invocation is
not documented either: the 1,769 MB row is also the figure for an unthrottled init. Each figure is the
median of ``--runs``; the CPU-time column is from the unthrottled runs.

The shipped asset is checked too: every ``.py`` must have its runtime's ``.pyc`` whose PEP 552 source
hash matches it. With ``node`` and Pyodide installed (``make install``), the shipped files themselves
are also timed by the runtime's own Python version (CPython 3.14 on WebAssembly, slower than native in
absolute terms): ``import server`` from the asset as shipped vs with its bytecode removed.

Target: the init with bytecode at most 0.75x the init without, in CPU time (the work that the memory
size's CPU share divides). Compiling was more than half of the init's CPU time in the measurement
recorded in docs/benchmarks.md (0.42x); the target leaves room for a loaded machine's noise while
still failing if the bytecode were not read at all (ratio near 1). Exit status 1 if it is missed or
the asset lacks its bytecode; without an asset in ``cdk.out`` nothing is measured (exit status 0, as
``bench_handler_import.py`` leaves its asset rows out).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from bench_handler_import import find_asset  # noqa: E402

TARGET = 0.75
ONE_VCPU_MB = 1769
THROTTLE_PERIOD_S = 0.020
READY_TIMEOUT_S = 120.0
SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:bench-tenant-key"


# ----------------------------------------------------------------------------- the shipped bytecode


def runtime_of(asset: Path) -> str:
    """The normalizer function's runtime in the synthesized template (``python3.14``)."""
    function = _function_resource(asset)
    return function["Properties"]["Runtime"]


def _function_resource(asset: Path) -> dict:
    """The normalizer's ``AWS::Lambda::Function`` in the synthesized template (the one whose code is
    this asset, else the only one whose handler is ``run.sh``)."""
    found = []
    for template in sorted((ROOT / "cdk.out").glob("*Normalizer.template.json")):
        for resource in json.loads(template.read_text())["Resources"].values():
            properties = resource.get("Properties") or {}
            if resource["Type"] == "AWS::Lambda::Function" and properties.get("Handler") == "run.sh":
                found.append(resource)
                if asset.name.removeprefix("asset.") in json.dumps(properties.get("Code")):
                    return resource
    if len(found) != 1:
        raise SystemExit(f"no single normalizer function in {ROOT / 'cdk.out'}: run `make synth`")
    return found[0]


def shipped_bytecode(asset: Path, runtime: str) -> tuple[int, list[str]]:
    """(modules, problems): each ``.py`` must have a checked-hash ``.pyc`` for the runtime's Python
    whose source hash is that of the ``.py`` beside it (PEP 552: keyed by the pyc's magic number)."""
    import _imp

    tag = "cpython-3" + runtime.removeprefix("python3.")
    problems, magics = [], set()
    sources = sorted(p for p in asset.rglob("*.py") if "__pycache__" not in p.parts)
    for source in sources:
        compiled = source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc"
        if not compiled.is_file():
            problems.append(f"{source.relative_to(asset)}: no {compiled.name}")
            continue
        header = compiled.read_bytes()[:16]
        flags = int.from_bytes(header[4:8], "little")
        magics.add(header[:4])
        if flags != 0b11:
            problems.append(f"{compiled.relative_to(asset)}: flags {flags:#b}, not a checked-hash pyc")
        elif header[8:16] != _imp.source_hash(int.from_bytes(header[:4], "little"), source.read_bytes()):
            problems.append(f"{compiled.relative_to(asset)}: its source hash is not that of {source.name}")
    others = sorted({p.name.split(".")[-2] for p in asset.rglob("*.pyc")} - {tag})
    if others:
        problems.append(f"bytecode for other Pythons: {', '.join(others)}")
    if len(magics) > 1:
        problems.append(f"{len(magics)} different magic numbers")
    return len(sources), problems


# ----------------------------------------------------------------------------- the two copies


def prepare_copies(asset: Path, work: Path) -> dict[str, Path]:
    """``no bytecode`` and ``bytecode`` (checked-hash, for this interpreter) copies of the asset."""
    bare, compiled = work / "no-bytecode", work / "bytecode"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(asset, bare, ignore=ignore)
    shutil.copytree(asset, compiled, ignore=ignore)
    subprocess.run(
        [sys.executable, "-E", "-c",
         "import compileall, py_compile, sys; sys.exit(0 if compileall.compile_dir(sys.argv[1], quiet=1, "
         "invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH) else 1)", str(compiled)],
        check=True,
    )
    return {"no bytecode": bare, "bytecode": compiled}


# ----------------------------------------------------------------------------- the stub and the environment


class _SecretsStub(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    calls = 0

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length") or 0))
        type(self).calls += 1
        body = json.dumps({"ARN": SECRET_ARN, "Name": "bench-tenant-key", "VersionId": "v1",
                           "SecretString": "k" * 64}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/x-amz-json-1.1")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def function_environment(asset: Path, secrets_url: str) -> dict[str, str]:
    """The function's environment from the template (references replaced by stand-ins), fake
    credentials, no AWS configuration files, and Secrets Manager on the stub."""
    variables = _function_resource(asset)["Properties"]["Environment"]["Variables"]
    env = {name: value if isinstance(value, str) else "bench" for name, value in variables.items()}
    env["TENANT_KEY_SECRET_ARN"] = SECRET_ARN
    env.update({
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
        "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "AKIDBENCHONLY", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_SESSION_TOKEN": "bench",
        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL_SECRETS_MANAGER": secrets_url,
    })
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ----------------------------------------------------------------------------- one cold start


def _throttle(pid: int, share: float, done: threading.Event) -> None:
    """Let the process run ``share`` of every period: SIGSTOP for the rest."""
    running = share * THROTTLE_PERIOD_S
    while not done.is_set():
        time.sleep(running)
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(THROTTLE_PERIOD_S - running)
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            return


def _ready(port: int) -> bool:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=READY_TIMEOUT_S)
        connection.request("GET", "/healthz")
        status = connection.getresponse().status
        connection.close()
        return status == 200
    except OSError:
        return False


def cold_start(copy: Path, env: dict[str, str], memory_mb: int, cpu: int) -> tuple[float, float]:
    """(seconds to the first readiness answer, CPU seconds of the process)."""
    port = _free_port()
    calls_before = _SecretsStub.calls
    share = min(1.0, memory_mb / ONE_VCPU_MB)
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-E", "-S", "-B", "-u", "server.py"], cwd=copy, env=dict(env, AWS_LWA_PORT=str(port)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    os.sched_setaffinity(process.pid, {cpu})  # one core (not preexec_fn: this process runs threads)
    done = threading.Event()
    throttle = threading.Thread(target=_throttle, args=(process.pid, share, done), daemon=True)
    if share < 1.0:
        throttle.start()
    try:
        while not _ready(port):
            if process.poll() is not None or time.perf_counter() - start > READY_TIMEOUT_S:
                raise SystemExit(f"the web app did not become ready:\n{process.stdout.read().decode()[-3000:]}")
            time.sleep(0.002)
        elapsed = time.perf_counter() - start
    finally:
        done.set()
        if throttle.is_alive():
            throttle.join()
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
            process.terminate()
    _, _, usage = os.wait4(process.pid, 0)
    output = process.stdout.read().decode()
    process.stdout.close()
    if "prefix_routing.configuration_error" in output or _SecretsStub.calls != calls_before + 1:
        raise SystemExit(f"the invoker was not built as in Lambda (GetSecretValue calls: "
                         f"{_SecretsStub.calls - calls_before}):\n{output[-3000:]}")
    return elapsed, usage.ru_utime + usage.ru_stime


# ----------------------------------------------------------------------------- the runtime's own Python


_PYODIDE_IMPORT = r"""
import { pathToFileURL } from "node:url";
const [pyodideModule, assetDir] = process.argv.slice(1);
const { loadPyodide } = await import(pathToFileURL(pyodideModule).href);
const py = await loadPyodide();
py.FS.mkdirTree("/var/task");
py.FS.mount(py.FS.filesystems.NODEFS, { root: assetDir }, "/var/task");
process.stdout.write(py.runPython(`
import os, sys, time
os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
sys.dont_write_bytecode = True
sys.path.insert(0, "/var/task")
start = time.process_time()
import server
f"{time.process_time() - start} {sys.implementation.cache_tag}"
`) + "\n");
"""


def runtime_python_import(asset: Path, runs: int) -> dict[str, float] | None:
    """Median CPU seconds of ``import server`` under Pyodide's CPython 3.14: as shipped, and bare."""
    # the pin and the place of stacks/constructs/lambda_assets.py, read without importing the CDK
    pinned = re.search(r'^PYODIDE_VERSION = "(.*)"$', (ROOT / "stacks" / "constructs" / "lambda_assets.py")
                       .read_text(), re.M)
    pyodide = ROOT / "build" / "pyodide" / "node_modules" / "pyodide"
    try:
        installed = json.loads((pyodide / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        installed = None
    if shutil.which("node") is None or pinned is None or installed != pinned.group(1):
        return None
    with tempfile.TemporaryDirectory(prefix="bench-cold-start-") as work:
        bare = Path(work) / "bare"
        shutil.copytree(asset, bare, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        copies = {"as shipped": asset, "no bytecode": bare}
        times: dict[str, list[float]] = {name: [] for name in copies}
        for _ in range(runs):
            for name, path in copies.items():
                out = subprocess.run(["node", "--input-type=module", "-e", _PYODIDE_IMPORT,
                                      str(pyodide / "pyodide.mjs"), str(path.resolve())],
                                     capture_output=True, text=True, check=True, timeout=600)
                seconds, tag = out.stdout.split()[-2:]
                times[name].append(float(seconds))
    return {name: statistics.median(values) for name, values in times.items()} | {"tag": tag}  # type: ignore[dict-item]


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="cold starts per copy and memory size (default 7)")
    parser.add_argument("--memory", type=int, nargs="+", default=[512, 1024, ONE_VCPU_MB],
                        help="memory sizes in MB whose CPU share is simulated (default 512 1024 1769)")
    parser.add_argument("--runtime-runs", type=int, default=3,
                        help="Pyodide (CPython 3.14) imports per copy (default 3; each starts Node)")
    parser.add_argument("--no-runtime-python", action="store_true", help="skip the Pyodide (CPython 3.14) rows")
    args = parser.parse_args(argv)

    asset = find_asset()
    if asset is None:  # as bench_handler_import.py does: `make bench` on a fresh checkout has no cdk.out
        print("no normalizer asset in cdk.out: nothing measured (run `make synth` first)")
        return 0
    runtime = runtime_of(asset)
    modules, problems = shipped_bytecode(asset, runtime)
    cpu = max(os.sched_getaffinity(0))
    memories = sorted(set(args.memory))

    stub = ThreadingHTTPServer(("127.0.0.1", 0), _SecretsStub)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    env = function_environment(asset, f"http://127.0.0.1:{stub.server_address[1]}")
    with tempfile.TemporaryDirectory(prefix="bench-cold-start-") as work:
        copies = prepare_copies(asset, Path(work))
        for name, copy in copies.items():  # warm the page cache; not counted
            cold_start(copy, env, ONE_VCPU_MB, cpu)
        ready: dict[tuple[str, int], list[float]] = {(n, m): [] for n in copies for m in memories}
        cpu_s: dict[str, list[float]] = {n: [] for n in copies}
        for _ in range(args.runs):
            for memory in memories:
                for name, copy in copies.items():
                    elapsed, used = cold_start(copy, env, memory, cpu)
                    ready[(name, memory)].append(elapsed)
                    if memory >= ONE_VCPU_MB:
                        cpu_s[name].append(used)
    stub.shutdown()
    if not any(m >= ONE_VCPU_MB for m in memories):
        print(f"--memory must include {ONE_VCPU_MB} (the unthrottled runs give the CPU time)")
        return 2

    median_cpu = {name: statistics.median(values) for name, values in cpu_s.items()}
    load = os.getloadavg()[0]
    print(f"cold start to the first readiness answer, median of {args.runs} fresh processes per cell; "
          f"Python {sys.version.split()[0]} (-E -S -B), one core, load average {load:.1f}")
    print(f"asset {asset.relative_to(ROOT)} ({runtime}); CPU share simulated as memory/{ONE_VCPU_MB} "
          f"(SIGSTOP/SIGCONT, {THROTTLE_PERIOD_S * 1000:.0f} ms periods)")
    header = f"{'memory MB':>9} {'share':>6} " + " ".join(f"{name + ' ms':>16}" for name in copies) + f" {'ratio':>7}"
    print(header)
    for memory in memories:
        row = {name: statistics.median(ready[(name, memory)]) for name in copies}
        print(f"{memory:>9} {min(1.0, memory / ONE_VCPU_MB):>6.2f} "
              + " ".join(f"{row[name] * 1000:>16.0f}" for name in copies)
              + f" {row['bytecode'] / row['no bytecode']:>6.2f}x")
    ratio = median_cpu["bytecode"] / median_cpu["no bytecode"]
    print(f"CPU time to ready (unthrottled): no bytecode {median_cpu['no bytecode'] * 1000:.0f} ms, "
          f"bytecode {median_cpu['bytecode'] * 1000:.0f} ms, ratio {ratio:.2f}x; scaled by {ONE_VCPU_MB}/memory: "
          + ", ".join(f"{m} MB {median_cpu['no bytecode'] * ONE_VCPU_MB / min(m, ONE_VCPU_MB):.2f} s -> "
                      f"{median_cpu['bytecode'] * ONE_VCPU_MB / min(m, ONE_VCPU_MB):.2f} s" for m in memories))

    if not args.no_runtime_python:
        shipped = runtime_python_import(asset, args.runtime_runs)
        if shipped is None:
            print("runtime-Python rows left out: node or Pyodide missing (run `make install`)")
        else:
            print(f"import server under Pyodide ({shipped['tag']}, WebAssembly), median of {args.runtime_runs}: "
                  f"as shipped {shipped['as shipped'] * 1000:.0f} ms CPU, without its bytecode "
                  f"{shipped['no bytecode'] * 1000:.0f} ms, ratio {shipped['as shipped'] / shipped['no bytecode']:.2f}x "
                  "(for information)")

    if problems:
        print(f"shipped bytecode: {len(problems)} problems in {modules} modules, e.g. " + "; ".join(problems[:3]))
    else:
        print(f"shipped bytecode: all {modules} modules have a checked-hash {runtime} .pyc matching their source")
    verdict = "ok" if ratio <= TARGET and not problems else "MISSED"
    print(f"bytecode / no bytecode = {ratio:.2f}x CPU time to ready (target <= {TARGET}x, and bytecode shipped "
          f"for every module): {verdict}")
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
