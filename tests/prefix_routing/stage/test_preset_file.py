"""Preset files (prefix_routing.stage.preset_file): the round trip, one clear error per bad field, and
the loaded preset in the lab (FleetConfig, LatencyModel.from_preset, the engine model's prefill)."""

from __future__ import annotations

import json
import math

import pytest

from prefix_routing.lab.fleet import Fleet, Request
from prefix_routing.lab.fleet_config import REQUEST_OVERHEAD_S, FleetConfig
from prefix_routing.lab.latency import LatencyModel
from prefix_routing.lab.routing import Strategy
from prefix_routing.rules.errors import UserError
from prefix_routing.stage.preset_file import (
    PresetFile,
    load_preset_file,
    read_preset_file,
    write_preset_file,
)
from prefix_routing.stage.presets import LatencyCoefficients

A, B, C, D, E = 0.0074, 0.000134, 1.8e-7, 0.00226, 8.9e-7


def content(**changes) -> PresetFile:
    base = PresetFile(
        name="local-test", coefficients=LatencyCoefficients(A, B, C, D, E), slots=2, context_per_slot=4096,
        kv_bytes_per_token=4096, model_name="tiny.gguf", model_shape=(2, 8, 64, 2),
        measured={"url": "http://127.0.0.1:8080", "date": "2026-12-01T10:00:00+00:00", "duration_s": 40.5,
                  "repeats": 3, "prefill": [{"cached_tokens": 0, "new_tokens": 256, "prompt_s": 0.05, "samples": 3}],
                  "decode": [{"context_tokens": 272, "step_s": 0.0025, "samples": 3}],
                  "fit_errors": {"prefill": {"median": 0.05, "worst": 0.2}, "decode": {"median": 0.01, "worst": 0.03}},
                  "notes": [], "sources": {"slots": "GET /slots"}},
    )
    return PresetFile(**{**base.__dict__, **changes})


@pytest.fixture
def preset_path(tmp_path):
    return write_preset_file(tmp_path / "preset.json", content())


def test_a_preset_file_round_trips(preset_path, tmp_path):
    assert read_preset_file(preset_path) == content()
    assert read_preset_file(preset_path).measured == content().measured
    assert [p.name for p in tmp_path.iterdir()] == ["preset.json"]  # no temporary file left
    bare = write_preset_file(tmp_path / "bare.json", content(model_shape=None, measured=None))
    assert read_preset_file(bare) == content(model_shape=None, measured=None)
    assert "measured" not in json.loads(bare.read_text())


def test_the_loaded_preset_is_a_lab_preset(preset_path):
    preset = load_preset_file(preset_path)
    assert preset.name == "local-test" and preset.instance.name == "local llama.cpp (CPU)"
    assert preset.model.kv_bytes_per_token == 4096 and preset.model.layers == 2 and preset.model.head_dim == 64
    assert (preset.kv_tokens, preset.max_num_seqs, preset.max_batched_tokens) == (8192, 2, 2048)
    assert (preset.tp, preset.replicas, preset.instance.gpus, preset.confidence) == (1, 1, 1, "measured")
    assert preset.decode_step_s == pytest.approx(D + E * 2048)
    assert preset.prefill_tokens_per_s == pytest.approx(4096 / (A + B * 4096 + C * 4096 * 2048))
    config = FleetConfig(instances=3, preset=preset)
    assert config.copies == 1 and config.capacity_tokens == 8192
    with pytest.raises(UserError, match="copies=2: local-test needs 1 GPUs per copy"):
        FleetConfig(instances=3, copies=2, preset=preset)
    # Without a shape the model is a stand-in with the same bytes per token.
    bare = write_preset_file(preset_path.with_name("bare.json"), content(model_shape=None, kv_bytes_per_token=1000))
    assert load_preset_file(bare).model.kv_bytes_per_token == 1000


def test_a_vllm_preset_keeps_its_block_and_its_kv_cache(tmp_path):
    vllm = content(engine_kind="vllm", block_tokens=32, cache_tokens=12_288, slots=1, context_per_slot=4096,
                   description="local vLLM (CPU)")
    path = write_preset_file(tmp_path / "vllm.json", vllm)
    engine = json.loads(path.read_text())["engine"]
    assert (engine["kind"], engine["block_tokens"], engine["kv_tokens"]) == ("vllm", 32, 12_288)
    assert read_preset_file(path) == vllm
    preset = load_preset_file(path)
    # the KV cache is vLLM's blocks, not slots × context (4,096): 12,288 tokens, served in blocks of 32
    assert (preset.kv_tokens, preset.engine_block_tokens, preset.max_num_seqs) == (12_288, 32, 1)
    assert FleetConfig(instances=2, preset=preset).engine_block == 32
    # A llama.cpp file says its kind and leaves the block to the lab's default.
    llama = load_preset_file(write_preset_file(tmp_path / "llama.json", content()))
    assert json.loads((tmp_path / "llama.json").read_text())["engine"]["kind"] == "llama.cpp"
    assert llama.engine_block_tokens == 16 and llama.kv_tokens == 2 * 4096


