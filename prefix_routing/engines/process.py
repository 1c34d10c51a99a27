"""Starting, stopping and watching local engines on 127.0.0.1, by the process ids this module started.

``start`` launches N engines of one kind (a :class:`prefix_routing.engines.engine_kind.Launch`: free
ports, each in a process group of its own), waits for ``/health`` and records each engine in a state
file: its url, its pid and the kernel's start time of that pid, and the processes it has started by
then (vLLM's engine core and worker). ``stop`` ends exactly those processes, by their ids, never by
name: SIGTERM to each engine (an engine stops its own workers), SIGKILL after a grace period to any of
them, workers included, still running. A recorded pid counts as the engine only while the same process
holds it: same start time (a reused pid has another), or, for records without one, the same program.
``status`` reads each engine's cached-prompt-token counter (and llama.cpp's ``/slots``).
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

from prefix_routing.engines.engine_kind import LLAMA_CPP, Launch
from prefix_routing.rules.errors import UserError

MAX_ENGINES = 16
STOP_GRACE_S = 30.0  # vLLM shuts its workers down in a few seconds; llama.cpp at once
KILL_WAIT_S = 10.0  # after SIGKILL, until the kernel has ended them


@dataclass(frozen=True, slots=True)
class Engine:
    url: str
    pid: int
    port: int
    log: str
    binary: str  # the program it runs (argv[0], or argv[1] for an interpreted stand-in)
    kind: str = LLAMA_CPP
    started: int | None = None  # the kernel's start time of pid (clock ticks since boot): its identity
    workers: tuple[tuple[int, int], ...] = ()  # (pid, start time) of the processes it started

    @classmethod
    def from_record(cls, record: dict) -> Engine:
        return cls(**{**record, "workers": tuple(tuple(w) for w in record.get("workers") or ())})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


# ----------------------------------------------------------------------------- processes as /proc shows them


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, parent pid, process group, start time) of ``pid``, or None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[1]), int(fields[2]), int(fields[19])


def start_time(pid: int) -> int | None:
    stat = _stat(pid)
    return None if stat is None else stat[3]


def still_running(pid: int, started: int) -> bool:
    """The process that had ``started`` as its start time still holds ``pid`` (a zombie does not run)."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and stat[3] == started


def descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, start time) of every process below ``pid``, children first."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                parents.setdefault(stat[1], []).append(int(entry.name))
    found, todo = [], list(parents.get(pid, ()))
    while todo:
        child = todo.pop(0)
        started = start_time(child)
        if started is not None:
            found.append((child, started))
            todo.extend(parents.get(child, ()))
    return found


# ----------------------------------------------------------------------------- start, stop, status


def start(count: int, launch: Launch, state: Path, *, log_dir: Path, wait_s: float | None = None) -> list[Engine]:
    """Start ``count`` engines and wait until each answers ``/health``; on failure stop what started."""
    if not 1 <= count <= MAX_ENGINES:
        raise UserError(f"engines: {count}: allowed 1 to {MAX_ENGINES}")
    if state.exists() and running(state):
        raise UserError(f"engines already running (see {state}): stop them first")
    wait_s = launch.wait_s if wait_s is None else wait_s
    log_dir.mkdir(parents=True, exist_ok=True)
    engines: list[Engine] = []
    children: list[subprocess.Popen] = []
    try:
        for index in range(count):
            port = free_port()
            log = log_dir / f"engine-{port}.log"
            with log.open("w") as out:
                process = subprocess.Popen(launch.command(port), stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=True, env=launch.env(index))
            children.append(process)
            engines.append(Engine(f"http://127.0.0.1:{port}", process.pid, port, str(log), launch.program,
                                  launch.kind, start_time(process.pid)))
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
        # Serving: every process an engine needs has started (vLLM's engine core and its worker).
        engines = [Engine(**{**asdict(e), "workers": tuple(descendants(e.pid))}) for e in engines]
    except BaseException:
        _stop_children(children)
        raise
    state.parent.mkdir(parents=True, exist_ok=True)
    tmp = state.with_suffix(".tmp")
    tmp.write_text(json.dumps({"engines": [asdict(e) for e in engines]}, indent=2))
    tmp.replace(state)
    return engines


