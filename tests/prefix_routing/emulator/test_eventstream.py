"""The event-stream encoder and decoder, checked against botocore's own parser."""

from __future__ import annotations

import binascii
import datetime as dt
import json
import struct
import uuid

import boto3
import pytest
from botocore.eventstream import ChecksumMismatch, EventStream, EventStreamBuffer
from botocore.exceptions import EventStreamError
from botocore.parsers import EventStreamJSONParser

from prefix_routing.emulator import eventstream as es


def botocore_messages(data: bytes) -> list:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return list(buffer)


def test_payload_part_round_trips_through_botocore():
    wire = es.payload_part(b'data: {"x":1}\n\n')
    (message,) = botocore_messages(wire)
    assert message.headers == {
        ":event-type": "PayloadPart",
        ":content-type": "application/octet-stream",
        ":message-type": "event",
    }
    assert message.payload == b'data: {"x":1}\n\n'
    (ours,) = es.decode_messages(wire)
    assert ours.headers == message.headers and ours.payload == message.payload
    assert ours.event_type == "PayloadPart" and ours.message_type == "event"


@pytest.mark.parametrize(
    "value, botocore_value",
    [
        ("text ünïcode", "text ünïcode"),
        (b"\x00\xffraw", b"\x00\xffraw"),
        (True, True),
        (False, False),
        (-(2**31), -(2**31)),
        (2**31 - 1, 2**31 - 1),
        (2**40, 2**40),
        (-(2**63), -(2**63)),
        (dt.datetime(2026, 11, 30, 12, 0, 1, 500000, tzinfo=dt.UTC), 1796040001500),
        (uuid.UUID("12345678-1234-5678-1234-567812345678"), uuid.UUID("12345678-1234-5678-1234-567812345678").bytes),
    ],
)
def test_every_header_type_decodes_identically_in_botocore_and_here(value, botocore_value):
    wire = es.encode_message([("h", value), (":message-type", "event")], b"payload")
    (theirs,) = botocore_messages(wire)
    assert theirs.headers == {"h": botocore_value, ":message-type": "event"}
    assert theirs.payload == b"payload"
    (ours,) = es.decode_messages(wire)
    assert ours.headers["h"] == value
    assert ours.header_list == (("h", value), (":message-type", "event"))


def test_byte_and_short_headers_decode():
    # The encoder never writes types 2 and 3; build them by hand and check both parsers agree.
    headers = b"\x01b\x02" + struct.pack("!b", -5) + b"\x01s\x03" + struct.pack("!h", 1234)
    total = 12 + len(headers) + 4
    prelude = struct.pack("!II", total, len(headers))
    prelude += struct.pack("!I", binascii.crc32(prelude))
    body = prelude + headers
    wire = body + struct.pack("!I", binascii.crc32(body))
    (theirs,) = botocore_messages(wire)
    (ours,) = es.decode_messages(wire)
    assert theirs.headers == ours.headers == {"b": -5, "s": 1234}
    assert ours.payload == b""


def test_many_messages_split_at_every_byte():
    messages = [es.payload_part(f"part {i}".encode()) for i in range(5)]
    messages.append(es.model_stream_error("boom", "StreamBroken"))
    wire = b"".join(messages)
    decoder = es.EventStreamDecoder()
    out = []
    for i in range(len(wire)):
        out.extend(decoder.feed(wire[i : i + 1]))
    decoder.close()
    assert [m.payload for m in out[:5]] == [f"part {i}".encode() for i in range(5)]
    assert [m.payload for m in out] == [m.payload for m in botocore_messages(wire)]
    assert list(es.iter_messages([wire[:7], wire[7:100], wire[100:]])) == out


