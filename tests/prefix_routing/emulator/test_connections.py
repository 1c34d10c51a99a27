"""Hostile or failing callers: stalled and dripping bodies, idle keep-alive, too many connections, odd methods
and framing (prefix_routing.emulator.connections, http_io)."""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

from prefix_routing.emulator.connections import ConnectionLimits
from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.server import RuntimeServer, serve_runtime
from prefix_routing.rules.errors import UserError
from tests.prefix_routing.emulator.conftest import BODY

INVOKE = "/endpoints/ep/invocations"


def _raw(server) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (10 s at most)."""
    data = b""
    while True:
        piece = sock.recv(65536)
        if not piece:
            return data
        data += piece


def _status_and_json(answer: bytes) -> tuple[int, dict, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, (json.loads(body) if body else {})


def _until(condition, timeout=5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_a_stalled_body_gets_408_and_frees_its_connection():
    with serve_runtime(EchoBackend(), request_timeout_s=0.3) as server:
        sock = _raw(server)
        sock.sendall(b"POST " + INVOKE.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mess")
        started = time.monotonic()
        status, headers, body = _status_and_json(_read_all(sock))  # the server closes after answering
        waited = time.monotonic() - started
        sock.close()
        assert status == 408 and headers["x-amzn-errortype"] == "RequestTimeoutException"
        assert "within 0.3 s" in body["message"]
        assert 0.25 < waited < 5  # the deadline, not the 60 s socket timeout
        assert _until(lambda: server.guard.open == 0)
        assert server.guard.status()["timed_out"] == 1
        assert server.request_count == 0  # never reached the runtime's record


def test_a_dripping_body_cannot_outlast_the_deadline():
    # A byte every 0.1 s keeps every single read short of any per-read timeout: only a deadline ends it.
    with serve_runtime(EchoBackend(), request_timeout_s=0.5) as server:
        sock = _raw(server)
        sock.sendall(b"POST " + INVOKE.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        started = time.monotonic()
        sock.settimeout(0.1)
        answer = b""
        while time.monotonic() - started < 5:
            try:
                sock.sendall(b"x")
                piece = sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            if not piece:
                break
            answer += piece
        assert answer.startswith(b"HTTP/1.1 408")
        assert time.monotonic() - started < 3


def test_a_slow_header_drip_is_cut_too():
    with serve_runtime(EchoBackend(), request_timeout_s=0.4) as server:
        sock = _raw(server)
        sock.sendall(b"POST " + INVOKE.encode() + b" HTTP/1.1\r\n")
        started = time.monotonic()
        sock.settimeout(0.1)
        answer = b""
        for i in range(40):
            try:
                sock.sendall(f"X-Drip-{i}: y\r\n".encode())
                answer += sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            if answer:
                break
        assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 3


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout():
    with serve_runtime(EchoBackend(max_tokens=1), idle_timeout_s=0.3) as server:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
        conn.request("POST", INVOKE, body=BODY)
        assert conn.getresponse().read()
        sock = conn.sock
        started = time.monotonic()
        assert sock.recv(1) == b""  # the server closed the idle connection
        assert 0.25 < time.monotonic() - started < 5
        conn.close()
        assert _until(lambda: server.guard.open == 0)


def test_connections_beyond_the_limit_get_503_and_the_limit_frees_up():
    with serve_runtime(EchoBackend(max_tokens=1), max_connections=2) as server:
        held = [_raw(server), _raw(server)]
        assert _until(lambda: server.guard.open == 2)
        extra = _raw(server)
        status, headers, body = _status_and_json(_read_all(extra))
        extra.close()
        assert status == 503 and headers["x-amzn-errortype"] == "ServiceUnavailable"
        assert "at most 2" in body["message"] and headers["connection"] == "close"
        held.pop().close()
        assert _until(lambda: server.guard.open == 1)
        conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
        conn.request("POST", INVOKE, body=BODY)
        assert conn.getresponse().status == 200
        conn.close()
        for sock in held:
            sock.close()
        assert server.status()["connections"]["refused"] == 1


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "BREW"])
def test_every_method_gets_json_unknown_operation(method):
    with serve_runtime(EchoBackend()) as server:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
        conn.request(method, INVOKE, body=b"{}")
        response = conn.getresponse()
        body = json.loads(response.read())
        conn.close()
    assert response.status == 404 and response.getheader("X-Amzn-ErrorType") == "UnknownOperationException"
    assert response.getheader("Content-Type") == "application/json"
    assert body == {"message": f"Unknown operation: {method} {INVOKE}"}


def test_head_gets_the_status_without_a_body():
    with serve_runtime(EchoBackend()) as server:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
        conn.request("HEAD", "/ping")
        response = conn.getresponse()
        assert response.status == 404 and response.read() == b""
        conn.close()


@pytest.mark.parametrize("head, message", [
    (b"Content-Length: abc\r\n", "Content-Length 'abc': allowed a decimal integer"),
    (b"Content-Length: -5\r\n", "Content-Length '-5'"),
    (b"Content-Length: 99999999999999999999999\r\n", "allowed a decimal integer from 0 to 67108864"),
])
def test_a_bad_content_length_is_400_naming_it(head, message):
    with serve_runtime(EchoBackend()) as server:
        sock = _raw(server)
        sock.sendall(b"POST " + INVOKE.encode() + b" HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n")
        status, headers, body = _status_and_json(_read_all(sock))
        sock.close()
    assert status == 400 and message in body["message"] and headers["connection"] == "close"


def test_a_body_over_the_read_limit_is_413_before_it_is_read():
    with serve_runtime(EchoBackend()) as server:
        sock = _raw(server)
        sock.sendall(b"POST " + INVOKE.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 67108865\r\n\r\n")
        status, _, body = _status_and_json(_read_all(sock))
        sock.close()
    assert status == 413 and body == {"message": "Request entity too large"}


@pytest.mark.parametrize("chunks, message", [
    (b"zz\r\n", "chunk size b'zz': allowed 1 to 16 hexadecimal digits"),
    (b"-5\r\n", "chunk size b'-5'"),
    (b"5\r\nhelloXX\r\n", "chunk data not followed by CRLF"),
    (b"1" * 2000 + b"\r\n", "chunk-size line longer than 1024 bytes"),
])
def test_a_malformed_chunked_body_is_400(chunks, message):
    with serve_runtime(EchoBackend()) as server:
        sock = _raw(server)
        sock.sendall(b"POST " + INVOKE.encode() + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + chunks)
        status, _, body = _status_and_json(_read_all(sock))
        sock.close()
    assert status == 400 and message in body["message"]


def test_a_well_formed_chunked_body_with_trailers_is_served():
    with serve_runtime(EchoBackend(max_tokens=2)) as server:
        sock = _raw(server)
        half = len(BODY) // 2
        sock.sendall(b"POST " + INVOKE.encode() + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     b"Connection: close\r\n\r\n" + b"%x;ext=1\r\n%s\r\n%x\r\n%s\r\n0\r\nX-Trailer: 1\r\n\r\n"
                     % (half, BODY[:half], len(BODY) - half, BODY[half:]))
        status, _, body = _status_and_json(_read_all(sock))
        sock.close()
        assert status == 200 and body["object"] == "chat.completion"
        assert server.requests[0].body == BODY


def test_a_caller_gone_mid_body_is_recorded_nowhere_and_frees_the_connection():
    with serve_runtime(EchoBackend()) as server:
        sock = _raw(server)
        sock.sendall(b"POST " + INVOKE.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        sock.close()
        assert _until(lambda: server.guard.open == 0)
        assert server.request_count == 0


@pytest.mark.parametrize("options, message", [
    ({"max_connections": 0}, "max_connections=0: allowed an integer from 1 to 10000"),
    ({"max_connections": 10**6}, "max_connections=1000000"),
    ({"idle_timeout_s": 0}, "idle_timeout_s=0: allowed 0.05 to 3600 seconds"),
    ({"request_timeout_s": float("inf")}, "request_timeout_s=inf"),
    ({"send_timeout_s": -1}, "send_timeout_s=-1"),
])
def test_connection_bounds_are_checked(options, message):
    with pytest.raises(UserError, match=message):
        RuntimeServer(EchoBackend(), **options)
    assert ConnectionLimits().max_connections == 512
