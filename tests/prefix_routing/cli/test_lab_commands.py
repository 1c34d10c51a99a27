"""The analyze / simulate / tune commands: flags, JSON keys, one-line errors with exit status 2."""

import json
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from prefix_routing.cli.main import main
from tests.conftest import MOONCAKE_SLICE, require_shared_trace

REPO_ROOT = Path(__file__).resolve().parents[3]


def run(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit:  # argparse's own errors (bad flag values)
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


def _head(tmp_path, broken: bool) -> Path:
    with MOONCAKE_SLICE.open() as f:
        lines = [next(f).rstrip("\n") for _ in range(400)]
    if broken:
        lines.insert(2, '{"timestamp": 1, "input_length": 5')
    path = tmp_path / ("broken.jsonl" if broken else "small.jsonl")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def small(tmp_path):
    """The first 400 requests of the real trace (from the slice kept in tests/data)."""
    return _head(tmp_path, broken=False)


@pytest.fixture
def broken(tmp_path):
    """The same with one broken line (line 3)."""
    return _head(tmp_path, broken=True)


def test_analyze_json(capsys):
    code, out, err = run(capsys, "analyze", require_shared_trace(), "--json")
    assert code == 0
    a = json.loads(out)
    for key in ("requests", "duration_s", "first_block_reuse", "hit_rate_bound", "key_groups"):
        assert key in a
    assert a["requests"] == 12_031
    assert {"blocks", "distinct", "largest_share"} <= set(a["key_groups"][0])
    assert [(g["blocks"], g["distinct"]) for g in a["key_groups"][:2]] == [(1, 1), (2, 7_373)]


def test_analyze_text(capsys):
    code, out, _ = run(capsys, "analyze", require_shared_trace())
    assert code == 0
    assert "requests: 12,031 over 3,537 s" in out
    assert "36.6% of blocks" in out
    assert "warning: a PrefixLength of 2048 bytes or less" in out


def test_simulate_json_keys_and_broken_lines(capsys, broken, tmp_path):
    code, out, err = run(
        capsys, "simulate", broken, "--json", "--instances", 4, "--strategy", "RANDOM", "--strategy", "prefix_aware",
        "--prefix-length", 4096, "--concurrency-threshold", 8, "--cache-tokens", "500k", "--seed", 3,
        "--out-dir", tmp_path / "plots",
    )
    assert code == 0, err
    result = json.loads(out)
    assert [r["strategy"] for r in result["results"]] == ["RANDOM", "PREFIX_AWARE"]
    for r in result["results"]:
        for key in ("strategy", "hit_rate", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "max_mean_requests", "spills"):
            assert key in r
        assert len(r["instance_request_share"]) == 4
    assert result["fleet"]["cache_tokens"] == 500_000 and result["fleet"]["concurrency_threshold"] == 8
    assert result["trace"]["requests"] == 400 and result["trace"]["skipped"]["count"] == 1
    assert f"warning: {broken}:3: invalid JSON line" in err
    assert "skipped 1 of 401 lines: 1 invalid JSON line" in err
    assert sorted(Path(p).name for p in result["plots"]) == ["hit_rate_over_time.png", "load_per_instance.png", "ttft_cdf.png"]


def test_simulate_text_table(capsys, small):
    code, out, _ = run(capsys, "simulate", small, "--limit", 200, "--no-plots", "--cache-tokens", "infinite")
    assert code == 0
    assert "hit rate (tokens)" in out and "PREFIX_AWARE" in out and "KV_AWARE" in out
    assert "unbounded" in out


def test_simulate_the_long_context_workload(capsys):
    code, out, err = run(capsys, "simulate", "--workload", "long-context", "--json", "--no-plots", "--strategy", "RANDOM", "--strategy", "PREFIX_AWARE")
    assert code == 0, err
    result = json.loads(out)
    assert result["fleet"]["instances"] == 7 and result["fleet"]["concurrency_threshold"] == 10
    random_, prefix = result["results"]
    assert prefix["ttft_p50_s"] <= 0.4 * random_["ttft_p50_s"]


def test_tune_json(capsys, small, tmp_path):
    code, out, err = run(
        capsys, "tune", small, "--json", "--instances", 4, "--prefix-length", 2048, "--prefix-length", 8192,
        "--concurrency-threshold", 2, "--concurrency-threshold", 64, "--out-dir", tmp_path,
    )
    assert code == 0, err
    result = json.loads(out)
    assert len(result["points"]) == 4
    assert {"prefix_length", "concurrency_threshold", "hit_rate", "ttft_p50_s", "max_mean_requests"} <= set(result["recommendation"])
    assert result["snippet"].startswith("[routing]\nstrategy = \"PREFIX_AWARE\"")
    assert Path(result["plots"][0]).name == "tune_heatmap.png"


def test_tune_text(capsys, small):
    code, out, _ = run(capsys, "tune", small, "--limit", 200, "--no-plots", "--prefix-length", 4096, "--concurrency-threshold", 16)
    assert code == 0
    assert "recommended: PrefixLength 4096" in out
    assert "prefix_length = 4096" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["simulate", "/no/such/trace.jsonl"], "trace file not found: /no/such/trace.jsonl"),
        (["simulate", "{small}", "--strategy", "FASTEST"], "argument --strategy: unknown routing strategy 'FASTEST'; allowed: RANDOM,"),
        (["analyze", "{small}", "--prefix-length", "100"], "argument --prefix-length: 100: must be from 1024 to 65536"),
        (["simulate", "--workload", "long-context", "{small}"], "give either TRACE or --workload"),
        (["simulate", "{small}", "--prefix-length", "512"], "error: argument --prefix-length: 512: must be from 1024 to 65536"),
        (["simulate", "{small}", "--prefix-length", "70000"], "argument --prefix-length: 70000: must be from 1024 to 65536"),
        (["tune", "{small}", "--concurrency-threshold", "0"], "argument --concurrency-threshold: 0: must be from 1 to 1024"),
        (["simulate", "{small}", "--concurrency-threshold", "2000"], "argument --concurrency-threshold: 2000: must be from 1 to 1024"),
        (["simulate", "{small}", "--cache-tokens", "lots"], "argument --cache-tokens: 'lots': takes a token count"),
        (["simulate", "{small}", "--preset", "p9"], "unknown preset 'p9'"),
        (["simulate", "{small}", "--copies", "2"], "at most 1 copies per instance"),
        (["analyze", "{broken}", "--strict"], "broken.jsonl:3: invalid JSON line"),
        (["analyze"], "no trace: give a TRACE file"),
    ],
)
def test_bad_input_is_one_line_and_status_2(capsys, small, broken, argv, message):
    code, out, err = run(capsys, *[a.replace("{small}", str(small)).replace("{broken}", str(broken)) for a in argv])
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert message in err


