"""Engines started, watched and stopped by the process ids this module started (prefix_routing.engines.process)."""

import dataclasses
import json
import os
import signal
import time
import subprocess
import sys
from pathlib import Path

import pytest

from prefix_routing.engines import llama_cpp, process
from prefix_routing.engines.engine_kind import EngineOptions
from prefix_routing.engines.llama_cpp import LlamaCpp
from prefix_routing.rules.errors import UserError


def launch(fake_server, model, **options):
    return LlamaCpp().launch(EngineOptions(**options), binary=fake_server, model=model)


def test_start_waits_for_health_records_and_stop_ends_exactly_those(fake_server, tmp_path):
    state = tmp_path / "run" / "engines.json"
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    engines = process.start(2, launch(fake_server, model), state, log_dir=tmp_path / "logs", wait_s=20)
    try:
        assert len({e.port for e in engines}) == 2 and all(e.url == f"http://127.0.0.1:{e.port}" for e in engines)
        recorded = json.loads(state.read_text())["engines"]
        assert [r["pid"] for r in recorded] == [e.pid for e in engines]
        assert [e.pid for e in process.running(state)] == [e.pid for e in engines]
        rows = process.status(state, {"llama.cpp": "llamacpp:prompt_tokens_cached_total"})
        assert [r["prompt_tokens_cached_total"] for r in rows] == [42.0, 42.0]
        assert rows[0]["slots"] == [{"id": 0, "busy": False, "n_ctx": 8192}]
        with pytest.raises(UserError, match="engines already running"):
            process.start(1, launch(fake_server, model), state, log_dir=tmp_path / "logs")
    finally:
        stopped = process.stop(state)
    assert sorted(e.pid for e in stopped) == sorted(e.pid for e in engines)
    assert process.running(state) == [] and not state.exists()
    for engine in engines:
        assert not os.path.exists(f"/proc/{engine.pid}/cmdline") or not process._alive(engine)


def test_stop_never_kills_a_process_that_reused_a_recorded_pid(fake_server, tmp_path):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state = tmp_path / "engines.json"
        state.write_text(json.dumps({"engines": [{"url": "http://127.0.0.1:1", "pid": bystander.pid, "port": 1,
                                                  "log": "x", "binary": str(fake_server)}]}))
        assert process.stop(state) == []
        assert bystander.poll() is None  # still running: its command line is not our binary
    finally:
        bystander.kill()
        bystander.wait()


def test_an_engine_that_dies_at_start_is_a_clear_error_and_nothing_is_left(fake_server, tmp_path, monkeypatch):
    real = launch(fake_server, tmp_path / "m.gguf")
    failing = dataclasses.replace(real, command=lambda port: real.command(port) + ["--fail"])
    with pytest.raises(UserError, match=r"exited with status 3 while starting: see .*engine-\d+\.log"):
        process.start(1, failing, tmp_path / "s.json", log_dir=tmp_path, wait_s=5)
    assert not (tmp_path / "s.json").exists()


def test_the_command_line_is_local_one_thread_prefix_caching_and_metrics(tmp_path):
    command = llama_cpp.server_command(tmp_path / "llama-server", tmp_path / "m.gguf", 8123, slots=2, context=4096)
    assert command[:3] == [str(tmp_path / "llama-server"), "-m", str(tmp_path / "m.gguf")]
    pairs = dict(zip(command[3::1], command[4::1]))
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "8123" and pairs["-t"] == "1"
    assert pairs["-np"] == "2" and pairs["-c"] == "4096"
    assert "--cache-prompt" in command and "--metrics" in command
    with pytest.raises(UserError, match="engines: 0: allowed 1 to 16"):
        process.start(0, launch(Path(__file__), tmp_path / "m"), tmp_path / "s.json", log_dir=tmp_path)


def test_terminate_ends_the_engines_in_hand_when_the_state_file_is_gone(fake_server, tmp_path):
    state = tmp_path / "engines.json"
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    engines = process.start(2, launch(fake_server, model), state, log_dir=tmp_path / "logs", wait_s=20)
    state.unlink()  # stop(state) alone would find nothing to stop now
    try:
        assert process.stop(state) == []
        assert all(process._alive(e) for e in engines)
    finally:
        stopped = process.terminate(engines)
    assert sorted(e.pid for e in stopped) == sorted(e.pid for e in engines)
    assert not any(process._alive(e) for e in engines)
    assert process.terminate(engines) == []  # nothing left: nothing signalled


# ----------------------------------------------------------------------------- identity and workers


def test_an_engines_workers_are_recorded_and_stopped_by_their_ids_even_when_they_ignore_sigterm(
        fake_server, tmp_path, monkeypatch):
    monkeypatch.setattr(process, "STOP_GRACE_S", 1.0)
    state = tmp_path / "engines.json"
    real = launch(fake_server, tmp_path / "m")
    with_worker = dataclasses.replace(real, command=lambda port: real.command(port) + ["--worker"])
    (engine,) = process.start(1, with_worker, state, log_dir=tmp_path, wait_s=20)
    assert engine.started == process.start_time(engine.pid)
    (worker,) = engine.workers
    assert process.still_running(*worker) and json.loads(state.read_text())["engines"][0]["workers"] == [list(worker)]
    assert process.stop(state) == [engine]
    assert not process.still_running(engine.pid, engine.started) and not process.still_running(*worker)


def test_descendants_are_the_children_then_theirs_with_their_start_times():
    script = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']);"
              "print(c.pid, flush=True); time.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    child = None
    try:
        child = int(parent.stdout.readline())
        assert process.descendants(parent.pid) == [(child, process.start_time(child))]
        mine = [pid for pid, _ in process.descendants(os.getpid())]
        assert mine.index(parent.pid) < mine.index(child)  # breadth first: a child before its own
    finally:
        if child is not None:
            os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.wait()
        parent.stdout.close()
