"""The load tester against the local SageMaker runtime (EchoBackend, fault injection), on 127.0.0.1.

Every run checks the accounting: requests sent = succeeded + failed, the server saw exactly as many
requests, and each failure names the fault the server injected (joined on the request id).
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from prefix_routing.lab import bodies
from prefix_routing import loadtest as L
from prefix_routing.cli.main import main
from prefix_routing.rules.errors import UserError
from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.faults import Faults
from prefix_routing.emulator.server import serve_runtime
from tests.network_guard import ISOLATED_AWS_ENV
from tests.prefix_routing.test_bodies import nfc

TOKEN = "test-token"
FAKE_KEY_ID = ISOLATED_AWS_ENV["AWS_ACCESS_KEY_ID"]  # the isolated credentials sign the requests


def mooncake_lines(n: int, output_length: int = 6) -> list[str]:
    """A small trace: 3 conversations whose prompts grow turn by turn (chained ids), 1 s apart."""
    lines = []
    for i in range(n):
        conversation, turn = i % 3, i // 3
        ids = [0] + [1000 * (conversation + 1) + k for k in range(turn + 1)]
        lines.append(json.dumps({"timestamp": i * 1000, "input_length": 512 * len(ids) - 100,
                                 "output_length": output_length, "hash_ids": ids}))
    return lines


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(mooncake_lines(24)) + "\n")
    return str(path)


def items(n: int, output_length: int = 6) -> list[L.WorkItem]:
    out = []
    for i, line in enumerate(mooncake_lines(n, output_length)):
        body = bodies.serialize(bodies.chat_body(json.loads(line)))
        out.append(L.WorkItem(i, body, float(i), f"test:{i}"))
    return out


def sagemaker(server) -> L.SageMakerTarget:
    return L.SageMakerTarget("ep", inference_component="ic-1", prefix_aware_id="tenant-a", endpoint_url=server.url,
                             timeout=5, concurrency=4)


def openai(server, token=TOKEN) -> L.OpenAITarget:
    return L.OpenAITarget(f"{server.url}/endpoints/ep/openai/v1", token=token, timeout=5)


def check_accounting(result: L.LoadResult, server, sent: int) -> dict:
    """requests sent = succeeded + failed = what the server recorded; returns the server's records by id."""
    assert server.wait_until_idle(5)
    summary = L.summarize(result)
    assert summary["requests_sent"] == sent == len(result.results)
    assert summary["succeeded"] + summary["failed"] == sent
    assert sum(summary["errors_by_kind"].values()) == summary["failed"]
    assert sorted(r.index for r in result.results) == list(range(sent))  # none lost, none twice
    records = {r.request.request_id: r for r in server.requests}
    assert len(server.requests) == summary["attempts"] == sent
    ids = [r.request_id for r in result.results]
    assert None not in ids and len(set(ids)) == sent and set(ids) == set(records)
    for row in result.results:
        assert row.ok == (row.error_kind is None)
        if not row.ok:
            assert row.error_detail
    return records


# --------------------------------------------------------------------------- reading answers


def parse(chunks, expect_usage=False):
    parser = L.StreamParser()
    for chunk in chunks:
        parser.feed(chunk)
    parser.close()
    return parser, parser.verdict(expect_usage)


def test_stream_parser_formats_and_fragments():
    usage = {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}}
    events = [{"choices": [{"delta": {"content": "a"}, "finish_reason": None}]},
              {"choices": [{"delta": {"content": "b"}, "finish_reason": "stop"}]},
              {"choices": [], "usage": usage}]
    sse = b"".join(b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events) + b"data: [DONE]\n\n"
    parser, verdict = parse([sse[i:i + 1] for i in range(len(sse))], expect_usage=True)  # one byte at a time
    assert verdict == (None, None)
    assert (parser.output_tokens, parser.prompt_tokens, parser.cached_tokens) == (2, 9, 3)
    assert parse([sse[: sse.rindex(b"data: [DONE]")]])[1][0] == "truncated"
    jsonl = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    assert parse([jsonl], expect_usage=True)[1] == (None, None)
    assert parse([jsonl[: jsonl.rindex(b'{"choices": []')]], expect_usage=True)[1][0] == "truncated"
    assert parse([jsonl[: jsonl.rindex(b'{"choices": []')]], expect_usage=False)[1] == (None, None)
    whole = json.dumps({"choices": [{"message": {"content": "ab"}, "finish_reason": "length"}], "usage": usage},
                       indent=2).encode()
    parser, verdict = parse([whole[:10], whole[10:]], expect_usage=True)
    assert verdict == (None, None) and parser.cached_tokens == 3
    tgi = [b'data:{"token":{"text":"a"},"generated_text":null}\n\n',
           b'data:{"token":{"text":"b"},"generated_text":"ab","details":{"finish_reason":"length",'
           b'"generated_tokens":2}}\n\n']
    parser, verdict = parse(tgi)
    assert verdict == (None, None) and parser.output_tokens == 2
    assert parse(tgi[:1])[1][0] == "truncated"
    assert parse([b'data: {"error": {"message": "boom", "code": "X"}}\n\n'])[1] == ("stream_error", "X: boom")
    assert parse([b""])[1][0] == "truncated"
    assert parse([b"<html>oops</html>"])[1] == ("truncated", "unreadable answer")


