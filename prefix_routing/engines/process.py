"""Starting, stopping and watching real engines on 127.0.0.1, by the process ids this module started.

``start`` launches N ``llama-server`` processes (free ports, one thread each, prefix caching on,
``--metrics``), waits for ``/health`` and records each engine (url, pid, port, log) in a state file;
``stop`` ends exactly those processes, by their ids (after checking that each id still runs the
binary it started), never by name; ``status`` reads each engine's ``/slots`` and ``/metrics``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from prefix_routing.rules.errors import UserError

CACHED_COUNTER = "llamacpp:prompt_tokens_cached_total"


@dataclass(frozen=True, slots=True)
class Engine:
    url: str
    pid: int
    port: int
    log: str
    binary: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(binary: Path, model: Path, port: int, *, slots: int = 1, context: int = 8192,
                   threads: int = 1, cache_ram_mib: int | None = None) -> list[str]:
    """One engine: 127.0.0.1 only, ``threads`` threads, ``slots`` slots sharing ``context`` tokens,
    prompt caching on (the server's default; said explicitly), metrics on. ``cache_ram_mib``: the
    host-memory LRU of saved slot states (llama.cpp's ``--cache-ram``; None: its default, 8,192 MiB,
    which holds about two million tokens of the tiny model: an engine that forgets nothing)."""
    command = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
               "-tb", str(threads), "-np", str(slots), "-c", str(context), "--cache-prompt", "--metrics",
               "--no-webui"]
    if cache_ram_mib is not None:
        command += ["--cache-ram", str(cache_ram_mib)]
    return command


def _healthy(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start(count: int, binary: Path, model: Path, state: Path, *, log_dir: Path, wait_s: float = 60.0,
          **options) -> list[Engine]:
    """Start ``count`` engines and wait until each answers ``/health``; on failure stop what started."""
    if not 1 <= count <= 16:
        raise UserError(f"engines: {count}: allowed 1 to 16")
    if state.exists() and running(state):
        raise UserError(f"engines already running (see {state}): stop them first")
    log_dir.mkdir(parents=True, exist_ok=True)
    engines, children = [], []
    try:
        for _ in range(count):
            port = free_port()
            log = log_dir / f"engine-{port}.log"
            with log.open("w") as out:
                process = subprocess.Popen(server_command(binary, model, port, **options), stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True)
            children.append(process)
            engines.append(Engine(f"http://127.0.0.1:{port}", process.pid, port, str(log), str(binary)))
        deadline = time.monotonic() + wait_s
        for engine, child in zip(engines, children):
            while not _healthy(engine.url):
                # Our own child: its Popen knows whether it exited (a /proc read right after the
                # start once saw a live engine as gone, and left it running).
                if child.poll() is not None:
                    raise UserError(f"engine on port {engine.port} (pid {engine.pid}) exited with status "
                                    f"{child.returncode} while starting: see {engine.log}")
                if time.monotonic() > deadline:
                    raise UserError(f"engine on port {engine.port} did not become healthy within {wait_s:g} s: "
                                    f"see {engine.log}")
                time.sleep(0.2)
    except BaseException:
        for child in children:  # by the ids this call started, whatever /proc says
            if child.poll() is None:
                child.terminate()
        for child in children:
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        raise
    state.parent.mkdir(parents=True, exist_ok=True)
    tmp = state.with_suffix(".tmp")
    tmp.write_text(json.dumps({"engines": [asdict(e) for e in engines]}, indent=2))
    tmp.replace(state)
    return engines


def running(state: Path) -> list[Engine]:
    """The recorded engines whose process still runs the binary that was started."""
    if not state.is_file():
        return []
    engines = [Engine(**e) for e in json.loads(state.read_text())["engines"]]
    return [e for e in engines if _alive(e)]


def _alive(engine: Engine) -> bool:
    """The pid exists and is still our binary (a pid can be reused by another program)."""
    try:
        cmdline = Path(f"/proc/{engine.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # argv[0] is the binary; an interpreted stand-in (a test's script) shows as argv[1]
    return engine.binary in [part.decode(errors="replace") for part in cmdline[:2]]


def _terminate(engines: list[Engine], wait_s: float = 10.0) -> None:
    for engine in engines:
        if _alive(engine):
            os.kill(engine.pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    for engine in engines:
        while _alive(engine) and time.monotonic() < deadline:
            try:
                os.waitpid(engine.pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.1)
        if _alive(engine):
            os.kill(engine.pid, signal.SIGKILL)


def stop(state: Path) -> list[Engine]:
    """End exactly the engines ``start`` recorded, by their ids; returns those it stopped."""
    alive = running(state)
    _terminate(alive)
    state.unlink(missing_ok=True)
    return alive


def terminate(engines: list[Engine]) -> list[Engine]:
    """End those of ``engines`` still running their binary, by their ids (SIGTERM, SIGKILL after 10 s),
    whatever a state file says; returns those it stopped."""
    alive = [e for e in engines if _alive(e)]
    _terminate(alive)
    return alive


def status(state: Path) -> list[dict]:
    """Per engine: url, pid, its slots (id, busy, tokens held) and its cached-prompt-token counter."""
    rows = []
    for engine in running(state):
        row: dict = {"url": engine.url, "pid": engine.pid, "slots": None, "prompt_tokens_cached_total": None}
        try:
            with urllib.request.urlopen(f"{engine.url}/slots", timeout=2) as response:
                row["slots"] = [{"id": s.get("id"), "busy": s.get("is_processing"), "n_ctx": s.get("n_ctx")}
                                for s in json.loads(response.read())]
            with urllib.request.urlopen(f"{engine.url}/metrics", timeout=2) as response:
                for line in response.read().decode().splitlines():
                    if line.startswith(CACHED_COUNTER):
                        row["prompt_tokens_cached_total"] = float(line.split()[-1])
        except (urllib.error.URLError, OSError, ValueError):
            pass
        rows.append(row)
    return rows
