"""``demo --engines``'s workload and the lab's prediction of it (the engines themselves: tests/test_real_engines.py)."""

from __future__ import annotations

import json

import pytest

from dataclasses import replace

from prefix_routing.cli.demo_engines import EngineDemoSpec, engine_items, predicted_case, predicted_vllm_case
from prefix_routing.stage.preset_file import PresetFile, load_preset_file, write_preset_file
from prefix_routing.stage.presets import LatencyCoefficients
from tests.prefix_routing.cli.test_lab_commands import run


@pytest.fixture
def preset(tmp_path):
    return load_preset_file(write_preset_file(tmp_path / "engine.json", PresetFile(
        name="local-test", coefficients=LatencyCoefficients(0.02, 0.00019, 1.6e-7, 0.0022, 1.6e-6), slots=1,
        context_per_slot=8192, kv_bytes_per_token=4096, model_name="tiny.gguf")))


def test_the_workload_shares_each_prefix_and_keeps_every_suffix_unique():
    spec = EngineDemoSpec(prefixes=4, requests=30)
    items = engine_items(spec)
    systems = [json.loads(item.body)["messages"][0]["content"] for item in items]
    users = [json.loads(item.body)["messages"][1]["content"] for item in items]
    assert len(items) == 30 and len(set(systems)) == 4 and len(set(users)) == 30
    assert all(len(s.encode()) > spec.prefix_length for s in systems)  # the routing key is inside the prefix


def test_the_prediction_keeps_prefixes_on_their_engine_and_random_scatters_them(preset):
    spec = EngineDemoSpec(prefixes=8, requests=80, concurrency=2)
    items = engine_items(spec)
    tokens = [len(item.body) // 4 for item in items]
    random_case = predicted_case(items, "RANDOM", "normalized", spec, preset, tokens)
    prefix_case = predicted_case(items, "PREFIX_AWARE", "normalized", spec, preset, tokens)
    assert random_case.sent == prefix_case.sent == 80
    # 8 prefixes, 2 one-slot engines keeping about 6 states each: prefix-aware misses little more
    # than the first touch of each prefix (8 of 80); random routing misses far more.
    assert prefix_case.hit_rate > random_case.hit_rate + 0.1
    assert prefix_case.ttft_p50_ms < random_case.ttft_p50_ms


def test_with_one_engine_routing_changes_nothing(preset):
    spec = EngineDemoSpec(engines=1, prefixes=4, requests=40, concurrency=1)
    items = engine_items(spec)
    tokens = [len(item.body) // 4 for item in items]
    hits = {s: predicted_case(items, s, "normalized", spec, preset, tokens).hit_rate for s in ("RANDOM", "PREFIX_AWARE")}
    assert hits["RANDOM"] == hits["PREFIX_AWARE"] > 0.5


def test_a_vllm_prediction_follows_the_engines_blocks_and_its_cache(preset):
    """Token ids of the engine's own (here: made up, 3,200 a prompt, the first 3,000 the prefix's): one
    engine, one prefix, every repeat serves the prefix's whole blocks of 32 (93 blocks: 2,976 tokens)."""
    spec = EngineDemoSpec(kind="vllm", engines=1, prefixes=1, requests=6, concurrency=1)
    items = engine_items(spec)
    n = len(items)
    assert n >= 3
    prefix = list(range(3000))
    token_ids = [prefix + [100_000 + 200 * i + j for j in range(200)] for i in range(n)]
    case = predicted_vllm_case(items, "PREFIX_AWARE", "normalized", spec, preset, token_ids)
    assert case.hit_rate == pytest.approx((n - 1) * 2976 / (n * 3200))
    # A cache of 92 blocks (2,944 tokens): a prompt's tail is evicted first, its first 92 blocks stay.
    small = predicted_vllm_case(items, "PREFIX_AWARE", "normalized", replace(spec, cache_tokens=2944), preset,
                                token_ids)
    assert small.hit_rate == pytest.approx((n - 1) * 2944 / (n * 3200))
    assert spec.engine_options() == {"kind": "vllm", "slots": 1, "context": 4096, "cache_tokens": 12_288,
                                     "block_size": 32}
    assert EngineDemoSpec().engine_options() == {"kind": "llama.cpp", "slots": 1, "cache_ram_mib": 40}


def test_demo_engines_refuses_bad_counts(capsys):
    code, _, err = run(capsys, "demo", "--engines", "0")
    assert code == 2 and "--engines 0: allowed 1 to 16" in err
    code, _, err = run(capsys, "demo", "--engines", "2", "--requests", "0")
    assert code == 2 and "--requests 0: allowed 1 to 10000" in err
    code, _, err = run(capsys, "demo", "--engine-kind", "vllm")
    assert code == 2 and "--engine-kind vllm: give --engines N" in err
