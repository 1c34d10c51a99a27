"""Trace readers: Mooncake, the normalizer's request log (file and CloudWatch), raw bodies."""

import gzip
import hashlib
import json
import math
import time
from pathlib import Path

import pytest

from prefix_routing.lab import traces
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LogField
from tests.conftest import MOONCAKE_SLICE


@pytest.fixture
def mooncake(mooncake_trace):
    return mooncake_trace


def write(tmp_path, name, lines) -> Path:
    path = tmp_path / name
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def mc(ts, n_tokens, ids, out=10):
    return {"timestamp": ts, "input_length": n_tokens, "output_length": out, "hash_ids": ids}


# ---------------------------------------------------------------- Mooncake


def test_the_real_trace(mooncake):
    assert len(mooncake) == 12_031
    assert round(mooncake.duration_s) == 3_537
    assert mooncake.skipped.count == 0 and not mooncake.notes
    assert mooncake.block_tokens == 512 and mooncake.block_bytes is None
    assert all(len(b) == math.ceil(p / 512) for b, p in zip(mooncake.blocks, mooncake.prompt_tokens))
    assert mooncake.blocks[0][0] == 0 and mooncake.arrivals[0] == 0.0


def test_the_slice_kept_in_the_repository(mooncake_slice):
    # Its README gives the source, the licence and the sha256 that pins these bytes.
    readme = (MOONCAKE_SLICE.parent / "README.md").read_text()
    assert hashlib.sha256(MOONCAKE_SLICE.read_bytes()).hexdigest() in readme
    assert "Apache-2.0" in readme and "kvcache-ai/Mooncake" in readme
    assert MOONCAKE_SLICE.stat().st_size <= 500_000
    # The reader against the JSON itself, line by line.
    rows = [json.loads(line) for line in MOONCAKE_SLICE.read_text().splitlines()]
    assert len(mooncake_slice) == len(rows) == 1_000 and mooncake_slice.skipped.count == 0
    assert mooncake_slice.arrivals == [r["timestamp"] / 1000 for r in rows]
    assert mooncake_slice.duration_s == 330.0
    assert mooncake_slice.prompt_tokens == [r["input_length"] for r in rows]
    assert mooncake_slice.output_tokens == [r["output_length"] for r in rows]
    # Interning keeps equality of ids: the same 781 distinct two-block keys as the raw ids.
    assert len({tuple(b[:2]) for b in mooncake_slice.blocks}) == len({tuple(r["hash_ids"][:2]) for r in rows}) == 781
    assert sum(map(len, mooncake_slice.blocks)) == 27_305


def test_broken_lines_are_reported_with_their_numbers(tmp_path):
    path = write(tmp_path, "t.jsonl", [
        mc(0, 1000, [1, 2]),
        '{"timestamp": 5, "input_length": ',  # line 2: truncated
        {"timestamp": 6, "input_length": 10, "output_length": 1},  # line 3: no hash_ids
        mc(7, 1000, [1]),  # line 4: 1 id for 2 blocks
        "",  # blank lines are not data
        mc(8, 600, [1, 3], out=-1),  # line 6: negative output
        "[1, 2]",  # line 7: not an object
        mc(9, 600, [1, 3]),
    ])
    trace = traces.read_mooncake(path)
    assert len(trace) == 2 and trace.lines == 7
    assert trace.skipped.count == 5
    assert trace.skipped.reasons == {
        "invalid JSON line": 1,
        "missing field 'hash_ids'": 1,
        "'hash_ids' does not match 'input_length'": 1,
        "bad 'output_length'": 1,
        "not a JSON object": 1,
    }
    assert trace.skipped.examples[0].startswith(f"{path}:2: invalid JSON line")
    assert any(e.startswith(f"{path}:4: 'hash_ids' does not match") and "expected 2" in e for e in trace.skipped.examples)
    summary = trace.skipped.summary(trace.lines)
    assert summary.startswith("skipped 5 of 7 lines: ")