# --------------------------------------------------------------------------- runs that succeed


def test_run_completes_with_correct_counts_usage_and_hits():
    with serve_runtime(EchoBackend(block_tokens=16)) as server:
        result = L.run_load(items(12), sagemaker(server), concurrency=3, progress=False)
        records = check_accounting(result, server, 12)
    summary = L.summarize(result)
    assert summary["succeeded"] == 12 and summary["errors_by_kind"] == {}
    assert summary["stopped_by"] == "end of input"
    assert summary["output_tokens"] == 12 * 6 and summary["requests_with_usage"] == 12
    # Later turns of a conversation reuse its earlier blocks. The hit rate is token-weighted (cached ÷
    # prompt tokens, each summed over the requests), not a mean of per-request rates, which differs here.
    prompt = sum(row.prompt_tokens for row in result.results)
    cached = sum(row.cached_tokens for row in result.results)
    per_request_mean = sum(row.cached_tokens / row.prompt_tokens for row in result.results) / 12
    assert 0 < cached < prompt and summary["hit_rate"] == round(cached / prompt, 4)
    assert abs(summary["hit_rate"] - per_request_mean) > 0.01
    for row in result.results:
        record = records[row.request_id]
        assert record.outcome == "ok"
        assert record.headers.inference_component == "ic-1" and record.headers.prefix_aware_id == "tenant-a"
        assert record.body == items(12)[row.index].body
        assert row.finish_reason == "length" and row.ttft_s <= row.e2e_s
    # the first request the server saw found an empty cache
    first = next(r for r in records.values() if r.request.index == 0)
    assert next(row for row in result.results if row.request_id == first.request.request_id).cached_tokens == 0


