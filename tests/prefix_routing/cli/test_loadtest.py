"""``python -m prefix_routing loadtest`` against the local runtime (prefix_routing.cli.loadtest)."""

from __future__ import annotations

import json

import pytest

from prefix_routing.cli.main import main
from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.faults import Faults
from prefix_routing.emulator.server import serve_runtime
from tests.prefix_routing.loadtest.conftest import items


def test_cli_run_writes_reports(trace_file, tmp_path, capsys):
    out = tmp_path / "out"
    with serve_runtime(EchoBackend()) as server:
        code = main(["loadtest", "--trace", trace_file, "--target", "sagemaker", "--endpoint", "ep",
                     "--component", "ic", "--endpoint-url", server.url, "--max-requests", "6",
                     "--concurrency", "2", "--out", str(out), "--json", "--no-progress"])
        server.wait_until_idle(5)
        assert len(server.requests) == 6
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["summary"]["requests_sent"] == 6 and printed["summary"]["succeeded"] == 6
    report = json.loads((out / "report.json").read_text())
    for key in ("requests_sent", "succeeded", "failed", "errors_by_kind", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
                "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "output_tokens_per_s", "hit_rate"):
        assert key in report["summary"]
    assert len(report["requests"]) == 6 and report["requests"][0]["request_id"]
    assert "| TTFT (client) |" in (out / "report.md").read_text()
    for png in ("ttft_cdf.png", "latency_over_time.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_bodies_file_and_max_error_rate(tmp_path, capsys):
    path = tmp_path / "bodies.jsonl"
    path.write_bytes(b"\n".join(w.body for w in items(4)) + b"\n")
    with serve_runtime(EchoBackend(), faults=Faults(throttle_first=2)) as server:
        code = main(["loadtest", "--bodies", str(path), "--target", "sagemaker", "--endpoint", "ep",
                     "--endpoint-url", server.url, "--rate", "50", "--no-progress", "--max-error-rate", "0.2"])
    captured = capsys.readouterr()
    assert code == 1 and "requests sent 4: succeeded 2, failed 2 (errors: throttled 2)" in captured.out
    assert "exceeds --max-error-rate" in captured.err


BAD_INPUT = [
    (["--trace", "/nonexistent/trace.jsonl", "--target", "sagemaker", "--endpoint", "ep"], "not found"),
    (["--bodies", "/nonexistent/b.jsonl", "--target", "openai", "--url", "http://127.0.0.1:9/", "--token", "t"],
     "not found"),
    (["--trace", "{trace}", "--target", "bedrock"], "unknown target"),
    (["--trace", "{trace}", "--target", "sagemaker"], "--endpoint"),
    (["--trace", "{trace}", "--target", "openai"], "--url"),
    (["--trace", "{trace}", "--target", "sagemaker", "--endpoint", "ep", "--concurrency", "0"], "--concurrency"),
    (["--trace", "{trace}", "--target", "sagemaker", "--endpoint", "ep", "--rate", "-1"], "--rate"),
    (["--trace", "{trace}", "--target", "sagemaker", "--endpoint", "ep", "--rate", "1", "--speed", "2"],
     "not allowed with"),
    (["--target", "sagemaker", "--endpoint", "ep"], "--trace"),
    (["--trace", "{trace}", "--target", "sagemaker", "--endpoint", "ep", "--prefix-aware-id", "x" * 65],
     "--prefix-aware-id"),
    (["--trace", "{trace}", "--target", "lambda-url", "--url", "ftp://x"], "--url"),
    (["--trace", "{trace}", "--target", "openai", "--url", "http://127.0.0.1:9/", "--token", "t",
      "--header", "no-colon"], "--header"),
    (["--trace", "{trace}", "--target", "sagemaker", "--endpoint", "ep", "--max-requests", "many"], "--max-requests"),
    (["--trace", "{trace}", "--target", "sagemaker", "--endpoint", "ep", "--prefix-length", "4096"],
     "--normalize"),
    (["--trace", "{trace}", "--target", "sagemaker", "--endpoint", "ep", "--normalize", "--prefix-length", "12"],
     "prefix_length"),
]


@pytest.mark.parametrize("argv,message", BAD_INPUT, ids=[str(i) for i in range(len(BAD_INPUT))])
def test_cli_bad_input_is_one_line_and_exit_2(argv, message, trace_file, capsys):
    argv = ["loadtest"] + [a.replace("{trace}", trace_file) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], captured.err
    assert "Traceback" not in captured.err


def test_cli_users_is_the_closed_loop_and_conflicts_with_another_concurrency(trace_file, tmp_path, capsys):
    with serve_runtime(EchoBackend()) as server:
        code = main(["loadtest", "--trace", trace_file, "--target", "sagemaker", "--endpoint", "ep",
                     "--endpoint-url", server.url, "--max-requests", "4", "--users", "2", "--json",
                     "--no-progress", "--out", str(tmp_path / "out")])
    assert code == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["config"]["users"] == 2 and report["config"]["concurrency"] == 2
    capsys.readouterr()
    assert main(["loadtest", "--trace", trace_file, "--target", "sagemaker", "--endpoint", "ep",
                 "--users", "2", "--concurrency", "5"]) == 2
    assert "--users 2 is 2 requests in flight; --concurrency 5 says otherwise" in capsys.readouterr().err
