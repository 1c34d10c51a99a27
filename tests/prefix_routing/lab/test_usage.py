"""``usage``: the request log added up per tenant, against sums computed by hand from the lines below."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prefix_routing.lab.latency import LatencyModel
from prefix_routing.lab.usage import CSV_COLUMNS, prefill_saved_s, read_usage, render_csv, render_text

ROOT = Path(__file__).resolve().parents[3]
MESSAGE = "prefix_routing.request"


def line(tenant: str | None, status: int = 200, **fields) -> str:
    record = {"message": MESSAGE, "status": status, **fields}
    if tenant is not None:
        record["tenant"] = tenant
    return json.dumps(record)


LOG = [
    line("arn:aws:iam::111122223333:role/acme", prompt_tokens=1000, cached_tokens=600, output_tokens=50),
    line("arn:aws:iam::111122223333:role/acme", prompt_tokens=200, cached_tokens=None, output_tokens=10),
    line("arn:aws:iam::111122223333:role/acme", 429, throttled_by="tokens_per_minute", error_kind="rate_limited"),
    line("arn:aws:iam::111122223333:role/beta", prompt_tokens=500, cached_tokens=700, output_tokens=5),  # cached > prompt
    line("arn:aws:iam::111122223333:role/beta", 502, error_kind="model_error"),
    line(None, prompt_tokens=100, cached_tokens=0, output_tokens=1),
    "START RequestId: 1234 Version: $LATEST",  # a runtime line
    json.dumps({"message": "something else", "status": 200}),
    '{"message": "prefix_routing.request", "status": 200, "prompt_tokens": ',  # cut short
    line("arn:aws:iam::111122223333:role/acme", prompt_tokens=-3),
    line("arn:aws:iam::111122223333:role/acme", prompt_tokens=20_000_000),  # beyond the lab's bound
]
#: Prefill: 1 ms a token, 10 ms a chunk of up to 10,000 tokens, nothing else.
LATENCY = LatencyModel(prefill_s_per_token=0.001, attention_s_per_token_pair=0.0, step_base_s=0.01,
                       step_s_per_context_token=0.0, step_s_per_sequence=0.0, chunk_tokens=10_000, max_num_seqs=1)


def test_the_prefill_saved_is_the_cold_prefill_minus_the_rest_after_the_cached_part():
    # 1,000 cold: 1.0 + 0.01; the 400 after 600 cached: 0.4 + 0.01; saved 0.6
    assert prefill_saved_s(LATENCY, 1000, 600) == pytest.approx(0.6)
    assert prefill_saved_s(LATENCY, 500, 500) == pytest.approx(0.5)  # 0.51 - one step of nothing new
    assert prefill_saved_s(LATENCY, 500, 0) == 0.0


def test_each_tenants_sums_are_the_hand_computed_ones():
    report = read_usage(((f"log:{i}", text) for i, text in enumerate(LOG, 1)), LATENCY)
    acme = report.tenants["arn:aws:iam::111122223333:role/acme"]
    assert (acme.requests, acme.served, acme.prompt_tokens, acme.cached_tokens, acme.completion_tokens, acme.errors) \
        == (3, 2, 1200, 600, 60, 0)
    assert dict(acme.refused) == {"tokens_per_minute": 1}
    assert acme.prefill_saved_s == pytest.approx(0.6)
    beta = report.tenants["arn:aws:iam::111122223333:role/beta"]
    assert (beta.requests, beta.served, beta.prompt_tokens, beta.cached_tokens, beta.errors) == (2, 1, 500, 500, 1)
    assert beta.prefill_saved_s == pytest.approx(0.5) and beta.cached_share == 1.0
    none = report.tenants["(none)"]
    assert (none.requests, none.prompt_tokens, none.completion_tokens) == (1, 100, 1)
    assert report.skipped.count == 3 and sum(report.skipped.ignored.values()) == 2
    assert report.lines == 11
    total = report.total()
    assert (total.requests, total.prompt_tokens, total.cached_tokens, total.completion_tokens) == (6, 1800, 1100, 66)


def test_the_csv_is_one_row_per_tenant_most_prompt_tokens_first():
    report = read_usage(((f"log:{i}", text) for i, text in enumerate(LOG, 1)), LATENCY)
    rows = render_csv(report).splitlines()
    assert rows[0].split(",") == list(CSV_COLUMNS)
    assert rows[1] == "arn:aws:iam::111122223333:role/acme,3,2,1200,600,60,0.5000,0.600,0,1,0,0"
    assert rows[2] == "arn:aws:iam::111122223333:role/beta,2,1,500,500,5,1.0000,0.500,0,0,0,1"
    assert rows[3] == "(none),1,1,100,0,1,0.0000,0.000,0,0,0,0"
    assert len(rows) == 4


def test_the_table_names_the_refusals_and_what_was_skipped():
    report = read_usage(((f"log:{i}", text) for i, text in enumerate(LOG, 1)), LATENCY)
    text = render_text(report, top=1)
    assert "(2 more tenants)" in text and "all tenants" in text
    assert "refused by limit: tokens_per_minute 1" in text
    assert "skipped 3 of 11 lines" in text


def test_the_command_reads_a_saved_log_and_prints_csv(tmp_path):
    log = tmp_path / "requests.jsonl"
    log.write_text("\n".join(LOG) + "\n")
    done = subprocess.run([sys.executable, "-m", "prefix_routing", "usage", "--log-file", str(log), "--csv"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith("arn:aws:iam::111122223333:role/acme,3,2,1200,600,60,0.5000,")
    missing = subprocess.run([sys.executable, "-m", "prefix_routing", "usage", "--log-file", str(tmp_path / "no")],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert missing.returncode != 0 and "Traceback" not in missing.stderr and "--log-file" in missing.stderr


def test_a_log_groups_window_is_read_with_the_request_filter_and_cut_at_its_bound():
    import boto3
    from botocore.stub import Stubber

    from prefix_routing.lab.usage import cloudwatch_lines, read_usage_from_cloudwatch
    from prefix_routing.rules.errors import UserError

    client = boto3.client("logs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    asked = {"logGroupName": "/aws/lambda/f", "startTime": 1000, "endTime": 2000,
             "filterPattern": '"prefix_routing.request"'}
    events = [{"eventId": str(i), "timestamp": 1000 + i, "message": text} for i, text in enumerate(LOG[:3])]
    with Stubber(client) as stub:
        stub.add_response("filter_log_events", {"events": events}, asked)
        report = read_usage_from_cloudwatch("/aws/lambda/f", 1000, 2000, LATENCY, client=client)
        assert report.tenants["arn:aws:iam::111122223333:role/acme"].requests == 3
        stub.add_response("filter_log_events", {"events": events}, asked)
        cut: list = []
        assert len(list(cloudwatch_lines(client, "/aws/lambda/f", 1000, 2000, max_events=2, cut=cut))) == 2
        assert cut == [1002]  # the first event past the bound
        stub.add_client_error("filter_log_events", "ResourceNotFoundException", "no such group")
        with pytest.raises(UserError, match="--log-group /aws/lambda/f: ResourceNotFoundException"):
            read_usage_from_cloudwatch("/aws/lambda/f", 1000, 2000, LATENCY, client=client)


def test_a_saved_log_is_read_as_every_trace_a_line_beyond_the_bound_skipped_not_held(tmp_path):
    import gzip

    from prefix_routing.lab import input_bounds
    from prefix_routing.lab.traces import LINE_TOO_LONG
    from prefix_routing.lab.usage import file_lines

    log = tmp_path / "requests.jsonl.gz"
    with gzip.open(log, "wt") as handle:
        handle.write("x" * (input_bounds.MAX_LINE_BYTES + 1) + "\n" + LOG[0] + "\n")
    report = read_usage(file_lines(str(log)), LATENCY)
    assert report.lines == 2 and dict(report.skipped.reasons) == {LINE_TOO_LONG: 1}
    assert report.tenants["arn:aws:iam::111122223333:role/acme"].prompt_tokens == 1000
