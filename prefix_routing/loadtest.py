"""Replay requests against an endpoint and measure what a client sees: TTFT, latency, errors, hits.

Sources (:func:`trace_requests`, :func:`body_requests`): a Mooncake trace (bodies made by
:mod:`prefix_routing.bodies`, arrival times from the trace) or a file of request bodies (JSON lines,
sent byte for byte). Each body may be varied as another client would send it (``vary``) and/or
normalized by :mod:`prefix_routing.normalize` before it is sent (``normalize``; variation first).

Targets (all streaming):

- :class:`SageMakerTarget`: boto3's ``sagemaker-runtime`` ``InvokeEndpointWithResponseStream`` with
  ``EndpointName``, ``InferenceComponentName``, ``PrefixAwareId``; ``endpoint_url`` points it at the
  emulator or the local runtime server (loopback URLs get dummy credentials when none are
  configured). botocore's own retries are off: every attempt is visible.
- :class:`LambdaUrlTarget`: the normalizer's Function URL, SigV4-signed for service ``lambda`` with
  botocore's ``SigV4Auth``; the streamed answer is read with ``http.client``.
- :class:`OpenAITarget`: an OpenAI-compatible chat-completions URL with server-sent events and a
  bearer token (given, or for SageMaker's OpenAI-compatible API made by the ``sagemaker`` SDK's
  ``sagemaker.core.token_generator``, imported only then).

What is measured per request (:class:`RequestResult`): client-side TTFT (from when the request
goes on the wire, botocore's ``before-send`` for the sagemaker target, to the first payload byte:
the first ``PayloadPart`` or the first body bytes; the SDK's own request building and signing before
that is reported as ``client_overhead_s``),
end-to-end latency (to the end of the stream), output tokens (``usage.completion_tokens``, else the
number of content chunks), prompt and cached tokens when usage comes back
(``usage.prompt_tokens``, ``usage.prompt_tokens_details.cached_tokens``), and the server's request
id (``x-amzn-RequestId``). Every request ends exactly once, as succeeded or as failed with one kind:

==================  =========================================================================
``throttled``       throttling error (``ThrottlingException``, HTTP 429 on the HTTP targets)
``model_error``     ``ModelError`` (the container answered an error)
``stream_error``    an error event in the stream (``ModelStreamError``, ``InternalStreamFailure``,
                    an SSE ``{"error": ...}``)
``truncated``       the stream ended cleanly but without its end: no ``data: [DONE]`` on an SSE
                    stream; no finish reason (or no usage when the body asked for it) otherwise
``timeout``         connect or read timeout
``connection``      connection refused, reset or dropped mid-stream
``http_<status>``   any other error status (``http_503``, ``http_500``, ``http_401`` ...)
``client_error``    the client could not send it (e.g. botocore parameter validation)
==================  =========================================================================

The normalizer front door's own error codes (``throttled``, ``model_error``, ``model_stream_error``,
``truncated``, ``timeout``; before the stream or as an in-band SSE error) map to the same kinds. A
truncated answer is never a success. Retries are off by default; with ``retries=N`` a request
that failed before its first payload byte with ``throttled``, ``timeout``, ``connection`` or a 5xx
is sent again (full-jitter exponential backoff) and counted once, with its attempts; its TTFT and
latency then include the retries.

:func:`run_load` drives the requests with bounded concurrency, at a fixed rate, at the trace's own
pace scaled by ``speed``, or as fast as the concurrency allows; it stops issuing at ``max_requests``
or after ``duration`` seconds (requests in flight finish, bounded by the timeout) or at the end of
the input. :func:`summarize`, :func:`write_reports` (JSON, Markdown, PNG plots) report on it.
"""

from __future__ import annotations

import dataclasses
import http.client
import inspect
import json
import math
import os
import random
import socket
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor, wait
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from prefix_routing import bodies, traces
from prefix_routing.errors import UserError
from prefix_routing.runtime_server import is_loopback_host

__all__ = [
    "TARGETS",
    "ERROR_KINDS",
    "WorkItem",
    "RequestResult",
    "LoadResult",
    "StreamParser",
    "Attempt",
    "SageMakerTarget",
    "LambdaUrlTarget",
    "OpenAITarget",
    "BodyPreparer",
    "trace_requests",
    "body_requests",
    "run_load",
    "summarize",
    "percentile",
    "write_reports",
    "render_markdown",
    "report_dict",
    "plot",
    "sagemaker_bearer_token",
]

TARGETS = ("sagemaker", "lambda-url", "openai")
ERROR_KINDS = ("throttled", "model_error", "stream_error", "truncated", "timeout", "connection", "client_error")
RETRYABLE = ("throttled", "timeout", "connection")

_THROTTLE_CODES = frozenset(
    {
        "ThrottlingException",
        "Throttling",
        "ThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "SlowDown",
        "rate_limit_exceeded",
    }
)
#: Error codes of the normalizer front door (``prefix_routing.invoke``: ``{"error": {"code": ...}}``
#: before the stream, ``{"error": {"type": ...}}`` in it) that name one of our kinds.
_FRONT_DOOR_KINDS = {
    "throttled": "throttled",
    "model_error": "model_error",
    "model_stream_error": "stream_error",
    "stream_failure": "stream_error",
    "truncated": "truncated",
    "timeout": "timeout",
}
_ERROR_BODY_LIMIT = 64 * 1024
_RAW_KEEP_LIMIT = 16 * 1024 * 1024


# --------------------------------------------------------------------------- what goes out


@dataclass(frozen=True)
class WorkItem:
    """One request to send: its body and, for trace replays, its arrival time in the trace."""

    index: int
    body: bytes
    #: Seconds from the first request of the source (trace timing); ``None`` for bodies files.
    at_s: float | None = None
    #: Where it came from (``FILE:LINE``), for the report.
    source: str = ""