def test_the_latency_model_uses_the_measured_coefficients(preset_path):
    lat = LatencyModel.from_preset(load_preset_file(preset_path))
    assert (lat.prefill_constant_s, lat.prefill_s_per_token, lat.attention_s_per_token_pair) == (A, B, C)
    assert (lat.step_base_s, lat.step_s_per_context_token, lat.step_s_per_sequence) == (D, E, 0.0)
    assert (lat.chunk_tokens, lat.max_num_seqs) == (2048, 2)
    # By hand: 1,000 new after 2,000 cached: 7.4 + 134 + 0.00018·1000·2500 = 591.4 ms, + one step at
    # batch 1 and 3,000 context: 2.26 + 2.67 = 4.93 ms.
    assert lat.prefill_s(1000, 2000, 1, 3000) == pytest.approx(0.5914 + 0.00493, rel=1e-12)
    # 3,000 cold: two chunks of 2,048: 7.4 + 402 + 0.00018·3000·1500 = 1,219.4 ms + 2 × 2.26 ms.
    assert lat.prefill_s(3000, 0) == pytest.approx(1.2194 + 2 * 0.00226, rel=1e-12)
    assert lat.step_s(4, 1000) == pytest.approx(0.00226 + 0.00089, rel=1e-12)


def test_the_fleet_adds_the_constant_once_per_prefill(preset_path):
    fleet = Fleet(FleetConfig(instances=1, preset=load_preset_file(preset_path), strategy=Strategy.RANDOM,
                              cache_tokens=math.inf))
    p = fleet.submit(Request(1000, 10, [1, 2]), 0.0)
    assert p.ttft_s == pytest.approx(A + B * 1000 + C * 1000 * 500 + D + REQUEST_OVERHEAD_S, rel=1e-12)
    assert p.per_token_s == pytest.approx(D + E * 1010, rel=1e-12)


def test_write_refuses_what_load_would_refuse_and_keeps_the_old_file(preset_path):
    before = preset_path.read_text()
    bad = content(coefficients=LatencyCoefficients(A, -B, C, D, E))
    with pytest.raises(UserError, match=r"latency.prefill_s_per_token = -0.000134: must be a finite number >= 0"):
        write_preset_file(preset_path, bad)
    assert preset_path.read_text() == before and len(list(preset_path.parent.iterdir())) == 1
    with pytest.raises(UserError, match="latency.step_base_s = NaN"):
        write_preset_file(preset_path, content(coefficients=LatencyCoefficients(A, B, C, math.nan, E)))


def test_a_prompt_and_a_step_must_cost_something(preset_path):
    for coefficients, field in (((A, 0, 0, D, E), "latency.prefill_s_per_token = 0: must be > 0 when "
                                 "latency.attention_s_per_token_pair is 0"),
                                ((A, B, C, 0, 0), "latency.step_base_s = 0: must be > 0 when latency.step_s_per")):
        with pytest.raises(UserError, match=field):
            write_preset_file(preset_path, content(coefficients=LatencyCoefficients(*coefficients)))
    zeros = write_preset_file(preset_path, content(coefficients=LatencyCoefficients(0, 0, C, 0, E)))  # allowed
    assert LatencyModel.from_preset(load_preset_file(zeros)).prefill_s(100, 0) == pytest.approx(C * 100 * 50)


