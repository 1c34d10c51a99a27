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
  ``ModelStreamError`` or ``InternalStreamFailure`` exception event (:mod:`prefix_routing.emulator.eventstream`).
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
- ``GET /endpoints/{EndpointName}/openai/v1/models``: the served model in OpenAI's list shape (the same
  bearer token as the chat path), which benchmark clients such as AIPerf read before they start.
- ``GET /ping`` (200) and ``GET /status`` (JSON: requests and counts by outcome since the start, the
  server's own time to first token of the streamed requests answered ok in the window (``ttft_ms``:
  p50, p90, samples; wall milliseconds from the request read to its first chunk written), the
  record's window, the connections open, refused and timed out, plus the backend's ``status()`` when it
  has one: the engine backend's includes each engine's health).
- Fault injection (:class:`Faults`): throttle the first K requests or a seeded fraction, a 5xx (or any
  error kind) for the first K or a fraction, a mid-stream ``ModelStreamError`` (or
  ``InternalStreamFailure``) after M chunks, a slow first chunk, a stream that ends early and cleanly
  (a truncated answer: the final usage chunk never comes), a dropped connection after M chunks, and
  payload parts split into small fragments.
- A thread-safe record of the latest requests (:class:`RecordedRequest`, by default the last 10,000,
  bodies within 32 MiB): operation, endpoint, every header as a named field, body, outcome, injected
  fault, chunks sent, server-side timings (TTFT); counts by outcome cover every request however many
  the window has forgotten (``status()``, ``outcome_counts()``).
- An inference-component endpoint (``require_component=True``, what ``start_emulator`` and
  ``start_engine_emulator`` serve) refuses an invocation without ``InferenceComponentName`` with
  SageMaker's ``ValidationError``; a server without a component (the echo backend in tests) accepts it.