def _trace_records(path: str, skip: int = 0) -> tuple[Iterator[dict[str, Any]], list[str]]:
    """Mooncake records (dicts) with ``at_s``, read by :func:`traces.read_mooncake` (broken lines are
    reported in the notes, as the lab reports them)."""
    trace = traces.read_mooncake(path)
    notes = [trace.skipped.summary(trace.lines)] if trace.skipped.count else []

    def rows() -> Iterator[dict[str, Any]]:
        base = trace.arrivals[skip] if skip < len(trace) else 0.0
        for i in range(skip, len(trace)):
            yield {
                "at_s": trace.arrivals[i] - base,
                "input_length": trace.prompt_tokens[i],
                "output_length": trace.output_tokens[i],
                "hash_ids": trace.blocks[i],
                "source": f"{path}#{i + 1}",
            }

    return rows(), notes


def trace_requests(
    path: str,
    *,
    system_blocks: int = 1,
    model: str | None = None,
    skip: int = 0,
    notes: list[str] | None = None,
    **params: Any,
) -> Iterator[WorkItem]:
    """Requests of a Mooncake trace: :func:`bodies.chat_body` of each record, serialized compactly.

    Records whose ids do not fit their length are reported in ``notes`` and not sent.
    """
    records, found = _trace_records(path, skip)
    if notes is not None:
        notes.extend(found)
    index = 0
    for record in records:
        try:
            body = bodies.chat_body(record, system_blocks, model=model, **params)
        except ValueError as error:
            if notes is not None:
                notes.append(f"{record['source']}: not sent: {error}")
            continue
        yield WorkItem(index, bodies.serialize(body), record["at_s"], record["source"])
        index += 1


def body_requests(path: str, *, skip: int = 0) -> Iterator[WorkItem]:
    """Requests of a bodies file: one body per non-empty line, sent byte for byte (no timing)."""
    if not os.path.exists(path):
        raise UserError(f"bodies file not found: {path}")
    if os.path.isdir(path):
        raise UserError(f"bodies path is a directory, not a file: {path}")
    try:
        handle = open(path, "rb")
    except OSError as error:
        raise UserError(f"cannot read bodies file {path}: {error.strerror or error}") from None

    def items() -> Iterator[WorkItem]:
        index, seen = 0, 0
        with handle:
            for lineno, line in enumerate(handle, 1):
                line = line.rstrip(b"\r\n")
                if not line.strip():
                    continue
                seen += 1
                if seen <= skip:
                    continue
                yield WorkItem(index, line, None, f"{path}:{lineno}")
                index += 1

    return items()


class BodyPreparer:
    """Client variation and/or normalization of each body before it is sent.

    ``vary``: :func:`bodies.vary` with ``random.Random(f"{seed}:{index}")`` (reproducible per request).
    ``normalize``: :func:`prefix_routing.normalize.normalize_body` with ``settings`` (default settings
    when ``None``). Raises ``ValueError`` with the reason when a body cannot be prepared.
    """

    def __init__(self, *, vary: bool = False, normalize: bool = False, settings: Any = None, seed: int = 0,
                 text_line_endings: bool = False):
        self.vary, self.normalize, self.seed = vary, normalize, seed
        self.text_line_endings = text_line_endings
        self._normalize_body = None
        self._settings = settings
        if normalize:
            try:
                from prefix_routing import normalize as norm
            except ImportError as error:
                raise UserError(
                    f"--normalize needs prefix_routing.normalize, which cannot be imported: {error}"
                ) from None
            self._normalize_body = norm.normalize_body
            self._settings = settings if settings is not None else norm.NormalizerSettings()

    @property
    def active(self) -> bool:
        return self.vary or self.normalize

    def __call__(self, item: WorkItem) -> bytes:
        body = item.body
        if self.vary:
            try:
                data = json.loads(body)
            except ValueError as error:
                raise ValueError(f"cannot vary a body that is not JSON: {error}") from None
            if not isinstance(data, dict):
                raise ValueError("cannot vary a body that is not a JSON object")
            body = bodies.vary(data, random.Random(f"{self.seed}:{item.index}"),
                               text_line_endings=self.text_line_endings)
        if self.normalize:
            try:
                body = self._normalize_body(body, self._settings).body
            except ValueError as error:  # NormalizationError
                raise ValueError(f"rejected by the normalizer: {error}") from None
        return body


# --------------------------------------------------------------------------- what comes back


