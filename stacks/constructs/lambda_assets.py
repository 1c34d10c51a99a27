"""What the Python functions' assets share: the library's subpackages copied in, bytecode for the runtime's
Python, and log retention days.

Assets are laid out by copying files (``ILocalBundling``), so synth needs neither Docker nor the
network; each function copies only the subpackages of ``prefix_routing`` it runs.

Bytecode. A function's Python compiles every module it imports on every cold start unless the asset
carries ``.pyc`` files for exactly its version (``__pycache__/NAME.cpython-314.pyc`` for
``python3.14``): ``/var/task`` is read-only, so nothing compiled there is kept. The project's
Python (3.11) cannot write 3.14 bytecode (the format changes with every minor version), and pip
offers no CPython 3.14 for Linux to install beside it; Pyodide can: CPython 3.14
compiled to WebAssembly, from the npm registry, run by the Node.js that the CDK needs anyway.
:func:`compile_bytecode` runs its ``compileall`` over the laid-out asset. The files are
*checked-hash* ``.pyc`` (PEP 552): they carry a hash of their source instead of its modification
time (which the zip and the deployment need not keep), so the output is reproducible (the asset hash
stays stable), and
the runtime reads a module's source and compares hashes before it uses its bytecode: a ``.pyc``
that does not match its ``.py`` is ignored, never run. CPython's bytecode does not depend on the
machine (``marshal`` is architecture-independent), only on the minor version; if a runtime update
ever changed the 3.14 magic number (it has not changed since 3.14rc3: 3627), the runtime would
ignore the files and compile, as it does without them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from aws_cdk import aws_logs as logs

ROOT = Path(__file__).resolve().parents[2]
#: Bytecode of the machine's own Python never goes in (it is for another Python than the runtime's);
#: the runtime's own is written into the laid-out asset by :func:`compile_bytecode`.
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")

#: The compiler: Pyodide's CPython 3.14 on WebAssembly (npm package ``pyodide``; 314.0.7 is CPython
#: 3.14.2), pinned in package.json and package-lock.json, which ``make install`` installs (``npm ci``).
PYODIDE_VERSION = "314.0.7"
PYODIDE_DIR = ROOT / "node_modules" / "pyodide"
#: Compiled files by the sources they were compiled from (a hash of every path and content), so a
#: second synth of the same sources copies them instead of starting the compiler again.
PYC_CACHE = ROOT / "build" / "pyc-cache"
PYC_CACHE_KEEP = 8

# Runs in Node.js: argv = [pyodide.mjs, asset dir, expected cache tag]. The Python part compiles
# every .py under the mounted asset with the names the runtime sees (/var/task/...).
_COMPILER_JS = r"""
import { pathToFileURL } from "node:url";
const [pyodideModule, assetDir, cacheTag] = process.argv.slice(1);
const { loadPyodide } = await import(pathToFileURL(pyodideModule).href);
const out = [];
const py = await loadPyodide({ stdout: (line) => out.push(line), stderr: (line) => out.push(line) });
py.FS.mkdir("/asset");
py.FS.mount(py.FS.filesystems.NODEFS, { root: assetDir }, "/asset");
py.globals.set("CACHE_TAG", cacheTag);
const result = py.runPython(`
import compileall, py_compile, sys
if sys.implementation.cache_tag != CACHE_TAG:
    raise SystemExit(f"this compiler is {sys.implementation.cache_tag}, the runtime needs {CACHE_TAG}")
ok = compileall.compile_dir("/asset", quiet=1, stripdir="/asset", prependdir="/var/task", workers=1,
                            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
sys.stdout.flush()
"ok" if ok else "failed"
`);
process.stdout.write(out.join("\n") + "\n" + result + "\n");
process.exit(result === "ok" ? 0 : 1);
"""


def cache_tag(runtime_name: str) -> str:
    """``python3.14`` -> ``cpython-314`` (the name part of the runtime's ``.pyc`` files)."""
    if not runtime_name.startswith("python3."):
        raise ValueError(f"{runtime_name}: not a Lambda Python runtime")
    return "cpython-3" + runtime_name.removeprefix("python3.")


def _sources(out: Path) -> list[Path]:
    return sorted(p for p in out.rglob("*.py") if p.is_file() and "__pycache__" not in p.parts)


def _key(out: Path, sources: list[Path], tag: str) -> str:
    digest = hashlib.sha256(f"{PYODIDE_VERSION}\0{tag}\0{_COMPILER_JS}\0".encode())
    for path in sources:
        digest.update(path.relative_to(out).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:40]


def compiled_path(source: Path, tag: str) -> Path:
    """Where the runtime looks for ``source``'s bytecode."""
    return source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc"


def _installed_pyodide() -> str | None:
    try:
        return json.loads((PYODIDE_DIR / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def _run_compiler(out: Path, tag: str) -> None:
    if _installed_pyodide() != PYODIDE_VERSION or shutil.which("node") is None:
        raise RuntimeError(
            f"{PYODIDE_DIR} does not hold pyodide {PYODIDE_VERSION} (or node is missing): run `make install` "
            "(it installs the compiler that writes the Lambda runtime's bytecode)"
        )
    result = subprocess.run(
        ["node", "--input-type=module", "-e", _COMPILER_JS, str(PYODIDE_DIR / "pyodide.mjs"), str(out.resolve()), tag],
        capture_output=True, text=True, timeout=600, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"compiling the asset for {tag} failed:\n{result.stdout[-4000:]}{result.stderr[-4000:]}")


def compile_bytecode(out: Path, runtime_name: str) -> int:
    """Write a checked-hash ``.pyc`` for ``runtime_name``'s Python beside every ``.py`` under ``out``.

    Returns the number of modules compiled. Raises ``RuntimeError`` when the compiler is missing or
    a module does not compile.
    """
    tag = cache_tag(runtime_name)
    sources = _sources(out)
    cached = PYC_CACHE / _key(out, sources, tag)
    if not (cached / ".complete").is_file():
        _run_compiler(out, tag)
        staging = PYC_CACHE / f".tmp-{cached.name}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        for source in sources:
            target = staging / compiled_path(source.relative_to(out), tag)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(compiled_path(source, tag), target)
        (staging / ".complete").write_text(f"pyodide {PYODIDE_VERSION}, {len(sources)} modules\n")
        try:
            staging.rename(cached)
        except OSError:  # another process compiled the same sources first: theirs are the same bytes
            shutil.rmtree(staging, ignore_errors=True)
        _prune_cache()
    else:
        shutil.copytree(cached, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".complete"))
        os.utime(cached)  # recently used: kept by the pruning
    missing = [s for s in sources if not compiled_path(s, tag).is_file()]
    if missing:
        raise RuntimeError(f"no {tag} bytecode for {missing[0].relative_to(out)} ({len(missing)} modules)")
    return len(sources)


def _prune_cache() -> None:
    entries = sorted((p for p in PYC_CACHE.iterdir() if not p.name.startswith(".")),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[PYC_CACHE_KEEP:]:
        shutil.rmtree(old, ignore_errors=True)


def copy_library(out: Path, packages: tuple[str, ...], *, modules: dict[str, tuple[str, ...]] | None = None) -> None:
    """``prefix_routing/__init__.py``, the subpackages in ``packages`` whole, and of other subpackages only the
    ``modules`` named (e.g. ``{"stage": ("__init__.py", "presets.py")}``), into ``out``."""
    package = out / "prefix_routing"
    package.mkdir(exist_ok=True)
    shutil.copy2(ROOT / "prefix_routing" / "__init__.py", package / "__init__.py")
    for name in packages:
        shutil.copytree(ROOT / "prefix_routing" / name, package / name, dirs_exist_ok=True, ignore=IGNORE)
    for name, files in (modules or {}).items():
        (package / name).mkdir(exist_ok=True)
        for file in files:
            shutil.copy2(ROOT / "prefix_routing" / name / file, package / name / file)


#: The stage's ``log_retention_days`` (which allows exactly these values) as CloudWatch's enum.
RETENTION = {
    1: logs.RetentionDays.ONE_DAY, 3: logs.RetentionDays.THREE_DAYS, 5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK, 14: logs.RetentionDays.TWO_WEEKS, 30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS, 90: logs.RetentionDays.THREE_MONTHS, 120: logs.RetentionDays.FOUR_MONTHS,
    150: logs.RetentionDays.FIVE_MONTHS, 180: logs.RetentionDays.SIX_MONTHS, 365: logs.RetentionDays.ONE_YEAR,
}
