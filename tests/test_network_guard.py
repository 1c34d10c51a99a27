"""The guard of tests/network_guard.py: nothing a test starts leaves 127.0.0.1."""

from __future__ import annotations

import os
import socket
import textwrap
from pathlib import Path

import boto3
import pytest

from tests import network_guard
from tests.network_guard import GUARD, ISOLATED_AWS_ENV, NetworkAccessBlocked

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def spy_connect(monkeypatch):
    """Records what reaches the real ``connect`` (the guard calls it only after its check)."""
    reached = []
    real = GUARD._real["connect"]

    def spy(sock, address):
        reached.append(address)
        return real(sock, address)

    monkeypatch.setitem(GUARD._real, "connect", spy)
    return reached


def forget_refusals(before: int) -> list[str]:
    """Take this test's deliberate refusals off the record, so that its own teardown passes."""
    refused = GUARD.refused[before:]
    del GUARD.refused[before:]
    return refused


def test_the_metadata_service_is_refused_before_anything_is_sent(spy_connect):
    before = len(GUARD.refused)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        with pytest.raises(NetworkAccessBlocked, match=r"169\.254\.169\.254.*127\.0\.0\.0/8"):
            sock.connect(("169.254.169.254", 80))
        with pytest.raises(NetworkAccessBlocked):
            sock.connect_ex(("169.254.169.254", 80))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        with pytest.raises(NetworkAccessBlocked):
            udp.sendto(b"x", ("8.8.8.8", 53))
    assert spy_connect == []  # the real connect was never called: no SYN left the machine
    assert len(forget_refusals(before)) == 3


@pytest.mark.parametrize("host", ["10.0.0.1", "192.168.1.1", "2001:db8::1", "0.0.0.0", "example.com",
                                  "runtime.sagemaker.us-east-1.amazonaws.com"])
def test_other_addresses_and_names_are_refused(host):
    before = len(GUARD.refused)
    with pytest.raises(NetworkAccessBlocked):
        socket.getaddrinfo(host, 443)
    assert forget_refusals(before) == [f"name lookup of ({host!r},)"]


def test_loopback_is_allowed(spy_connect):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        with socket.create_connection(("localhost", port), timeout=5):
            pass
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client:
            client.connect(("127.0.0.1", port))
    assert ("127.0.0.1", port) in spy_connect
    for host in ("127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1", "localhost", "[::1]", None, b"127.0.0.1"):
        assert network_guard.is_loopback_host(host), host


def test_a_swallowed_attempt_still_fails_the_test(pytester, monkeypatch):
    # botocore swallows a failed metadata-service call; the guard fails the test all the same.
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest("pytest_plugins = ['tests.network_guard']")
    pytester.makepyfile(test_inner=textwrap.dedent("""
        import socket

        def test_swallows():
            try:
                socket.create_connection(("169.254.169.254", 80), timeout=1)
            except OSError:
                pass
    """))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=1, errors=1)  # the test body passes; its teardown fails it
    # create_connection looks the address up first: refused there, before any connect.
    result.stdout.fnmatch_lines(["*the test tried to leave the machine: name lookup of ('169.254.169.254',)*"])


def test_aws_credentials_are_the_fake_ones_and_never_looked_up():
    for name, value in ISOLATED_AWS_ENV.items():
        assert os.environ[name] == value
    for name in network_guard.UNSET_AWS_ENV:
        assert name not in os.environ
    credentials = boto3.Session().get_credentials()
    assert (credentials.access_key, credentials.method) == ("testing", "env")