class StreamParser:
    """Incremental reader of a streamed chat answer: SSE (``data: ...`` events), JSON lines, or one
    JSON document (a non-streamed answer). Fed with payload bytes in any fragmentation."""

    def __init__(self) -> None:
        self._buffer = b""
        self._raw: list[bytes] = []
        self._raw_size = 0
        self.sse = False
        self.done = False  # "data: [DONE]" seen
        self.events = 0
        self.content_chunks = 0
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error: Any = None
        self.generated_tokens: int | None = None
        self.final_text = False  # TGI-style final event (generated_text) seen
        self.unparsed = 0

    def feed(self, data: bytes) -> None:
        if not data:
            return
        if self._raw_size < _RAW_KEEP_LIMIT:
            self._raw.append(data)
            self._raw_size += len(data)
        self._buffer += data
        while True:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                break
            line, self._buffer = self._buffer[:newline], self._buffer[newline + 1 :]
            self._line(line)

    def close(self) -> None:
        """End of stream: the last line without a line feed, or a whole (pretty-printed) document."""
        if self._buffer.strip():
            line, self._buffer = self._buffer, b""
            self._line(line)
        if self.events == 0 and not self.sse and self.unparsed and self._raw:
            try:
                obj = json.loads(b"".join(self._raw))
            except ValueError:
                return
            self.unparsed = 0
            self._event(obj)

    def _line(self, line: bytes) -> None:
        line = line.strip()
        if not line:
            return
        if line.startswith(b"data:"):
            self.sse = True
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                return
        elif line.startswith((b"event:", b"id:", b"retry:", b":")):
            self.sse = self.sse or not line.startswith(b":")
            return
        else:
            payload = line
        try:
            obj = json.loads(payload)
        except ValueError:
            self.unparsed += 1
            return
        self._event(obj)

    def _event(self, obj: Any) -> None:
        self.events += 1
        if not isinstance(obj, dict):
            return
        if obj.get("error") is not None or obj.get("object") == "error":
            self.error = obj.get("error", obj)
            return
        usage = obj.get("usage")
        if isinstance(usage, dict) and usage:
            self.usage = usage
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta") or choice.get("message") or {}
                text = delta.get("content") if isinstance(delta, dict) else None
                if text is None:
                    text = choice.get("text")
                if text:
                    self.content_chunks += 1
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
        # TGI / LMI streaming: {"token": {...}, "generated_text": null | "...", "details": {...}}
        if isinstance(obj.get("token"), dict):
            self.content_chunks += 1
        if obj.get("generated_text") is not None:
            self.final_text = True
            details = obj.get("details")
            self.finish_reason = (details or {}).get("finish_reason") if isinstance(details, dict) else None
            self.finish_reason = self.finish_reason or "stop"
            if isinstance(details, dict) and isinstance(details.get("generated_tokens"), int):
                self.generated_tokens = details["generated_tokens"]

    def verdict(self, expect_usage: bool) -> tuple[str | None, str | None]:
        """``(None, None)`` for a complete answer, else ``(kind, detail)``.

        Complete means: no error event, and the stream's own end was seen: ``data: [DONE]`` on an
        OpenAI-style SSE stream (TGI-style SSE: the event with ``generated_text``); otherwise (JSON
        lines, a whole JSON answer) a finish reason, plus the usage chunk when the body asked for it.
        """
        if self.error is not None:
            kind = "stream_error"
            if isinstance(self.error, dict):
                kind = _FRONT_DOOR_KINDS.get(str(self.error.get("type")), kind)
            return kind, _error_text(self.error)
        if self.sse:
            if self.done or self.final_text:
                return None, None
            return "truncated", "the stream ended without 'data: [DONE]'"
        if self.events == 0:
            return "truncated", "unreadable answer" if self.unparsed else "the stream ended before any answer"
        if self.finish_reason is None:
            return "truncated", "the stream ended without a finish reason"
        if expect_usage and self.usage is None:
            return "truncated", "the stream ended without the usage chunk"
        return None, None

    @property
    def output_tokens(self) -> int | None:
        if self.usage and isinstance(self.usage.get("completion_tokens"), int):
            return self.usage["completion_tokens"]
        if self.generated_tokens is not None:
            return self.generated_tokens
        return self.content_chunks or None

    @property
    def prompt_tokens(self) -> int | None:
        value = (self.usage or {}).get("prompt_tokens")
        return value if isinstance(value, int) else None

    @property
    def cached_tokens(self) -> int | None:
        if not self.usage:
            return None
        details = self.usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            return details["cached_tokens"]
        if isinstance(self.usage.get("cached_tokens"), int):
            return self.usage["cached_tokens"]
        return None


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        code = error.get("code") or error.get("type") or ""
        message = error.get("message") or error.get("Message") or json.dumps(error)[:200]
        return f"{code}: {message}" if code else str(message)
    return str(error)[:300]


def _expects_usage(body: bytes) -> bool:
    """Whether the body asked for usage in the stream (``stream_options.include_usage``)."""
    if b"include_usage" not in body:
        return False
    try:
        data = json.loads(body)
    except ValueError:
        return False
    options = data.get("stream_options") if isinstance(data, dict) else None
    return isinstance(options, dict) and options.get("include_usage") is True


@dataclass
class Attempt:
    """What one attempt gave: ``kind`` ``None`` for success."""

    kind: str | None = None
    detail: str | None = None
    status: int | None = None
    request_id: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    bytes_received: int = 0
    #: Client-side work before the request went on the wire (botocore: validation, endpoint
    #: resolution, signing), not part of ``ttft_s``/``e2e_s``.
    client_overhead_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.kind is None

    def finish(self, parser: StreamParser, expect_usage: bool) -> Attempt:
        parser.close()
        self.output_tokens = parser.output_tokens
        self.prompt_tokens = parser.prompt_tokens
        self.cached_tokens = parser.cached_tokens
        self.finish_reason = parser.finish_reason
        if self.kind is None:
            self.kind, self.detail = parser.verdict(expect_usage)
        return self


def _classify_http(status: int, code: str | None) -> str:
    if code in _THROTTLE_CODES or status == 429 and code != "ModelNotReadyException":
        return "throttled"
    if code == "ModelError":
        return "model_error"
    if code in ("ModelStreamError", "InternalStreamFailure"):
        return "stream_error"
    return f"http_{status}"


def _exception_kind(error: BaseException) -> str:
    """timeout / connection / client_error for exceptions raised while sending or reading."""
    names = {cls.__name__ for cls in type(error).__mro__}
    if isinstance(error, (socket.timeout, TimeoutError)) or any("Timeout" in name for name in names):
        return "timeout"
    if isinstance(error, (OSError, http.client.HTTPException)) or names & {
        "ProtocolError",
        "ConnectionClosedError",
        "EndpointConnectionError",
        "HTTPClientError",
        "IncompleteRead",
        "NewConnectionError",
        "ResponseStreamingError",
    }:
        return "connection"
    return "client_error"


def _describe(error: BaseException) -> str:
    text = str(error).strip().replace("\n", " ")
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


# --------------------------------------------------------------------------- targets


def _is_loopback_url(url: str | None) -> bool:
    return bool(url) and is_loopback_host(urlsplit(url).hostname or "")