def test_the_real_process_exits_2_with_one_line(tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}\nnot json\n')
    proc = subprocess.run(
        [sys.executable, "-m", "prefix_routing", "analyze", str(broken), "--strict"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == f"error: {broken}:2: invalid JSON line: invalid JSON (Expecting value at column 1) (--strict)\n"


def test_simulate_raw_bodies(capsys, tmp_path):
    system = "Answer from the manual below. " + "The manual says many things. " * 200
    path = tmp_path / "bodies.jsonl"
    with path.open("w") as f:
        for i in range(60):
            body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": f"question {i % 12}"}], "max_tokens": 50}
            f.write(json.dumps(body) + "\n")
    code, out, err = run(
        capsys, "simulate", path, "--json", "--no-plots", "--instances", 4, "--body-block-bytes", 1024, "--body-rate", 5,
        "--prefix-length", 8192, "--strategy", "RANDOM", "--strategy", "PREFIX_AWARE",
    )
    assert code == 0, err
    random_, prefix = json.loads(out)["results"]
    assert prefix["hit_rate"] > random_["hit_rate"]


def test_preset_list(capsys):
    code, out, _ = run(capsys, "simulate", "--preset", "list")
    assert code == 0
    assert "p5.48xlarge-llama3.1-70b" in out and "(default)" in out


def test_analyze_straight_from_cloudwatch(capsys, monkeypatch):
    import boto3
    import moto

    from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LogField

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(key, "testing")
    with moto.mock_aws():
        logs = boto3.client("logs", region_name="eu-west-1")
        logs.create_log_group(logGroupName="/aws/lambda/normalizer")
        logs.create_log_stream(logGroupName="/aws/lambda/normalizer", logStreamName="s")
        t0 = int(time.time() * 1000) - 60_000  # CloudWatch keeps no events older than 14 days
        events = [
            {
                "timestamp": t0 + i,
                "message": json.dumps({
                    LogField.MESSAGE: REQUEST_LOG_MESSAGE, LogField.TIMESTAMP_MS: t0 + 250 * i,
                    LogField.BLOCK_HASHES: ["sys", f"conv{i % 5}", f"turn{i}"], LogField.BLOCK_BYTES: 2048,
                    LogField.PROMPT_TOKENS: 1500, LogField.OUTPUT_TOKENS: 20, LogField.STATUS: 200,
                }),
            }
            for i in range(40)
        ]
        logs.put_log_events(logGroupName="/aws/lambda/normalizer", logStreamName="s", logEvents=events)
        code, out, err = run(
            capsys, "analyze", "cloudwatch:/aws/lambda/normalizer", "--region", "eu-west-1",
            "--start", datetime.fromtimestamp(t0 / 1000 - 10, timezone.utc).isoformat(), "--end", str(t0 + 60_000), "--json",
        )
    assert code == 0, err
    a = json.loads(out)
    assert a["requests"] == 40 and a["source"] == "cloudwatch:/aws/lambda/normalizer"
    assert a["block_bytes"] == 2048
    assert {g["blocks"]: g["distinct"] for g in a["key_groups"]}[2] == 5


def test_api_openai_counts_message_text_so_the_json_offset_does_not_apply():
    import argparse

    from prefix_routing.cli import lab_args, trace_args

    parser = argparse.ArgumentParser()
    trace_args.add_trace_arguments(parser)
    lab_args.add_fleet_arguments(parser, grid=False)
    # 4096-byte key, 2100 bytes of JSON before the prompt, 512-token blocks of 4 bytes (2048 bytes):
    # the invoke path keys on ceil((4096 - 2100) / 2048) = 1 block, the OpenAI path on 4096 / 2048 = 2.
    invoke = parser.parse_args(["t.jsonl", "--prefix-length", "4096", "--key-offset-bytes", "2100"])
    assert lab_args.fleet_config_from_args(invoke, None, None, prefix_length=4096).key_blocks == 1
    openai = parser.parse_args(["t.jsonl", "--prefix-length", "4096", "--api", "openai"])
    assert lab_args.fleet_config_from_args(openai, None, None, prefix_length=4096).key_blocks == 2


def test_api_openai_with_a_json_offset_is_one_line_and_status_2(capsys):
    code = main(["analyze", str(MOONCAKE_SLICE), "--api", "openai", "--key-offset-bytes", "100"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--key-offset-bytes 100: the OpenAI-compatible path counts the messages' text only" in err


def test_simulate_users_is_a_closed_loop_and_refuses_a_speed(capsys):
    assert main(["simulate", str(MOONCAKE_SLICE), "--limit", "50", "--users", "3", "--strategy", "RANDOM",
                 "--instances", "2", "--no-plots", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fleet"]["users"] == 3 and out["results"][0]["requests"] == 50
    assert main(["simulate", str(MOONCAKE_SLICE), "--users", "3", "--speed", "2", "--no-plots"]) == 2
    assert "--speed 2 replays the trace's timing; --users 3 replaces it" in capsys.readouterr().err


def test_simulate_zipf_with_replication_spreads_the_hot_prefixes(capsys):
    common = ["simulate", "--workload", "long-context", "--zipf", "1.1", "--strategy", "PREFIX_AWARE", "--json",
              "--no-plots", "--limit", "4000"]
    code, out, _ = run(capsys, *common)
    assert code == 0
    off = json.loads(out)["results"][0]
    code, out, _ = run(capsys, *common, "--replication", "on", "--replication-target-share", "0.25",
                       "--replication-max-replicas", "16")
    assert code == 0
    on = json.loads(out)["results"][0]
    assert "replicated_requests" not in off and on["replicated_requests"] > 500
    assert on["replication"] == {"target_share_factor": 0.25, "max_replicas": 16, "half_life_s": 300.0,
                                 "min_requests": 12.0, "steering": True}
    assert on["replica_redraws"] <= on["replica_collisions"] and on["replica_collisions"] > 0
    assert on["max_mean_requests"] < off["max_mean_requests"] - 0.3
    assert on["hit_rate"] >= 0.95 * off["hit_rate"]


def test_replication_and_zipf_flags_say_what_they_need(capsys):
    code, _, err = run(capsys, "simulate", "--workload", "long-context", "--replication-target-share", "0.5")
    assert code == 2 and "--replication-target-share needs --replication on" in err
    code, _, err = run(capsys, "simulate", "--workload", "long-context", "--replication-steering", "off")
    assert code == 2 and "--replication-steering needs --replication on" in err
    code, _, err = run(capsys, "simulate", "--zipf", "1.1", "trace.jsonl")
    assert code == 2 and "--zipf shapes a generated workload" in err
    code, _, err = run(capsys, "simulate", "--workload", "long-context", "--zipf", "11")
    assert code == 2 and "zipf=11.0: must be a number from 0 (uniform) to 10" in err


def test_simulate_autoscaling_reports_copies_copy_hours_and_hotspot_seconds(capsys, tmp_path):
    code, out, err = run(capsys, "simulate", "--workload", "long-context", "--instances", "14", "--strategy",
                         "PREFIX_AWARE", "--load-step", "1800:3", "--autoscaling", "on", "--autoscaling-min", "2",
                         "--json", "--out-dir", tmp_path)
    assert code == 0, err
    result = json.loads(out)["results"][0]
    assert result["copy_hours"] > 0 and "hotspot_seconds" in result and result["misses"]["first_touch"] > 0
    assert result["autoscaling"]["scale_events"] and (tmp_path / "copies_over_time.png").is_file()
    code, out, _ = run(capsys, "simulate", "--workload", "long-context", "--json", "--no-plots", "--limit", "300")
    fixed = json.loads(out)["results"][0]
    assert "autoscaling" not in fixed and fixed["copy_hours"] > 0


def test_autoscaling_and_load_step_flags_say_what_they_need(capsys):
    code, _, err = run(capsys, "simulate", "--workload", "long-context", "--autoscaling-target", "2")
    assert code == 2 and "--autoscaling-target needs --autoscaling on" in err
    code, _, err = run(capsys, "simulate", "--load-step", "10:3", "trace.jsonl")
    assert code == 2 and "--load-step shapes a generated workload" in err
    code, _, err = run(capsys, "simulate", "--workload", "long-context", "--load-step", "soon")
    assert code == 2 and "expected SECONDS:FACTOR" in err
    code, _, err = run(capsys, "simulate", "--workload", "long-context", "--autoscaling", "on", "--strategy", "KV_AWARE")
    assert code == 2 and "autoscaling: modelled for RANDOM" in err


STAGE_RUN = ["--workload", "long-context", "--strategy", "PREFIX_AWARE", "--json", "--no-plots", "--limit", "600"]


def test_simulate_with_a_stage_models_its_endpoint_and_its_autoscaling(capsys):
    # config/llama70b-p5.toml: 7 × ml.p5.48xlarge, one copy each, PrefixLength 4096, threshold 10,
    # copies 2..7 tracking 6 concurrent requests per copy (hotspot threshold 2 × 6 = 12), replication off.
    code, out, err = run(capsys, "simulate", "--stage", "llama70b-p5", *STAGE_RUN)
    assert code == 0, err
    doc = json.loads(out)
    fleet, result = doc["fleet"], doc["results"][0]
    assert (fleet["instances"], fleet["copies"], fleet["preset"], fleet["prefix_length"],
            fleet["concurrency_threshold"]) == (7, 1, "p5.48xlarge-llama3.1-70b", 4096, 10)
    assert result["autoscaling"]["hotspot_threshold"] == 12.0
    assert result["autoscaling"]["copies_over_time"][0]["provisioned"] == 2  # copies_min
    assert "replication" not in result
    # config/llama8b-g6e.toml differs from the workload's own fleet: 4 × ml.g6e.12xlarge with 4 copies
    # each, PrefixLength 8192, threshold 16.
    code, out, err = run(capsys, "simulate", "--stage", "llama8b-g6e", *STAGE_RUN)
    assert code == 0, err
    fleet = json.loads(out)["fleet"]
    assert (fleet["instances"], fleet["copies"], fleet["prefix_length"], fleet["concurrency_threshold"]) == (4, 4, 8192, 16)
    assert fleet["preset"].startswith("g6e.12xlarge-llama3.1-8b")
    # A flag overrides the stage: fixed copies, and replication on with the stage's other settings.
    code, out, err = run(capsys, "simulate", "--stage", "llama70b-p5", "--autoscaling", "off", "--replication", "on",
                         "--concurrency-threshold", "4", *STAGE_RUN)
    assert code == 0, err
    result = json.loads(out)["results"][0]
    assert "autoscaling" not in result and result["concurrency_threshold"] == 4
    assert result["replication"] == {"target_share_factor": 0.05, "max_replicas": 32, "half_life_s": 300.0,
                                     "min_requests": 12.0, "steering": True}


def test_a_stage_that_replicates_turns_replication_on_in_simulate_and_tune(capsys, tmp_path, monkeypatch):
    from prefix_routing.stage import config as stage_config

    (tmp_path / "hot.toml").write_text(
        '[model]\nframework = "vllm"\nimage_repository = "vllm"\nimage_tag = "v1"\n'
        'model_id = "meta-llama/Llama-3.1-70B-Instruct"\ntensor_parallel_degree = 8\naccelerators_per_copy = 8\n'
        'memory_per_copy_mb = 921600\n'
        '[endpoint]\ninstance_type = "ml.p5.48xlarge"\ninstances_min = 7\ninstances_max = 7\ncopies_min = 7\n'
        'copies_max = 7\n[routing]\nstrategy = "PREFIX_AWARE"\n'
        "[normalizer.replication]\nenabled = true\nmax_replicas = 16\ntarget_share_factor = 0.25\n"
    )
    real_load = stage_config.load_stage
    monkeypatch.setattr(stage_config, "load_stage", lambda name: real_load(name, config_dir=tmp_path))
    code, out, err = run(capsys, "simulate", "--stage", "hot", "--zipf", "1.1", *STAGE_RUN)
    assert code == 0, err
    result = json.loads(out)["results"][0]
    assert result["replication"]["target_share_factor"] == 0.25 and result["replication"]["max_replicas"] == 16
    assert "autoscaling" not in result  # copies_min == copies_max: nothing to scale
    code, out, err = run(capsys, "tune", "--stage", "hot", "--zipf", "1.1", "--prefix-length", "4096",
                         "--concurrency-threshold", "10", "--workload", "long-context", "--strategy", "RANDOM",
                         "--json", "--no-plots", "--limit", "600")
    assert code == 0, err
    swept = {p.get("replication") for p in json.loads(out)["points"]}
    assert swept == {None, 0.1, 0.25, 0.5, 1.0, 2.0}
    code, _, err = run(capsys, "simulate", "--stage", "hot", "--autoscaling-target", "3", *STAGE_RUN)
    assert code == 2 and "--autoscaling-target needs --autoscaling on (stage hot has fixed copies)" in err


def test_an_unknown_stage_is_a_clear_error(capsys):
    code, _, err = run(capsys, "simulate", "--stage", "no-such-stage", *STAGE_RUN)
    assert code == 2 and "no-such-stage" in err


def test_simulate_as_sent_books_the_clients_scattered_misses_as_rekeyed(capsys, tmp_path):
    # 8 system prompts of ~6 KB (past PrefixLength 4096), 20 requests each with their own question.
    # Every other round of 8 comes from a client that writes temperature first: 80 of the 160 are
    # re-keyed, and each prompt is sent both ways.
    lines = []
    for i in range(160):
        system = f"Prompt {i % 8}: you answer questions about the lab. " * 120
        messages = [{"role": "system", "content": system}, {"role": "user", "content": f"question {i}"}]
        body = {"temperature": 0.2, "messages": messages} if (i // 8) % 2 else {"messages": messages, "temperature": 0.2}
        lines.append(json.dumps(body, separators=(",", ":")))
    path = tmp_path / "bodies.jsonl"
    path.write_text("\n".join(lines) + "\n")
    common = ["simulate", str(path), "--format", "bodies", "--strategy", "PREFIX_AWARE", "--instances", "4",
              "--json", "--no-plots"]
    code, out, err = run(capsys, *common)
    assert code == 0, err
    fronted = json.loads(out)["results"][0]
    assert fronted["rekeyed_requests"] == 80 and fronted["as_sent"] is False
    assert fronted["misses"]["rekeyed"] == 0  # behind the front door every body keys as its normalized form
    code, out, err = run(capsys, *common, "--as-sent")
    assert code == 0, err
    raw = json.loads(out)["results"][0]
    assert raw["as_sent"] is True and raw["misses"]["rekeyed"] > 0
    assert raw["hit_rate"] < fronted["hit_rate"]
    code, _, err = run(capsys, "simulate", "--workload", "long-context", "--as-sent", "--no-plots")
    assert code == 2 and "--as-sent routes raw request bodies on their own bytes" in err


def test_analyze_gives_the_simulations_verdict_with_the_reuse_share_beside_it(capsys):
    code, out, err = run(capsys, "analyze", str(MOONCAKE_SLICE), "--json", "--instances", "4")
    assert code == 0, err
    a = json.loads(out)
    verdict = a["verdict"]
    # The verdict's figures are simulate's for the same fleet and trace (RANDOM against PREFIX_AWARE).
    code, out, err = run(capsys, "simulate", str(MOONCAKE_SLICE), "--json", "--no-plots", "--instances", "4",
                         "--strategy", "RANDOM", "--strategy", "PREFIX_AWARE")
    random, prefix = json.loads(out)["results"]
    assert verdict["hit_rate_gain_points"] == pytest.approx(100 * (prefix["hit_rate"] - random["hit_rate"]))
    assert verdict["ttft_p50_gain"] == pytest.approx(1 - prefix["ttft_p50_s"] / random["ttft_p50_s"])
    assert verdict["reuse_share"] == a["prefix_reuse"]
    assert verdict["pays"] is (verdict["hit_rate_gain_points"] >= 5 or verdict["ttft_p50_gain"] >= 0.2)
    assert not any("will do as well" in w for w in a["warnings"])  # no second, contradicting verdict


def test_analyze_and_tune_say_prefix_aware_routing_pays_on_the_mooncake_trace(capsys):
    # docs/lab.md: on the whole trace PREFIX_AWARE caches 37.4 % of tokens against RANDOM's 13.7 %.
    code, out, _ = run(capsys, "analyze", require_shared_trace())
    assert code == 0 and "verdict: prefix-aware routing pays here" in out and "the rule of thumb" in out
    code, out, err = run(capsys, "tune", str(MOONCAKE_SLICE), "--json", "--no-plots", "--instances", "4",
                         "--prefix-length", "4096", "--concurrency-threshold", "8")
    assert code == 0, err
    result = json.loads(out)
    random = next(b for b in result["baselines"] if b["strategy"] == "RANDOM")
    best = result["recommendation"]
    assert result["verdict"]["hit_rate_gain_points"] == pytest.approx(100 * (best["hit_rate"] - random["hit_rate"]))


def test_simulate_and_tune_with_a_sample_say_its_rate_size_and_bands(capsys):
    # 4,000 requests of 450 prefixes on 40 instances at 50 %: 20 whole instances for PREFIX_AWARE,
    # every one for RANDOM (50 requests a copy), about 200 effective keys.
    common = ["--workload", "long-context", "--limit", "4000", "--no-plots", "--instances", "40"]
    code, out, err = run(capsys, "simulate", *common, "--json", "--strategy", "RANDOM", "--sample", "50%")
    assert code == 0, err
    doc = json.loads(out)
    sample = doc["results"][0]["sample"]
    assert sample["rate"] == pytest.approx(0.5) and sample["of_requests"] == 4000 and sample["instances"] == 40
    assert 0 < sample["requests"] < 4000 and 0 < sample["hit_rate_band"] < 0.2
    low, high = sample["bands"]["ttft_p50_s"]
    assert low <= doc["results"][0]["ttft_p50_s"] <= high
    assert "sampled at 0.5" in doc["trace"]["source"]
    assert doc["sample"] == {"asked": 0.5, "rate": 0.5, "note": None}
    code, out, err = run(capsys, "simulate", *common, "--strategy", "PREFIX_AWARE", "--sample", "50%")
    assert code == 0, err
    assert "on 20 instances; figures in the whole trace's units, each with its 95 % band" in out
    hit_row = next(line for line in out.splitlines() if line.startswith("hit rate (tokens)"))
    p50_row = next(line for line in out.splitlines() if line.startswith("TTFT P50 (ms)"))
    spills_row = next(line for line in out.splitlines() if line.startswith("spills"))
    assert re.search(r"\d+\.\d% ±\d+\.\d%$", hit_row) and re.search(r"\d+ \(\d+–\d+\)$", p50_row)
    assert spills_row.split()[-1] == "—" and "—: not estimated from a sample" in out
    code, out, err = run(capsys, "tune", *common, "--json", "--sample", "0.5", "--prefix-length", "4096",
                         "--concurrency-threshold", "10")
    assert code == 0, err
    tuned = json.loads(out)
    assert tuned["sample"]["rate"] == 0.5 and tuned["sample"]["keyed_on_prefix_length"] == 4096
    assert all(0 < p["bands"]["hit_rate"] < 0.2 for p in tuned["points"] + tuned["baselines"])
    code, out, err = run(capsys, "tune", *common, "--sample", "0.5", "--prefix-length", "4096",
                         "--concurrency-threshold", "10")
    assert code == 0, err
    recommended = next(line for line in out.splitlines() if line.startswith("recommended:"))
    assert re.search(r"hit rate \d+\.\d% ±\d+\.\d%, P50 TTFT \d+ \(\d+–\d+\) ms$", recommended)
    code, out, err = run(capsys, "simulate", *common, "--sample", "0.1")  # 4 instances, 45 keys: the whole trace
    assert code == 0, err
    assert "sample: --sample 0.1: ran the whole trace instead: 40 instances at rate 0.1 leave 4" in out
    assert "±" not in out and "—" not in out
    code, out, err = run(capsys, "simulate", *common, "--json", "--sample", "0.1")
    assert code == 0, err
    sample = json.loads(out)["sample"]
    assert (sample["asked"], sample["rate"]) == (0.1, 1.0) and sample["note"].startswith("--sample 0.1: ran the whole")
    code, _, err = run(capsys, "simulate", *common, "--sample", "0")
    assert code == 2 and "--sample" in err and "a rate from 0.0001 to 1" in err
    code, _, err = run(capsys, "simulate", *common, "--sample", "0.5", "--replication", "on")
    assert code == 2 and "--sample: a sampled run does not model hot-prefix replication" in err


def test_tune_with_a_sample_runs_its_grid_on_whole_copies_and_its_baselines_on_every_copy(capsys, monkeypatch):
    # 40 instances at rate 0.5: the grid on 20, each copy whole; RANDOM and LEAST_OUTSTANDING_REQUESTS
    # on all 40, each copy's cache x 0.5 and the clock x 2 (lab/sampling.py).
    from prefix_routing import lab

    seen = {}
    real = lab.tune

    def spy(trace, config, **kwargs):
        seen.update(config=config, speed=kwargs["speed"], baseline_fleet=kwargs["baseline_fleet"])
        return real(trace, config, **kwargs)

    monkeypatch.setattr(lab, "tune", spy)
    code, _, err = run(capsys, "tune", "--workload", "long-context", "--limit", "4000", "--json", "--no-plots",
                       "--instances", "40", "--sample", "0.5", "--prefix-length", "4096",
                       "--concurrency-threshold", "10")
    assert code == 0, err
    assert (seen["config"].instances, seen["config"].cache_scale, seen["speed"]) == (20, 1.0, 1.0)
    base, speed = seen["baseline_fleet"]
    assert (base.instances, base.cache_scale, speed) == (40, 0.5, pytest.approx(2.0))
