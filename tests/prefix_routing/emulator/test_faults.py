"""Injected faults as botocore sees them (prefix_routing.emulator.faults)."""

from __future__ import annotations

import http.client
import threading
import time

import pytest
import urllib3.exceptions
from botocore.exceptions import EventStreamError

from prefix_routing.emulator import eventstream
from prefix_routing.emulator.backend import StreamFailure
from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.faults import Faults
from prefix_routing.emulator.server import RuntimeServer, serve_runtime
from prefix_routing.rules.errors import UserError
from tests.prefix_routing.emulator.conftest import BODY, Scripted, client_for, sse_objects


@pytest.mark.parametrize("kind, code", [("ModelStreamError", "StreamBroken"), ("InternalStreamFailure", None)])
def test_mid_stream_error_surfaces_through_botocore(kind, code):
    faults = Faults(stream_error_after=2, stream_error_kind=kind, stream_error_code=code or "unused")
    with serve_runtime(EchoBackend(max_tokens=5), faults=faults) as server:
        client = client_for(server)
        response = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        parts = []
        with pytest.raises(EventStreamError) as info:
            for event in response["Body"]:
                parts.append(event["PayloadPart"]["Bytes"])
        assert len(parts) == 2
        assert info.value.response["Error"] == {"Code": kind, "Message": "Injected mid-stream failure."}
        server.wait_until_idle()
        (record,) = server.requests
    assert (record.outcome, record.error_code, record.fault, record.chunks_sent) == (
        "stream_error",
        kind,
        "stream_error",
        2,
    )


def test_mid_stream_error_on_the_wire_carries_the_error_code():
    with serve_runtime(EchoBackend(max_tokens=5), faults=Faults(stream_error_after=1)) as server:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
        conn.request("POST", "/endpoints/ep/invocations-response-stream", body=BODY)
        response = conn.getresponse()
        assert response.getheader("Transfer-Encoding") == "chunked"
        messages = eventstream.decode_messages(response.read())
        conn.close()
    assert [m.event_type for m in messages] == ["PayloadPart", None]
    assert messages[-1].json() == {
        "Message": "Injected mid-stream failure.",
        "ErrorCode": "ModelInvocationTimeExceeded",
    }


def test_backend_stream_failure_and_backend_crash_mid_stream():
    failure = StreamFailure("ModelStreamError", "model timed out", "ModelInvocationTimeExceeded")
    backend = Scripted(chunks=[b"a", b"b"], fail=failure)
    with serve_runtime(backend) as server:
        client = client_for(server)
        response = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        with pytest.raises(EventStreamError, match="model timed out"):
            list(response["Body"])
        # Not streamed: the same failure is a ModelError.
        with pytest.raises(client.exceptions.ModelError, match="model timed out"):
            client.invoke_endpoint(EndpointName="ep", Body=BODY)
    with serve_runtime(Scripted(fail=ZeroDivisionError("x"))) as server:
        response = client_for(server).invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        with pytest.raises(EventStreamError) as info:
            list(response["Body"])
        assert info.value.response["Error"]["Code"] == "InternalStreamFailure"


def test_slow_first_chunk_is_a_delay_before_the_first_payload_part():
    with serve_runtime(EchoBackend(max_tokens=3), faults=Faults(first_chunk_delay=0.2)) as server:
        client = client_for(server)
        start = time.monotonic()
        response = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        headers_at = time.monotonic()
        iterator = iter(response["Body"])
        next(iterator)
        first_at = time.monotonic()
        list(iterator)
        end_at = time.monotonic()
        server.wait_until_idle()
        (record,) = server.requests
    assert headers_at - start < 0.15  # the headers come at once; the wait is for the first part
    assert first_at - headers_at >= 0.18
    assert end_at - first_at < 0.15
    assert record.ttft >= 0.2 and record.fault == "slow_first_chunk"


def test_backend_latency_first_chunk_and_per_token():
    with serve_runtime(EchoBackend(first_chunk_delay=0.1, token_delay=0.02, max_tokens=5)) as server:
        client = client_for(server)
        response = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        start = time.monotonic()
        times = [time.monotonic() - start for _ in response["Body"]]
        server.wait_until_idle()
        (record,) = server.requests
    assert times[0] >= 0.09
    assert times[4] - times[0] >= 4 * 0.02 * 0.9
    assert 0.1 <= record.ttft < 0.3 and record.duration >= 0.18


def test_truncated_stream_ends_cleanly_without_usage():
    with serve_runtime(EchoBackend(max_tokens=5), faults=Faults(truncate_after=3)) as server:
        client = client_for(server)
        events = list(client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)["Body"])
        server.wait_until_idle()
        (record,) = server.requests
    objects = sse_objects(b"".join(e["PayloadPart"]["Bytes"] for e in events).decode())
    assert len(events) == 3 and "[DONE]" not in objects
    assert not any("usage" in o for o in objects)
    assert (record.outcome, record.fault, record.status) == ("truncated", "truncate", 200)


