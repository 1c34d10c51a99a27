"""``log``: the request log the front door writes for a trace, read back by ``advise``."""

from __future__ import annotations

import json

import pytest

from prefix_routing import frontdoor
from prefix_routing.cli import log as log_command
from prefix_routing.lab import traces
from prefix_routing.lab.bodies import chat_body, serialize
from prefix_routing.rules import routing_identity
from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LogField
from tests.conftest import MOONCAKE_SLICE
from tests.prefix_routing.cli.test_advise import STAGE
from tests.prefix_routing.cli.test_lab_commands import run

T0_MS = 1_796_083_200_000  # 2026-12-01T00:00:00Z


@pytest.fixture
def slice_records():
    return [json.loads(line) for line in MOONCAKE_SLICE.read_text().splitlines()[:200]]


@pytest.fixture
def trace_file(tmp_path, slice_records):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in slice_records))
    return path


@pytest.fixture
def stages(tmp_path, monkeypatch):
    from prefix_routing.stage import config as stage_config

    real_load = stage_config.load_stage
    monkeypatch.setattr(stage_config, "load_stage", lambda name: real_load(name, config_dir=tmp_path))
    for pl in (1024, 8192):
        (tmp_path / f"pl{pl}.toml").write_text(STAGE.replace("PL", str(pl)))
    return tmp_path


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_trace_becomes_the_front_doors_log_and_advise_reads_it(capsys, tmp_path, trace_file, slice_records, stages):
    out = tmp_path / "requests.jsonl"
    code, text, err = run(capsys, "log", "--trace", trace_file, "--out", out, "--stage", "pl1024",
                          "--start", "2026-12-01T00:00:00Z")
    assert code == 0, err
    assert f"wrote 200 request log lines to {out}" in text and "advise --stage pl1024 --log-file" in text
    lines = read_lines(out)
    assert len(lines) == 200 and all(line[LogField.MESSAGE] == REQUEST_LOG_MESSAGE for line in lines)
    # Times, prompt and output tokens are the trace's, in its order (its timestamps are milliseconds).
    assert [line[LogField.TIMESTAMP_MS] for line in lines] == [T0_MS + r["timestamp"] for r in slice_records]
    assert [line[LogField.PROMPT_TOKENS] for line in lines] == [r["input_length"] for r in slice_records]
    assert [line[LogField.OUTPUT_TOKENS] for line in lines] == [r["output_length"] for r in slice_records]
    assert {line[LogField.PREFIX_LENGTH] for line in lines} == {1024} and {line[LogField.STATUS] for line in lines} == {200}
    # The modelled fleet caches some of the prompts, never more than a prompt.
    assert 0 < sum(line[LogField.CACHED_TOKENS] for line in lines)
    assert all(0 <= line[LogField.CACHED_TOKENS] <= line[LogField.PROMPT_TOKENS] for line in lines)
    code, text, err = run(capsys, "advise", "--stage", "pl1024", "--log-file", out, "--json")
    assert code == 0, err
    advice = json.loads(text)
    assert advice["window"]["requests"] == 200 and advice["measured_hit_rate"] > 0
    # Every request shares the first 2,048-byte block: PrefixLength 1024 keys them all alike.
    assert advice["current"]["prefix_length"] == 1024 and advice["best"]["prefix_length"] > 2048


def test_the_fingerprint_block_hashes_and_routing_id_are_the_front_doors(capsys, tmp_path, trace_file, slice_records):
    out = tmp_path / "requests.jsonl"
    assert run(capsys, "log", "--trace", trace_file, "--out", out)[0] == 0
    line = read_lines(out)[3]
    config = frontdoor.InvokeConfig(endpoint_name="e", tenancy="header")
    request = frontdoor.FrontRequest(body=serialize(chat_body(slice_records[3])), headers={"x-tenant-id": "tenant-0001"})
    prepared = frontdoor.prepare(request, config, log_command.OFFLINE_TENANT_KEY)
    assert line[LogField.BLOCK_HASHES] == list(prepared.normalized.block_hashes)
    assert line[LogField.PREFIX_FINGERPRINT] == prepared.normalized.prefix_fingerprint
    assert line[LogField.BODY_BYTES] == len(prepared.normalized.body)
    assert line[LogField.TENANT] == "tenant-0001"
    assert line[LogField.ROUTING_ID] == routing_identity("tenant-0001", None, log_command.OFFLINE_TENANT_KEY).prefix_aware_id