class SageMakerTarget:
    """``InvokeEndpointWithResponseStream`` through boto3 (or the emulator with ``endpoint_url``)."""

    name = "sagemaker"

    def __init__(
        self,
        endpoint_name: str,
        *,
        inference_component: str | None = None,
        prefix_aware_id: str | None = None,
        region: str | None = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
        timeout: float = 120.0,
        concurrency: int = 8,
        content_type: str = "application/json",
        custom_attributes: str | None = None,
        client: Any = None,
    ):
        if not endpoint_name:
            raise UserError("the sagemaker target needs --endpoint NAME")
        self.endpoint_name = endpoint_name
        self.params: dict[str, Any] = {"EndpointName": endpoint_name, "ContentType": content_type}
        if inference_component:
            self.params["InferenceComponentName"] = inference_component
        if prefix_aware_id:
            self.params["PrefixAwareId"] = prefix_aware_id
        if custom_attributes:
            self.params["CustomAttributes"] = custom_attributes
        self.description = f"sagemaker endpoint {endpoint_name}" + (
            f" component {inference_component}" if inference_component else ""
        ) + (f" at {endpoint_url}" if endpoint_url else "")
        self._local = threading.local()
        if client is not None:
            self.client = client
            self._register()
            return
        try:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError, ProfileNotFound
        except ImportError as error:  # pragma: no cover - boto3 is a dependency
            raise UserError(f"the sagemaker target needs boto3: {error}") from None
        local = _is_loopback_url(endpoint_url)
        try:
            session = boto3.Session(profile_name=profile) if profile else boto3.Session()
        except ProfileNotFound as error:
            raise UserError(str(error)) from None
        region = region or session.region_name or ("us-east-1" if local else None)
        if not region:
            raise UserError("the sagemaker target needs --region (or AWS_REGION / a profile with a region)")
        credentials = session.get_credentials()
        extra: dict[str, Any] = {}
        if credentials is None:
            if not local:
                raise UserError("no AWS credentials found for the sagemaker target (environment, profile or role)")
            extra = {"aws_access_key_id": "local", "aws_secret_access_key": "local"}
        config = Config(
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=min(10.0, timeout),
            read_timeout=timeout,
            max_pool_connections=max(10, concurrency + 2),
            tcp_keepalive=True,
        )
        try:
            self.client = session.client(
                "sagemaker-runtime", region_name=region, endpoint_url=endpoint_url, config=config, **extra
            )
        except (BotoCoreError, ValueError) as error:
            raise UserError(f"cannot make the sagemaker-runtime client: {error}") from None
        model = self.client.meta.service_model.operation_model("InvokeEndpointWithResponseStream")
        if prefix_aware_id and "PrefixAwareId" not in model.input_shape.members:
            raise UserError("this botocore has no PrefixAwareId parameter; upgrade boto3/botocore")
        self._register()

    def _register(self) -> None:
        # The clock starts when botocore hands the signed request to the HTTP layer (its own
        # request building is reported as client_overhead_s), like the HTTP targets' clocks.
        events = getattr(getattr(self.client, "meta", None), "events", None)
        if events is not None:
            events.register("before-send.sagemaker-runtime.InvokeEndpointWithResponseStream", self._on_send)

    def _on_send(self, **kwargs: Any) -> None:
        self._local.sent = time.perf_counter()
        return None

    def send(self, body: bytes) -> Attempt:
        from botocore.exceptions import ClientError, ParamValidationError

        attempt = Attempt()
        parser = StreamParser()
        expect_usage = _expects_usage(body)
        self._local.sent = None
        call_start = start = time.perf_counter()
        response = None
        try:
            try:
                try:
                    response = self.client.invoke_endpoint_with_response_stream(Body=body, **self.params)
                finally:
                    start = self._local.sent or call_start
                    attempt.client_overhead_s = start - call_start
            except ClientError as error:
                meta = error.response.get("ResponseMetadata", {})
                info = error.response.get("Error", {})
                attempt.status = meta.get("HTTPStatusCode")
                attempt.request_id = meta.get("RequestId")
                attempt.kind = _classify_http(attempt.status or 0, info.get("Code"))
                attempt.detail = f"{info.get('Code', 'error')}: {info.get('Message', '')}".strip()
                return attempt
            except ParamValidationError as error:
                attempt.kind, attempt.detail = "client_error", _describe(error)
                return attempt
            meta = response.get("ResponseMetadata", {})
            attempt.status = meta.get("HTTPStatusCode")
            attempt.request_id = meta.get("RequestId")
            try:
                for event in response["Body"]:
                    part = event.get("PayloadPart")
                    if part is None:
                        continue
                    data = part.get("Bytes") or b""
                    if data and attempt.ttft_s is None:
                        attempt.ttft_s = time.perf_counter() - start
                    attempt.bytes_received += len(data)
                    parser.feed(data)
            except ClientError as error:  # EventStreamError: ModelStreamError / InternalStreamFailure
                info = error.response.get("Error", {})
                attempt.kind = "stream_error"
                attempt.detail = f"{info.get('Code', 'error')}: {info.get('Message', '')}".strip()
        except Exception as error:  # timeouts, dropped connections, refused connections
            attempt.kind, attempt.detail = _exception_kind(error), _describe(error)
        finally:
            attempt.e2e_s = time.perf_counter() - start
            if response is not None:
                try:
                    response["Body"].close()
                except Exception:
                    pass
        return attempt.finish(parser, expect_usage)

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if callable(close):
            close()


