"""Tenants and per-tenant limits on the command line: simulate, tune and advise."""

from __future__ import annotations

import json

import pytest

from prefix_routing.cli.main import main
from tests.conftest import MOONCAKE_SLICE

STAGE = (
    '[model]\nframework = "vllm"\nimage_repository = "vllm"\nimage_tag = "v1"\n'
    'model_id = "meta-llama/Llama-3.1-70B-Instruct"\ntensor_parallel_degree = 8\naccelerators_per_copy = 8\n'
    'memory_per_copy_mb = 921600\n'
    '[endpoint]\ninstance_type = "ml.p5.48xlarge"\ninstances_min = 2\ninstances_max = 2\ncopies_min = 2\n'
    'copies_max = 2\n[routing]\nstrategy = "PREFIX_AWARE"\nprefix_length = 4096\nconcurrency_threshold = 10\n'
)
NOISY = ["--workload", "noisy-tenant", "--strategy", "PREFIX_AWARE", "--no-plots"]


def run(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit:  # argparse's own errors
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def stages(tmp_path, monkeypatch):
    """Stage files: `plain` (no limits) and `limited` (concurrent_streams 4 per tenant)."""
    from prefix_routing.stage import config as stage_config

    real_load = stage_config.load_stage
    monkeypatch.setattr(stage_config, "load_stage", lambda name: real_load(name, config_dir=tmp_path))
    (tmp_path / "plain.toml").write_text(STAGE)
    (tmp_path / "limited.toml").write_text(STAGE + "[normalizer]\ntimeout_s = 60\n[limits]\nconcurrent_streams = 4\n")
    return tmp_path


@pytest.fixture
def streams_file(tmp_path):
    path = tmp_path / "limits.toml"
    path.write_text("[limits]\nconcurrent_streams = 4\n")
    return path


def test_simulate_noisy_tenant_with_limits_prints_the_per_tenant_table(capsys, streams_file):
    code, out, err = run(capsys, "simulate", *NOISY, "--limits", streams_file)
    assert code == 0, err
    assert f"limits: on (--limits {streams_file}): per tenant concurrent_streams 4; before the router" in out
    assert "tenants: 8 (the noisy-tenant workload's)" in out
    lines = out.splitlines()
    head = lines.index("per tenant (PREFIX_AWARE):")
    assert lines[head + 1].split() == ["tenant", "requests", "served", "throttled", "P50", "ms", "P90", "ms",
                                       "goodput", "tok/s"]
    noisy = lines[head + 2].split()
    assert noisy[0] == "tenant-0001" and int(noisy[3].replace(",", "")) > 0
    assert "warning: tenant tenant-0001 sends 82 % of the tokens: one tenant's burst becomes everyone's latency; " \
           "consider [limits]" in out


def test_simulate_json_carries_the_tenants(capsys, streams_file):
    code, out, err = run(capsys, "simulate", *NOISY, "--limits", streams_file, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["fleet"]["limits"]["default"] == {"concurrent_streams": 4}
    tenants = data["tenants"]
    assert tenants["count"] == 8 and tenants["dominant"]["tenant"] == "tenant-0001"
    rows = tenants["by_strategy"]["PREFIX_AWARE"]
    result = data["results"][0]
    assert result["tenants"] == rows
    assert result["throttled"] == sum(r["throttled"] for r in rows) > 0
    assert result["requests"] == sum(r["served"] + r["failed"] for r in rows)  # the requests the endpoint got
    assert sum(r["requests"] for r in rows) == data["trace"]["requests"]
    code, out, _ = run(capsys, "simulate", *NOISY, "--json")
    assert code == 0 and json.loads(out)["fleet"]["limits"] is None
    assert json.loads(out)["results"][0]["throttled"] == 0


def test_the_stages_limits_apply_unless_limits_off(capsys, stages):
    code, out, err = run(capsys, "simulate", *NOISY, "--stage", "limited", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["fleet"]["limits"]["default"] == {"concurrent_streams": 4}
    assert data["fleet"]["limits"]["lease_s"] == 30  # short, renewed while an answer streams
    assert data["results"][0]["throttled"] > 0
    code, out, _ = run(capsys, "simulate", *NOISY, "--stage", "limited", "--limits", "off")
    assert code == 0 and "limits: off (--limits off)" in out and "throttled" in out
    code, out, _ = run(capsys, "simulate", *NOISY, "--stage", "plain")
    assert code == 0 and "limits: off\n" in out


def test_limits_on_an_untenanted_trace_treat_it_as_one_tenant(capsys, tmp_path, streams_file):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(MOONCAKE_SLICE.read_text().splitlines(keepends=True)[:50]))
    code, out, err = run(capsys, "simulate", trace, "--strategy", "RANDOM", "--no-plots", "--limits", streams_file)
    assert code == 0, err
    assert "the trace names no tenants: all its requests are one tenant's (--tenants N spreads them)" in out
    assert "per tenant (RANDOM):" in out and "\n  shared " in out


def test_tenants_spread_a_trace_by_conversation(capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(MOONCAKE_SLICE.read_text().splitlines(keepends=True)[:200]))
    code, out, err = run(capsys, "simulate", trace, "--strategy", "RANDOM", "--no-plots", "--tenants", "3", "--json")
    assert code == 0, err
    data = json.loads(out)
    rows = data["results"][0]["tenants"]
    assert data["tenants"]["count"] == 3 == len(rows)
    assert {r["tenant"] for r in rows} == {"tenant-0001", "tenant-0002", "tenant-0003"}
    assert sum(r["requests"] for r in rows) == 200
    code, out, _ = run(capsys, "simulate", trace, "--strategy", "RANDOM", "--no-plots", "--tenants", "3")
    assert code == 0 and "tenants: 3 (--tenants 3: by conversation)" in out


@pytest.mark.parametrize("argv, message", [
    (["--tenants", "0"], "--tenants"),
    (["--tenants", "1001"], "--tenants"),
    (["--zipf", "1.1"], "--zipf shapes the long-context workload, not noisy-tenant"),
    (["--tenants", "1"], "needs 2 to 1000 tenants"),
])
def test_bad_tenant_flags_are_one_error(capsys, argv, message):
    code, out, err = run(capsys, "simulate", *NOISY, *argv)
    assert code == 2 and message in err


def test_a_bad_limits_file_is_one_error(capsys, tmp_path):
    path = tmp_path / "limits.toml"
    path.write_text("[limits]\nconcurrent_stream = 4\n")
    code, out, err = run(capsys, "simulate", *NOISY, "--limits", path)
    assert code == 2 and "concurrent_stream" in err and len(err.strip().splitlines()) == 1


def _log_line(i: int, tenant: str) -> str:
    return json.dumps({"message": "prefix_routing.request", "request_ts_ms": 1_700_000_000_000 + 500 * i,
                       "tenant": tenant, "prefix_aware_id": f"id-{tenant}", "block_bytes": 2048,
                       "block_hashes": ["sys", f"{tenant}-{i}"], "prompt_tokens": 1000, "output_tokens": 50,
                       "cached_tokens": 0, "status": 200})


@pytest.fixture
def tenant_log(tmp_path):
    """30 requests: 20 from tenant `big`, 5 each from `a` and `b`."""
    path = tmp_path / "log.jsonl"
    names = ["big"] * 20 + ["a"] * 5 + ["b"] * 5
    path.write_text("".join(_log_line(i, t) + "\n" for i, t in enumerate(names)))
    return path


def test_advise_reads_the_tenants_from_the_log(capsys, stages, tenant_log):
    code, out, err = run(capsys, "advise", "--stage", "plain", "--log-file", tenant_log)
    assert code == 0, err
    assert "warning: tenant big sends 67 % of the tokens: one tenant's burst becomes everyone's latency; " \
           "consider [limits]" in out
    code, out, _ = run(capsys, "advise", "--stage", "plain", "--log-file", tenant_log, "--json")
    assert json.loads(out)["tenants"]["dominant"]["tenant"] == "big"


def test_simulate_rejects_tenants_for_a_log(capsys, tenant_log):
    code, out, err = run(capsys, "simulate", tenant_log, "--no-plots", "--tenants", "4")
    assert code == 2 and "names its tenants already" in err


def test_tune_reports_a_dominant_tenant(capsys):
    argv = ["tune", "--workload", "noisy-tenant", "--no-plots", "--prefix-length", "4096", "--concurrency-threshold",
            "10", "--strategy", "RANDOM"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert "warning: tenant tenant-0001 sends 82 % of the tokens" in out and "limits: off" in out
    code, out, _ = run(capsys, *argv, "--json")
    assert json.loads(out)["tenants"]["dominant"]["tenant"] == "tenant-0001"


def test_tune_models_the_limits_in_every_run(capsys, streams_file):
    argv = ["tune", "--workload", "noisy-tenant", "--no-plots", "--prefix-length", "4096", "--concurrency-threshold",
            "10", "--strategy", "RANDOM", "--json"]
    code, out, err = run(capsys, *argv, "--limits", streams_file)
    assert code == 0, err
    result = json.loads(out)
    assert result["fleet"]["limits"]["default"] == {"concurrent_streams": 4}
    assert result["recommendation"]["throttled"] > 0 and result["baselines"][0]["throttled"] > 0
    code, out, _ = run(capsys, *argv)
    assert json.loads(out)["recommendation"]["throttled"] == 0


def test_tenants_are_the_ones_log_tenants_writes(capsys, tmp_path):
    """`simulate --tenants N` gives each request the tenant `log --tenants N` names in its log line."""
    from prefix_routing.lab.tenants import with_tenants
    from prefix_routing.lab.traces import read_mooncake, read_request_log

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(MOONCAKE_SLICE.read_text().splitlines(keepends=True)[:100]))
    assert main(["log", "--trace", str(trace), "--out", str(tmp_path / "log.jsonl"), "--tenants", "3"]) == 0
    capsys.readouterr()
    logged = read_request_log(tmp_path / "log.jsonl").tenants
    assert len(set(logged)) == 3
    assert with_tenants(read_mooncake(trace), 3).tenants == logged