@pytest.fixture
def short_gil_switch():
    """Server and client share one process here (not so with the emulator): a shorter GIL switch
    interval keeps one side's thread from holding the other's timestamps back by up to 5 ms."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    yield
    sys.setswitchinterval(old)


@pytest.mark.parametrize("make_target", [sagemaker, openai], ids=["sagemaker", "openai"])
def test_client_ttft_agrees_with_server_ttft(make_target, short_gil_switch):
    """P50 client-side TTFT within 5 % of the server's own per-request TTFT (joined on request id),
    with a 100 ms first chunk. Connections are warmed up first (connection setup is not TTFT).

    CPU load from outside (other test workers on this 2-core machine) can only make the client late,
    never early, so a round spoilt by it is measured again: up to 3 rounds of 20 requests.
    """
    gaps = []
    with serve_runtime(EchoBackend(first_chunk_delay=0.1, token_delay=0.001), bearer_token=TOKEN) as server:
        target = make_target(server)
        L.run_load(items(4), target, concurrency=4, progress=False)  # warm-up: 4 kept-alive connections
        assert server.wait_until_idle(5)
        for _ in range(3):
            server.clear_requests()
            result = L.run_load(items(20), target, concurrency=4, progress=False)
            records = check_accounting(result, server, 20)
            pairs = [(row.ttft_s, records[row.request_id].ttft) for row in result.results]
            client = L.percentile([c for c, _ in pairs], 50)
            server_p50 = L.percentile([s for _, s in pairs], 50)
            gaps.append(round((client - server_p50) / server_p50, 4))
            per_request = L.percentile([c - s for c, s in pairs], 50)
            if abs(gaps[-1]) < 0.05 and abs(per_request) < 0.005:  # median per-request gap: a few ms
                break
    assert abs(gaps[-1]) < 0.05, f"relative P50 gaps per round: {gaps}"


def test_openai_target_against_the_sse_path():
    with serve_runtime(EchoBackend(), bearer_token=TOKEN) as server:
        target = openai(server)
        result = L.run_load(items(6), target, concurrency=2, progress=False)
        records = check_accounting(result, server, 6)
        assert target.connections_opened <= 2  # kept-alive connections are reused
        assert all(r.operation == "ChatCompletions" and r.outcome == "ok" for r in records.values())
        assert all(r.headers.bearer_token == TOKEN for r in records.values())
        assert L.summarize(result)["succeeded"] == 6
        assert all(row.output_tokens == 6 and row.prompt_tokens for row in result.results)

        bad = L.run_load(items(2), openai(server, token="wrong"), progress=False)
        assert [r.error_kind for r in bad.results] == ["http_401", "http_401"]


def test_openai_target_needs_a_token_or_the_sagemaker_sdk(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_sagemaker(name, *args, **kwargs):
        if name == "sagemaker" or name.startswith("sagemaker."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sagemaker)
    with pytest.raises(UserError, match=r"pip install sagemaker.*token_generator"):
        L.OpenAITarget("http://127.0.0.1:9/endpoints/ep/openai/v1/chat/completions")


class _FunctionUrl(BaseHTTPRequestHandler):
    """A stand-in for the normalizer's Function URL: checks the SigV4 header, streams SSE."""

    protocol_version = "HTTP/1.1"
    seen: list = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        auth = self.headers.get("Authorization", "")
        type(self).seen.append((auth, self.headers.get("X-Amz-Date"), self.headers.get("x-tenant-id"), body))
        if not auth.startswith(f"AWS4-HMAC-SHA256 Credential={FAKE_KEY_ID}/") or "/lambda/aws4_request" not in auth:
            payload = b'{"message":"Forbidden"}'
            self.send_response(403)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        for marker, status, code in ((b"throttle-me", 429, "throttled"), (b"model-fail", 502, "model_error")):
            if marker in body:  # the front door's error bodies (prefix_routing.invoke.UpstreamError)
                payload = json.dumps({"error": {"code": code, "message": "upstream said no", "status": status}})
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload.encode())
                return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("x-amzn-RequestId", "lambda-req-1")
        self.end_headers()
        events = [
            {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1,
                                      "prompt_tokens_details": {"cached_tokens": 4}}},
        ]
        chunks = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
        if b"cut-me" in body:  # the upstream stream was cut: the front door appends an in-band error
            chunks = chunks[:1] + [b'data: {"error":{"message":"cut","type":"truncated","code":502}}\n\n']
        for chunk in chunks:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")


def test_lambda_url_target_signs_with_sigv4_and_streams():
    _FunctionUrl.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FunctionUrl)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/"
        target = L.LambdaUrlTarget(url, region="eu-west-1", headers={"x-tenant-id": "t1"}, timeout=5)
        work = items(3) + [
            L.WorkItem(3 + i, b'{"messages":[{"role":"user","content":"%s"}]}' % marker, None, "x")
            for i, marker in enumerate((b"throttle-me", b"model-fail", b"cut-me"))
        ]
        result = L.run_load(work, target, concurrency=2, progress=False)
        target.close()
    finally:
        server.shutdown()
        server.server_close()
    rows = result.results
    assert [r.ok for r in rows] == [True, True, True, False, False, False]
    assert [r.error_kind for r in rows[3:]] == ["throttled", "model_error", "truncated"]
    assert rows[0].request_id == "lambda-req-1" and rows[0].cached_tokens == 4
    assert len(_FunctionUrl.seen) == 6
    for auth, date, tenant, _ in _FunctionUrl.seen:
        assert "/eu-west-1/lambda/aws4_request" in auth and date and tenant == "t1"
        assert "SignedHeaders=" in auth and "x-tenant-id" in auth.split("SignedHeaders=")[1]


# --------------------------------------------------------------------------- every fault kind, accounted


