"""The web app adds no latency of its own (prefix_routing.frontdoor.webapp): TCP_NODELAY on every
accepted connection, the head with the first bytes in one send, each later event in one send, and
the time to first token taken when the bytes were handed to the client's socket.

Deterministic: the socket option is read back from the accepted connection and the sends are
counted; no test here depends on a timing but the last, which only bounds one from below.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time

from prefix_routing import frontdoor
from prefix_routing.frontdoor.webapp import FrontDoorHandler, make_server
from tests.prefix_routing.frontdoor.conftest import BODY, KEY, FakeRuntime, config, iam_context, sse_chunks, url_event


class _Recording(FrontDoorHandler):
    """The web app, noting the accepted socket's TCP_NODELAY and every write it makes."""

    seen: list = []

    def setup(self) -> None:
        super().setup()
        type(self).seen.append(("nodelay", self.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
        write = self.wfile.write

        def counted(data: bytes) -> int:
            type(self).seen.append(("send", bytes(data)))
            return write(data)

        self.wfile.write = counted


@contextlib.contextmanager
def _served(invoker: frontdoor.Invoker):
    _Recording.seen = []
    app = make_server("127.0.0.1", 0, lambda: invoker, handler_class=_Recording)
    thread = threading.Thread(target=app.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield app.server_address[1]
    finally:
        app.shutdown()
        app.server_close()
        thread.join(5)


def _post(port: int) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", "/", body=BODY, headers={"x-amzn-request-context": json.dumps(iam_context())})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data


def test_every_accepted_connection_has_tcp_nodelay():
    invoker = frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=lambda line: None)
    with _served(invoker) as port:
        assert _post(port)[0] == 200
    nodelay = [value for kind, value in _Recording.seen if kind == "nodelay"]
    assert nodelay and all(value != 0 for value in nodelay)


def test_the_head_goes_out_with_the_first_event_and_each_event_in_one_send():
    events = sse_chunks(("alpha", "beta", "gamma"))  # three tokens, usage, [DONE]: five events
    invoker = frontdoor.Invoker(FakeRuntime(events), config(), KEY, emit=lambda line: None)
    with _served(invoker) as port:
        status, data = _post(port)
    assert status == 200 and data == b"".join(events)
    sends = [value for kind, value in _Recording.seen if kind == "send"]
    assert len(sends) == len(events) + 1  # one per event, the last one also carrying the end of the body
    head, first = sends[0].split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    assert first == b"%x\r\n%s\r\n" % (len(events[0]), events[0])
    for event, sent in zip(events[1:], sends[1:-1]):
        assert sent == b"%x\r\n%s\r\n" % (len(event), event)
    assert sends[-1] == b"0\r\n\r\n"


def test_an_error_answer_is_one_send_too():
    invoker = frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=lambda line: None)
    _Recording.seen = []
    app = make_server("127.0.0.1", 0, lambda: invoker, handler_class=_Recording)
    thread = threading.Thread(target=app.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", app.server_address[1], timeout=10)
        connection.request("POST", "/", body=b"{", headers={"x-amzn-request-context": json.dumps(iam_context())})
        response = connection.getresponse()
        assert response.status == 400 and json.loads(response.read())["error"]["code"] == "invalid_json"
        connection.close()
    finally:
        app.shutdown()
        app.server_close()
        thread.join(5)
    sends = [value for kind, value in _Recording.seen if kind == "send"]
    assert len(sends) == 1 and sends[0].startswith(b"HTTP/1.1 400") and sends[0].endswith(b"}")


def test_time_to_first_token_is_taken_when_the_consumer_has_written_the_first_bytes(lines):
    # The web app writes each item before it asks for the next: a consumer that takes 0.3 s to hand
    # the first bytes over shows in TimeToFirstToken, which is what the client felt.
    invoker = frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=lines)
    exchange = invoker.stream(frontdoor.request_from_event(url_event()))
    first_bytes = None
    for item in exchange:
        if isinstance(item, bytes) and first_bytes is None:
            first_bytes = item
            time.sleep(0.3)
    (log,) = lines.requests
    assert first_bytes and log["ttft_ms"] >= 300 and lines.emf[0]["TimeToFirstToken"] >= 300
    assert log["total_ms"] >= log["ttft_ms"] and log["wall_ms"] >= log["total_ms"]
    assert log["upstream_ttft_ms"] < 300  # the endpoint's own first byte did not wait for the consumer
