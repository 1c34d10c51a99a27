"""The server's record: a bounded window of the latest requests, bodies within a byte budget, exact counts
(prefix_routing.emulator.recording)."""

from __future__ import annotations

import http.client
import json

import pytest

from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.protocol import OP_INVOKE, RequestHeaders, RuntimeRequest
from prefix_routing.emulator.recording import RequestLog
from prefix_routing.emulator.server import serve_runtime
from prefix_routing.rules.errors import UserError


def _request(i: int, body: bytes = b"") -> RuntimeRequest:
    return RuntimeRequest(OP_INVOKE, "ep", body, RequestHeaders(), (), 0.0, 0.0, f"r{i}", i, False, "/")


def _finish(log: RequestLog, record, outcome: str) -> None:
    record.outcome = outcome
    log.finish(record)


def test_the_window_keeps_the_latest_and_the_counts_stay_exact():
    log = RequestLog(limit=3)
    for i in range(5):
        _finish(log, log.admit(_request(i)), "ok" if i % 2 == 0 else "error")
    pending = log.admit(_request(5))
    assert [r.request.request_id for r in log.snapshot()] == ["r3", "r4", "r5"]
    assert log.total == 6
    assert log.outcome_counts() == {"ok": 3, "error": 2, "pending": 1}
    _finish(log, pending, "ok")
    assert log.outcome_counts() == {"ok": 4, "error": 2}


def test_bodies_are_kept_for_the_latest_within_the_byte_budget():
    log = RequestLog(limit=100, body_bytes=25)
    records = [log.admit(_request(i, bytes([65 + i]) * 10)) for i in range(4)]  # 10 bytes each
    # 25 bytes hold the last two bodies (20 bytes); the older two are dropped, their lengths kept.
    assert [r.body for r in records] == [b"", b"", b"C" * 10, b"D" * 10]
    assert [(r.body_recorded, r.body_length) for r in records] == [(False, 10), (False, 10), (True, 10), (True, 10)]
    big = log.admit(_request(9, b"x" * 26))  # larger than the whole budget: never kept
    assert (big.body, big.body_recorded, big.body_length) == (b"", False, 26)
    assert records[3].body == b"D" * 10
    assert log.window()["body_bytes"] == 20


def test_a_record_leaving_the_window_gives_its_body_bytes_back():
    log = RequestLog(limit=2, body_bytes=30)
    for i in range(5):
        log.admit(_request(i, b"z" * 10))
    assert log.window() == {"records": 2, "limit": 2, "bodies": 2, "body_bytes": 20, "body_bytes_limit": 30}
    assert all(r.body == b"z" * 10 for r in log.snapshot())


def test_record_bodies_false_keeps_none_and_clear_forgets_the_requests_in_flight():
    log = RequestLog(record_bodies=False)
    record = log.admit(_request(0, b"body"))
    assert (record.body, record.body_recorded, record.body_length) == (b"", False, 4)
    log.clear()
    _finish(log, record, "ok")  # admitted before the clear: not counted after it
    assert log.outcome_counts() == {} and log.total == 0


@pytest.mark.parametrize("options, message", [
    ({"limit": 0}, "record_limit=0: allowed an integer from 1 to 1000000"),
    ({"limit": 10**7}, "record_limit=10000000"),
    ({"body_bytes": -1}, "record_body_bytes=-1: allowed an integer from 0 to 1073741824"),
    ({"limit": 2.5}, "record_limit=2.5"),
])
def test_record_bounds_are_checked(options, message):
    with pytest.raises(UserError, match=message):
        RequestLog(**options)


def test_a_long_run_holds_a_bounded_record_and_exact_counts():
    """2,000 requests of 20 KB: the server holds the last 100 records and 100 KB of bodies, and counts all."""
    body = json.dumps({"messages": [{"role": "user", "content": "word " * 4000}], "max_tokens": 1}).encode()
    assert len(body) > 20_000
    with serve_runtime(EchoBackend(), record_limit=100, record_body_bytes=100_000) as server:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
        for _ in range(2000):
            conn.request("POST", "/endpoints/ep/invocations", body=body)
            assert conn.getresponse().read()
        conn.close()
        server.wait_until_idle()
        records = server.requests
        status = server.status()
    assert len(records) == 100
    assert sum(len(r.body) for r in records) <= 100_000
    assert [r.request.index for r in records] == list(range(1900, 2000))
    assert records[-1].body == body and not records[0].body_recorded
    assert status["requests"] == 2000 and status["outcomes"] == {"ok": 2000}
    assert server.outcome_counts() == {"ok": 2000} and server.request_count == 2000


def test_ttft_counts_streamed_answers_that_ended_ok_with_numpys_percentiles():
    def streamed(i: int, stream: bool = True) -> RuntimeRequest:
        return RuntimeRequest(OP_INVOKE, "ep", b"", RequestHeaders(), (), 0.0, 0.0, f"r{i}", i, stream, "/")

    log = RequestLog(limit=10)
    for i, (stream, outcome, ttft) in enumerate([(True, "ok", 0.010), (True, "ok", 0.020), (True, "ok", 0.040),
                                                 (True, "ok", 0.030), (False, "ok", 0.5), (True, "error", 0.9),
                                                 (True, "stream_error", 0.9)]):
        record = log.admit(streamed(i, stream))
        record.first_chunk_at = ttft  # arrival is 0.0
        _finish(log, record, outcome)
    log.admit(streamed(9)).first_chunk_at = 0.9  # still pending: no outcome yet
    ttft = log.ttft_ms()
    assert ttft["samples"] == 4
    assert ttft["p50"] == pytest.approx(25.0) and ttft["p90"] == pytest.approx(37.0)  # numpy.percentile's