class _HttpTarget:
    """A streaming POST with ``http.client`` over a pool of kept-alive connections."""

    name = "http"

    def __init__(self, url: str, *, timeout: float = 120.0, headers: dict[str, str] | None = None):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"--url {url!r}: expected an http:// or https:// URL")
        self.url = url
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port
        self.netloc = parts.netloc
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout = timeout
        self.headers = dict(headers or {})
        self._idle: list[http.client.HTTPConnection] = []  # kept-alive connections, most recent last
        self._lock = threading.Lock()
        self.connections_opened = 0

    def _acquire(self) -> tuple[http.client.HTTPConnection, bool]:
        """(a connection, whether it was used before)."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
            self.connections_opened += 1
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout), False

    def _release(self, conn: http.client.HTTPConnection, reusable: bool) -> None:
        if reusable:
            with self._lock:
                self._idle.append(conn)
        else:
            conn.close()

    def request_headers(self, body: bytes) -> dict[str, str]:
        return {"Content-Type": "application/json", "Accept": "text/event-stream, application/json", **self.headers}

    def classify_error(self, status: int, payload: bytes) -> tuple[str, str]:
        code = None
        message = payload[:300].decode("utf-8", "replace")
        try:
            data = json.loads(payload)
        except ValueError:
            data = None
        if isinstance(data, dict):
            error = data.get("error", data)
            if isinstance(error, dict):
                code = error.get("code") or error.get("type") or error.get("__type")
                message = error.get("message") or error.get("Message") or message
            elif isinstance(error, str):
                code = data.get("code") if isinstance(data.get("code"), str) else error
                message = data.get("message") or message
        code = code if isinstance(code, str) else None
        kind = _FRONT_DOOR_KINDS.get(code or "") or _classify_http(status, code)
        if kind.startswith("http_") and code and "throttl" in code.lower():
            kind = "throttled"
        if kind.startswith("http_") and code and code.lower() in ("modelerror", "model_error"):
            kind = "model_error"
        return kind, f"{status} {code + ': ' if code else ''}{message}".strip()

    def send(self, body: bytes) -> Attempt:
        attempt = Attempt()
        parser = StreamParser()
        expect_usage = _expects_usage(body)
        call_start = time.perf_counter()
        headers = self.request_headers(body)
        start = time.perf_counter()
        attempt.client_overhead_s = start - call_start
        conn, reused = self._acquire()
        reusable = False
        try:
            try:
                conn.request("POST", self.path, body=body, headers=headers)
                response = conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                if not reused:
                    raise
                # A kept-alive connection the server had closed meanwhile: once more on a fresh one.
                conn.close()
                with self._lock:
                    self.connections_opened += 1
                conn = type(conn)(self.host, self.port, timeout=self.timeout)
                start = time.perf_counter()
                conn.request("POST", self.path, body=body, headers=headers)
                response = conn.getresponse()
            attempt.status = response.status
            attempt.request_id = response.getheader("x-amzn-RequestId") or response.getheader("x-request-id")
            if response.status >= 400:
                payload = response.read(_ERROR_BODY_LIMIT)
                attempt.kind, attempt.detail = self.classify_error(response.status, payload)
                reusable = not response.will_close and response.isclosed()
                return attempt
            while True:
                data = response.read1(65536)
                if not data:
                    break
                if attempt.ttft_s is None:
                    attempt.ttft_s = time.perf_counter() - start
                attempt.bytes_received += len(data)
                parser.feed(data)
            reusable = not response.will_close
        except Exception as error:
            attempt.kind, attempt.detail = _exception_kind(error), _describe(error)
        finally:
            attempt.e2e_s = time.perf_counter() - start
            self._release(conn, reusable)
        return attempt.finish(parser, expect_usage)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class OpenAITarget(_HttpTarget):
    """An OpenAI-compatible chat-completions URL (SSE), with a bearer token.

    ``url``: the full ``.../chat/completions`` URL; a URL ending in ``/v1`` gets ``/chat/completions``
    appended. ``token``: the bearer token; when ``None``, the ``sagemaker`` SDK's token generator
    (``sagemaker.core.token_generator.generate_token``) makes one for ``region`` (SageMaker's
    OpenAI-compatible API).
    """

    name = "openai"

    def __init__(self, url: str, *, token: str | None = None, region: str | None = None, timeout: float = 120.0,
                 headers: dict[str, str] | None = None):
        if url.rstrip("/").endswith("/v1"):
            url = url.rstrip("/") + "/chat/completions"
        super().__init__(url, timeout=timeout, headers=headers)
        self.token = token if token else sagemaker_bearer_token(region or _region_from_host(self.host))
        self.description = f"openai-compatible {url}"

    def request_headers(self, body: bytes) -> dict[str, str]:
        return {**super().request_headers(body), "Authorization": f"Bearer {self.token}"}


def _region_from_host(host: str) -> str | None:
    # runtime.sagemaker.<region>.amazonaws.com / <id>.lambda-url.<region>.on.aws
    parts = host.split(".")
    for marker in ("sagemaker", "lambda-url"):
        if marker in parts:
            i = parts.index(marker)
            if i + 1 < len(parts):
                return parts[i + 1]
    return None


def sagemaker_bearer_token(region: str | None) -> str:
    """A short-lived bearer token for SageMaker's OpenAI-compatible API, from the ``sagemaker`` SDK.

    The SDK is imported only here; its absence is a :class:`UserError` naming the package.
    """
    try:
        from sagemaker.core.token_generator import generate_token  # type: ignore[import-not-found]
    except ImportError:
        raise UserError(
            "the openai target needs a bearer token: pass --token, or install the SageMaker Python SDK "
            "('pip install sagemaker', module sagemaker.core.token_generator) to generate one"
        ) from None
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    kwargs: dict[str, Any] = {}
    try:
        accepted = inspect.signature(generate_token).parameters
    except (TypeError, ValueError):  # pragma: no cover
        accepted = {}
    if region and ("region" in accepted or not accepted):
        kwargs["region"] = region
    try:
        token = generate_token(**kwargs)
    except Exception as error:
        raise UserError(f"sagemaker.core.token_generator.generate_token failed: {_describe(error)}") from None
    if not isinstance(token, str) or not token:
        raise UserError("sagemaker.core.token_generator.generate_token returned no token")
    return token


class LambdaUrlTarget(_HttpTarget):
    """The normalizer's Function URL, each request SigV4-signed for service ``lambda``."""

    name = "lambda-url"

    def __init__(self, url: str, *, region: str | None = None, profile: str | None = None, timeout: float = 120.0,
                 headers: dict[str, str] | None = None, credentials: Any = None):
        super().__init__(url, timeout=timeout, headers=headers)
        try:
            import boto3
            from botocore.auth import SigV4Auth
            from botocore.awsrequest import AWSRequest
            from botocore.exceptions import ProfileNotFound
        except ImportError as error:  # pragma: no cover
            raise UserError(f"the lambda-url target needs botocore: {error}") from None
        self._SigV4Auth, self._AWSRequest = SigV4Auth, AWSRequest
        if credentials is None:
            try:
                session = boto3.Session(profile_name=profile) if profile else boto3.Session()
            except ProfileNotFound as error:
                raise UserError(str(error)) from None
            credentials = session.get_credentials()
            region = region or _region_from_host(self.host) or session.region_name
        else:
            region = region or _region_from_host(self.host)
        if credentials is None:
            raise UserError("no AWS credentials found to sign requests to the Function URL")
        if not region:
            raise UserError("the lambda-url target needs --region (not found in the URL)")
        self.credentials = credentials
        self.region = region
        self.description = f"lambda function url {url}"

    def request_headers(self, body: bytes) -> dict[str, str]:
        headers = {**super().request_headers(body), "Host": self.netloc}
        frozen = self.credentials.get_frozen_credentials() if hasattr(self.credentials, "get_frozen_credentials") \
            else self.credentials
        request = self._AWSRequest(method="POST", url=self.url, data=body, headers=headers)
        self._SigV4Auth(frozen, "lambda", self.region).add_auth(request)
        return dict(request.headers.items())