def test_dropped_connection_mid_stream():
    with serve_runtime(EchoBackend(max_tokens=5), faults=Faults(drop_after=2)) as server:
        client = client_for(server)
        response = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        parts = []
        with pytest.raises(urllib3.exceptions.ProtocolError):  # botocore does not wrap it
            for event in response["Body"]:
                parts.append(event)
        assert len(parts) == 2
        server.wait_until_idle()
        assert server.requests[0].outcome == "dropped"
        # The client goes on on a new connection (stream faults do not touch InvokeEndpoint).
        assert client.invoke_endpoint(EndpointName="ep", Body=BODY)["Body"].read()


def test_fragmented_payload_parts_reassemble():
    with serve_runtime(EchoBackend(max_tokens=4)) as server:
        whole = [
            e["PayloadPart"]["Bytes"]
            for e in client_for(server).invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)["Body"]
        ]
    with serve_runtime(EchoBackend(max_tokens=4), faults=Faults(fragment_bytes=7)) as server:
        parts = [
            e["PayloadPart"]["Bytes"]
            for e in client_for(server).invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)["Body"]
        ]
    assert len(parts) > len(whole) and max(len(p) for p in parts) == 7

    def strip(objs):
        return [o if o == "[DONE]" else {k: v for k, v in o.items() if k not in ("id", "created")} for o in objs]

    assert strip(sse_objects(b"".join(parts).decode())) == strip(sse_objects(b"".join(whole).decode()))


def test_client_disconnect_closes_the_backend_iterator():
    backend = Scripted(chunks=[b"x" * 1000, *([0.01, b"y" * 1000] * 200)])
    with serve_runtime(backend) as server:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
        conn.request("POST", "/endpoints/ep/invocations-response-stream", body=BODY)
        response = conn.getresponse()
        response.read(100)
        conn.close()
        assert backend.closed.wait(5)
        assert server.wait_until_idle(5)
        (record,) = server.requests
    assert record.outcome == "client_disconnected" and record.chunks_sent < 200


def test_stop_ends_streams_in_flight():
    backend = Scripted(chunks=[b"x", *([0.01, b"y"] * 500)])
    server = RuntimeServer(backend).start()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    conn.request("POST", "/endpoints/ep/invocations-response-stream", body=BODY)
    response = conn.getresponse()
    response.read(16)
    server.stop()
    assert backend.closed.wait(5) and server.wait_until_idle(5)
    assert server.requests[0].outcome == "client_disconnected"
    conn.close()


def test_concurrent_requests_are_all_recorded():
    with serve_runtime(EchoBackend(token_delay=0.005, max_tokens=5)) as server:
        client = client_for(server)
        results = []

        def call(i):
            events = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY, InferenceId=f"id-{i}")[
                "Body"
            ]
            results.append(len(list(events)))

        threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert server.wait_until_idle()
        records = server.requests
    assert results == [7] * 8
    assert sorted(r.request.index for r in records) == list(range(8))
    assert sorted(r.headers.inference_id for r in records) == sorted(f"id-{i}" for i in range(8))
    assert {r.outcome for r in records} == {"ok"}


@pytest.mark.parametrize("kind", ["stream_error", "truncate", "drop"])
def test_a_stream_fault_rate_alone_means_from_the_first_chunk(kind):
    """It used to inject nothing, silently, without the matching *_after (the README's own example)."""
    alone = Faults.from_spec(f"{kind}_rate=0.25,seed=3")
    assert getattr(alone, f"{kind}_after") == 0 and getattr(alone, f"{kind}_rate") == 0.25
    explicit = Faults(**{f"{kind}_after": 4, f"{kind}_rate": 0.5})
    assert getattr(explicit, f"{kind}_after") == 4
    untouched = Faults()
    assert getattr(untouched, f"{kind}_after") is None and getattr(untouched, f"{kind}_rate") == 1.0
    with pytest.raises(UserError, match=f"fault {kind}_rate=1.5: must be between 0 and 1"):
        Faults(**{f"{kind}_rate": 1.5})


def test_truncate_rate_alone_truncates_through_the_server():
    with serve_runtime(EchoBackend(max_tokens=5), faults=Faults.from_spec("truncate_rate=1.0")) as server:
        client = client_for(server)
        response = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=BODY)
        events = list(response["Body"])
        server.wait_until_idle()
    assert server.requests[-1].outcome == "truncated" and server.requests[-1].fault == "truncate"
    assert not any("PayloadPart" in e for e in events)  # from the first chunk: nothing of the answer
