"""Hostile values in traces and request logs: each line is skipped with a reason that names the field
and the bound (prefix_routing/lab/input_bounds.py), and the rest of the trace is read as before.

Before the bounds, one request-log line with ``output_tokens: 10**12`` kept ``advise`` busy for
hours (the CLI test below, in a subprocess with a deadline) and the readers took such values as
they came (the reader tests below: nothing was skipped).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefix_routing.lab import input_bounds, traces
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LogField

REPO_ROOT = Path(__file__).resolve().parents[3]
T0_MS = 1_796_032_800_000  # 2026-11-30T10:00:00Z
NOW_MS = time.time() * 1000


def write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def log_line(i: int, **fields) -> dict:
    line = {LogField.MESSAGE: REQUEST_LOG_MESSAGE, LogField.TIMESTAMP_MS: T0_MS + i * 1000,
            LogField.BLOCK_HASHES: [f"{i % 3:016x}", f"{i:016x}"], LogField.BLOCK_BYTES: 2048,
            LogField.PROMPT_TOKENS: 1024, LogField.OUTPUT_TOKENS: 100, LogField.STATUS: 200}
    line.update(fields)
    return line


def mooncake_line(i: int, **fields) -> dict:
    line = {"timestamp": i * 1000, "input_length": 1024, "output_length": 100, "hash_ids": [0, i + 1]}
    line.update(fields)
    return line


def read_log_with(tmp_path, **hostile) -> traces.Trace:
    """Ten good lines with the hostile fields on the fifth."""
    rows = [log_line(i, **(hostile if i == 4 else {})) for i in range(10)]
    return traces.read_request_log(write(tmp_path / "log.jsonl", rows))


def only_skip(trace: traces.Trace) -> str:
    (reason,) = trace.skipped.reasons
    assert trace.skipped.count == 1 and len(trace) == 9
    assert trace.skipped.examples[0].startswith(f"{trace.source}:5: {reason}")
    return reason


@pytest.mark.parametrize("fields, reason", [
    ({LogField.OUTPUT_TOKENS: 10**12}, "'output_tokens' above 1,000,000"),
    ({LogField.PROMPT_TOKENS: 10**12}, "'prompt_tokens' above 10,000,000"),
    ({LogField.BODY_BYTES: 10**12}, "'body_bytes' above 6,291,456"),
    ({LogField.TIMESTAMP_MS: 10**18}, "'request_ts_ms' more than a day in the future"),
    ({LogField.TIMESTAMP_MS: 0}, "'request_ts_ms' before 2000-01-01"),
    ({LogField.BLOCK_HASHES: ["ab"] * 4000}, "'block_hashes count' above 3,072"),  # 6 MiB / 2,048 bytes
    ({LogField.BLOCK_BYTES: 1}, "missing or bad 'block_bytes'"),
])
def test_a_hostile_request_log_value_skips_its_line_by_name(tmp_path, fields, reason):
    trace = read_log_with(tmp_path, **fields)
    assert only_skip(trace) == reason
    assert max(trace.output_tokens) == 100 and max(trace.prompt_tokens) == 1024


def test_the_bounds_themselves_are_accepted(tmp_path):
    trace = read_log_with(tmp_path, **{LogField.OUTPUT_TOKENS: 1_000_000, LogField.PROMPT_TOKENS: 10_000_000,
                                       LogField.BLOCK_HASHES: ["ab"] * 3072})
    assert trace.skipped.count == 0 and max(trace.output_tokens) == 1_000_000


def test_a_request_far_from_the_others_in_time_is_skipped_not_modelled(tmp_path):
    # 40 days before the rest: 31 days is the longest trace modelled (half of it either side of the median).
    trace = read_log_with(tmp_path, **{LogField.TIMESTAMP_MS: T0_MS - 40 * 86_400_000})
    assert only_skip(trace) == "timestamp more than 15.5 days from the trace's median arrival"
    assert trace.duration_s == pytest.approx(9.0)  # the nine others, 1 s apart (line 5 is the gap)
    rows = [log_line(i) for i in range(10)]
    rows[4][LogField.TIMESTAMP_MS] = T0_MS - 40 * 86_400_000
    with pytest.raises(UserError, match=r"strict\.jsonl:5: timestamp more than 15\.5 days .* \(--strict\)"):
        traces.read_request_log(write(tmp_path / "strict.jsonl", rows), strict=True)


@pytest.mark.parametrize("fields, reason", [
    ({"output_length": 10**12}, "'output_length' above 1,000,000"),
    ({"input_length": 10**9, "hash_ids": []}, "'input_length' above 10,000,000"),
    ({"timestamp": NOW_MS + 3 * 86_400_000}, "'timestamp' more than a day in the future"),
])
def test_a_hostile_mooncake_value_skips_its_line_by_name(tmp_path, fields, reason):
    rows = [mooncake_line(i, **(fields if i == 4 else {})) for i in range(10)]
    trace = traces.read_mooncake(write(tmp_path / "trace.jsonl", rows))
    assert only_skip(trace) == reason


@pytest.mark.parametrize("body, reason", [
    ({"max_tokens": 10**12}, "'max_tokens' above 1,000,000"),
    ({"parameters": {"max_new_tokens": 10**7}}, "'parameters.max_new_tokens' above 1,000,000"),
    ({"max_tokens": -5}, "bad 'max_tokens'"),
])
def test_a_hostile_body_skips_its_line_by_name(tmp_path, body, reason):
    rows = [{"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 16} for i in range(10)]
    rows[4] = {"messages": [{"role": "user", "content": "question 4"}], **body}
    trace = traces.read_bodies(write(tmp_path / "bodies.jsonl", rows))
    assert only_skip(trace) == reason and max(trace.output_tokens) == 16


def test_a_body_rate_outside_its_range_is_one_clear_error(tmp_path):
    path = write(tmp_path / "bodies.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(UserError, match=r"body rate 1e-09 \(--body-rate\): must be from 0.001 to 1,000,000"):
        traces.read_bodies(path, rate=1e-9)


@pytest.mark.parametrize("compress", [False, True])
def test_a_line_longer_than_a_body_can_be_is_skipped_without_holding_it(tmp_path, compress):
    rows = [json.dumps(log_line(i)) for i in range(10)]
    rows[4] = json.dumps(log_line(4, padding="x" * (input_bounds.MAX_LINE_BYTES + 10)))
    text = "\n".join(rows) + "\n"
    path = tmp_path / ("log.jsonl.gz" if compress else "log.jsonl")
    if compress:
        with gzip.open(path, "wt") as out:
            out.write(text)
    else:
        path.write_text(text)
    trace = traces.read_request_log(path)
    assert only_skip(trace) == "line longer than 6,356,992 bytes"
    assert trace.lines == 10


HOSTILE_LOG = "\n".join(json.dumps(log_line(i, **({LogField.OUTPUT_TOKENS: 10**12} if i == 10 else {})))
                        for i in range(50)) + "\n"


def test_advise_on_a_log_with_a_hostile_count_finishes_and_says_what_it_skipped(tmp_path):
    path = tmp_path / "hostile.jsonl"
    path.write_text(HOSTILE_LOG)
    try:  # it used to run for hours: a deadline, in a process of its own
        done = subprocess.run([sys.executable, "-m", "prefix_routing", "advise", "--stage", "default", "--log-file",
                               str(path), "--json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("advise did not finish within 120 s on a log with output_tokens 10**12")
    assert done.returncode == 0, done.stderr
    assert "skipped 1 of 50 lines: 1 'output_tokens' above 1,000,000" in done.stderr
    assert json.loads(done.stdout)["window"]["requests"] == 49


def test_a_body_is_never_made_for_a_prompt_beyond_the_bound():
    from prefix_routing.lab.bodies import chat_body

    # Refused before any text is made (4 GB of it, for the first).
    with pytest.raises(ValueError, match=r"a prompt of 1,000,000,000 tokens: at most 10,000,000"):
        chat_body({"hash_ids": list(range(1_953_125)), "input_length": 10**9, "output_length": 1})
    with pytest.raises(ValueError, match=r"a prompt of 10,240,000 tokens: at most 10,000,000"):
        chat_body({"hash_ids": list(range(20_000)), "output_length": 1})
