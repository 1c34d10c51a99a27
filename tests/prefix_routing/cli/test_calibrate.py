"""``calibrate`` against a stand-in engine on 127.0.0.1, and ``simulate``/``tune --preset-file``."""

from __future__ import annotations

import json

import pytest

from prefix_routing.cli.main import COMMANDS
from prefix_routing.lab.fleet_config import REQUEST_OVERHEAD_S
from prefix_routing.lab.workloads import LongContextSpec, long_context_workload
from prefix_routing.stage.preset_file import PresetFile, read_preset_file, write_preset_file
from prefix_routing.stage.presets import LatencyCoefficients
from tests.prefix_routing.cli.test_lab_commands import run
from tests.prefix_routing.engines.test_calibrate import StandIn, stand_in  # noqa: F401 - a fixture, found by name

A, B, C, D, E = 0.0074, 0.000134, 1.8e-7, 0.00226, 8.9e-7


@pytest.fixture
def preset_file(tmp_path):
    return write_preset_file(tmp_path / "engine.json", PresetFile(
        name="local-test", coefficients=LatencyCoefficients(A, B, C, D, E), slots=4, context_per_slot=16384,
        kv_bytes_per_token=4096, model_name="tiny.gguf"))


def test_calibrate_writes_a_preset_the_lab_reads(capsys, stand_in, tmp_path):  # noqa: F811 - the fixture
    assert COMMANDS["calibrate"] == "calibrate"
    out_file = tmp_path / "calibrated.json"
    code, out, err = run(capsys, "calibrate", "--engine-url", stand_in + "/", "--out", out_file, "--quick")
    assert code == 0, err
    assert "prefill: ms ≈" in out and "decode:  ms per token ≈" in out and "error median" in out
    assert f"wrote {out_file}" in out and "1 slot(s) × 8192 tokens" in err
    content = read_preset_file(out_file)
    assert (content.slots, content.context_per_slot, content.kv_bytes_per_token) == (1, 8192, 4096)
    assert content.name == "local-llama.cpp-cpu" and content.description == "local llama.cpp (CPU)"
    assert content.model_shape == (2, 8, 64, 2)
    assert content.measured["url"] == stand_in and content.measured["repeats"] == 1
    assert isinstance(content.measured["seed"], int) and f"seed {content.measured['seed']}" in err  # fresh per run
    assert content.measured["sources"]["kv_bytes_per_token"] == "GET /props (the tiny model's file name)"
    assert all(r["model"] == "stand-in" for r in StandIn.requests)
    code, out, err = run(capsys, "simulate", "--workload", "long-context", "--limit", 20, "--preset-file", out_file,
                         "--no-plots", "--strategy", "RANDOM")
    assert code == 0, err
    assert "fleet: 7 × local llama.cpp (CPU), tiny-llama-l2-h512-f1408-s0.gguf TP1, 1 copy each" in out


def test_calibrate_options_override_what_the_server_says(capsys, stand_in, tmp_path):  # noqa: F811
    code, out, err = run(capsys, "calibrate", "--engine-url", stand_in, "--out", tmp_path / "p.json", "--quick",
                         "--slots", 3, "--context", 2048, "--kv-bytes-per-token", 1000, "--name", "mine", "--seed", 5,
                         "--json")
    assert code == 0, err
    printed = json.loads(out)
    assert printed["out"] == str(tmp_path / "p.json") and printed["name"] == "mine"
    assert printed["engine"]["slots"] == 3 and printed["engine"]["context_per_slot"] == 2048
    assert printed["model"] == {"name": "tiny-llama-l2-h512-f1408-s0.gguf", "kv_bytes_per_token": 1000}
    assert printed["measured"]["sources"]["slots"] == "--slots" and printed["measured"]["seed"] == 5


def test_calibrate_without_slots_information_says_which_options_to_give(capsys, tmp_path, monkeypatch):
    from prefix_routing.engines import calibrate

    monkeypatch.setattr(calibrate, "engine_info", lambda url: calibrate.EngineInfo())
    code, _, err = run(capsys, "calibrate", "--engine-url", "http://127.0.0.1:9", "--out", tmp_path / "p.json")
    assert code == 2 and "does not say how many slots" in err and "give --slots and --context" in err
    assert err.count("\n") == 1 and not (tmp_path / "p.json").exists()


def test_calibrate_on_vllm_asks_for_its_sequences_and_takes_its_longest_sequence(capsys, tmp_path, monkeypatch):
    from prefix_routing.engines import calibrate

    info = calibrate.EngineInfo(model="tiny-llama", vllm=True, block_tokens=32, kv_tokens=12_288, max_model_len=4096)
    monkeypatch.setattr(calibrate, "engine_info", lambda url: info)
    code, _, err = run(capsys, "calibrate", "--engine-url", "http://127.0.0.1:9", "--out", tmp_path / "p.json")
    assert code == 2 and err.count("\n") == 1
    assert "a vLLM engine does not say how many sequences it runs at once (--max-num-seqs): give --slots" in err
    assert "--context" not in err  # its max_model_len is the context


def test_simulate_with_a_preset_file_gives_the_hand_computed_ttft(capsys, preset_file):
    # One request on an idle copy: TTFT = a + b·n + c·n²/2 + one step per 2,048-token chunk + 15 ms.
    n = long_context_workload(LongContextSpec(), seed=0).prompt_tokens[0]
    code, out, err = run(capsys, "simulate", "--workload", "long-context", "--limit", 1, "--preset-file", preset_file,
                         "--json", "--no-plots", "--strategy", "RANDOM")
    assert code == 0, err
    result = json.loads(out)
    assert result["fleet"]["preset"] == "local-test" and result["fleet"]["copies"] == 1
    chunks = -(-n // 2048)
    expected = A + B * n + C * n * n / 2 + chunks * D + REQUEST_OVERHEAD_S
    assert result["results"][0]["ttft_p50_s"] == pytest.approx(expected, rel=1e-9)


def test_tune_with_a_preset_file(capsys, preset_file):
    code, out, err = run(capsys, "tune", "--workload", "long-context", "--limit", 40, "--preset-file", preset_file,
                         "--no-plots", "--prefix-length", 4096, "--concurrency-threshold", 16)
    assert code == 0, err
    assert "local llama.cpp (CPU), tiny.gguf TP1, 1 copy each" in out


def test_preset_and_preset_file_together_is_one_clear_error(capsys, preset_file):
    code, _, err = run(capsys, "simulate", "--workload", "long-context", "--preset", "p5.48xlarge-llama3.1-8b",
                       "--preset-file", preset_file, "--no-plots")
    assert code == 2 and "--preset p5.48xlarge-llama3.1-8b and --preset-file" in err and "give one of them" in err


def test_a_bad_preset_file_names_the_field(capsys, preset_file):
    document = json.loads(preset_file.read_text())
    document["engine"]["slots"] = 0
    preset_file.write_text(json.dumps(document))
    code, _, err = run(capsys, "tune", "--workload", "long-context", "--preset-file", preset_file, "--no-plots")
    assert code == 2 and err.count("\n") == 1
    assert f"error: preset file {preset_file}: engine.slots = 0: must be an integer from 1 to 1024" in err