def test_strict_fails_on_the_first_broken_line(tmp_path):
    path = write(tmp_path, "t.jsonl", [mc(0, 1000, [1, 2]), "{oops"])
    with pytest.raises(UserError, match=r"t\.jsonl:2: invalid JSON line.*--strict"):
        traces.read_mooncake(path, strict=True)


def test_missing_empty_and_unreadable_files(tmp_path):
    with pytest.raises(UserError, match="trace file not found"):
        traces.read_mooncake(tmp_path / "nope.jsonl")
    with pytest.raises(UserError, match="is a directory"):
        traces.read_mooncake(tmp_path)
    empty = write(tmp_path, "empty.jsonl", [])
    with pytest.raises(UserError, match="no requests found"):
        traces.read_mooncake(empty)
    garbage = write(tmp_path, "garbage.jsonl", ["not json", "still not"])
    with pytest.raises(UserError, match=r"no requests found \(skipped 2 of 2 lines: 2 invalid JSON line\)"):
        traces.read_mooncake(garbage)


def test_gzip_and_out_of_order_times(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for row in (mc(3000, 10, [5]), mc(1000, 10, [6]), mc(2000, 10, [7])):
            f.write(json.dumps(row) + "\n")
    trace = traces.read_mooncake(path)
    assert trace.arrivals == [0.0, 1.0, 2.0]
    assert [b[0] for b in trace.blocks] == [6, 7, 5]
    assert trace.notes == ["requests were not in arrival order; sorted by time"]


def test_replay_shifts_ids_and_times(tmp_path):
    trace = traces.read_mooncake(write(tmp_path, "t.jsonl", [mc(0, 600, [0, 1]), mc(1000, 600, [0, 2])]))
    twice = trace.replay(3)
    assert len(twice) == 6
    assert twice.arrivals == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert twice.blocks[2] == [3, 4] and twice.blocks[5] == [6, 8]
    assert trace.head(1).prompt_tokens == [600]


def test_format_is_sniffed(tmp_path):
    assert traces.sniff_format(MOONCAKE_SLICE) == "mooncake"
    log = write(tmp_path, "log.jsonl", ["START RequestId: 1", {LogField.MESSAGE: REQUEST_LOG_MESSAGE}])
    assert traces.sniff_format(log) == "log"
    bodies = write(tmp_path, "bodies.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    assert traces.sniff_format(bodies) == "bodies"
    with pytest.raises(UserError, match="unknown trace format"):
        traces.load_trace(log, "csv")


# ---------------------------------------------------------------- the normalizer's log


def log_line(ts_ms, hashes, prompt=1000, output=50, **extra):
    line = {
        LogField.MESSAGE: REQUEST_LOG_MESSAGE,
        LogField.TIMESTAMP_MS: ts_ms,
        LogField.BLOCK_HASHES: hashes,
        LogField.BLOCK_BYTES: 2048,
        LogField.PROMPT_TOKENS: prompt,
        LogField.OUTPUT_TOKENS: output,
        LogField.STATUS: 200,
    }
    line.update(extra)
    return line


def test_request_log_file(tmp_path):
    t0 = 1_764_500_000_000
    path = write(tmp_path, "log.jsonl", [
        "START RequestId: abc Version: $LATEST",
        log_line(t0, ["aa", "bb"], **{LogField.ROUTING_ID: "pa-tenant1"}),
        {LogField.MESSAGE: "cold start", "level": "INFO"},
        log_line(t0 + 1500, ["aa", "cc"]),
        log_line(t0 + 2000, ["aa"], **{LogField.STATUS: 400}),
        '{"message": "' + REQUEST_LOG_MESSAGE + '", "request_ts_ms": 1',  # broken request line (6)
        log_line(t0 + 3000, ["aa"], **{LogField.BLOCK_BYTES: 1024}),  # line 7: other block size
        {k: v for k, v in log_line(t0 + 4000, ["aa", "dd"]).items() if k != LogField.PROMPT_TOKENS} | {LogField.BODY_BYTES: 4096},
    ])
    trace = traces.read_request_log(path)
    assert len(trace) == 3
    assert trace.arrivals == [0.0, 1.5, 4.0]
    assert trace.blocks == [[0, 1], [0, 2], [0, 3]]  # hashes interned; shared "aa" is one id
    assert trace.prompt_tokens == [1000, 1000, 1024]  # the last estimated from 4,096 bytes
    assert trace.block_bytes == 2048 and trace.block_tokens == 512
    assert trace.routing_ids == ["pa-tenant1", None, None]
    assert trace.skipped.count == 2
    assert any(e.startswith(f"{path}:6: broken request log line") for e in trace.skipped.examples)
    assert any(e.startswith(f"{path}:7: 'block_bytes' differs") for e in trace.skipped.examples)
    assert trace.skipped.ignored == {
        "lines that are not JSON (runtime lines)": 1,
        f"lines whose message is not {REQUEST_LOG_MESSAGE!r}": 1,
        "failed requests (status 4xx)": 1,
    }
    assert "estimated from body bytes" in trace.notes[0]
    with pytest.raises(UserError, match=r"log\.jsonl:6: broken request log line"):
        traces.read_request_log(path, strict=True)


def test_request_log_carries_the_front_doors_rekeyed_flag(tmp_path):
    t0 = 1_764_500_000_000
    path = write(tmp_path, "log.jsonl", [
        log_line(t0, ["aa"], **{LogField.REKEYED: True}),
        log_line(t0 + 1000, ["aa"], **{LogField.REKEYED: False}),
        log_line(t0 + 2000, ["aa"]),  # written before the front door judged it: not re-keyed
    ])
    assert traces.read_request_log(path).rekeyed == [True, False, False]
    older = write(tmp_path, "old.jsonl", [log_line(t0, ["aa"])])
    assert traces.read_request_log(older).rekeyed is None  # the log cannot tell


def test_request_log_with_only_other_lines_is_an_error(tmp_path):
    path = write(tmp_path, "log.jsonl", ["START RequestId: 1", {LogField.MESSAGE: "hello"}])
    with pytest.raises(UserError, match="no requests found.*ignored"):
        traces.read_request_log(path)


@pytest.fixture
def aws_env(monkeypatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)


def test_cloudwatch_logs_through_moto(aws_env):
    import boto3
    import moto
    with moto.mock_aws():
        client = boto3.client("logs", region_name="us-east-1")
        client.create_log_group(logGroupName="/aws/lambda/normalizer")
        client.create_log_stream(logGroupName="/aws/lambda/normalizer", logStreamName="2026/11/30/[$LATEST]abc")
        now = int(time.time() * 1000)
        events = [{"timestamp": now, "message": "START RequestId: 1 Version: $LATEST"}]
        for i in range(120):  # more than one page is not needed by moto, but many events are
            events.append({"timestamp": now + i, "message": json.dumps(log_line(now + 10 * i, ["r", f"x{i % 7}"]))})
        events.append({"timestamp": now + 200, "message": '{"message": "' + REQUEST_LOG_MESSAGE + '", broken'})
        client.put_log_events(logGroupName="/aws/lambda/normalizer", logStreamName="2026/11/30/[$LATEST]abc", logEvents=events)
        trace = traces.read_cloudwatch("/aws/lambda/normalizer", now - 1000, now + 1000, client=client)
        assert len(trace) == 120
        assert trace.source == "cloudwatch:/aws/lambda/normalizer"
        assert trace.blocks[0][0] == trace.blocks[50][0]
        assert trace.skipped.count == 1 and "broken request log line" in trace.skipped.examples[0]
        assert "event" in trace.skipped.examples[0]
        with pytest.raises(UserError, match="ResourceNotFoundException"):
            traces.read_cloudwatch("/missing", now - 1000, now + 1000, client=client)
        # A bound on the events read cuts the window, and says so.
        cut = traces.read_cloudwatch("/aws/lambda/normalizer", now - 1000, now + 1000, client=client, max_events=50)
        assert len(cut) == 50 and cut.lines == 50
        assert any(n.startswith("read the first 50 events only (the bound): the window was cut at") for n in cut.notes)
        assert not any("the bound" in n for n in trace.notes)


# ---------------------------------------------------------------- raw bodies, through the normalizer


def test_raw_bodies_are_normalized(tmp_path):
    from prefix_routing import rules as normalize
    system = "You are a careful assistant for the lab. " * 60  # ~2.5 KB shared system prompt
    bodies = [
        {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "first question"}], "max_tokens": 64},
        # The same system prompt with the keys in another order and parameters first: the
        # normalizer gives it the same leading bytes, so the same leading blocks.
        {"max_tokens": 32, "messages": [{"content": system, "role": "system"}, {"role": "user", "content": "second"}]},
        "not json at all",
        {"no_prompt": True},
        {"prompt": "short", "parameters": {"max_new_tokens": 7}},
    ]
    path = tmp_path / "bodies.jsonl"
    path.write_text("".join((b if isinstance(b, str) else json.dumps(b, indent=None)) + "\n" for b in bodies))
    trace = traces.read_bodies(path, block_bytes=512, rate=2.0)
    assert len(trace) == 3
    assert trace.arrivals == [0.0, 0.5, 1.0]
    assert trace.output_tokens == [64, 32, 7]
    assert trace.block_bytes == 512 and trace.block_tokens == 128
    first, second, short = trace.blocks
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    assert shared >= 4  # the system prompt's blocks are common
    assert len(short) == 1  # shorter than a block: one id of the whole body
    assert trace.skipped.reasons == {"invalid JSON line": 1, "rejected by the normalizer": 1}
    assert any(e.startswith(f"{path}:4: rejected by the normalizer: NormalizationError") for e in trace.skipped.examples)
    with pytest.raises(UserError, match=r"bodies\.jsonl:3: invalid JSON line"):
        traces.read_bodies(path, strict=True)
    assert traces.load_trace(path, "auto", block_bytes=512).blocks == trace.blocks  # sniffed as bodies
    settings = normalize.NormalizerSettings(block_bytes=1024)
    assert traces.read_bodies(path, settings=settings).block_bytes == 1024


