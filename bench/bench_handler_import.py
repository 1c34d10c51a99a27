"""Benchmark: the normalizer Lambda handler's import time as a ratio to importing boto3 alone.

    python bench/bench_handler_import.py [--runs 15] [--pyc]

Each measurement is a fresh ``python`` subprocess that times one import statement with
``time.perf_counter`` (interpreter start-up excluded, ``sys.path`` set up before the clock starts):

* ``boto3``: ``import boto3`` (the baseline: any handler that calls SageMaker pays it);
* ``handler``: ``import handler`` from ``lambda/normalizer`` (boto3, botocore's ``Config``, and the
  library's ``frontdoor`` and ``rules``), the figure the target applies to;
* ``powertools``: the handler plus Powertools' EMF provider, for information: what the first
  request's metrics add once its answer has streamed (``prefix_routing.frontdoor.emf_document`` imports
  the provider then, keeping it off the cold start's path to the first token);
* ``server``: ``import server`` (the web app ``run.sh`` starts in Lambda: the handler plus
  ``http.server``), for information;
* ``asset boto3`` and ``asset handler``: the same imports from the synthesized asset in
  ``cdk.out`` alone (``python -I -S``, so the vendored boto3/botocore answer), when ``make synth``
  has written it, for information: what the function pays without bytecode, with the asset's size.
  The asset carries bytecode for its runtime's Python (3.14), which this Python ignores: these rows
  are the asset compiled at import, as every cold start was before; ``bench_cold_start.py``
  measures what the bytecode saves.

Runs alternate between the imports so that a noisy machine slows them alike; the figures are ratios
of medians, of wall-clock time and of the subprocess's CPU time. The target is checked on CPU time:
on a shared machine wall-clock time mostly measures the neighbours' load (on an idle one the two
agree, the imports being CPU-bound once the files are in the page cache). By default the environment decides about bytecode caches: with
``PYTHONDONTWRITEBYTECODE=1`` (as on the machines this project runs on) the project's own modules are
compiled on every run, as they are in Lambda, whose ``/var/task`` is read-only and ships no ``.pyc``
for them; ``--pyc`` instead gives each subprocess a warmed ``PYTHONPYCACHEPREFIX`` (the best case).

Target: handler import at most 1.5x boto3's, so that the front door's own code adds at most half of
what boto3 already costs every cold start before the first token. Exit status 1 if it is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAMBDA_DIR = ROOT / "lambda" / "normalizer"
TARGET = 1.5

_SNIPPET = """
import sys, time
sys.path[:0] = [{root!r}, {lambda_dir!r}]
start, cpu = time.perf_counter(), time.process_time()
{statement}
print(time.perf_counter() - start, time.process_time() - cpu)
"""
STATEMENTS = {
    "boto3": "import boto3",
    "handler": "import handler",
    "powertools": "import handler; "
                  "from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider",
    "server": "import server",
}


#: The same imports from the synthesized Lambda asset alone (``-I -S``: no site-packages, so the
#: vendored boto3/botocore answer), for information: what the function itself pays.
ASSET_STATEMENTS = {"asset boto3": "import boto3", "asset handler": "import handler"}


def find_asset() -> Path | None:
    """The normalizer's asset in ``cdk.out`` (``make synth`` writes it), or None.

    Told apart from the other functions' assets (the routing advisor's has a ``handler.py`` too) by
    what only it holds: the web app ``server.py`` and the adapter's start-up script ``run.sh``.
    """
    found = sorted((p for p in (ROOT / "cdk.out").glob("asset.*")
                    if (p / "server.py").is_file() and (p / "run.sh").is_file() and (p / "handler.py").is_file()),
                   key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def measure(module: str, env: dict[str, str], asset: Path | None = None) -> tuple[float, float]:
    """(wall-clock seconds, CPU seconds) of the module's import statement in a fresh interpreter."""
    if module in ASSET_STATEMENTS:
        code = _SNIPPET.format(root=str(asset), lambda_dir=str(asset), statement=ASSET_STATEMENTS[module])
        command, cwd = [sys.executable, "-I", "-S", "-B", "-c", code], str(asset)
    else:
        code = _SNIPPET.format(root=str(ROOT), lambda_dir=str(LAMBDA_DIR), statement=STATEMENTS[module])
        command, cwd = [sys.executable, "-c", code], str(ROOT)
    out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, check=True)
    wall, cpu = out.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="subprocesses per module (default 15)")
    parser.add_argument("--pyc", action="store_true", help="use a warmed bytecode cache for every run")
    args = parser.parse_args(argv)

    env = dict(os.environ)
    # Lambda's environment: no AWS configuration files to read, a region set.
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    cache = None
    if args.pyc:
        cache = tempfile.TemporaryDirectory(prefix="bench-pyc-")
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache.name
    asset = find_asset()
    modules = tuple(STATEMENTS) + (tuple(ASSET_STATEMENTS) if asset else ())
    for module in modules:  # warm the page cache (and the bytecode cache with --pyc); not counted
        measure(module, env, asset)
    wall: dict[str, list[float]] = {module: [] for module in modules}
    cpu: dict[str, list[float]] = {module: [] for module in modules}
    for _ in range(args.runs):
        for module in modules:
            w, c = measure(module, env, asset)
            wall[module].append(w)
            cpu[module].append(c)
    med_wall = {module: statistics.median(values) for module, values in wall.items()}
    med_cpu = {module: statistics.median(values) for module, values in cpu.items()}
    bytecode = "warmed PYTHONPYCACHEPREFIX" if args.pyc else (
        "no bytecode cache for the project's modules" if env.get("PYTHONDONTWRITEBYTECODE") else "default")
    print(f"import time, median of {args.runs} fresh subprocesses each ({bytecode}); Python {sys.version.split()[0]}")
    print(f"{'import':<12} {'wall ms':>9} {'ratio':>7} {'CPU ms':>8} {'ratio':>7}")
    for module in modules:
        print(f"{module:<12} {med_wall[module] * 1000:>9.1f} {med_wall[module] / med_wall['boto3']:>6.2f}x "
              f"{med_cpu[module] * 1000:>8.1f} {med_cpu[module] / med_cpu['boto3']:>6.2f}x")
    if asset is None:
        print("asset rows left out: no normalizer asset in cdk.out (run `make synth` first)")
    else:
        files = [p for p in asset.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        print(f"asset {asset.relative_to(ROOT)}: {len(files)} files, {size / 2**20:.1f} MiB unzipped; "
              f"asset handler / asset boto3 = {med_cpu['asset handler'] / med_cpu['asset boto3']:.2f}x CPU time "
              "(the vendored SDK, no site-packages; for information)")
    ratio_wall = med_wall["handler"] / med_wall["boto3"]
    ratio = med_cpu["handler"] / med_cpu["boto3"]
    verdict = "ok" if ratio <= TARGET else "MISSED"
    print(f"handler / boto3 = {ratio:.2f}x CPU time, {ratio_wall:.2f}x wall clock (target <= {TARGET}x on CPU time): "
          f"{verdict}")
    if cache is not None:
        cache.cleanup()
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
