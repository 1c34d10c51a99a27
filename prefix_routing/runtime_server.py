"""The SageMaker runtime's wire protocol, served on 127.0.0.1, with a pluggable backend.

Point boto3's own ``sagemaker-runtime`` client at it with ``endpoint_url`` and it behaves like the
real runtime as far as botocore can tell::

    with serve_runtime(EchoBackend(first_chunk_delay=0.05)) as server:
        client = boto3.client("sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1",
                              aws_access_key_id="test", aws_secret_access_key="test")
        stream = client.invoke_endpoint_with_response_stream(EndpointName="ep", Body=b"{...}")
        for event in stream["Body"]: ...
        server.wait_until_idle(); server.requests[-1].outcome   # "ok"

What it implements (paths and headers from botocore's service model ``runtime.sagemaker-2017-05-13``):

- ``POST /endpoints/{EndpointName}/invocations`` (``InvokeEndpoint``): request headers
  ``Content-Type``, ``Accept``, ``X-Amzn-SageMaker-Custom-Attributes``, ``-Target-Model``,
  ``-Target-Variant``, ``-Target-Container-Hostname``, ``-Inference-Id``, ``-Enable-Explanations``,
  ``-Inference-Component``, ``-Session-Id``, ``-Prefix-Aware-Id``; response body as the backend made it,
  with ``Content-Type``, ``x-Amzn-Invoked-Production-Variant``, ``X-Amzn-SageMaker-Custom-Attributes``
  and, for ``SessionId="NEW_SESSION"``, ``X-Amzn-SageMaker-New-Session-Id``.
- ``POST /endpoints/{EndpointName}/invocations-response-stream``
  (``InvokeEndpointWithResponseStream``): the same request headers except that the accept header is
  ``X-Amzn-SageMaker-Accept`` (and no ``-Target-Model``/``-Enable-Explanations``); a 200 answer with
  ``Content-Type: application/vnd.amazon.eventstream``, the payload's type in
  ``X-Amzn-SageMaker-Content-Type``, ``x-Amzn-Invoked-Production-Variant`` and custom attributes, and
  a chunked body of event-stream messages: one ``PayloadPart`` per backend chunk, then possibly a
  ``ModelStreamError`` or ``InternalStreamFailure`` exception event (:mod:`prefix_routing.eventstream`).
- Errors before the answer starts, in the rest-json error protocol (``X-Amzn-ErrorType`` header and a
  JSON body with the shape's members), so that botocore raises the modelled exception classes:
  ``ValidationError`` 400, ``ModelError`` 424 (``OriginalStatusCode``, ``OriginalMessage``,
  ``LogStreamArn``), ``ModelNotReadyException`` 429 and ``InternalDependencyException`` 530 (modelled
  for ``InvokeEndpoint`` only), ``InternalFailure`` 500, ``ServiceUnavailable`` 503. Throttling is
  **not** modelled for the SageMaker runtime: the server sends AWS's common ``ThrottlingException``
  (HTTP 400 by default, like AWS's common-errors table; ``Faults.throttle_status`` changes it), which
  botocore raises as a plain ``ClientError`` with code ``ThrottlingException`` and its retry logic
  treats as throttling.
- ``POST /endpoints/{EndpointName}/openai/v1/chat/completions`` (OpenAI-compatible API): requires
  ``Authorization: Bearer <token>`` (401 otherwise); answers JSON, or server-sent events when the body
  says ``"stream": true``; errors as OpenAI-style ``{"error": {"message", "type", "code"}}`` with the
  HTTP status of the error (throttling 429). A mid-stream error is an SSE event
  ``data: {"error": ...}`` and the stream ends without ``data: [DONE]``. (SageMaker's exact error
  bodies on this path are unconfirmed; these follow OpenAI's.)
- ``GET /ping`` (200) and ``GET /status`` (JSON: counts by outcome, plus the backend's ``status()``
  when it has one).
- Fault injection (:class:`Faults`): throttle the first K requests or a seeded fraction, a 5xx (or any
  error kind) for the first K or a fraction, a mid-stream ``ModelStreamError`` (or
  ``InternalStreamFailure``) after M chunks, a slow first chunk, a stream that ends early and cleanly
  (a truncated answer: the final usage chunk never comes), a dropped connection after M chunks, and
  payload parts split into small fragments.
- A thread-safe record of every request (:class:`RecordedRequest`): operation, endpoint, every header
  as a named field, body, outcome, injected fault, chunks sent, server-side timings (TTFT).

What a boto3 caller sees for each fault (checked by the tests): throttling → ``ClientError`` code
``ThrottlingException``; an error kind → ``client.exceptions.<Kind>`` (or a plain ``ClientError`` on
the streaming call for kinds not modelled there); a mid-stream error → ``EventStreamError`` with
``Code`` ``ModelStreamError``/``InternalStreamFailure`` while iterating ``response["Body"]``; a
truncated stream → the iteration just ends (no usage chunk, no ``[DONE]``); a dropped connection →
``urllib3.exceptions.ProtocolError`` while iterating (botocore does not wrap it).

What it does not implement: SigV4 verification (the ``Authorization`` header is recorded, never
checked), routing, KV caches, queues or any latency model (that is the backend's job: see
``prefix_routing.emulator``), ``InvokeEndpointAsync``, TLS, and anything but 127.0.0.1/loopback.

The backend (:class:`Backend`) gets a parsed :class:`RuntimeRequest` and returns either an
:class:`ErrorReply` (sent before any response byte) or a :class:`BackendResponse` whose ``chunks`` the
server pulls one by one, sending each as it comes: the backend sleeps between chunks to model
latency, and may raise :class:`StreamFailure` from the iterator to fail mid-stream. The server always
closes the iterator (``close()``) when it stops pulling, so a backend's ``finally`` runs even when the
client goes away. :class:`EchoBackend` is the built-in one for tests and demos.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import ipaddress
import itertools
import json
import random
import re
import socket
import socketserver
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit

from prefix_routing import eventstream
from prefix_routing.errors import UserError

__all__ = [
    "OP_INVOKE",
    "OP_INVOKE_STREAM",
    "OP_CHAT_COMPLETIONS",
    "ERROR_STATUS",
    "MAX_BODY_BYTES",
    "RequestHeaders",
    "RuntimeRequest",
    "ErrorReply",
    "StreamFailure",
    "BackendResponse",
    "Backend",
    "Faults",
    "RecordedRequest",
    "RuntimeServer",
    "serve_runtime",
    "EchoBackend",
    "sse_event",
    "SSE_DONE",
]

OP_INVOKE = "InvokeEndpoint"
OP_INVOKE_STREAM = "InvokeEndpointWithResponseStream"
#: Our name for the OpenAI-compatible chat-completions call (not a boto3 operation).
OP_CHAT_COMPLETIONS = "ChatCompletions"

#: HTTP status of each error code, from the service model (``ThrottlingException`` is AWS's common
#: error, not in the model; 400 as in AWS's common-errors table).
ERROR_STATUS: dict[str, int] = {
    "ValidationError": 400,
    "ModelError": 424,
    "ModelNotReadyException": 429,
    "InternalFailure": 500,
    "ServiceUnavailable": 503,
    "InternalDependencyException": 530,
    "ThrottlingException": 400,
}

#: Members of each error shape besides ``Message`` that the server puts in the JSON body.
_ERROR_EXTRA_MEMBERS = {"ModelError": ("OriginalStatusCode", "OriginalMessage", "LogStreamArn")}

STREAM_ERROR_KINDS = ("ModelStreamError", "InternalStreamFailure")

#: ``Body`` of InvokeEndpoint / InvokeEndpointWithResponseStream: at most 6 MiB (service model).
MAX_BODY_BYTES = 6 * 1024 * 1024
_READ_LIMIT = 64 * 1024 * 1024  # beyond this the server answers 413 and closes

_NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
_COMPONENT_RE = re.compile(r"^[a-zA-Z0-9]([\-a-zA-Z0-9]*[a-zA-Z0-9])?$")
_PRINTABLE_ID_RE = re.compile(r"^[!-~][ -~]*$")  # \A\S[\p{Print}]*\z, ASCII
_SESSION_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")

_PATHS = (
    (re.compile(r"^/endpoints/([^/]+)/invocations$"), OP_INVOKE),
    (re.compile(r"^/endpoints/([^/]+)/invocations-response-stream$"), OP_INVOKE_STREAM),
    (re.compile(r"^/endpoints/([^/]+)/openai/v1/chat/completions$"), OP_CHAT_COMPLETIONS),
)


def _route(path: str) -> tuple[re.Match[str], str] | None:
    for pattern, operation in _PATHS:
        match = pattern.match(path)
        if match:
            return match, operation
    return None


# --------------------------------------------------------------------------- the request


@dataclass(frozen=True)
class RequestHeaders:
    """Every request header botocore sends for the two invoke operations, as named fields.

    Field names are boto3's parameter names in snake case. ``accept`` comes from ``Accept`` for
    ``InvokeEndpoint`` and from ``X-Amzn-SageMaker-Accept`` for the streaming call.
    """

    content_type: str | None = None
    accept: str | None = None
    custom_attributes: str | None = None
    target_model: str | None = None
    target_variant: str | None = None
    target_container_hostname: str | None = None
    inference_id: str | None = None
    enable_explanations: str | None = None
    inference_component: str | None = None
    session_id: str | None = None
    prefix_aware_id: str | None = None
    authorization: str | None = None

    #: field -> HTTP header (``accept`` depends on the operation, see :meth:`from_http`).
    HTTP_NAMES = {
        "content_type": "Content-Type",
        "custom_attributes": "X-Amzn-SageMaker-Custom-Attributes",
        "target_model": "X-Amzn-SageMaker-Target-Model",
        "target_variant": "X-Amzn-SageMaker-Target-Variant",
        "target_container_hostname": "X-Amzn-SageMaker-Target-Container-Hostname",
        "inference_id": "X-Amzn-SageMaker-Inference-Id",
        "enable_explanations": "X-Amzn-SageMaker-Enable-Explanations",
        "inference_component": "X-Amzn-SageMaker-Inference-Component",
        "session_id": "X-Amzn-SageMaker-Session-Id",
        "prefix_aware_id": "X-Amzn-SageMaker-Prefix-Aware-Id",
        "authorization": "Authorization",
    }

    @classmethod
    def from_http(cls, operation: str, headers: Any) -> RequestHeaders:
        """Read the named fields from an ``email.message.Message``-like mapping (case-insensitive)."""
        values = {name: headers.get(http) for name, http in cls.HTTP_NAMES.items()}
        accept_header = "X-Amzn-SageMaker-Accept" if operation == OP_INVOKE_STREAM else "Accept"
        values["accept"] = headers.get(accept_header)
        return cls(**values)

    @property
    def bearer_token(self) -> str | None:
        """The token of an ``Authorization: Bearer <token>`` header."""
        if self.authorization and self.authorization[:7].lower() == "bearer ":
            return self.authorization[7:].strip() or None
        return None


@dataclass(frozen=True)
class RuntimeRequest:
    """One parsed request, as the backend sees it."""

    operation: str  # OP_INVOKE, OP_INVOKE_STREAM or OP_CHAT_COMPLETIONS
    endpoint_name: str
    body: bytes
    headers: RequestHeaders
    #: Every header as received, in order (names as the client spelled them).
    raw_headers: tuple[tuple[str, str], ...]
    #: ``time.monotonic()`` when the request was read completely; all server timings use it.
    arrival: float
    #: ``time.time()`` at the same moment.
    arrival_wall: float
    request_id: str
    #: 0, 1, 2, ... in order of arrival at the server (all operations together).
    index: int
    #: Whether the answer is a stream: always for the streaming call, ``"stream": true`` on the
    #: OpenAI path, never for ``InvokeEndpoint``.
    stream: bool
    path: str

    def json(self) -> Any:
        """The body parsed as JSON (raises ``ValueError`` if it is not)."""
        return json.loads(self.body.decode("utf-8"))


# --------------------------------------------------------------------------- what a backend returns


@dataclass(frozen=True)
class ErrorReply:
    """An error answered before any response byte: a code from :data:`ERROR_STATUS` (or any code with
    an explicit ``status``) and a message. ``ModelError`` may carry its modelled members."""

    code: str
    message: str
    status: int | None = None
    original_status_code: int | None = None
    original_message: str | None = None
    log_stream_arn: str | None = None

    @property
    def http_status(self) -> int:
        if self.status is not None:
            return self.status
        try:
            return ERROR_STATUS[self.code]
        except KeyError:
            raise ValueError(f"error code {self.code!r} has no default HTTP status; give status=") from None

    def body(self) -> dict[str, Any]:
        """The rest-json error body: ``Message`` plus the shape's other members that are set."""
        out: dict[str, Any] = {"Message": self.message}
        if self.original_status_code is not None:
            out["OriginalStatusCode"] = self.original_status_code
        if self.original_message is not None:
            out["OriginalMessage"] = self.original_message
        if self.log_stream_arn is not None:
            out["LogStreamArn"] = self.log_stream_arn
        return out