# --------------------------------------------------------------------------- the run


@dataclass
class RequestResult:
    """One row of the report: a request, sent once (or retried), succeeded or failed with a kind."""

    index: int
    source: str
    ok: bool
    error_kind: str | None
    error_detail: str | None
    status: int | None
    request_id: str | None
    #: Seconds from the start of the run to when the request was issued / was due.
    start_s: float
    scheduled_s: float | None
    ttft_s: float | None
    e2e_s: float | None
    output_tokens: int | None
    prompt_tokens: int | None
    cached_tokens: int | None
    finish_reason: str | None
    body_bytes: int
    bytes_received: int
    attempts: int = 1
    retried: list[str] = field(default_factory=list)
    client_overhead_s: float | None = None

    @property
    def hit_rate(self) -> float | None:
        if self.prompt_tokens and self.cached_tokens is not None:
            return self.cached_tokens / self.prompt_tokens
        return None


@dataclass
class LoadResult:
    results: list[RequestResult]
    started_at: float  # time.time()
    duration_s: float
    stopped_by: str  # "end of input", "max_requests", "duration", "interrupted"
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (source, reason): not sent
    config: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: CPU seconds this process used during the run (all threads).
    client_cpu_s: float | None = None


def _send_with_retries(target: Any, body: bytes, retries: int, rng: random.Random,
                       base_delay: float = 0.1, max_delay: float = 5.0) -> tuple[Attempt, int, list[str], float]:
    """(last attempt, attempts, kinds retried, seconds from the first attempt's start)."""
    start = time.perf_counter()
    retried: list[str] = []
    attempt_no = 0
    while True:
        attempt_no += 1
        attempt_start = time.perf_counter()
        result = target.send(body)
        retryable = result.kind in RETRYABLE or (result.kind or "").startswith("http_5")
        if result.ok or attempt_no > retries or not retryable or result.bytes_received:
            offset = attempt_start - start
            if offset:  # times as the caller saw them, retries included
                if result.ttft_s is not None:
                    result.ttft_s += offset
                if result.e2e_s is not None:
                    result.e2e_s += offset
            return result, attempt_no, retried, offset
        retried.append(result.kind or "")
        time.sleep(rng.uniform(0, min(max_delay, base_delay * 2 ** (attempt_no - 1))))


def run_load(
    items: Iterable[WorkItem],
    target: Any,
    *,
    concurrency: int = 8,
    rate: float | None = None,
    speed: float | None = None,
    max_requests: int | None = None,
    duration: float | None = None,
    retries: int = 0,
    prepare: Callable[[WorkItem], bytes] | None = None,
    progress: bool = True,
    total_hint: int | None = None,
    seed: int = 0,
    on_result: Callable[[RequestResult], None] | None = None,
) -> LoadResult:
    """Send ``items`` to ``target`` (anything with ``send(body) -> Attempt``) and collect one
    :class:`RequestResult` per request sent.

    Pacing: ``rate`` requests per second (request *i* due at ``i / rate``), or the items' own
    ``at_s`` divided by ``speed``, or (neither) as fast as ``concurrency`` allows. A due request
    waits for a free slot when ``concurrency`` requests are in flight (its lag shows as
    ``start_s - scheduled_s``). Stops issuing at ``max_requests``, after ``duration`` seconds, or at
    the end of ``items``; then waits for the requests in flight. ``prepare`` turns an item into the
    bytes to send (variation, normalization); a ``ValueError`` from it skips the item (reported in
    ``skipped``, never sent). Ctrl-C stops issuing and waits for the requests in flight.
    """
    if concurrency < 1:
        raise UserError(f"concurrency={concurrency}: must be >= 1")
    if rate is not None and speed is not None:
        raise UserError("give either a rate or a speed, not both")
    if rate is not None and not rate > 0:
        raise UserError(f"rate={rate}: must be > 0")
    if speed is not None and not speed > 0:
        raise UserError(f"speed={speed}: must be > 0")
    if max_requests is not None and max_requests < 0:
        raise UserError(f"max_requests={max_requests}: must be >= 0")
    if duration is not None and not duration > 0:
        raise UserError(f"duration={duration}: must be > 0")
    if retries < 0:
        raise UserError(f"retries={retries}: must be >= 0")

    results: list[RequestResult] = []
    skipped: list[tuple[str, str]] = []
    lock = threading.Lock()
    slots = threading.Semaphore(concurrency)
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="loadtest")
    futures: list[Future] = []
    counts = Counter()
    bar = _progress_bar(progress, min(x for x in (max_requests, total_hint) if x is not None)
                        if (max_requests is not None or total_hint is not None) else None)
    started_wall = time.time()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    deadline = t0 + duration if duration is not None else None
    stopped_by = "end of input"

    def worker(item: WorkItem, body: bytes, scheduled: float | None, issued: float) -> None:
        rng = random.Random(f"{seed}:retry:{item.index}")
        try:
            try:
                attempt, attempts, retried, _ = _send_with_retries(target, body, retries, rng)
            except BaseException as error:  # a bug in a target must not lose the request
                attempt, attempts, retried = Attempt(kind="client_error", detail=_describe(error)), 1, []
            row = RequestResult(
                index=item.index,
                source=item.source,
                ok=attempt.ok,
                error_kind=attempt.kind,
                error_detail=attempt.detail,
                status=attempt.status,
                request_id=attempt.request_id,
                start_s=issued - t0,
                scheduled_s=scheduled,
                ttft_s=attempt.ttft_s,
                e2e_s=attempt.e2e_s,
                output_tokens=attempt.output_tokens,
                prompt_tokens=attempt.prompt_tokens,
                cached_tokens=attempt.cached_tokens,
                finish_reason=attempt.finish_reason,
                body_bytes=len(body),
                bytes_received=attempt.bytes_received,
                attempts=attempts,
                retried=retried,
                client_overhead_s=attempt.client_overhead_s,
            )
            with lock:
                results.append(row)
                counts["ok" if row.ok else "failed"] += 1
                if bar is not None:
                    bar.set_postfix(ok=counts["ok"], failed=counts["failed"], refresh=False)
                    bar.update(1)
            if on_result is not None:
                try:
                    on_result(row)
                except Exception:
                    pass
        finally:
            slots.release()

    sent = 0
    first_at: float | None = None
    try:
        for item in items:
            if max_requests is not None and sent >= max_requests:
                stopped_by = "max_requests"
                break
            try:
                body = prepare(item) if prepare is not None else item.body
            except ValueError as error:
                skipped.append((item.source, str(error)))
                continue
            if speed is not None and item.at_s is not None:
                first_at = item.at_s if first_at is None else first_at
                scheduled = (item.at_s - first_at) / speed
            elif rate is not None:
                scheduled = sent / rate
            else:
                scheduled = None
            if scheduled is not None:
                due = t0 + scheduled
                if deadline is not None and due >= deadline:
                    stopped_by = "duration"
                    break
                _sleep_until(due)
            if deadline is not None and time.perf_counter() >= deadline:
                stopped_by = "duration"
                break
            if not _acquire_until(slots, deadline):
                stopped_by = "duration"
                break
            issued = time.perf_counter()
            try:
                futures.append(pool.submit(worker, item, body, scheduled, issued))
            except BaseException:
                slots.release()
                raise
            sent += 1
            if len(futures) > 4 * concurrency:  # forget finished requests
                futures = [f for f in futures if not f.done()]
    except KeyboardInterrupt:
        stopped_by = "interrupted"
        print("\ninterrupted: waiting for the requests in flight (Ctrl-C again to abandon them)", file=sys.stderr)
    try:
        wait(futures)
    except KeyboardInterrupt:  # abandoned: they are still counted if they finish before we report
        stopped_by = "interrupted"
    pool.shutdown(wait=False)
    duration_s = time.perf_counter() - t0
    cpu_s = time.process_time() - cpu0
    if bar is not None:
        bar.close()
    with lock:
        rows = sorted(results, key=lambda r: r.index)
    notes = []
    if duration_s > 1 and cpu_s / duration_s > 0.8:
        notes.append(
            f"the load tester used {cpu_s / duration_s:.0%} of a CPU core: client-side TTFT and latency include "
            "its own queuing; lower --concurrency/--rate or split the load over several processes"
        )
    return LoadResult(rows, started_wall, duration_s, stopped_by, skipped, notes=notes, client_cpu_s=cpu_s)