def test_raw_bodies_say_which_the_client_keyed_differently(tmp_path):
    system = "You are a careful assistant for the lab. " * 150  # ~6 KB: past PrefixLength 4096
    canonical = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "q"}], "max_tokens": 64}
    compact = json.dumps(canonical, separators=(",", ":"))  # what the normalizer writes: not re-keyed
    spaced = json.dumps(canonical)  # ", " and ": " from the first byte on: re-keyed
    first = json.dumps({"max_tokens": 64, **canonical}, separators=(",", ":"))  # a parameter first: re-keyed
    path = tmp_path / "bodies.jsonl"
    path.write_text("\n".join([compact, spaced, first, spaced]) + "\n")
    trace = traces.read_bodies(path)
    assert trace.rekeyed == [False, True, True, True]
    assert trace.raw_keys[0] is None and trace.raw_keys[1] == trace.raw_keys[3] != trace.raw_keys[2]
    assert len(set(map(tuple, trace.blocks))) == 1  # one normalized body: the cache sees one prompt
    assert trace.head(2).rekeyed == [False, True] and trace.head(2).raw_keys[1] == trace.raw_keys[1]


def test_request_log_gives_the_measured_hit_rate_of_its_window(tmp_path):
    t0 = 1_764_500_000_000
    path = write(tmp_path, "log.jsonl", [
        log_line(t0, ["aa"], **{LogField.CACHED_TOKENS: 500}),
        log_line(t0 + 1000, ["aa"], **{LogField.CACHED_TOKENS: None}),  # no usage reported: left out
        log_line(t0 + 2000, ["aa"], **{LogField.CACHED_TOKENS: 1200}),  # more than the prompt: the prompt
    ])
    trace = traces.read_request_log(path)
    assert trace.cached_tokens == [500, None, 1000]
    assert trace.measured_hit_rate() == pytest.approx((500 + 1000) / (1000 + 1000))
    assert traces.read_request_log(write(tmp_path, "none.jsonl", [log_line(t0, ["aa"])])).measured_hit_rate() is None
