"""The AWS event-stream binary framing, as the SageMaker runtime uses it (standard library only).

``InvokeEndpointWithResponseStream`` answers with ``Content-Type: application/vnd.amazon.eventstream``
and a body made of *messages*, each framed like this (all integers big-endian)::

    +--------------+---------------+-------------+---------+---------+-------------+
    | total length | headers length| prelude CRC | headers | payload | message CRC |
    |   uint32     |    uint32     |   uint32    |   ...   |   ...   |   uint32    |
    +--------------+---------------+-------------+---------+---------+-------------+

The prelude CRC is the CRC32 of the first 8 bytes; the message CRC is the CRC32 of everything
before it (prelude CRC included). A header is ``name length (uint8) | name (UTF-8) | type (uint8) |
value``; type 7 (string) and 6 (bytes) carry a uint16 length before the value.

What the SageMaker runtime sends in that framing (``boto3.client("sagemaker-runtime")``'s service
model, shape ``ResponseStream``):

- ``PayloadPart`` events: ``:message-type`` = ``event``, ``:event-type`` = ``PayloadPart``,
  ``:content-type`` = ``application/octet-stream``; the payload is a piece of the model's answer
  (member ``Bytes``, an ``eventpayload`` blob). Boundaries between parts are not guaranteed to line
  up with the container's own framing (SSE lines, JSON lines).
- ``ModelStreamError`` exception: ``:message-type`` = ``exception``, ``:exception-type`` =
  ``ModelStreamError``, JSON payload ``{"Message": ..., "ErrorCode": ...}``; documented error codes
  ``ModelInvocationTimeExceeded`` and ``StreamBroken``.
- ``InternalStreamFailure`` exception: same, payload ``{"Message": ...}``.

botocore turns an exception message into ``botocore.exceptions.EventStreamError`` (a
``ClientError``) while the caller iterates the stream; ``e.response["Error"]`` carries only
``Code`` (the exception type) and ``Message``: the ``ErrorCode`` member is parsed but not surfaced
by botocore 1.44.

This module implements: the encoder (:func:`encode_message`), the SageMaker event helpers
(:func:`payload_part`, :func:`model_stream_error`, :func:`internal_stream_failure`,
:func:`exception_event`, :func:`error_event`), and an incremental decoder
(:class:`EventStreamDecoder`, :func:`decode_messages`, :func:`iter_messages`) that checks both CRCs
and understands every header type (0 true, 1 false, 2 byte, 3 short, 4 integer, 5 long, 6 bytes,
7 string, 8 timestamp, 9 uuid). The encoding is checked in the tests against botocore's own parser
(``botocore.eventstream.EventStreamBuffer``).

It does not implement: the ``initial-request``/``initial-response`` events of RPC-style
(``application/vnd.amazon.eventstream`` request bodies) services, message signing
(``:chunk-signature``), or HTTP: :mod:`prefix_routing.emulator.server` puts these messages on the
wire, and boto3 reads them.
"""

from __future__ import annotations

import binascii
import datetime as _dt
import json
import struct
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CONTENT_TYPE",
    "HeaderValue",
    "Message",
    "EventStreamDecodeError",
    "EventStreamDecoder",
    "encode_message",
    "payload_part",
    "exception_event",
    "error_event",
    "model_stream_error",
    "internal_stream_failure",
    "decode_messages",
    "iter_messages",
    "MAX_HEADERS_LENGTH",
    "MAX_PAYLOAD_LENGTH",
]

#: The HTTP ``Content-Type`` of a response whose body is an event stream.
CONTENT_TYPE = "application/vnd.amazon.eventstream"

#: Limits applied by botocore's parser (``botocore.eventstream``); the encoder refuses more.
MAX_HEADERS_LENGTH = 128 * 1024
MAX_PAYLOAD_LENGTH = 24 * 1024 * 1024

_PRELUDE_LENGTH = 12  # total length, headers length, prelude CRC
_MIN_MESSAGE_LENGTH = _PRELUDE_LENGTH + 4  # + message CRC

