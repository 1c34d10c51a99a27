"""No engine a test started outlives the test run (a pytest plugin, loaded by the root ``conftest.py``).

Tests and the commands they run stop the engines they start by their process ids. This plugin checks
that they did: when the whole run ends (in the controlling process, after every xdist worker), any
process started since the run began that is an engine of the engine cache (its program lies under
``.../prefix-routing/engines/``) or one of vLLM's workers (which rename themselves ``VLLM::...``)
fails the run, listed with its pid and command line. It only looks; it stops nothing: a leftover is
a bug of the test or command that started it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

ENGINE_MARKS = (b"/prefix-routing/engines/", b"VLLM::")
GRACE_S = 15.0  # engines that are being stopped at the very end get this long


def _start_time(pid: int | str) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else int(fields[19])


def engine_processes_since(started: int) -> list[tuple[int, str]]:
    """(pid, command line) of the engine processes started at or after ``started`` (clock ticks since boot)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        began = _start_time(entry.name)
        if began is None or began < started:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if any(mark in cmdline.split(b"\0", 1)[0] for mark in ENGINE_MARKS):
            found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(errors="replace").strip()[:200]))
    return found


def pytest_sessionstart(session):
    session.config._engines_since = _start_time(os.getpid())


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput") or getattr(session.config, "_engines_since", None) is None:
        return  # an xdist worker: the controller looks once every worker is done
    deadline = time.monotonic() + GRACE_S
    left = engine_processes_since(session.config._engines_since)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = engine_processes_since(session.config._engines_since)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"  pid {pid}: {cmdline}" for pid, cmdline in left]
        message = "engine processes left running after the tests (each must be stopped by its id):\n" + "\n".join(lines)
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