class StreamFailure(Exception):
    """Raise from a backend's chunk iterator to fail the answer mid-stream.

    ``kind`` is ``ModelStreamError`` (with an ``error_code`` such as ``ModelInvocationTimeExceeded``
    or ``StreamBroken``) or ``InternalStreamFailure``. On ``InvokeEndpoint`` (not streamed) the
    server answers ``ModelError`` 424 instead.
    """

    def __init__(self, kind: str = "ModelStreamError", message: str = "stream failed", error_code: str | None = None):
        if kind not in STREAM_ERROR_KINDS:
            raise ValueError(f"stream failure kind must be one of {STREAM_ERROR_KINDS}, got {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.error_code = error_code


@dataclass
class BackendResponse:
    """A successful start of an answer: the chunks are pulled lazily, one per ``PayloadPart``
    (or per SSE write on the OpenAI path; joined into one body when not streaming)."""

    chunks: Iterable[bytes]
    content_type: str = "application/json"
    #: ``x-Amzn-Invoked-Production-Variant``; default: the request's target variant, else ``AllTraffic``.
    invoked_variant: str | None = None
    custom_attributes: str | None = None
    #: ``InvokeEndpoint`` only; the server makes one up for ``SessionId="NEW_SESSION"`` if not set.
    new_session_id: str | None = None
    closed_session_id: str | None = None


@runtime_checkable
class Backend(Protocol):
    """What the server calls for every request that passed validation and fault injection.

    ``handle`` runs on the request's own thread (the server is threaded): it may block (a queue),
    and the returned iterator may sleep between chunks. Optional: a ``status() -> dict`` method,
    served as JSON under ``GET /status``.
    """

    def handle(self, request: RuntimeRequest) -> BackendResponse | ErrorReply: ...


# --------------------------------------------------------------------------- faults


@dataclass(frozen=True)
class Faults:
    """Fault injection. Counts apply to requests in order of arrival (all operations together);
    fractions draw from ``random.Random(seed)``, the same number of draws for every request, so a
    run is reproducible for a given arrival order.

    Order of checks per request: validation, throttling, error, then the backend; stream faults
    apply to streamed answers only (``truncate`` wins over ``stream_error`` over ``drop`` when several
    are drawn for one request).
    """

    #: Throttle the first K requests, then a fraction p of the rest.
    throttle_first: int = 0
    throttle_rate: float = 0.0
    throttle_status: int = 400
    #: Answer ``error_kind`` (default ``ServiceUnavailable`` 503) to the first K requests after the
    #: throttled ones, then to a fraction p.
    error_first: int = 0
    error_rate: float = 0.0
    error_kind: str = "ServiceUnavailable"
    #: After M chunks, a ``stream_error_kind`` event instead of the rest of the answer, on a fraction
    #: of streamed answers (if the answer has fewer chunks, the error replaces its natural end).
    stream_error_after: int | None = None
    stream_error_rate: float = 1.0
    stream_error_kind: str = "ModelStreamError"
    stream_error_code: str = "ModelInvocationTimeExceeded"
    #: After M chunks the stream ends cleanly, without error: a truncated answer.
    truncate_after: int | None = None
    truncate_rate: float = 1.0
    #: After M chunks the server closes the connection without ending the chunked body.
    drop_after: int | None = None
    drop_rate: float = 1.0
    #: Extra delay before the first chunk (seconds), on a fraction of answers.
    first_chunk_delay: float = 0.0
    first_chunk_delay_rate: float = 1.0
    #: Split every chunk into payload parts of at most this many bytes (0: no split).
    fragment_bytes: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_rate") and not 0.0 <= value <= 1.0:
                raise UserError(f"fault {f.name}={value}: must be between 0 and 1")
            if f.name.endswith(("_first", "_after", "_bytes")) and value is not None and value < 0:
                raise UserError(f"fault {f.name}={value}: must be >= 0")
        if self.first_chunk_delay < 0:
            raise UserError(f"fault first_chunk_delay={self.first_chunk_delay}: must be >= 0")
        if self.error_kind not in ERROR_STATUS:
            raise UserError(f"fault error_kind={self.error_kind!r}: one of {', '.join(ERROR_STATUS)}")
        if self.stream_error_kind not in STREAM_ERROR_KINDS:
            raise UserError(
                f"fault stream_error_kind={self.stream_error_kind!r}: one of {', '.join(STREAM_ERROR_KINDS)}"
            )

    @classmethod
    def from_spec(cls, spec: str) -> Faults:
        """Parse ``"throttle_rate=0.1,stream_error_after=3,seed=7"`` (for a command line).

        Raises :class:`~prefix_routing.errors.UserError` naming the bad item.
        """
        types = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            key, sep, raw = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in types:
                raise UserError(f"fault {item!r}: expected NAME=VALUE with NAME one of {', '.join(types)}")
            kind = str(types[key])
            raw = raw.strip()
            try:
                if kind.startswith("int"):
                    values[key] = None if raw.lower() == "none" else int(raw)
                elif kind.startswith("float"):
                    values[key] = float(raw)
                else:
                    values[key] = raw
            except ValueError:
                raise UserError(f"fault {item!r}: {raw!r} is not a number") from None
        return cls(**values)


@dataclass(frozen=True)
class _Plan:
    throttle: bool = False
    error: bool = False
    stream_error_after: int | None = None
    truncate_after: int | None = None
    drop_after: int | None = None
    first_chunk_delay: float = 0.0


def _plan(faults: Faults, index: int, rng: random.Random) -> _Plan:
    draws = [rng.random() for _ in range(6)]  # always six: reproducible whatever is enabled
    throttle = index < faults.throttle_first or draws[0] < faults.throttle_rate
    error = not throttle and (
        faults.throttle_first <= index < faults.throttle_first + faults.error_first or draws[1] < faults.error_rate
    )
    truncate = faults.truncate_after if faults.truncate_after is not None and draws[3] < faults.truncate_rate else None
    stream_error = (
        faults.stream_error_after
        if truncate is None and faults.stream_error_after is not None and draws[2] < faults.stream_error_rate
        else None
    )
    drop = (
        faults.drop_after
        if truncate is None and stream_error is None and faults.drop_after is not None and draws[4] < faults.drop_rate
        else None
    )
    delay = faults.first_chunk_delay if draws[5] < faults.first_chunk_delay_rate else 0.0
    return _Plan(throttle, error, stream_error, truncate, drop, delay)


# --------------------------------------------------------------------------- the record


@dataclass
class RecordedRequest:
    """What the server saw and did for one request. Times are ``time.monotonic()``."""

    request: RuntimeRequest
    #: ``pending`` while being answered, then ``ok``, ``error`` (answered with an HTTP error),
    #: ``stream_error`` (an exception event or SSE error mid-stream), ``truncated`` (ended early,
    #: cleanly), ``dropped`` (connection closed mid-body) or ``client_disconnected``.
    outcome: str = "pending"
    status: int | None = None
    error_code: str | None = None
    #: The injected fault that decided the outcome: ``throttle``, ``error``, ``stream_error``,
    #: ``truncate``, ``drop``; ``slow_first_chunk`` when only the first chunk was delayed.
    fault: str | None = None
    chunks_sent: int = 0
    bytes_sent: int = 0
    headers_sent_at: float | None = None
    first_chunk_at: float | None = None
    finished_at: float | None = None

    @property
    def operation(self) -> str:
        return self.request.operation

    @property
    def endpoint_name(self) -> str:
        return self.request.endpoint_name

    @property
    def headers(self) -> RequestHeaders:
        return self.request.headers

    @property
    def body(self) -> bytes:
        return self.request.body

    @property
    def ttft(self) -> float | None:
        """Server-side time to first chunk: arrival to the first chunk written."""
        return None if self.first_chunk_at is None else self.first_chunk_at - self.request.arrival

    @property
    def duration(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.request.arrival


# --------------------------------------------------------------------------- the server


def is_loopback_host(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1): the only places we serve or load-test."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Disconnected(Exception):
    pass


class RuntimeServer(ThreadingHTTPServer):
    """A threaded HTTP server speaking the SageMaker runtime's protocol on a loopback address.

    ``port=0`` picks a free port (see :attr:`port` / :attr:`url`). ``endpoints``: if given, other
    endpoint names get ``ValidationError`` ("Endpoint ... not found"). ``bearer_token``: if given, the
    OpenAI path requires exactly this token, otherwise any non-empty one. ``record_bodies=False``
    keeps memory flat in long load tests (bodies recorded as ``b""``).
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        backend: Backend,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        faults: Faults | None = None,
        endpoints: Iterable[str] | None = None,
        bearer_token: str | None = None,
        record_bodies: bool = True,
    ):
        if not is_loopback_host(host):
            raise UserError(f"host {host!r}: the runtime server binds to a loopback address only (127.0.0.1)")
        if not callable(getattr(backend, "handle", None)):
            raise TypeError("backend must have a handle(request) method")
        self.backend = backend
        self.faults = faults or Faults()
        self.endpoints = frozenset(endpoints) if endpoints is not None else None
        self.bearer_token = bearer_token
        self.record_bodies = record_bodies
        self._lock = threading.Condition()
        self._records: list[RecordedRequest] = []
        self._pending = 0
        self._counter = itertools.count()
        self._rng = random.Random(self.faults.seed)
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would look the host up with socket.getfqdn (DNS); not needed here.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[0], self.server_address[1]

    # -- addresses
    @property
    def host(self) -> str:
        return self.server_address[0]

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- life cycle
    def start(self) -> RuntimeServer:
        """Serve on a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"runtime-server-{self.port}",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket (streams in flight are abandoned)."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.server_close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:  # idle keep-alive connections and streams in flight
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> RuntimeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the record
    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received so far, in order of arrival."""
        with self._lock:
            return list(self._records)

    def clear_requests(self) -> None:
        with self._lock:
            self._records.clear()

    def wait_until_idle(self, timeout: float = 5.0) -> bool:
        """Wait until no request is being answered (outcomes are final); False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: self._pending == 0, timeout)

    def outcome_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(Counter(r.outcome for r in self._records))

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": len(self.requests), "outcomes": self.outcome_counts()}
        status = getattr(self.backend, "status", None)
        if callable(status):
            out["backend"] = status()
        return out

    # -- used by the handler
    def _admit(self, make_request) -> tuple[RuntimeRequest, RecordedRequest, _Plan]:
        with self._lock:
            index = next(self._counter)
            plan = _plan(self.faults, index, self._rng)
            request = make_request(index)
            record = RecordedRequest(request if self.record_bodies else replace(request, body=b""))
            self._records.append(record)
            self._pending += 1
        return request, record, plan

    def _finish(self, record: RecordedRequest, outcome: str, status: int | None, error_code: str | None = None) -> None:
        with self._lock:
            record.outcome = outcome
            record.status = status
            record.error_code = error_code
            record.finished_at = time.monotonic()
            self._pending -= 1
            self._lock.notify_all()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RuntimeServer
    server_version = "prefix-routing-runtime"
    sys_version = ""
    timeout = 120  # idle keep-alive connections

    def setup(self) -> None:
        super().setup()
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server._lock:
            self.server._connections.add(self.connection)

    def finish(self) -> None:
        with self.server._lock:
            self.server._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet by default
        pass

    # -- plumbing
    def _read_body(self) -> bytes | None:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts, total = [], 0
            while True:
                line = self.rfile.readline(1024)
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                total += size
                if total > _READ_LIMIT:
                    return None
                parts.append(self.rfile.read(size))
                self.rfile.readline(8)
        length = int(self.headers.get("Content-Length") or 0)
        if length > _READ_LIMIT:
            return None
        return self.rfile.read(length) if length else b""

    def _send(self, data: bytes) -> None:
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError) as exc:
            self.close_connection = True
            raise _Disconnected from exc

    def _send_chunk(self, data: bytes) -> None:
        if data:
            self._send(b"%x\r\n%s\r\n" % (len(data), data))

    def _simple(self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self._send(body)

    def _aws_error(self, request_id: str, error: ErrorReply) -> int:
        status = error.http_status
        self._simple(
            status,
            json.dumps(error.body()).encode(),
            "application/json",
            {"X-Amzn-ErrorType": error.code, "x-amzn-RequestId": request_id},
        )
        return status

    def _openai_error(self, request_id: str, status: int, message: str, code: str) -> int:
        kind = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error"}.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        self._simple(status, json.dumps(body).encode(), "application/json", {"x-amzn-RequestId": request_id})
        return status

    # -- GET
    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/ping":
            self._simple(200, b"", "text/plain")
        elif path == "/status":
            self._simple(200, json.dumps(self.server.status()).encode(), "application/json")
        else:
            self._simple(
                404, b'{"message":"not found"}', "application/json", {"X-Amzn-ErrorType": "UnknownOperationException"}
            )

    # -- POST
    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        routed = _route(path)
        if routed is None:
            self._read_body()
            self._simple(
                404,
                b'{"message":"Unknown operation"}',
                "application/json",
                {"X-Amzn-ErrorType": "UnknownOperationException"},
            )
            return
        match, operation = routed
        body = self._read_body()
        if body is None:
            self.close_connection = True
            self._simple(413, b'{"message":"Request entity too large"}', "application/json")
            return
        endpoint = unquote(match.group(1))
        stream = operation == OP_INVOKE_STREAM
        openai_body: Any = None
        if operation == OP_CHAT_COMPLETIONS:
            with contextlib.suppress(ValueError):
                openai_body = json.loads(body.decode("utf-8"))
            stream = isinstance(openai_body, dict) and openai_body.get("stream") is True
        arrival, arrival_wall = time.monotonic(), time.time()
        request_id = str(uuid.uuid4())

        def make(index: int) -> RuntimeRequest:
            return RuntimeRequest(
                operation=operation,
                endpoint_name=endpoint,
                body=body,
                headers=RequestHeaders.from_http(operation, self.headers),
                raw_headers=tuple(self.headers.items()),
                arrival=arrival,
                arrival_wall=arrival_wall,
                request_id=request_id,
                index=index,
                stream=stream,
                path=path,
            )

        request, record, plan = self.server._admit(make)
        outcome, status, code = "error", 500, "InternalFailure"
        try:
            if operation == OP_CHAT_COMPLETIONS:
                outcome, status, code = self._openai(request, record, plan, openai_body)
            else:
                outcome, status, code = self._sagemaker(request, record, plan)
        except _Disconnected:
            outcome, status, code = "client_disconnected", None, None
        finally:
            self.server._finish(record, outcome, status, code)

    # -- the SageMaker operations
    def _validate(self, request: RuntimeRequest) -> str | None:
        h = request.headers
        name = request.endpoint_name
        if not (len(name) <= 63 and _NAME_RE.match(name)):
            return f"1 validation error detected: Value '{name}' at 'endpointName' failed to satisfy constraint"
        if len(request.body) > MAX_BODY_BYTES:
            return f"Request body of {len(request.body)} bytes exceeds the maximum of {MAX_BODY_BYTES} bytes"
        if h.prefix_aware_id is not None and not (
            1 <= len(h.prefix_aware_id) <= 64 and _PRINTABLE_ID_RE.match(h.prefix_aware_id)
        ):
            return "Value at 'prefixAwareId' failed to satisfy constraint: 1-64 printable ASCII characters"
        if h.inference_component is not None and not (
            len(h.inference_component) <= 63 and _COMPONENT_RE.match(h.inference_component)
        ):
            return "Value at 'inferenceComponentName' failed to satisfy constraint"
        if h.inference_id is not None and not (
            1 <= len(h.inference_id) <= 64 and _PRINTABLE_ID_RE.match(h.inference_id)
        ):
            return "Value at 'inferenceId' failed to satisfy constraint"
        if h.session_id is not None and not (
            len(h.session_id) <= 256
            and (_SESSION_RE.match(h.session_id) or (h.session_id == "NEW_SESSION" and request.operation == OP_INVOKE))
        ):
            return "Value at 'sessionId' failed to satisfy constraint"
        if self.server.endpoints is not None and name not in self.server.endpoints:
            return f"Endpoint {name} of account 000000000000 not found."
        return None

    def _before_backend(self, request: RuntimeRequest, record: RecordedRequest, plan: _Plan) -> ErrorReply | None:
        faults = self.server.faults
        if plan.throttle:
            record.fault = "throttle"
            return ErrorReply("ThrottlingException", "Rate exceeded", status=faults.throttle_status)
        if plan.error:
            record.fault = "error"
            kind = faults.error_kind
            if kind == "ModelError":
                return ErrorReply(
                    kind,
                    'Received server error (500) from primary with message "injected fault".',
                    original_status_code=500,
                    original_message='{"object":"error","message":"injected fault","code":500}',
                    log_stream_arn=_log_stream_arn(request.endpoint_name),
                )
            return ErrorReply(kind, f"Injected {kind}.")
        return None

    def _call_backend(self, request: RuntimeRequest) -> BackendResponse | ErrorReply:
        try:
            result = self.server.backend.handle(request)
        except Exception as exc:  # a backend bug: the runtime's own 500
            return ErrorReply("InternalFailure", f"backend failed: {type(exc).__name__}: {exc}")
        if not isinstance(result, (BackendResponse, ErrorReply)):
            return ErrorReply("InternalFailure", f"backend returned {type(result).__name__}")
        return result

    def _response_headers(self, request: RuntimeRequest, response: BackendResponse) -> dict[str, str]:
        out = {
            "x-Amzn-Invoked-Production-Variant": response.invoked_variant
            or request.headers.target_variant
            or "AllTraffic",
            "x-amzn-RequestId": request.request_id,
        }
        if response.custom_attributes is not None:
            out["X-Amzn-SageMaker-Custom-Attributes"] = response.custom_attributes
        return out

    def _sagemaker(self, request: RuntimeRequest, record: RecordedRequest, plan: _Plan) -> tuple[str, int, str | None]:
        problem = self._validate(request)
        error = ErrorReply("ValidationError", problem) if problem else self._before_backend(request, record, plan)
        result = error or self._call_backend(request)
        if isinstance(result, ErrorReply):
            return "error", self._aws_error(request.request_id, result), result.code
        if request.operation == OP_INVOKE:
            return self._invoke(request, record, plan, result)
        return self._invoke_stream(request, record, plan, result)

    def _invoke(self, request, record, plan, response: BackendResponse) -> tuple[str, int, str | None]:
        iterator = iter(response.chunks)
        try:
            if plan.first_chunk_delay:
                record.fault = "slow_first_chunk"
                time.sleep(plan.first_chunk_delay)
            body = b"".join(iterator)
        except StreamFailure as failure:
            error = ErrorReply(
                "ModelError",
                f'Received server error (500) from primary with message "{failure.message}".',
                original_status_code=500,
                original_message=failure.message,
            )
            return "error", self._aws_error(request.request_id, error), "ModelError"
        except Exception as exc:
            error = ErrorReply("InternalFailure", f"backend failed: {type(exc).__name__}: {exc}")
            return "error", self._aws_error(request.request_id, error), "InternalFailure"
        finally:
            _close(iterator)
        headers = self._response_headers(request, response)
        session = request.headers.session_id
        new_session = response.new_session_id
        if new_session is None and session == "NEW_SESSION":
            expires = (_dt.datetime.now(_dt.UTC) + _dt.timedelta(minutes=20)).strftime("%Y-%m-%dT%H:%M:%SZ")
            new_session = f"{uuid.uuid4().hex}; Expires={expires}"
        if new_session:
            headers["X-Amzn-SageMaker-New-Session-Id"] = new_session
        if response.closed_session_id:
            headers["X-Amzn-SageMaker-Closed-Session-Id"] = response.closed_session_id
        now = time.monotonic()
        record.headers_sent_at = record.first_chunk_at = now
        record.chunks_sent, record.bytes_sent = 1, len(body)
        self._simple(200, body, response.content_type, headers)
        return "ok", 200, None

    def _start_stream(self, record: RecordedRequest, content_type: str, headers: dict[str, str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()  # flushes the status line and headers
        record.headers_sent_at = time.monotonic()

    def _pump(
        self, record: RecordedRequest, plan: _Plan, response: BackendResponse, frame
    ) -> tuple[str, StreamFailure | None]:
        """Send chunks through ``frame`` until the end or a fault; returns (how it ended, failure)."""
        iterator = iter(response.chunks)
        fragment = self.server.faults.fragment_bytes
        stops = [
            (plan.truncate_after, "truncate"),
            (plan.stream_error_after, "stream_error"),
            (plan.drop_after, "drop"),
        ]
        try:
            if plan.first_chunk_delay:
                record.fault = "slow_first_chunk"
                time.sleep(plan.first_chunk_delay)
            while True:
                for limit, fault in stops:
                    if limit is not None and record.chunks_sent >= limit:
                        record.fault = fault
                        return fault, None
                try:
                    chunk = next(iterator)
                except StopIteration:
                    if plan.stream_error_after is not None:  # fewer chunks than M: the error ends it
                        record.fault = "stream_error"
                        return "stream_error", None
                    return "end", None
                except StreamFailure as failure:
                    return "backend_failure", failure
                except Exception as exc:
                    return "backend_failure", StreamFailure("InternalStreamFailure", f"{type(exc).__name__}: {exc}")
                if not chunk:
                    continue
                pieces = [chunk[i : i + fragment] for i in range(0, len(chunk), fragment)] if fragment else [chunk]
                self._send_chunk(b"".join(frame(piece) for piece in pieces))
                if record.first_chunk_at is None:
                    record.first_chunk_at = time.monotonic()
                record.chunks_sent += 1
                record.bytes_sent += len(chunk)
        finally:
            _close(iterator)

    def _end_stream(self, ended: str) -> None:
        if ended == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._send(b"0\r\n\r\n")

    def _invoke_stream(self, request, record, plan, response: BackendResponse) -> tuple[str, int, str | None]:
        headers = self._response_headers(request, response)
        headers["X-Amzn-SageMaker-Content-Type"] = response.content_type
        self._start_stream(record, eventstream.CONTENT_TYPE, headers)
        ended, failure = self._pump(record, plan, response, eventstream.payload_part)
        faults = self.server.faults
        if ended == "stream_error":
            code = faults.stream_error_code if faults.stream_error_kind == "ModelStreamError" else None
            failure = StreamFailure(faults.stream_error_kind, "Injected mid-stream failure.", code)
        if failure is not None:
            if failure.kind == "ModelStreamError":
                event = eventstream.model_stream_error(failure.message, failure.error_code)
            else:
                event = eventstream.internal_stream_failure(failure.message)
            self._send_chunk(event)
        self._end_stream(ended)
        return _stream_outcome(ended, failure)

    # -- the OpenAI-compatible path
    def _openai(self, request, record, plan, body: Any) -> tuple[str, int, str | None]:
        rid = request.request_id
        token = request.headers.bearer_token
        expected = self.server.bearer_token
        if token is None or (expected is not None and token != expected):
            return (
                "error",
                self._openai_error(rid, 401, "Missing or invalid bearer token.", "invalid_api_key"),
                "Unauthorized",
            )
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return (
                "error",
                self._openai_error(rid, 400, "Body must be a JSON object with a 'messages' list.", "invalid_request"),
                "ValidationError",
            )
        error = self._before_backend(request, record, plan) or None
        if error is None and self.server.endpoints is not None and request.endpoint_name not in self.server.endpoints:
            error = ErrorReply("ValidationError", f"Endpoint {request.endpoint_name} not found.")
        result = error or self._call_backend(request)
        if isinstance(result, ErrorReply):
            status = (
                429
                if result.code == "ThrottlingException"
                else (
                    result.original_status_code
                    if result.code == "ModelError" and result.original_status_code
                    else result.http_status
                )
            )
            return "error", self._openai_error(rid, status, result.message, result.code), result.code
        response = result
        headers = {"x-amzn-RequestId": rid}
        if not request.stream:
            iterator = iter(response.chunks)
            try:
                if plan.first_chunk_delay:
                    record.fault = "slow_first_chunk"
                    time.sleep(plan.first_chunk_delay)
                data = b"".join(iterator)
            except Exception as exc:
                message = exc.message if isinstance(exc, StreamFailure) else f"{type(exc).__name__}: {exc}"
                return "error", self._openai_error(rid, 500, message, "ModelError"), "ModelError"
            finally:
                _close(iterator)
            record.headers_sent_at = record.first_chunk_at = time.monotonic()
            record.chunks_sent, record.bytes_sent = 1, len(data)
            self._simple(200, data, response.content_type, headers)
            return "ok", 200, None
        headers["Cache-Control"] = "no-cache"
        self._start_stream(record, "text/event-stream; charset=utf-8", headers)
        ended, failure = self._pump(record, plan, response, lambda piece: piece)
        faults = self.server.faults
        if ended == "stream_error":
            failure = StreamFailure(faults.stream_error_kind, "Injected mid-stream failure.", faults.stream_error_code)
        if failure is not None:
            error_body = {
                "error": {
                    "message": failure.message,
                    "type": "server_error",
                    "code": failure.error_code or failure.kind,
                }
            }
            self._send_chunk(sse_event(error_body))
        self._end_stream(ended)
        return _stream_outcome(ended, failure)


def _stream_outcome(ended: str, failure: StreamFailure | None) -> tuple[str, int, str | None]:
    if failure is not None:
        return "stream_error", 200, failure.kind
    if ended == "truncate":
        return "truncated", 200, None
    if ended == "drop":
        return "dropped", 200, None
    return "ok", 200, None


def _log_stream_arn(endpoint_name: str) -> str:
    return f"arn:aws:logs:us-east-1:000000000000:log-group:/aws/sagemaker/Endpoints/{endpoint_name}"


def _close(iterator: Any) -> None:
    close = getattr(iterator, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


@contextlib.contextmanager
def serve_runtime(backend: Backend | None = None, **options: Any) -> Iterator[RuntimeServer]:
    """Run a :class:`RuntimeServer` on a free port of 127.0.0.1 for the ``with`` block.

    ``options`` are :class:`RuntimeServer`'s keywords (``faults=``, ``endpoints=``, ``bearer_token=``,
    ``port=``, ``record_bodies=``). The default backend is ``EchoBackend()``.
    """
    server = RuntimeServer(backend if backend is not None else EchoBackend(), **options)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# --------------------------------------------------------------------------- OpenAI-style chunks

#: The last server-sent event of an OpenAI-style stream.
SSE_DONE = b"data: [DONE]\n\n"


def sse_event(obj: Any) -> bytes:
    """One server-sent event ``data: <compact JSON>\\n\\n``."""
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n\n"


_WORD_RE = re.compile(r"\S+")


def _prompt_text(body: Any) -> tuple[str, str]:
    """(all prompt text in order, the last user turn's text) of a chat, completions or LMI body."""

    def text_of(content: Any) -> str:
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "\n".join(
                part.get("text", "") for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
            )
        return ""

    if not isinstance(body, dict):
        raise ValueError("body is not a JSON object")
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        texts, last_user = [], ""
        for message in messages:
            if not isinstance(message, dict):
                raise ValueError("messages[] must be objects")
            text = text_of(message.get("content"))
            texts.append(f"{message.get('role', '')}: {text}")
            if message.get("role") == "user":
                last_user = text
        return "\n".join(texts), last_user
    for key in ("prompt", "inputs"):
        value = body.get(key)
        if isinstance(value, list):
            value = "\n".join(v for v in value if isinstance(v, str))
        if isinstance(value, str) and value:
            return value, value
    raise ValueError("body has no 'messages', 'prompt' or 'inputs'")


@dataclass(frozen=True)
class ChatRequest:
    """What a model backend needs from a chat, completions or LMI body."""

    body: dict[str, Any]
    prompt_text: str  # all prompt text in order, as a chat template would lay it out ("role: content")
    prompt_words: list[str]  # whitespace-separated words of all prompt text: the stand-in for tokens
    out_words: list[str]  # the answer: the last user turn's words, repeated to n_out
    n_out: int
    finish: str  # "length" when the body set a token limit, else "stop"
    cache_salt: str


def parse_chat_request(request: RuntimeRequest, *, default_max_tokens: int) -> ChatRequest | ErrorReply:
    """Parse the body as a container would; a body it cannot serve gets ``ModelError`` (original 400)."""
    try:
        body = request.json()
        everything, last_user = _prompt_text(body)
    except (ValueError, UnicodeDecodeError) as exc:
        message = json.dumps({"object": "error", "message": str(exc), "type": "BadRequestError", "code": 400})
        return ErrorReply(
            "ModelError",
            f'Received client error (400) from primary with message "{message}".',
            original_status_code=400,
            original_message=message,
            log_stream_arn=_log_stream_arn(request.endpoint_name),
        )
    limit = body.get("max_tokens") or body.get("max_completion_tokens")
    if limit is None and isinstance(body.get("parameters"), dict):
        limit = body["parameters"].get("max_new_tokens")
    n_out = limit if isinstance(limit, int) and limit > 0 else default_max_tokens
    words = _WORD_RE.findall(last_user) or ["ok"]
    return ChatRequest(
        body=body,
        prompt_text=everything,
        prompt_words=_WORD_RE.findall(everything),
        out_words=[words[i % len(words)] for i in range(n_out)],
        n_out=n_out,
        finish="length" if isinstance(limit, int) and limit > 0 else "stop",
        cache_salt=body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else "",
    )


def chat_response(
    request: RuntimeRequest,
    chat: ChatRequest,
    *,
    prompt_tokens: int,
    cached_tokens: int,
    wait: Callable[[int], None],
    whole_delay: float,
    stream_format: str = "sse",
    model: str = "echo",
    variant: str | None = None,
    on_close: Callable[[], None] | None = None,
    tokens_per_chunk: int = 1,
) -> BackendResponse:
    """An OpenAI chat-completion answer: streamed chunks ending with a usage chunk (and ``[DONE]``
    in SSE), or one JSON object after ``whole_delay`` seconds. ``wait(i)`` runs before the chunk
    whose first token is token ``i``; ``tokens_per_chunk`` > 1 groups tokens (the first chunk always
    carries the first token alone, so time to first token is unchanged). ``on_close`` runs when the
    server stops pulling, finished or not."""
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": chat.n_out,
        "total_tokens": prompt_tokens + chat.n_out,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    head = {
        "id": f"chatcmpl-{request.request_id}",
        "created": int(request.arrival_wall),
        "model": chat.body.get("model") if isinstance(chat.body.get("model"), str) else model,
    }

    def frame(obj: Any) -> bytes:
        if stream_format == "sse":
            return sse_event(obj)
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"

    def groups() -> Iterator[tuple[int, str]]:
        words = chat.out_words
        yield 0, words[0]
        for start in range(1, len(words), tokens_per_chunk):
            yield start, "".join(" " + w for w in words[start : start + tokens_per_chunk])

    def streamed() -> Iterator[bytes]:
        try:
            for i, text in groups():
                wait(i)
                delta: dict[str, Any] = {"content": text}
                if i == 0:
                    delta = {"role": "assistant", **delta}
                finish = chat.finish if i + (1 if i == 0 else tokens_per_chunk) >= len(chat.out_words) else None
                yield frame({**head, "object": "chat.completion.chunk",
                             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            yield frame({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
            if stream_format == "sse":
                yield SSE_DONE
        finally:
            if on_close:
                on_close()

    def whole() -> Iterator[bytes]:
        try:
            time.sleep(whole_delay)
            message = {"role": "assistant", "content": " ".join(chat.out_words)}
            yield json.dumps(
                {**head, "object": "chat.completion",
                 "choices": [{"index": 0, "message": message, "finish_reason": chat.finish}], "usage": usage},
                separators=(",", ":"),
                ensure_ascii=False,
            ).encode("utf-8")
        finally:
            if on_close:
                on_close()

    if request.stream:
        content_type = "text/event-stream" if stream_format == "sse" else "application/jsonlines"
        chunks = streamed()
    else:
        content_type, chunks = "application/json", whole()
    return BackendResponse(
        chunks=chunks,
        content_type=content_type,
        invoked_variant=variant or request.headers.target_variant or None,
        custom_attributes=request.headers.custom_attributes,
    )


class EchoBackend:
    """A scripted model for tests and demos: answers OpenAI chat-completion chunks that echo the
    last user message word by word.

    - Streamed (``request.stream``): chunks ``{"id","object":"chat.completion.chunk","created","model",
      "choices":[{"index":0,"delta":{"content":...},"finish_reason":...}]}``, then a last chunk with
      ``"choices": []`` and ``usage`` (``prompt_tokens``, ``completion_tokens``, ``total_tokens``,
      ``prompt_tokens_details.cached_tokens``). With ``stream_format="sse"`` (default, what vLLM's
      OpenAI server and the SageMaker vLLM container send) each chunk is ``data: {...}\\n\\n`` and the
      stream ends with ``data: [DONE]\\n\\n``; with ``"jsonl"`` each chunk is one JSON line. Usage is
      always sent (vLLM sends it only with ``stream_options.include_usage``).
    - Not streamed: one ``chat.completion`` JSON object with ``message`` and the same ``usage``.
    - Tokens are whitespace-separated words (a stand-in for a tokenizer). ``cached_tokens`` comes
      from a tiny prefix cache: blocks of ``block_tokens`` prompt words, chained hashes seeded with the
      body's ``cache_salt``; a block counts as cached when the same chain was seen before (one cache
      shared by all requests: no instances, no eviction beyond ``cache_blocks``).
    - Latency: ``first_chunk_delay`` before the first chunk, ``token_delay`` before each next one (a
      non-streamed answer sleeps the sum). ``max_tokens`` (or ``max_completion_tokens``,
      ``parameters.max_new_tokens``) from the body, else the backend's ``max_tokens``.
    - A body without ``messages``/``prompt``/``inputs`` gets ``ModelError`` with
      ``OriginalStatusCode`` 400, as a container rejecting it would.
    """

    def __init__(
        self,
        *,
        first_chunk_delay: float = 0.0,
        token_delay: float = 0.0,
        max_tokens: int = 8,
        stream_format: str = "sse",
        model: str = "echo",
        block_tokens: int = 16,
        cache_blocks: int = 100_000,
        variant: str | None = None,
    ):
        if stream_format not in ("sse", "jsonl"):
            raise ValueError("stream_format must be 'sse' or 'jsonl'")
        self.first_chunk_delay = first_chunk_delay
        self.token_delay = token_delay
        self.max_tokens = max_tokens
        self.stream_format = stream_format
        self.model = model
        self.block_tokens = block_tokens
        self.cache_blocks = cache_blocks
        self.variant = variant
        self._lock = threading.Lock()
        self._cache: OrderedDict[bytes, None] = OrderedDict()
        self._totals = Counter()

    # -- the prefix cache
    def _cached_tokens(self, words: list[str], salt: str) -> int:
        chain = hashlib.sha256(salt.encode("utf-8")).digest()
        hits, still_hitting = 0, True
        n = self.block_tokens
        with self._lock:
            for start in range(0, len(words) - n + 1, n):
                chain = hashlib.sha256(chain + "\x00".join(words[start : start + n]).encode("utf-8")).digest()
                if still_hitting and chain in self._cache:
                    hits += n
                    self._cache.move_to_end(chain)
                else:
                    still_hitting = False
                    self._cache[chain] = None
                    if len(self._cache) > self.cache_blocks:
                        self._cache.popitem(last=False)
        return hits

    def status(self) -> dict[str, Any]:
        with self._lock:
            totals = dict(self._totals)
            blocks = len(self._cache)
        prompt = totals.get("prompt_tokens", 0)
        return {
            **totals,
            "cached_blocks": blocks,
            "hit_rate": (totals.get("cached_tokens", 0) / prompt) if prompt else None,
        }

    def handle(self, request: RuntimeRequest) -> BackendResponse | ErrorReply:
        chat = parse_chat_request(request, default_max_tokens=self.max_tokens)
        if isinstance(chat, ErrorReply):
            return chat
        cached = self._cached_tokens(chat.prompt_words, chat.cache_salt)
        with self._lock:
            self._totals.update(
                requests=1, prompt_tokens=len(chat.prompt_words), cached_tokens=cached, completion_tokens=chat.n_out
            )

        def wait(i: int) -> None:
            time.sleep(self.first_chunk_delay if i == 0 else self.token_delay)

        return chat_response(
            request,
            chat,
            prompt_tokens=len(chat.prompt_words),
            cached_tokens=cached,
            wait=wait,
            whole_delay=self.first_chunk_delay + self.token_delay * max(0, chat.n_out - 1),
            stream_format=self.stream_format,
            model=self.model,
            variant=self.variant,
        )