# Header value types.
_TRUE, _FALSE, _BYTE, _SHORT, _INTEGER, _LONG, _BYTES, _STRING, _TIMESTAMP, _UUID = range(10)

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)

#: What a header value may be when encoding: ``str`` (type 7), ``bytes`` (6), ``bool`` (0/1),
#: ``int`` (4 when it fits in int32, else 5), ``datetime`` (8, milliseconds since the epoch; naive
#: means UTC) and ``uuid.UUID`` (9). Decoding gives the same Python types back (timestamps as
#: aware UTC ``datetime``; byte and short headers as ``int``).
HeaderValue = str | bytes | bool | int | _dt.datetime | uuid.UUID


class EventStreamDecodeError(ValueError):
    """Bytes that are not a valid event stream: bad lengths, a CRC mismatch, a bad header."""


@dataclass(frozen=True)
class Message:
    """One decoded event-stream message."""

    headers: dict[str, HeaderValue]
    payload: bytes = b""
    #: The headers in wire order (the dict keeps only the last value of a repeated name).
    header_list: tuple[tuple[str, HeaderValue], ...] = field(default=(), compare=False, repr=False)

    @property
    def message_type(self) -> str | None:
        """``event``, ``exception`` or ``error`` (``:message-type``)."""
        value = self.headers.get(":message-type")
        return value if isinstance(value, str) else None

    @property
    def event_type(self) -> str | None:
        value = self.headers.get(":event-type")
        return value if isinstance(value, str) else None

    @property
    def exception_type(self) -> str | None:
        value = self.headers.get(":exception-type")
        return value if isinstance(value, str) else None

    def json(self) -> Any:
        """The payload parsed as JSON (exception events carry JSON)."""
        return json.loads(self.payload.decode("utf-8"))


# --------------------------------------------------------------------------- encoding


def _crc32(data: bytes, crc: int = 0) -> int:
    return binascii.crc32(data, crc) & 0xFFFFFFFF


def _encode_header(name: str, value: HeaderValue) -> bytes:
    raw_name = name.encode("utf-8")
    if not 0 < len(raw_name) < 256:
        raise ValueError(f"event-stream header name must be 1-255 bytes of UTF-8, got {name!r}")
    head = struct.pack("!B", len(raw_name)) + raw_name
    # bool before int: bool is a subclass of int.
    if isinstance(value, bool):
        return head + struct.pack("!B", _TRUE if value else _FALSE)
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return head + struct.pack("!Bi", _INTEGER, value)
        if -(2**63) <= value < 2**63:
            return head + struct.pack("!Bq", _LONG, value)
        raise ValueError(f"event-stream header {name!r}: integer {value} does not fit in 64 bits")
    if isinstance(value, str):
        raw = value.encode("utf-8")
        if len(raw) > 0xFFFF:
            raise ValueError(f"event-stream header {name!r}: string longer than 65535 bytes")
        return head + struct.pack("!BH", _STRING, len(raw)) + raw
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if len(raw) > 0xFFFF:
            raise ValueError(f"event-stream header {name!r}: bytes longer than 65535")
        return head + struct.pack("!BH", _BYTES, len(raw)) + raw
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.UTC)
        millis = (value - _EPOCH) // _dt.timedelta(milliseconds=1)
        return head + struct.pack("!Bq", _TIMESTAMP, millis)
    if isinstance(value, uuid.UUID):
        return head + struct.pack("!B", _UUID) + value.bytes
    raise TypeError(f"event-stream header {name!r}: unsupported value type {type(value).__name__}")