def test_exception_events_carry_the_modelled_members():
    (error,) = es.decode_messages(es.model_stream_error("Model timed out", "ModelInvocationTimeExceeded"))
    assert error.message_type == "exception" and error.exception_type == "ModelStreamError"
    assert error.headers[":content-type"] == "application/json"
    assert error.json() == {"Message": "Model timed out", "ErrorCode": "ModelInvocationTimeExceeded"}
    (failure,) = es.decode_messages(es.internal_stream_failure("oops"))
    assert failure.exception_type == "InternalStreamFailure" and failure.json() == {"Message": "oops"}
    (plain,) = botocore_messages(es.error_event("SomeCode", "some message"))
    assert plain.headers == {":error-code": "SomeCode", ":error-message": "some message", ":message-type": "error"}


def test_the_members_are_those_of_the_service_model():
    model = boto3.client("sagemaker-runtime", region_name="us-east-1").meta.service_model
    stream = model.operation_model("InvokeEndpointWithResponseStream").output_shape.members["Body"]
    assert set(stream.members) == {"PayloadPart", "ModelStreamError", "InternalStreamFailure"}
    assert set(stream.members["ModelStreamError"].members) == {"Message", "ErrorCode"}
    assert set(stream.members["InternalStreamFailure"].members) == {"Message"}
    assert stream.members["PayloadPart"].members["Bytes"].serialization == {"eventpayload": True}


def _botocore_stream(wire: bytes):
    model = boto3.client("sagemaker-runtime", region_name="us-east-1").meta.service_model
    shape = model.operation_model("InvokeEndpointWithResponseStream").output_shape.members["Body"]

    class Raw:
        def stream(self):
            yield wire[:10]
            yield wire[10:]

        def close(self):
            pass

    return EventStream(Raw(), shape, EventStreamJSONParser(), "InvokeEndpointWithResponseStream")


@pytest.mark.parametrize(
    "event, code, message",
    [
        (
            es.model_stream_error("Model timed out", "ModelInvocationTimeExceeded"),
            "ModelStreamError",
            "Model timed out",
        ),
        (es.internal_stream_failure("unknown failure"), "InternalStreamFailure", "unknown failure"),
    ],
)
def test_botocore_raises_the_modelled_exception_while_iterating(event, code, message):
    events = _botocore_stream(es.payload_part(b"first") + event)
    iterator = iter(events)
    assert next(iterator) == {"PayloadPart": {"Bytes": b"first"}}
    with pytest.raises(EventStreamError) as info:
        next(iterator)
    assert info.value.response["Error"] == {"Code": code, "Message": message}


def test_corruption_is_detected_by_both_parsers():
    wire = bytearray(es.payload_part(b"hello"))
    wire[-6] ^= 0x01  # inside the payload: message CRC mismatch
    with pytest.raises(es.EventStreamDecodeError, match="message CRC"):
        es.decode_messages(bytes(wire))
    with pytest.raises(ChecksumMismatch):
        botocore_messages(bytes(wire))
    wire = bytearray(es.payload_part(b"hello"))
    wire[1] ^= 0x01  # inside the prelude
    with pytest.raises(es.EventStreamDecodeError, match="prelude CRC"):
        es.decode_messages(bytes(wire))


def test_a_stream_that_ends_inside_a_message_is_an_error():
    wire = es.payload_part(b"hello")
    with pytest.raises(es.EventStreamDecodeError, match="ended inside a message"):
        es.decode_messages(wire[:-1])
    assert es.EventStreamDecoder().feed(wire[:-1]) == []


def test_limits_and_bad_headers_are_refused():
    with pytest.raises(ValueError, match="header name"):
        es.encode_message([("x" * 256, "v")])
    with pytest.raises(ValueError, match="payload"):
        es.encode_message([], b"\0" * (es.MAX_PAYLOAD_LENGTH + 1))
    with pytest.raises(TypeError):
        es.encode_message([("h", 1.5)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="64 bits"):
        es.encode_message([("h", 2**64)])


def test_empty_message_is_sixteen_bytes():
    wire = es.encode_message()
    assert len(wire) == 16
    assert es.decode_messages(wire) == [es.Message(headers={}, payload=b"")]
    assert json.loads(es.decode_messages(es.exception_event("X", {"Message": "m"}))[0].payload) == {"Message": "m"}