FAULTS = [
    ("throttled", Faults(throttle_first=3), "throttle", 3),
    ("http_503", Faults(error_first=2), "error", 2),
    ("model_error", Faults(error_first=2, error_kind="ModelError"), "error", 2),
    ("stream_error", Faults(stream_error_after=2, stream_error_rate=0.5, seed=4), "stream_error", None),
    ("truncated", Faults(truncate_after=3, truncate_rate=0.5, seed=5), "truncate", None),
    ("connection", Faults(drop_after=2, drop_rate=0.5, seed=6), "drop", None),
]


@pytest.mark.parametrize("kind,faults,server_fault,expected", FAULTS, ids=[f[0] for f in FAULTS])
@pytest.mark.parametrize("make_target", [sagemaker, openai], ids=["sagemaker", "openai"])
def test_each_fault_is_accounted_once_with_its_reason(kind, faults, server_fault, expected, make_target):
    n = 10
    with serve_runtime(EchoBackend(), faults=faults, bearer_token=TOKEN) as server:
        result = L.run_load(items(n), make_target(server), concurrency=3, progress=False)
        records = check_accounting(result, server, n)
    summary = L.summarize(result)
    injected = [r for r in records.values() if r.fault == server_fault]
    assert injected, "the fault was injected at least once"
    if expected is not None:
        assert len(injected) == expected
    # exactly the requests the server failed are failed on the client side, with the fault's kind
    assert summary["failed"] == len(injected)
    assert summary["errors_by_kind"] == {kind: len(injected)}
    for row in result.results:
        record = records[row.request_id]
        assert (record.fault == server_fault) == (not row.ok)
        if not row.ok:
            assert row.error_kind == kind
        else:
            assert record.outcome == "ok" and row.finish_reason
    if kind == "truncated":  # the answer had started: never passed off as complete
        assert all(r.bytes_received > 0 for r in result.results if not r.ok)


def test_timeout_is_a_failure_of_its_own():
    with serve_runtime(EchoBackend(first_chunk_delay=1.0)) as server:
        target = L.SageMakerTarget("ep", endpoint_url=server.url, timeout=0.3)
        result = L.run_load(items(2), target, concurrency=2, progress=False)
        server.wait_until_idle(5)
        assert len(server.requests) == 2
    assert [r.error_kind for r in result.results] == ["timeout", "timeout"]


def test_retries_are_counted_once_per_request():
    with serve_runtime(EchoBackend(), faults=Faults(throttle_first=3)) as server:
        result = L.run_load(items(4), sagemaker(server), concurrency=1, retries=3, progress=False)
        server.wait_until_idle(5)
        assert len(server.requests) == 7
    summary = L.summarize(result)
    assert summary["requests_sent"] == 4 and summary["succeeded"] == 4 and summary["attempts"] == 7
    assert result.results[0].retried == ["throttled"] * 3


def test_bounds_stop_the_run_by_themselves():
    with serve_runtime(EchoBackend()) as server:
        target = sagemaker(server)
        by_count = L.run_load(items(24), target, max_requests=5, progress=False)
        by_time = L.run_load(items(24), target, rate=10, duration=0.45, progress=False)
        by_speed = L.run_load(items(24), target, speed=20, duration=0.3, progress=False)
        server.wait_until_idle(5)
        assert len(server.requests) == len(by_count.results) + len(by_time.results) + len(by_speed.results)
    assert (len(by_count.results), by_count.stopped_by) == (5, "max_requests")
    assert by_time.stopped_by == "duration" and 4 <= len(by_time.results) <= 5
    assert by_speed.stopped_by == "duration" and len(by_speed.results) == 6  # at 0, 0.05, ... 0.25 s
    assert all(r.start_s - r.scheduled_s < 0.2 for r in by_time.results)


def test_vary_and_normalize_are_applied_before_sending():
    work = items(3)
    with serve_runtime(EchoBackend()) as server:
        target = sagemaker(server)
        L.run_load(work, target, prepare=L.BodyPreparer(vary=True, seed=1), concurrency=1, progress=False)
        L.run_load(work, target, prepare=L.BodyPreparer(vary=True, normalize=True, seed=1), concurrency=1,
                   progress=False)
        bad = L.run_load([L.WorkItem(0, b"not json", None, "x:1")], target,
                         prepare=L.BodyPreparer(normalize=True), progress=False)
        server.wait_until_idle(5)
        sent = [r.body for r in server.requests]
    assert len(sent) == 6
    def nfc_loads(data: bytes):
        return nfc(json.loads(data))

    assert all(v != w.body for v, w in zip(sent[:3], work))
    assert all(nfc_loads(v) == json.loads(w.body) for v, w in zip(sent[:3], work))
    from prefix_routing.rules.body import normalize_body

    assert sent[3:] == [normalize_body(w.body).body for w in work]
    assert bad.results == [] and bad.skipped[0][0] == "x:1"