def encode_message(
    headers: Mapping[str, HeaderValue] | Sequence[tuple[str, HeaderValue]] = (),
    payload: bytes = b"",
) -> bytes:
    """Frame one event-stream message: prelude, headers, payload, CRCs.

    ``headers`` is a mapping or a sequence of ``(name, value)`` pairs (kept in that order); see
    :data:`HeaderValue` for the types. Raises ``ValueError`` past botocore's limits (128 KiB of
    headers, 24 MiB of payload).
    """
    items = headers.items() if isinstance(headers, Mapping) else headers
    raw_headers = b"".join(_encode_header(name, value) for name, value in items)
    payload = bytes(payload)
    if len(raw_headers) > MAX_HEADERS_LENGTH:
        raise ValueError(f"event-stream headers of {len(raw_headers)} bytes exceed {MAX_HEADERS_LENGTH}")
    if len(payload) > MAX_PAYLOAD_LENGTH:
        raise ValueError(f"event-stream payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_LENGTH}")
    total = _PRELUDE_LENGTH + len(raw_headers) + len(payload) + 4
    prelude = struct.pack("!II", total, len(raw_headers))
    prelude += struct.pack("!I", _crc32(prelude))
    body = prelude + raw_headers + payload
    return body + struct.pack("!I", _crc32(body))


# --------------------------------------------------------------------------- SageMaker events


def payload_part(data: bytes) -> bytes:
    """A ``PayloadPart`` event carrying ``data`` (a piece of the model's answer)."""
    return encode_message(
        [
            (":event-type", "PayloadPart"),
            (":content-type", "application/octet-stream"),
            (":message-type", "event"),
        ],
        data,
    )


