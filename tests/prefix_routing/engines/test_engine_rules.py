"""The engines' small rules (prefix_routing/engines): a KV cache's bytes per token, what a llama.cpp
server says about itself, the fits' points and their refusals, one engine's command line, and which
recorded engines still run their binary (stand-ins started here are waited for: no zombie is left
for a process that waits on its children, as mutmut does)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
import sys
import textwrap

import pytest

from prefix_routing.engines import calibrate, llama_cpp, process
from prefix_routing.engines.calibrate import DecodePoint, PrefillPoint, Sample
from prefix_routing.engines.model import ModelShape
from prefix_routing.rules.errors import UserError

# ----------------------------------------------------------------------------- KV bytes per token


def test_kv_bytes_are_k_and_v_times_layers_kv_heads_head_dim_and_two_bytes():
    # The tiny model: 2 × 2 layers × 8 KV heads × (512 / 8) × 2 bytes = 4,096.
    assert calibrate._kv_bytes(2, 512) == 4096 == calibrate.DEFAULT_KV_BYTES_PER_TOKEN
    assert calibrate._kv_bytes(4, 1024) == 2 * 4 * 8 * 128 * 2
    assert calibrate._kv_bytes(3, 768, ModelShape(heads=12, kv_heads=4)) == 2 * 3 * 4 * 64 * 2


@pytest.mark.parametrize("name, kv", [
    ("/models/tiny-llama-l4-h1024-f2816-s0.gguf", 16_384),
    ("tiny-llama-l2-h512-f1408-s7.gguf", 4096),
    ("tiny-llama-l2-h512-f1408-s7.gguf.part", None),
    ("llama-3.1-8b-q4.gguf", None),
    ("", None),
    (None, None),
])
def test_the_tiny_models_file_name_gives_its_kv_bytes(name, kv):
    assert calibrate.kv_bytes_from_model_file(name) == kv


# ----------------------------------------------------------------------------- what the server says


def answers(slots=None, props=None, models=None):
    asked = []
    table = {"/slots": slots, "/props": props, "/v1/models": models}

    def get(url):
        asked.append(url)
        return table[url.removeprefix("http://e")]
    return get, asked


def test_engine_info_reads_slots_props_and_the_first_model():
    get, asked = answers(slots=[{"id": 0, "n_ctx": 4096}, {"id": 1, "n_ctx": 2048}],
                         props={"model_path": "/m/tiny.gguf", "build_info": "b1"},
                         models={"data": [{"id": "tiny"}, {"id": "other"}]})
    info = calibrate.engine_info("http://e", get, lambda url: None)
    assert (info.slots, info.context_per_slot, info.model, info.model_file, info.llama_cpp) == (
        2, 2048, "tiny", "/m/tiny.gguf", True)
    assert asked == ["http://e/slots", "http://e/props", "http://e/v1/models"]


@pytest.mark.parametrize("slots, props, models", [
    (None, None, None),
    ([], "not a dict", {"data": []}),
    ([{"id": 0, "n_ctx": 4096}, {"id": 1}], {"model_path": 7}, {"data": [{"id": 3}]}),
    ([{"id": 0, "n_ctx": "4096"}], {}, {"data": "x"}),
    ("slots", {"model_path": None}, {"object": "list"}),
])
def test_engine_info_keeps_only_what_is_well_formed(slots, props, models):
    info = calibrate.engine_info("http://e", answers(slots, props, models)[0], lambda url: None)
    assert (info.slots, info.context_per_slot, info.model, info.model_file) == (None, None, None, None)
    assert info.llama_cpp is False


def test_a_server_with_props_but_no_build_info_is_not_llama_cpp():
    info = calibrate.engine_info("http://e", answers(props={"model_path": "/m/x.gguf"})[0], lambda url: None)
    assert info.model_file == "/m/x.gguf" and info.llama_cpp is False


# ----------------------------------------------------------------------------- the fits' points


def sample(prompt, cached, completion, ttft, per_token):
    return Sample(prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion, ttft_s=ttft,
                  per_token_s=per_token)


def test_a_prefill_point_is_the_median_of_its_samples():
    samples = [sample(1000, 200, 8, 0.30, 0.01), sample(1100, 100, 8, 0.10, 0.01), sample(900, 300, 8, 0.20, None)]
    assert calibrate._prefill_point(samples) == PrefillPoint(200, 800, 0.20, 3)


def test_a_decode_point_uses_the_timed_samples_at_half_their_answer():
    samples = [sample(1000, 0, 10, 0.3, 0.020), sample(1000, 0, 30, 0.3, 0.030), sample(1000, 0, 1, 0.3, None),
               sample(1000, 0, 20, 0.3, 0.0)]
    # Timed: the first two; contexts 1000 + 10/2 and 1000 + 30/2, medians 1010 and 0.025.
    assert calibrate._decode_point(samples) == DecodePoint(1010, pytest.approx(0.025), 2)


def test_a_fit_needs_as_many_distinct_points_as_coefficients_and_positive_times():
    with pytest.raises(UserError, match=r"^calibrate: 1 distinct decode points; the fit needs at least 2$"):
        calibrate.fit_decode([DecodePoint(100, 0.01, 1), DecodePoint(100, 0.01, 1)])
    # (numpy 2 writes the value as np.float64(-0.5): the value and the rule are what is pinned here)
    with pytest.raises(UserError, match=r"^calibrate: a decode time of .*-0\.5\)? s: times must be > 0$"):
        calibrate.fit_decode([DecodePoint(100, 0.01, 1), DecodePoint(200, -0.5, 1)])


def test_a_fit_reports_each_points_prediction_and_relative_error():
    # step = 0.01 + 0.001 × context through (0, 0.01) and (10, 0.02); a third point 20 % off.
    fit = calibrate.fit_decode([DecodePoint(0, 0.01, 1), DecodePoint(10, 0.02, 1), DecodePoint(5, 0.015, 1)])
    assert fit.coefficients == pytest.approx((0.01, 0.001))
    assert fit.predicted == pytest.approx((0.01, 0.02, 0.015)) and max(fit.relative_errors) < 1e-9
    rough = calibrate.fit_decode([DecodePoint(0, 1.0, 1), DecodePoint(1, 1.0, 1)])
    assert rough.coefficients == pytest.approx((1.0, 0.0)) and rough.worst_error == pytest.approx(0.0, abs=1e-12)


def test_of_two_fits_the_one_with_less_relative_error_wins():
    # Two points, both exact with (d, e) = (0.5, 0.5): the full model; dropping either column is worse.
    fit = calibrate.fit_decode([DecodePoint(1, 1.0, 1), DecodePoint(3, 2.0, 1)])
    assert fit.coefficients == pytest.approx((0.5, 0.5))
    assert fit.median_error == pytest.approx(0.0, abs=1e-12)


# ----------------------------------------------------------------------------- one engine's command line


def flags(command: list[str]) -> tuple[dict, set]:
    values, bare, i = {}, set(), 0
    while i < len(command):
        if i + 1 < len(command) and not command[i + 1].startswith("-"):
            values[command[i]] = command[i + 1]
            i += 2
        else:
            bare.add(command[i])
            i += 1
    return values, bare


def test_an_engine_listens_on_127_0_0_1_with_its_slots_context_threads_caching_and_metrics(tmp_path):
    command = llama_cpp.server_command(tmp_path / "llama-server", tmp_path / "m.gguf", 8123, slots=2, context=4096,
                                     threads=3, cache_ram_mib=512)
    assert command[0] == str(tmp_path / "llama-server")
    values, bare = flags(command[1:])
    assert values == {"-m": str(tmp_path / "m.gguf"), "--host": "127.0.0.1", "--port": "8123", "-t": "3", "-tb": "3",
                      "-np": "2", "-c": "4096", "--cache-ram": "512"}
    assert bare == {"--cache-prompt", "--metrics", "--no-webui"}


def test_an_engines_defaults_are_one_slot_one_thread_8192_tokens_and_llama_cpps_cache_ram(tmp_path):
    values, _ = flags(llama_cpp.server_command(tmp_path / "b", tmp_path / "m", 1)[1:])
    assert (values["-np"], values["-t"], values["-tb"], values["-c"]) == ("1", "1", "1", "8192")
    assert "--cache-ram" not in values


# ----------------------------------------------------------------------------- which engines still run


@pytest.fixture
def stand_in(tmp_path):
    """A script run by the interpreter (the binary shows as argv[1]), waited for at the end."""
    script = tmp_path / "llama-server"
    script.write_text(textwrap.dedent("""\
        import sys, time
        sys.stdout.write("up\\n"); sys.stdout.flush()
        time.sleep(60)
    """))
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"up\n"
    yield script, child
    child.kill()
    child.wait()
    child.stdout.close()


def engine(pid, binary) -> process.Engine:
    return process.Engine(url="http://127.0.0.1:1", pid=pid, port=1, log="x", binary=str(binary))


def test_an_engine_is_alive_while_its_pid_runs_its_binary(stand_in, tmp_path):
    script, child = stand_in
    assert process._alive(engine(child.pid, script))  # an interpreted stand-in: argv[1]
    assert process._alive(engine(child.pid, sys.executable))  # argv[0]
    assert not process._alive(engine(child.pid, tmp_path / "another-binary"))  # a reused pid


def test_a_pid_that_is_gone_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not process._alive(engine(child.pid, sys.executable))


def test_running_lists_the_recorded_engines_still_alive(stand_in, tmp_path):
    script, child = stand_in
    state = tmp_path / "engines.json"
    assert process.running(state) == []  # no state file
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    recorded = [engine(child.pid, script), engine(gone.pid, script), engine(child.pid, tmp_path / "other")]
    state.write_text(json.dumps({"engines": [dataclasses.asdict(e) for e in recorded]}))
    assert process.running(state) == [recorded[0]]
    (tmp_path / "a-directory").mkdir()
    assert process.running(tmp_path / "a-directory") == []


def test_a_recorded_pid_with_another_start_time_is_another_process_and_is_left_alone(tmp_path):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = process.start_time(bystander.pid)
        ours = process.Engine("http://127.0.0.1:1", bystander.pid, 1, "x", sys.executable, "vllm", started)
        reused = dataclasses.replace(ours, started=started - 1)  # the pid, held by a later process
        assert process._alive(ours) and not process._alive(reused)
        state = tmp_path / "engines.json"
        state.write_text(json.dumps({"engines": [dataclasses.asdict(reused)]}))
        assert process.stop(state) == [] and bystander.poll() is None
        worker = dataclasses.replace(reused, pid=999_999_999, workers=((bystander.pid, started - 1),))
        assert process.terminate([worker]) == [] and bystander.poll() is None  # a reused worker pid: spared
    finally:
        bystander.kill()
        bystander.wait()


def test_a_counters_value_is_the_sum_of_its_label_sets_and_nothing_else():
    exposition = "\n".join([
        "# HELP vllm:prompt_tokens_cached_total Number of cached prompt tokens.",
        "# TYPE vllm:prompt_tokens_cached_total counter",
        'vllm:prompt_tokens_cached_total{engine="0",model_name="m"} 100.0',
        'vllm:prompt_tokens_cached_total{engine="1",model_name="m"} 28',
        'vllm:prompt_tokens_cached_created{engine="0"} 1.7e9',
        'vllm:prompt_tokens_cached_total_other 5',
        "llamacpp:prompt_tokens_cached_total 42",
    ])
    assert process.counter_value(exposition, "vllm:prompt_tokens_cached_total") == 128.0
    assert process.counter_value(exposition, "llamacpp:prompt_tokens_cached_total") == 42.0
    assert process.counter_value(exposition, "vllm:prefix_cache_hits_total") is None
    spaced = 'vllm:prompt_tokens_cached_total{model_name="a model"} 7'  # a label value may hold a space
    assert process.counter_value(spaced, "vllm:prompt_tokens_cached_total") == 7.0


def test_a_processs_stat_is_read_past_its_name_whatever_the_name_holds():
    """/proc/PID/stat: ``pid (comm) state ppid pgrp ...``; a name may hold spaces and parentheses."""
    script = "open('/proc/self/comm', 'w').write('x) (y z'); import sys; print('up', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"up\n"
        state, parent, group, started = process._stat(child.pid)
        assert state in "RS" and parent == os.getpid() and group == os.getpgrp()
        assert started == int(open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[19])
        assert started >= process.start_time(os.getpid())
    finally:
        child.stdin.close()
        child.wait(10)
        child.stdout.close()
    assert process._stat(child.pid) is None


def test_a_zombie_does_not_run_and_a_reaped_pid_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process.start_time(child.pid)
    deadline = time.monotonic() + 10
    while process._stat(child.pid)[0] != "Z" and time.monotonic() < deadline:  # exited, not yet reaped
        time.sleep(0.01)
    assert process.start_time(child.pid) == started and not process.still_running(child.pid, started)
    child.wait()
    assert process.start_time(child.pid) is None and not process.still_running(child.pid, started)


def test_a_binary_named_later_on_the_command_line_is_not_the_engine(tmp_path):
    code = "print('up', flush=True); import time; time.sleep(30)"
    other = subprocess.Popen([sys.executable, "-S", "-c", code, str(tmp_path / "bin")], stdout=subprocess.PIPE)
    try:
        assert other.stdout.readline() == b"up\n"  # its own command line now, not ours
        record = process.Engine("http://127.0.0.1:1", other.pid, 1, "x", str(tmp_path / "bin"))
        assert not process._alive(record)  # argv[4]: not the program that runs
        assert not process._alive(dataclasses.replace(record, binary="-c"))  # argv[2] either
        assert process._alive(dataclasses.replace(record, binary="-S"))  # argv[1]: an interpreted stand-in's place
    finally:
        other.kill()
        other.wait()
        other.stdout.close()


def test_a_command_line_that_is_not_utf_8_is_read_with_replacements(tmp_path):
    import os

    script = tmp_path / os.fsdecode(b"engine-\xff.py")  # a file name that is not UTF-8
    script.write_text("import sys, time\nprint('up', flush=True)\ntime.sleep(30)\n")
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"up\n"
        assert process._alive(engine(child.pid, sys.executable))  # argv[0]; argv[1] read without an error
        assert not process._alive(engine(child.pid, tmp_path / "engine-.py"))
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