def _set(document: dict, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    node = document
    for key in path:
        node = node[int(key)] if key.isdigit() else node[key]
    if value is DELETE:
        del node[last]
    else:
        node[int(last) if last.isdigit() else last] = value


DELETE = object()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("format", "other", 'format = "other": must be "prefix-routing-preset"'),
        ("version", 2, "version = 2: must be 1"),
        ("version", True, "version = true: must be 1"),
        ("name", "", 'name = "": must be a non-empty string'),
        ("name", DELETE, "name = null: missing; it is required"),
        ("colour", "red", 'colour = "red": unknown key; allowed: format, version, name'),
        ("engine", [], "engine = []: must be an object with description, slots"),
        ("engine.slots", 0, "engine.slots = 0: must be an integer from 1 to 1024"),
        ("engine.slots", 1.5, "engine.slots = 1.5: must be an integer"),
        ("engine.slots", DELETE, "engine.slots = null: missing"),
        ("engine.context_per_slot", "8k", 'engine.context_per_slot = "8k": must be an integer'),
        ("engine.max_batched_tokens", 0, "engine.max_batched_tokens = 0: must be an integer"),
        ("engine.description", 5, "engine.description = 5: must be a non-empty string"),
        ("engine.kind", "sglang", 'engine.kind = "sglang": must be one of llama.cpp, vllm'),
        ("engine.block_tokens", 0, "engine.block_tokens = 0: must be an integer from 1 to 4096"),
        ("engine.kv_tokens", 12.5, "engine.kv_tokens = 12.5: must be an integer from 1"),
        ("engine.threads", 1, "engine.threads = 1: unknown key; allowed: description, slots, context_per_slot"),
        ("model.name", None, "model.name = null: must be a non-empty string"),
        ("model.kv_bytes_per_token", -1, "model.kv_bytes_per_token = -1: must be an integer from 2"),
        ("model.kv_bytes_per_token", 8192, "model.kv_bytes_per_token = 8192: must equal 2 × layers × kv_heads"),
        ("model.layers", DELETE, "model.layers = null: must be given with model.kv_heads"),
        ("model.head_dim", 0, "model.head_dim = 0: must be an integer from 1"),
        ("model.hidden", 512, "model.hidden = 512: unknown key"),
        ("latency.prefill_constant_s", -0.001, "latency.prefill_constant_s = -0.001: must be a finite number >= 0"),
        ("latency.prefill_s_per_token", -1e-9, "latency.prefill_s_per_token = -1e-09: must be a finite number >= 0"),
        ("latency.attention_s_per_token_pair", "1e-7", 'latency.attention_s_per_token_pair = "1e-7": must be a finite'),
        ("latency.step_s_per_context_token", True, "latency.step_s_per_context_token = true: must be a finite"),
        ("latency.step_s_per_context_token", DELETE, "latency.step_s_per_context_token = null: missing"),
        ("latency.step_s_per_sequence", 0.0, "latency.step_s_per_sequence = 0.0: unknown key"),
        ("measured", "yes", 'measured = "yes": must be an object with url, date'),
        ("measured.url", DELETE, "measured.url = null: missing"),
        ("measured.date", "yesterday", 'measured.date = "yesterday": must be an ISO 8601 date'),
        ("measured.duration_s", -1, "measured.duration_s = -1: must be a finite number >= 0"),
        ("measured.repeats", 0, "measured.repeats = 0: must be an integer from 1"),
        ("measured.seed", "x", 'measured.seed = "x": must be an integer'),
        ("measured.prefill", [], "measured.prefill = []: must be a non-empty list of points"),
        ("measured.prefill.0.prompt_s", 0, "measured.prefill[0].prompt_s = 0: must be a finite number > 0"),
        ("measured.prefill.0.ttft", 1, "measured.prefill[0].ttft = 1: unknown key"),
        ("measured.decode.0.samples", 0, "measured.decode[0].samples = 0: must be an integer from 1"),
        ("measured.decode.0.context_tokens", DELETE, "measured.decode[0].context_tokens = null: missing"),
        ("measured.fit_errors.decode", DELETE, "measured.fit_errors.decode = null: missing"),
        ("measured.fit_errors.prefill.worst", -0.1, "measured.fit_errors.prefill.worst = -0.1: must be a finite"),
        ("measured.notes", [1], "measured.notes = [1]: must be a list of strings"),
        ("measured.sources", {"slots": 1}, 'measured.sources = {"slots": 1}: must be an object of strings'),
        ("measured.raw", [], "measured.raw = []: unknown key"),
    ],
)
def test_every_bad_field_is_named(preset_path, field, value, message):
    document = json.loads(preset_path.read_text())
    _set(document, field, value)
    bad = preset_path.with_name("bad.json")
    bad.write_text(json.dumps(document))
    with pytest.raises(UserError) as caught:
        load_preset_file(bad)
    assert str(caught.value).startswith(f"preset file {bad}: ")
    assert message in str(caught.value)


def test_a_missing_file_not_json_and_nan_are_user_errors(tmp_path, preset_path):
    with pytest.raises(UserError, match=f"preset file {tmp_path / 'none.json'}: cannot read it"):
        load_preset_file(tmp_path / "none.json")
    (tmp_path / "text.json").write_text("not json")
    with pytest.raises(UserError, match="text.json: not JSON"):
        load_preset_file(tmp_path / "text.json")
    (tmp_path / "nan.json").write_text(preset_path.read_text().replace(f'"step_base_s": {D}', '"step_base_s": NaN'))
    with pytest.raises(UserError, match="nan.json: not JSON .*NaN is not allowed"):
        load_preset_file(tmp_path / "nan.json")