# --------------------------------------------------------------------------- the command line


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


# --------------------------------------------------------------------------- the summary's arithmetic


def row(i, *, ok=True, ttft=None, e2e=None, prompt=None, cached=None, output=None, kind=None) -> L.RequestResult:
    return L.RequestResult(index=i, source=f"r{i}", ok=ok, error_kind=kind, error_detail=None, status=200 if ok else 502,
                           request_id=f"id-{i}", start_s=float(i), scheduled_s=None, ttft_s=ttft, e2e_s=e2e,
                           output_tokens=output, prompt_tokens=prompt, cached_tokens=cached, finish_reason=None,
                           body_bytes=10, bytes_received=10)


def test_percentile_interpolates_between_closest_ranks():
    # Hand computed: position = (n - 1) × q / 100, then linear between the two ranks around it.
    assert L.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # position 1.5: 2 + 0.5 × (3 − 2)
    assert L.percentile([10, 20, 30, 40, 50], 90) == pytest.approx(46.0)  # position 3.6: 40 + 0.6 × 10
    assert L.percentile(list(range(1, 101)), 99) == pytest.approx(99.01)  # position 98.01
    assert L.percentile([10, 20, 30, 40, 50], 0) == 10 and L.percentile([10, 20, 30, 40, 50], 100) == 50
    assert L.percentile([7.0], 90) == 7.0
    assert L.percentile([], 50) is None and L.percentile([None, float("nan")], 50) is None
    assert L.percentile([3.0, None, 1.0], 50) == 2.0  # missing values are left out


def test_summary_hit_rate_is_token_weighted_over_succeeded_requests():
    rows = [
        row(0, ttft=0.1, e2e=1.0, prompt=1000, cached=900, output=10),  # 90 %
        row(1, ttft=0.3, e2e=2.0, prompt=100, cached=0, output=10),  # 0 %
        row(2, ttft=0.2, e2e=1.5, prompt=400, cached=None, output=5),  # no cache figure: counts as 0 cached
        row(3, ok=False, kind="model_error", prompt=5000, cached=5000),  # failed: left out
        row(4, ttft=0.4, e2e=0.5, prompt=None, cached=None, output=1),  # no usage: left out
    ]
    summary = L.summarize(L.LoadResult(rows, started_at=0.0, duration_s=10.0, stopped_by="end of input"))
    # Token-weighted: (900 + 0 + 0) / (1000 + 100 + 400) = 0.6. (A mean of per-request rates gives 0.3.)
    assert summary["hit_rate"] == 0.6
    assert (summary["prompt_tokens"], summary["cached_tokens"], summary["requests_with_usage"]) == (1500, 900, 3)
    assert (summary["succeeded"], summary["failed"], summary["errors_by_kind"]) == (4, 1, {"model_error": 1})
    assert summary["error_rate"] == 0.2 and summary["achieved_rate_rps"] == 0.5
    # TTFT over succeeded requests: 0.1, 0.2, 0.3, 0.4 -> P50 0.25 (position 1.5), P90 0.37 (position 2.7).
    assert summary["ttft_p50_s"] == 0.25 and summary["ttft_p90_s"] == 0.37
    assert summary["ttft_mean_s"] == 0.25 and summary["ttft_max_s"] == 0.4
    # Output tokens of succeeded requests: 10 + 10 + 5 + 1 over 10 s.
    assert summary["output_tokens"] == 26 and summary["output_tokens_per_s"] == 2.6
    # Decode speed: (output − 1) / (e2e − ttft) for outputs > 1: 9/0.9 = 10, 9/1.7 ≈ 5.294, 4/1.3 ≈ 3.077 -> P50 5.294.
    assert summary["decode_tokens_per_s_p50"] == 5.294
    # E2E over succeeded requests: 1.0, 2.0, 1.5, 0.5 -> sorted 0.5 1.0 1.5 2.0: P50 1.25, mean 1.25, max 2.0.
    assert (summary["e2e_p50_s"], summary["e2e_mean_s"], summary["e2e_max_s"]) == (1.25, 1.25, 2.0)
    assert summary["attempts"] == 5 and summary["request_ids_seen"] == 5
    assert (summary["duration_s"], summary["stopped_by"], summary["skipped_not_sent"]) == (10.0, "end of input", 0)
    assert summary["client_cpu_utilization"] is None and summary["schedule_lag_p50_s"] is None