def _sleep_until(due: float) -> None:
    while True:
        left = due - time.perf_counter()
        if left <= 0:
            return
        time.sleep(min(left, 0.5))


def _acquire_until(semaphore: threading.Semaphore, deadline: float | None) -> bool:
    if deadline is None:
        while not semaphore.acquire(timeout=0.5):
            pass
        return True
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return semaphore.acquire(blocking=False)
        if semaphore.acquire(timeout=min(left, 0.5)):
            return True


def _progress_bar(enabled: bool, total: int | None):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency; run without a bar otherwise
        return None
    return tqdm(total=total, file=sys.stderr, unit="req", desc="loadtest", dynamic_ncols=True, leave=True)


# --------------------------------------------------------------------------- the numbers


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks; None if empty."""
    data = sorted(v for v in values if v is not None and not math.isnan(v))
    if not data:
        return None
    if len(data) == 1:
        return data[0]
    position = (len(data) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (position - low)


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def summarize(result: LoadResult) -> dict[str, Any]:
    """The summary block of the report. Latency figures are over succeeded requests."""
    rows = result.results
    ok = [r for r in rows if r.ok]
    errors = Counter(r.error_kind for r in rows if not r.ok)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2es = [r.e2e_s for r in ok if r.e2e_s is not None]
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    with_usage = [r for r in ok if r.prompt_tokens is not None]
    prompt = sum(r.prompt_tokens or 0 for r in with_usage)
    cached = sum(r.cached_tokens or 0 for r in with_usage if r.cached_tokens is not None)
    decode = [
        (r.output_tokens - 1) / (r.e2e_s - r.ttft_s)
        for r in ok
        if r.output_tokens and r.output_tokens > 1 and r.ttft_s is not None and r.e2e_s and r.e2e_s > r.ttft_s
    ]
    lags = [r.start_s - r.scheduled_s for r in rows if r.scheduled_s is not None]
    summary: dict[str, Any] = {
        "requests_sent": len(rows),
        "succeeded": len(ok),
        "failed": len(rows) - len(ok),
        "errors_by_kind": dict(sorted(errors.items())),
        "error_rate": _round((len(rows) - len(ok)) / len(rows), 4) if rows else None,
        "attempts": sum(r.attempts for r in rows),
        "skipped_not_sent": len(result.skipped),
        "duration_s": _round(result.duration_s, 3),
        "stopped_by": result.stopped_by,
        "achieved_rate_rps": _round(len(rows) / result.duration_s, 3) if result.duration_s > 0 else None,
    }
    for name, values in (("ttft", ttfts), ("e2e", e2es)):
        for q in (50, 90, 99):
            summary[f"{name}_p{q}_s"] = _round(percentile(values, q))
        summary[f"{name}_mean_s"] = _round(sum(values) / len(values)) if values else None
        summary[f"{name}_max_s"] = _round(max(values)) if values else None
    summary.update(
        {
            "output_tokens": out_tokens,
            "output_tokens_per_s": _round(out_tokens / result.duration_s, 3) if result.duration_s > 0 else None,
            "decode_tokens_per_s_p50": _round(percentile(decode, 50), 3),
            "requests_with_usage": len(with_usage),
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "hit_rate": _round(cached / prompt, 4) if prompt else None,
            "request_ids_seen": sum(1 for r in rows if r.request_id),
            "client_cpu_utilization": _round(result.client_cpu_s / result.duration_s, 3)
            if result.client_cpu_s is not None and result.duration_s > 0 else None,
            "client_overhead_p50_s": _round(percentile([r.client_overhead_s for r in rows
                                                        if r.client_overhead_s is not None], 50)),
            "schedule_lag_p50_s": _round(percentile(lags, 50)),
            "schedule_lag_max_s": _round(max(lags)) if lags else None,
        }
    )
    return summary


def report_dict(result: LoadResult) -> dict[str, Any]:
    """The whole JSON report: summary, configuration, notes, skipped bodies and one row per request."""
    return {
        "summary": summarize(result),
        "config": result.config,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(result.started_at)),
        "notes": result.notes,
        "skipped": [{"source": s, "reason": r} for s, r in result.skipped],
        "requests": [dataclasses.asdict(r) | {"hit_rate": _round(r.hit_rate, 4)} for r in result.results],
    }


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value * 1000:.1f} ms" if value < 10 else f"{value:.2f} s"


def render_markdown(result: LoadResult, plots: Sequence[str] = ()) -> str:
    s = summarize(result)
    cfg = result.config
    lines = [
        "# Load test report",
        "",
        f"Target: {cfg.get('target_description', cfg.get('target', '?'))}  ",
        f"Source: {cfg.get('source', '?')}  ",
        f"Started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(result.started_at))}, "
        f"ran {s['duration_s']} s, stopped by {s['stopped_by']}.",
        "",
        "| requests sent | succeeded | failed | attempts | achieved rate |",
        "| ---: | ---: | ---: | ---: | ---: |",
        f"| {s['requests_sent']} | {s['succeeded']} | {s['failed']} | {s['attempts']} | "
        f"{s['achieved_rate_rps'] if s['achieved_rate_rps'] is not None else '–'} req/s |",
        "",
        "| measure | P50 | P90 | P99 | mean | max |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, label in (("ttft", "TTFT (client)"), ("e2e", "end-to-end latency")):
        lines.append(
            f"| {label} | {_fmt_s(s[f'{name}_p50_s'])} | {_fmt_s(s[f'{name}_p90_s'])} | "
            f"{_fmt_s(s[f'{name}_p99_s'])} | {_fmt_s(s[f'{name}_mean_s'])} | {_fmt_s(s[f'{name}_max_s'])} |"
        )
    hit = f"{s['hit_rate']:.1%}" if s["hit_rate"] is not None else "– (no usage in the answers)"
    lines += [
        "",
        f"- Output tokens: {s['output_tokens']:,} ({s['output_tokens_per_s'] or 0:,.1f} tokens/s overall; "
        f"per-request decode P50 {s['decode_tokens_per_s_p50'] or 0:,.1f} tokens/s)",
        f"- Cache hit rate (cached ÷ prompt tokens, {s['requests_with_usage']} answers with usage): {hit}",
    ]
    if s["errors_by_kind"]:
        lines += ["", "## Errors", "", "| kind | count | example |", "| --- | ---: | --- |"]
        examples: dict[str, str] = {}
        for r in result.results:
            if not r.ok and r.error_kind not in examples:
                examples[r.error_kind] = (r.error_detail or "").replace("|", "\\|")[:120]
        for kind, count in s["errors_by_kind"].items():
            lines.append(f"| {kind} | {count} | {examples.get(kind, '')} |")
    if result.skipped:
        lines += ["", f"{len(result.skipped)} bodies were not sent (could not be prepared), e.g. "
                      f"{result.skipped[0][0]}: {result.skipped[0][1]}"]
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in result.notes]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots]
    return "\n".join(lines) + "\n"


def plot(result: LoadResult, out_dir: str) -> list[str]:
    """``ttft_cdf.png`` and ``latency_over_time.png`` (matplotlib, Agg); the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in result.results if r.ok]
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ttfts = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    if ttfts:
        ys = [(i + 1) / len(ttfts) for i in range(len(ttfts))]
        ax.step([t * 1000 for t in ttfts], ys, where="post")
        for q in (50, 90, 99):
            value = percentile(ttfts, q)
            ax.axvline(value * 1000, linestyle=":", color="grey")
            ax.annotate(f"P{q}", (value * 1000, q / 100), textcoords="offset points", xytext=(3, -10), fontsize=8)
    else:
        ax.text(0.5, 0.5, "no successful request", ha="center", transform=ax.transAxes)
    ax.set_xlabel("time to first token (ms, client side)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title("TTFT CDF")
    ax.grid(alpha=0.3)
    path = os.path.join(out_dir, "ttft_cdf.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    if ok:
        ax.scatter([r.start_s for r in ok], [(r.e2e_s or 0) * 1000 for r in ok], s=8, label="end-to-end", alpha=0.6)
        timed = [r for r in ok if r.ttft_s is not None]
        ax.scatter([r.start_s for r in timed], [r.ttft_s * 1000 for r in timed], s=8, label="TTFT", alpha=0.6)
    failed = [r for r in result.results if not r.ok]
    if failed:
        ax.scatter([r.start_s for r in failed], [(r.e2e_s or 0) * 1000 for r in failed], s=14, marker="x",
                   color="red", label="failed")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("Latency over time")
    ax.grid(alpha=0.3)
    if ok or failed:
        ax.legend(loc="upper left", fontsize=8)
    path = os.path.join(out_dir, "latency_over_time.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths


def write_reports(result: LoadResult, out_dir: str, *, plots: bool = True) -> dict[str, str]:
    """Write ``report.json``, ``report.md`` and (``plots``) the PNGs into ``out_dir``; their paths."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as error:
        raise UserError(f"--out {out_dir}: cannot create the directory: {error.strerror or error}") from None
    written: dict[str, str] = {}
    pngs = plot(result, out_dir) if plots else []
    for path in pngs:
        written[os.path.splitext(os.path.basename(path))[0]] = path
    json_path = os.path.join(out_dir, "report.json")
    with open(json_path, "w", encoding="utf-8") as handle:
        json.dump(report_dict(result), handle, indent=2, ensure_ascii=False)
        handle.write("\n")
    md_path = os.path.join(out_dir, "report.md")
    with open(md_path, "w", encoding="utf-8") as handle:
        handle.write(render_markdown(result, pngs))
    written["json"], written["markdown"] = json_path, md_path
    return written