- Hostile or failing callers are bounded (:mod:`prefix_routing.emulator.connections`): at most
  ``max_connections`` open connections (503 beyond), a kept-alive connection closed after
  ``idle_timeout_s`` without a request, a request's headers and body within ``request_timeout_s`` of its
  request line (408 and closed otherwise), a caller that stops reading dropped after ``send_timeout_s``;
  a bad ``Content-Length`` or chunk is 400, a body over 64 MiB 413; any other method or path is 404
  ``UnknownOperationException``, in JSON like every answer.

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
client goes away. :class:`EchoBackend` is the built-in one for tests and demos."""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import random
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from http.server import ThreadingHTTPServer
from typing import Any

from prefix_routing.emulator.backend import Backend
from prefix_routing.emulator.connections import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_SEND_TIMEOUT_S,
    ConnectionGuard,
    ConnectionLimits,
)
from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.faults import FaultPlan, Faults, plan_faults
from prefix_routing.emulator.handler import RuntimeHandler
from prefix_routing.emulator.protocol import RuntimeRequest
from prefix_routing.emulator.recording import (
    DEFAULT_RECORD_BODY_BYTES,
    DEFAULT_RECORD_LIMIT,
    RecordedRequest,
    RequestLog,
)
from prefix_routing.rules.errors import UserError


def is_loopback_host(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1): the only places we serve or load-test."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RuntimeServer(ThreadingHTTPServer):
    """A threaded HTTP server speaking the SageMaker runtime's protocol on a loopback address.

    ``port=0`` picks a free port (see :attr:`port` / :attr:`url`). ``endpoints``: if given, other
    endpoint names get ``ValidationError`` ("Endpoint ... not found"). ``require_component``: the
    endpoints are inference-component endpoints: an invocation without ``InferenceComponentName`` is a
    ``ValidationError``. ``bearer_token``: if given, the OpenAI path requires exactly this token,
    otherwise any non-empty one. ``served_model``: the model id its OpenAI model list names. The record keeps the last ``record_limit`` requests and the bodies of
    the latest within ``record_body_bytes`` (``record_bodies=False``: none). The connection bounds are
    :class:`~prefix_routing.emulator.connections.ConnectionLimits`.
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
        require_component: bool = False,
        record_limit: int = DEFAULT_RECORD_LIMIT,
        record_body_bytes: int = DEFAULT_RECORD_BODY_BYTES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
        served_model: str = "echo",
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
        self.require_component = require_component
        self.served_model = served_model
        self.started_wall = time.time()
        self.limits = ConnectionLimits(max_connections, idle_timeout_s, request_timeout_s, send_timeout_s)
        self.guard = ConnectionGuard(self.limits)
        self._lock = threading.Condition()
        self._log = RequestLog(limit=record_limit, body_bytes=record_body_bytes, record_bodies=record_bodies)
        self._pending = 0
        self._counter = itertools.count()
        self._rng = random.Random(self.faults.seed)
        self._thread: threading.Thread | None = None
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), RuntimeHandler)

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
        self.guard.start()
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
        self.guard.stop()
        for connection in self.guard.connections():  # idle keep-alive connections and streams in flight
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        close = getattr(self.backend, "close", None)
        if callable(close):  # e.g. the engine backend's health checks
            close()

    # -- connections: counted, refused beyond the limit
    def process_request(self, request, client_address) -> None:
        if not self.guard.admit():
            self.guard.refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.guard.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.guard.release()

    def __enter__(self) -> RuntimeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the record
    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of the latest requests received (at most ``record_limit``), in order of arrival."""
        with self._lock:
            return self._log.snapshot()

    @property
    def request_count(self) -> int:
        """Requests received since the start (or the last :meth:`clear_requests`), all of them."""
        with self._lock:
            return self._log.total

    def clear_requests(self) -> None:
        with self._lock:
            self._log.clear()

    def wait_until_idle(self, timeout: float = 5.0) -> bool:
        """Wait until no request is being answered (outcomes are final); False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: self._pending == 0, timeout)

    def outcome_counts(self) -> dict[str, int]:
        """Requests by outcome since the start (or the last clear), exact: ``pending`` for those in flight."""
        with self._lock:
            return self._log.outcome_counts()

    def status(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {"requests": self._log.total, "outcomes": self._log.outcome_counts(),
                                   "ttft_ms": self._log.ttft_ms(), "record": self._log.window()}
        out["connections"] = self.guard.status()
        status = getattr(self.backend, "status", None)
        if callable(status):
            out["backend"] = status()
        return out

    # -- used by the handler
    def admit(
        self, make_request: Callable[[int], RuntimeRequest]
    ) -> tuple[RuntimeRequest, RecordedRequest, FaultPlan]:
        """Number a request as it arrives (``make_request(index)`` builds it), draw its faults, record it."""
        with self._lock:
            index = next(self._counter)
            plan = plan_faults(self.faults, index, self._rng)
            request = make_request(index)
            record = self._log.admit(request)
            self._pending += 1
        return request, record, plan

    def record_outcome(self, record: RecordedRequest, outcome: str, status: int | None,
                       error_code: str | None = None) -> None:
        """The request is answered: its outcome is final (:meth:`wait_until_idle` counts it done)."""
        with self._lock:
            record.outcome = outcome
            record.status = status
            record.error_code = error_code
            record.finished_at = time.monotonic()
            self._log.finish(record)
            self._pending -= 1
            self._lock.notify_all()


@contextlib.contextmanager
def serve_runtime(backend: Backend | None = None, **options: Any) -> Iterator[RuntimeServer]:
    """Run a :class:`RuntimeServer` on a free port of 127.0.0.1 for the ``with`` block.

    ``options`` are :class:`RuntimeServer`'s keywords (``faults=``, ``endpoints=``, ``bearer_token=``,
    ``port=``, ``require_component=``, ``record_bodies=``, ``record_limit=``, the connection bounds). The
    default backend is ``EchoBackend()``.
    """
    server = RuntimeServer(backend if backend is not None else EchoBackend(), **options)
    server.start()
    try:
        yield server
    finally:
        server.stop()
