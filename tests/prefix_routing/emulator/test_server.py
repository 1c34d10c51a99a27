"""The server itself: loopback only, keep-alive, records, stopping (prefix_routing.emulator.server)."""

from __future__ import annotations

import pytest

from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.faults import Faults
from prefix_routing.emulator.server import RuntimeServer
from prefix_routing.rules.errors import UserError
from tests.prefix_routing.emulator.test_handler import _get


def test_port_url_ping_and_loopback_only():
    backend = EchoBackend()
    with RuntimeServer(backend) as server:
        assert server.port > 0 and server.url == f"http://127.0.0.1:{server.port}"
        assert _get(server, "/ping") == b""
    with pytest.raises(UserError, match="loopback"):
        RuntimeServer(backend, host="0.0.0.0")
    with pytest.raises(TypeError):
        RuntimeServer(object())  # type: ignore[arg-type]


def test_fault_spec_parsing():
    faults = Faults.from_spec(
        "throttle_rate=0.25, stream-error-after=3,error_kind=InternalFailure,seed=9,drop_after=none"
    )
    assert (faults.throttle_rate, faults.stream_error_after, faults.error_kind, faults.seed, faults.drop_after) == (
        0.25,
        3,
        "InternalFailure",
        9,
        None,
    )
    assert Faults.from_spec("") == Faults()
    for bad, message in [
        ("nope=1", "NAME=VALUE"),
        ("throttle_rate=x", "not a number"),
        ("throttle_rate=2", "between 0 and 1"),
        ("error_kind=Teapot", "error_kind"),
        ("stream_error_kind=X", "stream_error_kind"),
        ("truncate_after=-1", ">= 0"),
        ("first_chunk_delay=1e9", "first_chunk_delay=1000000000.0: allowed 0 to 3600 seconds"),
        ("first_chunk_delay=nan", "first_chunk_delay=nan: allowed 0 to 3600"),
    ]:
        with pytest.raises(UserError, match=message):
            Faults.from_spec(bad)


def test_accepted_connections_have_tcp_nodelay():
    # A streaming server without it holds each small event until the previous one is acknowledged.
    import http.client
    import socket

    with RuntimeServer(EchoBackend()) as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        connection.request("GET", "/ping")
        assert connection.getresponse().read() == b""
        accepted = server.guard.connections()  # the kept-alive connection, as the server accepted it
        assert accepted and all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in accepted)
        connection.close()
