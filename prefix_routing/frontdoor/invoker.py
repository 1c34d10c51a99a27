"""The exchange: call the endpoint with retries, stream the answer, report the outcome."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from prefix_routing.frontdoor.config import JSON_HEADERS, InvokeConfig
from prefix_routing.frontdoor.limiter import Admission, Limiter, admit_request
from prefix_routing.frontdoor.prepare import Prepared, prepare
from prefix_routing.frontdoor.record import RequestRecord, Telemetry
from prefix_routing.frontdoor.replicas import Replicas
from prefix_routing.frontdoor.request import FrontRequest, RequestError
from prefix_routing.frontdoor.stream import StreamReader
from prefix_routing.frontdoor.upstream import Opened, Upstream, close_body, random_jitter
from prefix_routing.frontdoor.upstream_errors import MODEL_REJECTED, UpstreamError, classify_error, one_line
from prefix_routing.rules.sampling import sample_bucket

_STATUS_CLIENT_CLOSED: Final = 499  # nginx's convention: the caller went away mid-answer


@dataclass(frozen=True, slots=True)
class Head:
    """The status line and headers of the answer (the first item the generator yields)."""

    status: int
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Outcome:
    """The last item the generator yields: how the request ended (the head may have said 200 earlier)."""

    status: int
    error: dict[str, Any] | None
    record: RequestRecord
    reader: StreamReader | None = None


@dataclass(frozen=True, slots=True)
class Buffered:
    """A whole answer: status, headers and a JSON-serializable body."""

    status: int
    headers: dict[str, str]
    body: dict[str, Any]

    def body_bytes(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _with_request_id(headers: dict[str, str], request: FrontRequest) -> dict[str, str]:
    """Every answer names its request id (Lambda's), the key of its log line."""
    if request.request_id:
        headers["x-request-id"] = request.request_id
    return headers


def _in_band_error(fmt: str | None, error: UpstreamError, last_byte: bytes) -> bytes:
    """The error event appended to a stream whose 200 head was already sent."""
    payload = _json_bytes({"error": {"message": error.message, "type": error.kind, "code": error.status}})
    if fmt == "sse" or fmt is None:
        separator = b"" if last_byte == b"\n\n" else b"\n" if last_byte.endswith(b"\n") else b"\n\n"
        return separator + b"data: " + payload + b"\n\n"
    return (b"" if last_byte.endswith(b"\n") else b"\n") + payload + b"\n"


class _State:
    """Where an exchange is: what was opened and sent, and whether its telemetry is written."""

    __slots__ = ("opened", "reader", "head_sent", "concluded", "admission", "limit_headers")

    def __init__(self) -> None:
        self.opened: Opened | None = None
        self.reader: StreamReader | None = None
        self.head_sent = False
        self.concluded = False
        self.admission: Admission | None = None  # what the request holds under the tenant's limits
        self.limit_headers: dict[str, str] = {}

    def free(self, limiter: Limiter | None, tokens_used: int | None) -> None:
        """Give the tenant's stream back (and book the engine's token count), once."""
        if limiter is not None and self.admission is not None:
            limiter.finish(self.admission, tokens_used)
            self.admission = None

    def free_if_complete(self, limiter: Limiter | None, reader: StreamReader) -> None:
        """Free the stream when its end marker has arrived, before it is handed on: a client that
        sends its next request as soon as it reads the end must find its slot free."""
        if self.admission is not None and reader.complete:
            self.free(limiter, _tokens_used(reader.prompt_tokens, reader.completion_tokens))


#: Whose fault a failed call was, by its kind (else the endpoint's): a container's own 4xx is the caller's.
_ORIGINS = {"internal": "internal", MODEL_REJECTED: "client"}


def _tokens_used(prompt: int | None, completion: int | None) -> int | None:
    """What a tenant's minute is charged for an answer: prompt + completion (None: the engine said nothing)."""
    return None if prompt is None else prompt + (completion or 0)


def _since_ms(start: float, now: float) -> float:
    return (now - start) * 1000.0


def _deadline(request: FrontRequest, config: InvokeConfig) -> float:
    """When the answer must be over: the front door's limit from arrival, or the caller's deadline if sooner."""
    deadline = request.arrival + config.request_timeout_s
    if request.deadline is not None:
        deadline = min(deadline, request.deadline)
    return deadline


def _book_prepared(record: RequestRecord, prepared: Prepared) -> None:
    """What the request is, on its record: who sent it, its routing identity and its canonical body."""
    record.tenant, record.application = prepared.tenant, prepared.application
    record.domain, record.component = prepared.domain, prepared.component
    record.routing_id = prepared.identity.prefix_aware_id
    record.body_kind = prepared.normalized.kind
    record.fingerprint = prepared.normalized.prefix_fingerprint
    record.sample_bucket = sample_bucket(prepared.identity.prefix_aware_id, record.fingerprint)
    record.rekeyed = prepared.rekeyed
    record.block_hashes = prepared.normalized.block_hashes
    record.body_bytes = len(prepared.normalized.body)
    record.normalize_ms = prepared.normalize_ms


def _answer_headers(opened: Opened, prepared: Prepared, limit_headers: dict[str, str]) -> dict[str, str]:
    """The headers of a streamed answer's 200 head: its content type, its routing key, the tenant's limits."""
    return {
        "content-type": opened.content_type,
        "cache-control": "no-cache",
        "x-prefix-aware-id": prepared.identity.prefix_aware_id,
        "x-prefix-fingerprint": prepared.normalized.prefix_fingerprint,
        **limit_headers,
    }


def _stream_failure(reader: StreamReader, failure: UpstreamError | None) -> tuple[UpstreamError | None, bool]:
    """How an answer that got its 200 head ended: its failure (None: complete), and whether the model's own
    error event already told the caller."""
    if failure is None and reader.error is not None:
        detail = reader.error.get("message") if isinstance(reader.error, Mapping) else reader.error
        return UpstreamError(502, "model_stream_error",
                             f"the model reported an error mid-stream: {one_line(detail, 200)}"), True
    if failure is None and not reader.complete:
        failure = UpstreamError(502, "truncated", "the model's answer ended before its final chunk "
                                "(truncated): do not use it as complete")
    return failure, False


def _buffered(items: Iterator[Head | bytes | Outcome]) -> Buffered:
    """The whole answer of an exchange's items, as :meth:`Invoker.buffered` returns it."""
    head: Head | None = None
    for item in items:
        if isinstance(item, Head):
            head = item
        elif isinstance(item, Outcome):
            headers = dict(head.headers) if head is not None else {}
            headers["content-type"] = "application/json"
            if item.error is None:
                body = item.reader.answer() if item.reader is not None else {}
                return Buffered(200, headers, body)
            body = {"error": item.error}
            if item.reader is not None and item.reader.total_bytes:
                body["partial"] = item.reader.answer()
            return Buffered(item.status, headers, body)
    raise RuntimeError("the exchange ended without an outcome")  # pragma: no cover


class Invoker:
    """The front door: :meth:`stream` for the Function URL, :meth:`buffered` for direct invocations.

    ``client`` is a boto3 ``sagemaker-runtime`` client (create it with botocore retries off:
    ``Config(retries={"total_max_attempts": 1})``; the invoker retries itself, before the first byte
    only). ``key`` is the tenant HMAC key. ``sleep`` and ``jitter`` (a number in [0, 1) per backoff)
    are for tests, and ``replicas`` (the hot-prefix tracker, :class:`Replicas`, used only with
    ``config.replication.enabled``; by default one sized by the telemetry's copy counts).
    """

    def __init__(
        self,
        client: Any,
        config: InvokeConfig,
        key: bytes,
        *,
        telemetry_sink: Telemetry | None = None,
        emit: Callable[[str], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] | None = None,
        replicas: Replicas | None = None,
        limiter: Limiter | None = None,
    ) -> None:
        self.config = config
        self.key = key
        self.telemetry = telemetry_sink or Telemetry(config, emit)
        self.clock = time.monotonic  # FrontRequest.arrival and deadlines are on this clock
        self.upstream = Upstream(client, config, sleep=sleep, jitter=jitter or random_jitter, clock=self.clock)
        enabled = config.replication.enabled
        self.replicas = (replicas or Replicas(config, copies=self.telemetry.copies)) if enabled else None
        # Without replication the same rule still counts prefixes, only to log hot ones as in every
        # sample of the log (rules/sampling.py): the advisor must not sample a hotspot away.
        self._hot_counter = None if enabled else Replicas(config, copies=self.telemetry.copies)
        if config.limits.enabled and limiter is None:
            raise ValueError("the configuration sets per-tenant limits: give the invoker a limiter (frontdoor.Limiter)")
        self.limiter = limiter if config.limits.enabled else None

    # -- the streaming interface
    def stream(self, request: FrontRequest, *, collect: bool = False) -> Iterator[Head | bytes | Outcome]:
        """Yield a :class:`Head`, the answer's bytes as they arrive, then an :class:`Outcome`.

        The consumer writes each item before it asks for the next, so the moment a ``yield`` of bytes
        returns is the moment they were handed to the client's socket: time to first token and the
        end of the answer are taken there, from the request's arrival (what the client feels, less
        the network and whatever sits in front of the web app). The request's metrics and log line
        are written before the :class:`Outcome` is yielded. Close
        the generator (``.close()``) if the caller goes away mid-answer: the upstream stream is closed
        and the request is logged with status 499 (``client_closed``).
        """
        record = RequestRecord(arrival_ms=request.arrival_ms, request_id=request.request_id,
                               limits_enabled=self.limiter is not None,
                               steering_active=self.replicas is not None and self.replicas.steering is not None)
        state = _State()
        try:
            yield from self._exchange(request, record, state, collect)
        except GeneratorExit:
            if not state.concluded and record.status == 200:
                record.status, record.error_kind = _STATUS_CLIENT_CLOSED, "client_closed"
            raise
        except Exception as exc:  # noqa: BLE001 - a bug must still answer and be logged
            if state.concluded:
                raise
            head_sent = state.head_sent
            record.status, record.error_kind, record.origin = 500, "internal", "internal"
            record.error_field = type(exc).__name__
            error = UpstreamError(500, "internal", "internal error in the front door")
            if head_sent:
                yield _in_band_error(state.reader.format if state.reader else None, error, b"")
            else:
                yield Head(500, _with_request_id(dict(JSON_HEADERS), request))
                yield _json_bytes(error.body())
            self._conclude(request, record, state)
            yield Outcome(500, error.body()["error"], record, state.reader)
        finally:
            if not state.concluded:
                self._conclude(request, record, state)

    def _conclude(self, request: FrontRequest, record: RequestRecord, state: _State) -> None:
        """Close the upstream stream and write the request's telemetry, once."""
        if state.concluded:
            return
        state.concluded = True
        if state.opened is not None:
            close_body(state.opened.response)
        record.wall_ms = _since_ms(request.arrival, self.clock())
        if self.limiter is not None:
            # Before the answer's end reaches the adapter: in Lambda nothing after it is sure to run
            # before the environment is frozen (a lease left would hold the slot until it expires).
            state.free(self.limiter, _tokens_used(record.prompt_tokens, record.output_tokens))
        if record.status is None:
            record.status = 500
        if self.replicas is not None:
            # Steering: the replica's in-flight count goes back, once the answer's last bytes (its
            # end marker) are in the client's socket, before the log line that reports a collision.
            self.replicas.answered(record)
            record.hot_prefixes = self.replicas.hot()
        self.telemetry.publish(record)

    def _exchange(self, request: FrontRequest, record: RequestRecord, state: _State,
                  collect: bool) -> Iterator[Head | bytes | Outcome]:
        try:
            prepared = prepare(request, self.config, self.key)
        except RequestError as error:
            record.normalize_ms = error.normalize_ms
            record.error_field, record.origin = error.field, "client"
            yield from self._answer_error(request, record, state, error.status, error.code, error.body(),
                                          {"allow": "POST"} if error.status == 405 else {})
            return
        _book_prepared(record, prepared)
        if self.limiter is not None:
            refusal = admit_request(self.limiter, prepared.tenant, prepared.normalized.body, record, state)
            if refusal is not None:
                yield from self._answer_error(request, record, state, *refusal)
                return
        deadline = _deadline(request, self.config)
        prefix_aware_id = prepared.identity.prefix_aware_id
        if self.replicas is not None:  # replication: replica j of a hot prefix goes out as <id>-r<j>
            prefix_aware_id = self.replicas.route(prefix_aware_id, record)
            record.sample_hot = record.replicas > 1
        else:
            record.sample_hot = self._hot_counter.assign(prefix_aware_id, record.fingerprint)[1] > 1
        record.sent = True
        try:
            opened = state.opened = self.upstream.open(prepared, record, deadline, prefix_aware_id)
        except UpstreamError as error:
            record.origin = _ORIGINS.get(error.kind, "upstream")
            retry = {"retry-after": str(max(1, math.ceil(self.config.backoff_max_s)))} if error.status == 429 else {}
            yield from self._answer_error(request, record, state, error.status, error.kind,
                                          error.body(record.attempts), {**state.limit_headers, **retry})
            return
        record.upstream_ttft_ms = _since_ms(opened.started, opened.first_at)
        reader = state.reader = StreamReader(expects_usage=prepared.expects_usage, collect=collect)
        record.status = 200
        state.head_sent = True
        yield Head(200, _with_request_id(_answer_headers(opened, prepared, state.limit_headers), request))
        failure: UpstreamError | None = None
        last = opened.first[-2:]
        limiter = self.limiter
        reader.feed(opened.first)
        state.free_if_complete(limiter, reader)
        yield opened.first
        delivered = self.clock()  # the head and the first bytes are in the client's socket
        record.ttft_ms = _since_ms(request.arrival, delivered)
        try:
            for chunk in opened.events:
                reader.feed(chunk)
                last = (last + chunk)[-2:]
                state.free_if_complete(limiter, reader)
                yield chunk
                delivered = self.clock()
                if delivered > deadline:
                    failure = UpstreamError(504, "timeout", "the answer took longer than the front door's limit "
                                            f"of {self.config.request_timeout_s:g} s")
                    break
        except Exception as exc:  # noqa: BLE001 - a mid-stream failure (GeneratorExit is not an Exception)
            failure = classify_error(exc)
        record.total_ms = _since_ms(request.arrival, delivered)
        reader.finish()
        record.prompt_tokens, record.cached_tokens = reader.prompt_tokens, reader.cached_tokens
        record.output_tokens = reader.completion_tokens
        failure, reported_by_model = _stream_failure(reader, failure)
        if failure is not None:
            # An exception of ours mid-stream (classified "internal") is not the endpoint's failure.
            origin = "internal" if failure.kind == "internal" else "upstream"
            record.status, record.error_kind, record.origin = failure.status, failure.kind, origin
            if not reported_by_model:
                yield _in_band_error(reader.format, failure, last)
            self._conclude(request, record, state)
            yield Outcome(failure.status, failure.body()["error"], record, reader)
            return
        self._conclude(request, record, state)
        yield Outcome(200, None, record, reader)

    def _answer_error(self, request: FrontRequest, record: RequestRecord, state: _State, status: int, code: str,
                      body: dict[str, Any], headers: dict[str, str]) -> Iterator[Head | bytes | Outcome]:
        """A JSON error answered before any of the endpoint's bytes: the head, the body, the outcome."""
        record.status, record.error_kind = status, code
        state.head_sent = True
        yield Head(status, _with_request_id({**JSON_HEADERS, **headers}, request))
        yield _json_bytes(body)
        self._conclude(request, record, state)
        yield Outcome(status, body["error"], record)

    # -- the buffered interface
    def buffered(self, request: FrontRequest) -> Buffered:
        """The whole answer as one JSON object (for direct invocations and buffered HTTP events).

        Success: the model's own JSON document if it answered with one, else the streamed chunks
        assembled (``choices[].text``, ``finish_reason``, ``usage``). Failure: ``{"error": {...}}``,
        plus ``partial`` (what arrived) if the stream failed after it began.
        """
        return _buffered(self.stream(request, collect=True))


def decode_direct_payload(payload: bytes) -> dict[str, Any]:
    """The JSON answer of a direct invocation, from the ``Payload`` that ``lambda:Invoke`` returns.

    The function streams its responses (Lambda Web Adapter in ``response_stream`` mode), so a direct
    invocation's payload may start with the adapter's HTTP metadata prelude (a JSON object, then 8
    zero bytes) before the answer; this strips it when present.
    """
    data = bytes(payload)
    marker = data.find(b"\x00" * 8)
    if marker > 0 and data[:1] == b"{":
        data = data[marker + 8:]
    return json.loads(data.decode("utf-8"))