def _stop_children(children: list[subprocess.Popen]) -> None:
    """A failed start: the engines started so far and what each has started by now, by their ids."""
    started = [Engine("", child.pid, 0, "", "", started=start_time(child.pid) or -1,
                      workers=tuple(descendants(child.pid))) for child in children]
    _terminate(started, wait=[child.wait for child in children])


def running(state: Path) -> list[Engine]:
    """The recorded engines whose process still runs (the same process: see ``_alive``)."""
    if not state.is_file():
        return []
    engines = [Engine.from_record(e) for e in json.loads(state.read_text())["engines"]]
    return [e for e in engines if _alive(e)]


def _alive(engine: Engine) -> bool:
    """The engine's pid is still the engine: same start time, or (a record without one) same program."""
    if engine.started is not None:
        return still_running(engine.pid, engine.started)
    try:
        cmdline = Path(f"/proc/{engine.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # argv[0] is the binary; an interpreted stand-in (a test's script) shows as argv[1]
    return engine.binary in [part.decode(errors="replace") for part in cmdline[:2]]


def _left(engine: Engine) -> list[int]:
    """The engine's processes still running: itself and its recorded workers."""
    pids = [engine.pid] if _alive(engine) else []
    return pids + [pid for pid, started in engine.workers if still_running(pid, started)]


def _terminate(engines: list[Engine], grace_s: float | None = None, wait=()) -> None:
    """SIGTERM to each engine still running, then SIGKILL to whatever of them and their workers is
    left after ``grace_s`` (default STOP_GRACE_S), and a wait until they are gone. ``wait``: our own
    children's ``wait`` (reaped, or they stay zombies)."""
    for engine in engines:
        if _alive(engine):
            _signal(engine.pid, signal.SIGTERM)
    _wait_gone(engines, STOP_GRACE_S if grace_s is None else grace_s)
    for engine in engines:
        for pid in _left(engine):
            _signal(pid, signal.SIGKILL)
    _wait_gone(engines, KILL_WAIT_S)
    for reap in wait:
        try:
            reap(10)
        except subprocess.TimeoutExpired:
            pass


def _wait_gone(engines: list[Engine], seconds: float) -> None:
    """Until none of ``engines`` or their workers runs, or ``seconds`` pass; reaps those that are our children."""
    deadline = time.monotonic() + seconds
    while True:
        for engine in engines:
            try:
                os.waitpid(engine.pid, os.WNOHANG)
            except ChildProcessError:
                pass
        if not any(_left(e) for e in engines) or time.monotonic() >= deadline:
            return
        time.sleep(0.1)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def stop(state: Path) -> list[Engine]:
    """End exactly the engines ``start`` recorded, by their ids; returns those it stopped."""
    if not state.is_file():
        return []
    recorded = [Engine.from_record(e) for e in json.loads(state.read_text())["engines"]]
    alive = [e for e in recorded if _left(e)]
    _terminate(alive)
    state.unlink(missing_ok=True)
    return alive


def terminate(engines: list[Engine]) -> list[Engine]:
    """End those of ``engines`` still running, workers included, by their ids (SIGTERM, SIGKILL after
    the grace period), whatever a state file says; returns those it stopped."""
    alive = [e for e in engines if _left(e)]
    _terminate(alive)
    return alive


def status(state: Path, counters: dict[str, str]) -> list[dict]:
    """Per engine: url, pid, kind, its slots (llama.cpp: id, busy, tokens held) and its cached-prompt-token
    counter (``counters``: kind → the counter's name)."""
    rows = []
    for engine in running(state):
        row: dict = {"url": engine.url, "pid": engine.pid, "kind": engine.kind, "slots": None,
                     "prompt_tokens_cached_total": None}
        try:
            if engine.kind == LLAMA_CPP:
                with urllib.request.urlopen(f"{engine.url}/slots", timeout=2) as response:
                    row["slots"] = [{"id": s.get("id"), "busy": s.get("is_processing"), "n_ctx": s.get("n_ctx")}
                                    for s in json.loads(response.read())]
            with urllib.request.urlopen(f"{engine.url}/metrics", timeout=2) as response:
                row["prompt_tokens_cached_total"] = counter_value(response.read().decode(), counters[engine.kind])
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            pass
        rows.append(row)
    return rows


def counter_value(exposition: str, name: str) -> float | None:
    """The sum of a counter's samples in Prometheus text (every label set), or None when it has none."""
    values = [float(line.split()[-1]) for line in exposition.splitlines()
              if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " ")]
    return sum(values) if values else None