def test_tenants_split_the_requests_and_a_conversation_keeps_its_tenant(capsys, tmp_path, trace_file, slice_records):
    out = tmp_path / "requests.jsonl"
    assert run(capsys, "log", "--trace", trace_file, "--out", out, "--tenants", 3)[0] == 0
    lines = read_lines(out)
    assert {line[LogField.TENANT] for line in lines} == {"tenant-0001", "tenant-0002", "tenant-0003"}
    assert len({line[LogField.ROUTING_ID] for line in lines}) == 3
    by_conversation = {}
    for record, line in zip(slice_records, lines):
        key = record["hash_ids"][1] if len(record["hash_ids"]) > 1 else record["hash_ids"][0]
        by_conversation.setdefault(key, set()).add(line[LogField.TENANT])
    assert all(len(tenants) == 1 for tenants in by_conversation.values())


@pytest.mark.parametrize("argv, message", [
    (["--tenants", "0"], "argument --tenants: 0: must be from 1 to 1000"),
    (["--tenants", "1001"], "argument --tenants: 1001: must be from 1 to 1000"),
    (["--start", "1999-12-31T23:59:59Z"], "--start 1999-12-31T23:59:59Z: give a time from 2000-01-01"),
])
def test_bad_flags_are_one_line_and_status_2(capsys, tmp_path, trace_file, argv, message):
    out = tmp_path / "requests.jsonl"
    code, _, err = run(capsys, "log", "--trace", trace_file, "--out", out, *argv)
    assert code == 2 and message in err and err.count("\n") == 1 and not out.exists()


def test_a_request_log_is_not_a_trace_and_a_missing_file_says_so(capsys, tmp_path, trace_file):
    out = tmp_path / "requests.jsonl"
    assert run(capsys, "log", "--trace", trace_file, "--out", out)[0] == 0
    code, _, err = run(capsys, "log", "--trace", out, "--out", tmp_path / "again.jsonl")
    assert code == 2 and "is a request log already" in err
    code, _, err = run(capsys, "log", "--trace", tmp_path / "nope.jsonl", "--out", tmp_path / "again.jsonl")
    assert code == 2 and "trace file not found" in err


def test_raw_bodies_arrive_at_the_rate_and_a_rejected_body_is_logged_as_rejected(capsys, tmp_path):
    bodies = [{"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 8} for i in range(5)]
    rows = [json.dumps(b) for b in bodies]
    rows.insert(2, json.dumps({"messages": "not a list"}))
    rows.insert(4, json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**12}))
    path = tmp_path / "bodies.jsonl"
    path.write_text("\n".join(rows) + "\n")
    out = tmp_path / "requests.jsonl"
    code, text, err = run(capsys, "log", "--trace", path, "--out", out, "--body-rate", 4, "--start", T0_MS)
    assert code == 0, err
    assert "'max_tokens' above 1,000,000" in err and "1 request failed at the front door (1 × 400)" in text
    lines = read_lines(out)
    assert [line[LogField.TIMESTAMP_MS] for line in lines] == [T0_MS + 250 * i for i in range(6)]
    assert [line[LogField.STATUS] for line in lines] == [200, 200, 400, 200, 200, 200]
    window = traces.read_request_log(out)
    assert len(window) == 5 and window.skipped.ignored  # the rejected one: a failed request, ignored


def test_nothing_half_written_when_a_run_fails(capsys, tmp_path, trace_file, monkeypatch):
    out = tmp_path / "requests.jsonl"
    out.write_text("the previous log\n")
    calls = []

    def failing(self, request):
        calls.append(request)
        if len(calls) == 50:
            raise RuntimeError("disk full")
        return real(self, request)

    real = frontdoor.Invoker.buffered
    monkeypatch.setattr(frontdoor.Invoker, "buffered", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        run(capsys, "log", "--trace", trace_file, "--out", out)
    assert out.read_text() == "the previous log\n"  # untouched
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".requests")] == []  # no temporary left