def exception_event(exception_type: str, members: Mapping[str, Any]) -> bytes:
    """A modelled exception event: ``:exception-type`` plus the shape's members as JSON."""
    return encode_message(
        [
            (":exception-type", exception_type),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        json.dumps(dict(members), separators=(",", ":")).encode("utf-8"),
    )


def model_stream_error(message: str, error_code: str | None = None) -> bytes:
    """A ``ModelStreamError`` exception event (members ``Message``, ``ErrorCode``).

    Documented error codes: ``ModelInvocationTimeExceeded``, ``StreamBroken``.
    """
    members: dict[str, Any] = {"Message": message}
    if error_code is not None:
        members["ErrorCode"] = error_code
    return exception_event("ModelStreamError", members)


def internal_stream_failure(message: str) -> bytes:
    """An ``InternalStreamFailure`` exception event (member ``Message``)."""
    return exception_event("InternalStreamFailure", {"Message": message})


def error_event(error_code: str, error_message: str) -> bytes:
    """An unmodelled error message (``:message-type`` = ``error``, ``:error-code``, ``:error-message``).

    botocore raises it as ``EventStreamError`` with that code and message.
    """
    return encode_message(
        [
            (":error-code", error_code),
            (":error-message", error_message),
            (":message-type", "error"),
        ]
    )


# --------------------------------------------------------------------------- decoding


def _decode_headers(raw: bytes) -> list[tuple[str, HeaderValue]]:
    out: list[tuple[str, HeaderValue]] = []
    pos, end = 0, len(raw)
    try:
        while pos < end:
            name_len = raw[pos]
            pos += 1
            if name_len == 0 or pos + name_len + 1 > end:
                raise EventStreamDecodeError("event-stream header name is empty or runs past the headers")
            name = raw[pos : pos + name_len].decode("utf-8")
            pos += name_len
            kind = raw[pos]
            pos += 1
            value: HeaderValue
            if kind == _TRUE:
                value = True
            elif kind == _FALSE:
                value = False
            elif kind == _BYTE:
                (value,) = struct.unpack_from("!b", raw, pos)
                pos += 1
            elif kind == _SHORT:
                (value,) = struct.unpack_from("!h", raw, pos)
                pos += 2
            elif kind == _INTEGER:
                (value,) = struct.unpack_from("!i", raw, pos)
                pos += 4
            elif kind in (_LONG, _TIMESTAMP):
                (number,) = struct.unpack_from("!q", raw, pos)
                pos += 8
                value = _EPOCH + _dt.timedelta(milliseconds=number) if kind == _TIMESTAMP else number
            elif kind in (_BYTES, _STRING):
                (length,) = struct.unpack_from("!H", raw, pos)
                pos += 2
                if pos + length > end:
                    raise EventStreamDecodeError(f"event-stream header {name!r} runs past the headers")
                data = raw[pos : pos + length]
                pos += length
                value = data.decode("utf-8") if kind == _STRING else bytes(data)
            elif kind == _UUID:
                if pos + 16 > end:
                    raise EventStreamDecodeError(f"event-stream header {name!r} runs past the headers")
                value = uuid.UUID(bytes=bytes(raw[pos : pos + 16]))
                pos += 16
            else:
                raise EventStreamDecodeError(f"event-stream header {name!r} has unknown type {kind}")
            if pos > end:
                raise EventStreamDecodeError(f"event-stream header {name!r} runs past the headers")
            out.append((name, value))
    except struct.error as exc:
        raise EventStreamDecodeError(f"truncated event-stream header: {exc}") from None
    except UnicodeDecodeError as exc:
        raise EventStreamDecodeError(f"event-stream header is not UTF-8: {exc}") from None
    return out


class EventStreamDecoder:
    """Incremental decoder: feed bytes as they arrive, get whole messages back.

    >>> decoder = EventStreamDecoder()
    >>> [m.payload for m in decoder.feed(payload_part(b"hi"))]
    [b'hi']
    """

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def pending(self) -> int:
        """Bytes received that do not yet form a whole message."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Message]:
        """Add ``data``; return every message now complete. Raises :class:`EventStreamDecodeError`."""
        self._buffer += data
        messages = []
        while True:
            message = self._next()
            if message is None:
                return messages
            messages.append(message)

    def close(self) -> None:
        """Declare the end of the stream; raises if a partial message is left over."""
        if self._buffer:
            raise EventStreamDecodeError(f"event stream ended inside a message ({len(self._buffer)} bytes left over)")

    def _next(self) -> Message | None:
        buf = self._buffer
        if len(buf) < _PRELUDE_LENGTH:
            return None
        total, headers_length, prelude_crc = struct.unpack_from("!III", buf, 0)
        if _crc32(bytes(buf[:8])) != prelude_crc:
            raise EventStreamDecodeError("event-stream prelude CRC mismatch")
        if total < _MIN_MESSAGE_LENGTH or headers_length > total - _MIN_MESSAGE_LENGTH:
            raise EventStreamDecodeError(
                f"event-stream lengths are inconsistent (total {total}, headers {headers_length})"
            )
        if headers_length > MAX_HEADERS_LENGTH:
            raise EventStreamDecodeError(f"event-stream headers of {headers_length} bytes exceed the limit")
        if total - _MIN_MESSAGE_LENGTH - headers_length > MAX_PAYLOAD_LENGTH:
            raise EventStreamDecodeError("event-stream payload exceeds the limit")
        if len(buf) < total:
            return None
        raw = bytes(buf[:total])
        del buf[:total]
        (message_crc,) = struct.unpack_from("!I", raw, total - 4)
        if _crc32(raw[: total - 4]) != message_crc:
            raise EventStreamDecodeError("event-stream message CRC mismatch")
        header_list = _decode_headers(raw[_PRELUDE_LENGTH : _PRELUDE_LENGTH + headers_length])
        payload = raw[_PRELUDE_LENGTH + headers_length : total - 4]
        return Message(headers=dict(header_list), payload=payload, header_list=tuple(header_list))


def decode_messages(data: bytes) -> list[Message]:
    """Decode a complete event stream; raises if it ends inside a message."""
    decoder = EventStreamDecoder()
    messages = decoder.feed(data)
    decoder.close()
    return messages


def iter_messages(chunks: Iterable[bytes]) -> Iterator[Message]:
    """Decode messages from an iterable of byte chunks of any size (a socket, an HTTP body)."""
    decoder = EventStreamDecoder()
    for chunk in chunks:
        yield from decoder.feed(chunk)
    decoder.close()