def test_summary_of_a_paced_run_with_retries_skips_and_client_figures():
    rows = [row(i, ttft=0.1 * (i + 1), e2e=1.0, prompt=10, cached=5, output=2) for i in range(4)]
    for i, r in enumerate(rows):
        r.scheduled_s = float(i)
        r.start_s = i + 0.01 * (i + 1)  # late by 10, 20, 30, 40 ms
        r.client_overhead_s = 0.001 * (i + 1)
    rows[1].attempts = 3
    rows[2].request_id = None
    result = L.LoadResult(rows, started_at=0.0, duration_s=4.0, stopped_by="duration",
                          skipped=[("x:1", "bad line")], client_cpu_s=1.0)
    summary = L.summarize(result)
    assert summary["attempts"] == 6 and summary["request_ids_seen"] == 3 and summary["skipped_not_sent"] == 1
    assert summary["stopped_by"] == "duration" and summary["achieved_rate_rps"] == 1.0
    assert summary["client_cpu_utilization"] == 0.25  # 1 CPU second over 4 s
    assert summary["client_overhead_p50_s"] == 0.0025  # 1, 2, 3, 4 ms -> 2.5 ms
    assert summary["schedule_lag_p50_s"] == 0.025 and summary["schedule_lag_max_s"] == 0.04
    assert summary["error_rate"] == 0.0 and summary["errors_by_kind"] == {}
    assert summary["hit_rate"] == 0.5
    empty = L.summarize(L.LoadResult([], started_at=0.0, duration_s=0.0, stopped_by="end of input"))
    assert empty["error_rate"] is None and empty["achieved_rate_rps"] is None and empty["hit_rate"] is None
    assert empty["ttft_p50_s"] is None and empty["ttft_mean_s"] is None and empty["output_tokens_per_s"] is None


def test_summary_rounds_rates_to_their_digits_and_guards_its_divisions():
    rows = [
        row(0, ttft=0.5, e2e=1.5, prompt=100, cached=50, output=2),  # decode: (2 − 1) / 1.0 = 1.0 token/s
        row(1, ttft=0.5, e2e=0.5, prompt=100, cached=0, output=10),  # e2e == ttft: no decode speed
        row(2, ttft=0.2, e2e=0.9, prompt=100, cached=0, output=None),  # no output count: 0 tokens
        row(3, ok=False, kind="throttled"),
    ]
    summary = L.summarize(L.LoadResult(rows, started_at=0.0, duration_s=3.14159, stopped_by="end of input",
                                       client_cpu_s=1.0))
    # By hand: 1 failure of 4 = 0.25; 4 / 3.14159 s = 1.273; 12 tokens / 3.14159 s = 3.82; 1 / 3.14159 = 0.318.
    assert summary["error_rate"] == 0.25 and summary["duration_s"] == 3.142
    assert summary["achieved_rate_rps"] == 1.273 and summary["output_tokens"] == 12
    assert summary["output_tokens_per_s"] == 3.82 and summary["client_cpu_utilization"] == 0.318
    assert summary["decode_tokens_per_s_p50"] == 1.0
    assert summary["hit_rate"] == round(50 / 300, 4) == 0.1667
    third = L.summarize(L.LoadResult(rows[:3] + [rows[3], row(4, ok=False, kind="x")] + [rows[3]] * 1,
                                     started_at=0.0, duration_s=0.5, stopped_by="end of input"))
    # 3 of 6 failed; a run shorter than a second still has rates: 6 / 0.5 s = 12.0.
    assert third["error_rate"] == 0.5 and third["achieved_rate_rps"] == 12.0
    assert third["output_tokens_per_s"] == 24.0
    one_of_three = L.summarize(L.LoadResult(rows[:2] + [rows[3]], started_at=0.0, duration_s=1.0,
                                            stopped_by="end of input"))
    assert one_of_three["error_rate"] == 0.3333  # four digits
