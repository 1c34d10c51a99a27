"""The normalizer front door's logic: who is calling, is the body acceptable, call the endpoint, measure.

The Lambda handler (``lambda/normalizer/``) is thin: it turns a Lambda event or an HTTP request into
a :class:`FrontRequest` and hands it to an :class:`Invoker`; everything else is here, as plain
functions and small classes that tests call directly. Importing it imports only the standard library
(boto3's client is passed in; botocore's exceptions are recognised by class name; Powertools' EMF
provider is imported when the first metrics are written).

One request, in order:

1. **Tenant** (:func:`identify_tenant`), by the configured tenancy mode:

   - ``iam``: the caller's IAM principal from the request context of a Function URL or API Gateway
     event (``requestContext.authorizer.iam`` for Function URLs and HTTP APIs,
     ``requestContext.identity`` for REST APIs), see :func:`principal_tenant`: an assumed role counts
     as its role (``arn:aws:iam::<account>:role/<name>``), whatever the session name, so one
     application keeps one routing id across sessions;
   - ``header``: the value of a configured header, for trusted callers (a gateway that authenticates
     end users and calls the Function URL with its own IAM identity);
   - ``none``: every request is tenant :data:`SHARED_TENANT`.

   Direct invocations (``lambda:InvokeFunction``, already a privileged caller) name the tenant in the
   event's ``tenant`` field. An optional application (header :attr:`InvokeConfig.application_header`,
   or the event's ``application``) splits one tenant's traffic further; it can never reach another
   tenant's routing id, because the tenant is part of the keyed hash.

2. **Validation and normalization** (:func:`prepare`): the body (UTF-8, JSON, at most 6 MiB, nesting
   depth, required fields) is checked by :func:`prefix_routing.normalize.normalize_body`, which also
   gives the canonical bytes, the prefix fingerprint and the block hashes; the tenant's
   ``PrefixAwareId`` and ``cache_salt`` come from :func:`prefix_routing.normalize.routing_identity`
   with the tenant key (a secret, never logged). Any problem is a :class:`RequestError`: HTTP 400
   (401 for a missing IAM identity, 405 for a method other than POST) with a JSON body
   ``{"error": {"code", "field", "message", "status"}}`` that names it.
   With :attr:`InvokeConfig.stream_usage` (the default), a chat or completion body that streams
   (``"stream": true``) and does not say ``stream_options.include_usage`` gets
   ``"include_usage": true`` there, so that vLLM reports token usage (and cached tokens) in a last
   chunk with empty ``choices``, as OpenAI documents it; the canonical bytes are computed after that.

3. **The call** (:meth:`Invoker.stream`): ``InvokeEndpointWithResponseStream`` with ``EndpointName``,
   ``InferenceComponentName``, ``PrefixAwareId``, ``ContentType="application/json"`` and the canonical
   ``Body``. Throttling and transient errors (see :func:`classify_error`) are retried with bounded,
   jittered exponential backoff, but only until the first ``PayloadPart`` has arrived, that is before
   anything was sent to the caller; the overall deadline is never overrun by a backoff sleep.
   Persistent throttling answers 429 (with ``Retry-After``), an unavailable endpoint 503,
   ``ModelError``/``ModelStreamError``/other upstream failures 502, timeouts 504, each with a JSON
   error that says what happened.

4. **The answer**: the generator yields a :class:`Head` (status and headers) as soon as the outcome
   is known (the first ``PayloadPart``, or an error), then every payload part's bytes as they arrive,
   then an :class:`Outcome`. Once the head said 200 the status cannot change: a mid-stream error, a
   timeout or a truncated stream (see :class:`StreamReader`: an OpenAI-style SSE stream without
   ``data: [DONE]``, a JSON-lines stream without a final chunk, an unparseable last line) is reported
   in-band as a last ``data: {"error": {...}}`` event (or JSON line) and the stream ends without
   ``[DONE]``; the request is logged and counted as failed (502/504). A truncated answer is never
   passed off as complete. :meth:`Invoker.buffered` collects the same into one JSON answer for
   direct invocations.

5. **Telemetry** (:class:`Telemetry`): per request one EMF document, serialized by Powertools (namespace
   :data:`telemetry.NAMESPACE`, one dimension ``InferenceComponent``, high resolution) with TTFT (time
   from the call to the first ``PayloadPart``), end-to-end latency, prompt and cached tokens,
   normalization time and the request/error counters, and one JSON log line with the
   :class:`telemetry.LogField` fields (tenant, routing id, fingerprint, block hashes, lengths,
   timings, status; never prompt text, never the key).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from prefix_routing import telemetry
from prefix_routing.normalize import (
    MAX_BODY_BYTES_LIMIT,
    NormalizationError,
    NormalizerSettings,
    Normalized,
    RoutingIdentity,
    normalize_body,
    routing_identity,
)

__all__ = [
    "MAX_BODY_BYTES_LIMIT",  # re-exported for the web app's request size check
    "SHARED_TENANT",
    "ConfigurationError",
    "FrontRequest",
    "Head",
    "InvokeConfig",
    "Invoker",
    "Outcome",
    "Prepared",
    "RequestError",
    "RequestRecord",
    "StreamReader",
    "Telemetry",
    "UpstreamError",
    "Buffered",
    "classify_error",
    "decode_direct_payload",
    "emf_document",
    "identify_tenant",
    "load_tenant_key",
    "log_record",
    "prepare",
    "principal_tenant",
    "request_from_event",
    "request_from_http",
]

#: The tenant of every request when the tenancy mode is ``none``.
SHARED_TENANT: Final = "shared"
TENANCY_MODES: Final = ("iam", "header", "none")

#: Extra fields of the request log line (informational; no alarm, query or reader depends on them).
LOG_REQUEST_ID: Final = "request_id"
LOG_APPLICATION: Final = "application"
LOG_BODY_KIND: Final = "body_kind"
LOG_ATTEMPTS: Final = "attempts"
LOG_ERROR_FIELD: Final = "error_field"
LOG_WALL_MS: Final = "wall_ms"  # arrival to the end of the answer, retries and normalization included

JSON_HEADERS: Final = {"content-type": "application/json"}
_MAX_HEADER_VALUE: Final = 128
_TENANT_CHARS: Final = frozenset(chr(c) for c in range(0x21, 0x7F))  # printable ASCII, no space
_APPLICATION_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-/")
_STATUS_CLIENT_CLOSED: Final = 499  # nginx's convention: the caller went away mid-answer


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


class ConfigurationError(ValueError):
    """A deployment setting (an environment variable) is missing or invalid; the message names it."""


@dataclass(frozen=True, slots=True)
class InvokeConfig:
    """Everything the front door needs besides the client and the tenant key (read-only).

    Build it from the Lambda's environment with :meth:`from_env` (the variables are those the stack
    sets, see ``stacks/constructs/normalizer_function.py``). Fields: ``endpoint_name`` (required),
    ``component_name``, ``tenancy`` (iam|header|none), ``tenant_header``, ``application_header``,
    ``settings`` (:class:`~prefix_routing.normalize.NormalizerSettings`), ``max_attempts`` (total
    attempts of the upstream call, 1 = no retry), ``backoff_base_s``, ``backoff_max_s``,
    ``request_timeout_s`` (wall-clock budget of one request from its arrival; past it: 504),
    ``stream_usage`` (add ``stream_options.include_usage`` to streaming chat/completion bodies).
    """

    endpoint_name: str
    component_name: str | None = None
    tenancy: str = "iam"
    tenant_header: str = "x-tenant-id"
    application_header: str = "x-application-id"
    settings: NormalizerSettings = field(default_factory=NormalizerSettings)
    max_attempts: int = 3
    backoff_base_s: float = 0.1
    backoff_max_s: float = 2.0
    request_timeout_s: float = 110.0
    stream_usage: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.endpoint_name, str) or not self.endpoint_name:
            raise ConfigurationError("ENDPOINT_NAME: missing; the SageMaker endpoint to invoke")
        if self.tenancy not in TENANCY_MODES:
            raise ConfigurationError(f"TENANCY: {self.tenancy!r} is not one of {', '.join(TENANCY_MODES)}")
        if self.tenancy == "header" and not self.tenant_header:
            raise ConfigurationError("TENANT_HEADER: missing; required with TENANCY=header")
        if not 1 <= self.max_attempts <= 10:
            raise ConfigurationError(f"UPSTREAM_MAX_ATTEMPTS: {self.max_attempts} is not in 1..10")
        if not (0 <= self.backoff_base_s <= self.backoff_max_s <= 30):
            raise ConfigurationError("backoff: need 0 <= base <= max <= 30 seconds")
        if not 0 < self.request_timeout_s <= 900:
            raise ConfigurationError(f"REQUEST_TIMEOUT_S: {self.request_timeout_s} is not in (0, 900]")
        object.__setattr__(self, "tenant_header", self.tenant_header.lower())
        object.__setattr__(self, "application_header", (self.application_header or "").lower())

    @property
    def metric_component(self) -> str:
        """The value of the ``InferenceComponent`` dimension."""
        return self.component_name or self.endpoint_name

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> InvokeConfig:
        """Read the configuration from environment variables; raises :class:`ConfigurationError`.

        ``ENDPOINT_NAME`` (required), ``INFERENCE_COMPONENT_NAME``, ``TENANCY`` (iam|header|none),
        ``TENANT_HEADER``, ``APPLICATION_HEADER``, ``PREFIX_LENGTH`` (0 or absent: the normalizer's
        default), ``BLOCK_BYTES``, ``NORMALIZER_SETTINGS`` (a JSON object of
        :class:`~prefix_routing.normalize.NormalizerSettings` fields, e.g. freeze rules),
        ``UPSTREAM_MAX_ATTEMPTS``, ``REQUEST_TIMEOUT_S``, ``STREAM_USAGE`` (true|false).
        """
        env = os.environ if environ is None else environ

        def number(name: str, default: float, kind=float) -> Any:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                return kind(raw)
            except ValueError:
                raise ConfigurationError(f"{name}: {raw!r} is not a number") from None

        data: dict[str, Any] = {}
        raw_settings = env.get("NORMALIZER_SETTINGS", "").strip()
        if raw_settings:
            try:
                data = json.loads(raw_settings)
            except ValueError as error:
                raise ConfigurationError(f"NORMALIZER_SETTINGS: not valid JSON ({error})") from None
            if not isinstance(data, dict):
                raise ConfigurationError("NORMALIZER_SETTINGS: not a JSON object")
        prefix_length = number("PREFIX_LENGTH", 0, int)
        if prefix_length:
            data["prefix_length"] = prefix_length
        block_bytes = number("BLOCK_BYTES", 0, int)
        if block_bytes:
            data["block_bytes"] = block_bytes
        try:
            settings = NormalizerSettings.from_mapping(data, source="environment")
        except ValueError as error:
            raise ConfigurationError(str(error)) from None
        usage = env.get("STREAM_USAGE", "true").strip().lower()
        if usage not in ("true", "false", "1", "0", "yes", "no"):
            raise ConfigurationError(f"STREAM_USAGE: {usage!r} is not true or false")
        return cls(
            endpoint_name=env.get("ENDPOINT_NAME", "").strip(),
            component_name=env.get("INFERENCE_COMPONENT_NAME", "").strip() or None,
            tenancy=env.get("TENANCY", "iam").strip().lower(),
            tenant_header=env.get("TENANT_HEADER", "x-tenant-id").strip(),
            application_header=env.get("APPLICATION_HEADER", "x-application-id").strip(),
            settings=settings,
            max_attempts=number("UPSTREAM_MAX_ATTEMPTS", 3, int),
            request_timeout_s=number("REQUEST_TIMEOUT_S", 110.0),
            stream_usage=usage in ("true", "1", "yes"),
        )


def load_tenant_key(client: Any, secret_id: str) -> bytes:
    """The tenant HMAC key from Secrets Manager (``GetSecretValue``), as bytes.

    The secret's string (or binary) value is the key material; it must be at least 16 bytes.
    Raises :class:`ConfigurationError` (never with the value in the message).
    """
    if not secret_id:
        raise ConfigurationError("TENANT_KEY_SECRET_ARN: missing; the secret that holds the tenant key")
    answer = client.get_secret_value(SecretId=secret_id)
    if answer.get("SecretString") is not None:
        key = answer["SecretString"].encode("utf-8")
    else:
        key = bytes(answer.get("SecretBinary") or b"")
    if len(key) < 16:
        raise ConfigurationError(f"{secret_id}: the tenant key must be at least 16 bytes")
    return key


# --------------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------------


class RequestError(Exception):
    """The request is rejected before it reaches the endpoint (4xx).

    ``code`` is a stable machine-readable kind (``invalid_json``, ``missing_tenant``, ...), ``field``
    the JSON path or header at fault, ``status`` the HTTP status.
    """

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        #: Time spent normalizing before the body was found bad (None if normalization did not run).
        self.normalize_ms: float | None = None

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message, "status": self.status}
        if self.field is not None:
            error["field"] = self.field
        return {"error": error}


@dataclass(slots=True)
class FrontRequest:
    """One request as the front door sees it, whatever transport brought it.

    ``source`` is ``"http"`` (Function URL, API Gateway, or the web app behind the Lambda Web
    Adapter) or ``"direct"`` (a direct invocation). ``request_context`` is the event's
    ``requestContext`` (HTTP only: who is calling). ``tenant``/``application`` are the fields of a
    direct invocation. ``deadline`` is a ``time.monotonic()`` instant by which the answer must be
    complete (from the Lambda context), if known. ``problem`` is a :class:`RequestError` found while
    reading the event (answered without looking further).
    """

    body: bytes | str | Mapping | None
    headers: Mapping[str, str] = field(default_factory=dict)
    source: str = "http"
    method: str = "POST"
    request_context: Mapping | None = None
    tenant: Any = None
    application: Any = None
    request_id: str | None = None
    deadline: float | None = None
    problem: RequestError | None = None
    arrival: float = field(default_factory=time.monotonic)  # time.monotonic() when the request was read
    arrival_ms: int = field(default_factory=lambda: int(time.time() * 1000))  # epoch milliseconds, same moment


def _lower_headers(headers: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(headers, Mapping):
        for key, value in headers.items():
            if isinstance(key, str) and isinstance(value, str):
                out[key.lower()] = value
    return out


def _deadline_from_remaining_ms(remaining_ms: Any, margin_s: float = 1.5) -> float | None:
    if isinstance(remaining_ms, (int, float)) and not isinstance(remaining_ms, bool) and remaining_ms > 0:
        return time.monotonic() + max(0.0, remaining_ms / 1000.0 - margin_s)
    return None


def request_from_event(event: Any, context: Any = None) -> FrontRequest:
    """A :class:`FrontRequest` from a Lambda event: Function URL / API Gateway HTTP API (payload 2.0),
    API Gateway REST API (1.0), or a direct invocation ``{"body": {...} | "<json>", "tenant": ...,
    "application": ...}``. Never raises: a malformed event gives a request whose ``problem`` is set.
    """
    request_id = getattr(context, "aws_request_id", None)
    remaining = None
    if context is not None and callable(getattr(context, "get_remaining_time_in_millis", None)):
        try:
            remaining = context.get_remaining_time_in_millis()
        except Exception:  # noqa: BLE001 - a test double without it
            remaining = None
    deadline = _deadline_from_remaining_ms(remaining)
    if not isinstance(event, Mapping):
        return FrontRequest(
            body=None, source="direct", request_id=request_id, deadline=deadline,
            problem=RequestError(400, "invalid_event", "the event is not a JSON object", "event"),
        )
    context_data = event.get("requestContext")
    is_v2 = isinstance(context_data, Mapping) and isinstance(context_data.get("http"), Mapping)
    is_v1 = isinstance(context_data, Mapping) and isinstance(event.get("httpMethod"), str)
    if is_v2 or is_v1:
        method = context_data["http"].get("method") if is_v2 else event.get("httpMethod")
        headers = _lower_headers(event.get("headers"))
        raw = event.get("body")
        problem = None
        body: bytes | str | None
        if raw is None:
            body = b""
        elif not isinstance(raw, str):
            body, problem = None, RequestError(400, "invalid_event", "the event's body is not a string", "body")
        elif event.get("isBase64Encoded"):
            try:
                body = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                body, problem = None, RequestError(400, "invalid_base64", "the body is not valid base64", "body")
        else:
            body = raw.encode("utf-8", "surrogatepass")
        return FrontRequest(
            body=body, headers=headers, source="http", method=str(method or "").upper(),
            request_context=context_data, request_id=request_id or _str(context_data.get("requestId")),
            deadline=deadline, problem=problem,
        )
    if "body" not in event:
        return FrontRequest(
            body=None, source="direct", request_id=request_id, deadline=deadline,
            problem=RequestError(
                400, "invalid_event",
                'a direct invocation needs {"body": <request body object or JSON string>, "tenant": ...}',
                "body",
            ),
        )
    raw = event.get("body")
    problem = None
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    elif not isinstance(raw, Mapping):
        problem = RequestError(400, "invalid_event", "body: must be a JSON object or a JSON string", "body")
    return FrontRequest(
        body=raw, source="direct", tenant=event.get("tenant"), application=event.get("application"),
        request_id=request_id, deadline=deadline, problem=problem,
    )


def request_from_http(
    method: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    request_context: Mapping | None = None,
    lambda_context: Mapping | None = None,
) -> FrontRequest:
    """A :class:`FrontRequest` from an HTTP request forwarded by the Lambda Web Adapter.

    ``request_context`` and ``lambda_context`` are the parsed ``x-amzn-request-context`` and
    ``x-amzn-lambda-context`` headers (the adapter sets both and overwrites any client-sent value).
    """
    request_id = None
    deadline = None
    if isinstance(lambda_context, Mapping):
        request_id = _str(lambda_context.get("request_id") or lambda_context.get("requestId"))
        deadline_ms = lambda_context.get("deadline", lambda_context.get("deadline_ms"))
        if isinstance(deadline_ms, (int, float)) and not isinstance(deadline_ms, bool):
            deadline = _deadline_from_remaining_ms(deadline_ms - time.time() * 1000)
    if request_id is None and isinstance(request_context, Mapping):
        request_id = _str(request_context.get("requestId"))
    return FrontRequest(
        body=body, headers=_lower_headers(headers), source="http", method=method.upper(),
        request_context=request_context, request_id=request_id, deadline=deadline,
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


# --------------------------------------------------------------------------------------------------
# Tenants
# --------------------------------------------------------------------------------------------------


def principal_tenant(user_arn: Any, caller_id: Any = None, account_id: Any = None) -> str | None:
    """The tenant of an IAM principal: stable across sessions of the same role.

    ``arn:aws:sts::111122223333:assumed-role/Reader/session-1`` → ``arn:aws:iam::111122223333:role/Reader``
    (the role's path is not in the STS ARN, so it is not in the tenant either); an IAM user or the
    account root keep their ARN. Without an ARN: the unique id part of ``callerId`` (``AROA...`` for a
    role, before the ``:session``), else ``account:<id>``. None if nothing identifies the caller.
    """
    if isinstance(user_arn, str) and user_arn.startswith("arn:"):
        parts = user_arn.split(":", 5)
        if len(parts) == 6:
            _, partition, service, _, account, resource = parts
            if service == "sts" and resource.startswith("assumed-role/"):
                role = resource.split("/")[1] if resource.count("/") >= 1 else ""
                if role:
                    return f"arn:{partition}:iam::{account}:role/{role}"
            return user_arn
    if isinstance(caller_id, str) and caller_id:
        return caller_id.split(":", 1)[0] or None
    if isinstance(account_id, str) and account_id:
        return f"account:{account_id}"
    return None


def _iam_tenant(request_context: Mapping | None) -> str | None:
    if not isinstance(request_context, Mapping):
        return None
    authorizer = request_context.get("authorizer")
    iam = authorizer.get("iam") if isinstance(authorizer, Mapping) else None
    if isinstance(iam, Mapping):  # Function URL, API Gateway HTTP API
        found = principal_tenant(iam.get("userArn"), iam.get("callerId"), iam.get("accountId"))
        if found:
            return found
    identity = request_context.get("identity")  # API Gateway REST API with AWS_IAM
    if isinstance(identity, Mapping):
        return principal_tenant(identity.get("userArn"), identity.get("caller"), identity.get("accountId"))
    return None


def _checked_name(value: Any, what: str, allowed_chars: frozenset, limit: int, allowed: str) -> str:
    if not isinstance(value, str) or not value:
        raise RequestError(400, f"invalid_{what}", f"{what}: must be a non-empty string; allowed: {allowed}", what)
    if len(value) > limit or not all(c in allowed_chars for c in value):
        shown = json.dumps(value[:40], ensure_ascii=True)
        raise RequestError(400, f"invalid_{what}", f"{what}: {shown} is not allowed; allowed: {allowed}", what)
    return value


_TENANT_ALLOWED: Final = "1-128 printable ASCII characters without spaces"
_APPLICATION_ALLOWED: Final = "1-64 characters among letters, digits and . _ : - /"


def identify_tenant(request: FrontRequest, config: InvokeConfig) -> tuple[str, str | None]:
    """(tenant, application) of a request; raises :class:`RequestError` (401/400) if unidentified."""
    application: Any = None
    if request.source == "direct":
        application = request.application
    elif config.application_header:
        application = request.headers.get(config.application_header)
    if application is not None:
        application = _checked_name(application, "application", _APPLICATION_CHARS, 64, _APPLICATION_ALLOWED)
    if config.tenancy == "none":
        return SHARED_TENANT, application
    if request.source == "direct":
        if request.tenant is None:
            raise RequestError(400, "missing_tenant", 'tenant: missing; a direct invocation names its tenant in '
                               'the event ("tenant": "...")', "tenant")
        return _checked_name(request.tenant, "tenant", _TENANT_CHARS, _MAX_HEADER_VALUE, _TENANT_ALLOWED), application
    if config.tenancy == "header":
        value = request.headers.get(config.tenant_header)
        if value is None:
            raise RequestError(400, "missing_tenant", f"header {config.tenant_header}: missing; it names the tenant",
                               config.tenant_header)
        return _checked_name(value, "tenant", _TENANT_CHARS, _MAX_HEADER_VALUE, _TENANT_ALLOWED), application
    tenant = _iam_tenant(request.request_context)
    if tenant is None:
        raise RequestError(401, "unauthenticated", "no IAM identity in the request context: call the Function URL "
                           "with SigV4-signed requests (service lambda)", "requestContext.authorizer.iam")
    return tenant, application


# --------------------------------------------------------------------------------------------------
# Validation and normalization
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated request: tenant, routing identity, canonical body. ``expects_usage``: the body asks
    for a usage chunk at the end of the stream (``stream_options.include_usage``)."""

    tenant: str
    application: str | None
    identity: RoutingIdentity
    normalized: Normalized
    normalize_ms: float
    expects_usage: bool


def _wants_usage(normalized: Normalized) -> tuple[bool, bool]:
    """(the body streams and asks for usage, the body streams without saying) for chat/completion."""
    if normalized.kind == "lmi" or b'"stream":true' not in normalized.body:
        return False, False
    data = json.loads(normalized.body)
    if data.get("stream") is not True:
        return False, False
    options = data.get("stream_options")
    if options is None:
        return False, True
    if isinstance(options, dict):
        if options.get("include_usage") is True:
            return True, False
        return False, "include_usage" not in options
    return False, False


def prepare(request: FrontRequest, config: InvokeConfig, key: bytes) -> Prepared:
    """Identify the tenant, validate and normalize the body; raises :class:`RequestError` (4xx).

    The normalization time covers parsing, validation and canonical serialization.
    """
    if request.problem is not None:
        raise request.problem
    if request.source == "http" and request.method != "POST":
        raise RequestError(405, "method_not_allowed", f"method {request.method[:16]}: only POST is accepted",
                           "method")
    tenant, application = identify_tenant(request, config)
    try:
        identity = routing_identity(tenant, application, key)
    except ValueError as error:
        raise RequestError(400, "invalid_tenant", f"tenant/application: {error}", "tenant") from None
    started = time.perf_counter()
    try:
        normalized = normalize_body(request.body if request.body is not None else b"", config.settings,
                                    identity=identity)
        expects_usage = False
        if config.stream_usage:
            expects_usage, add = _wants_usage(normalized)
            if add:
                data = json.loads(normalized.body)
                options = data.get("stream_options")
                data["stream_options"] = {**(options or {}), "include_usage": True}
                normalized = normalize_body(data, config.settings, identity=identity)
                expects_usage = True
        elif normalized.kind != "lmi" and b'"include_usage":true' in normalized.body:
            expects_usage = _wants_usage(normalized)[0]
    except NormalizationError as error:
        rejected = RequestError(400, error.code, str(error), error.field)
        rejected.normalize_ms = (time.perf_counter() - started) * 1000.0
        raise rejected from None
    normalize_ms = (time.perf_counter() - started) * 1000.0
    return Prepared(tenant, application, identity, normalized, normalize_ms, expects_usage)


# --------------------------------------------------------------------------------------------------
# Reading the model's stream
# --------------------------------------------------------------------------------------------------


class StreamReader:
    """Follows a model's answer as it streams: SSE (``data: {...}``) or JSON lines, or one JSON document.

    Reads ``usage`` (``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``)
    wherever it appears, in-band errors (``{"error": ...}`` or ``{"object": "error"}``), and the end
    markers that make an answer :attr:`complete`:

    - OpenAI-style SSE (chunks with ``choices``): the closing ``data: [DONE]``;
    - other SSE (e.g. TGI's ``generated_text``), or JSON lines: a final chunk (a non-null
      ``finish_reason``, ``generated_text`` or ``details.finish_reason``) and, when the request asked
      for it (``expects_usage``), the ``usage`` chunk;
    - a body that is one JSON document (a non-streamed answer): that it parses, whole.

    A last line cut in the middle never parses, so a stream that ends there is incomplete too.
    With ``collect=True`` it also assembles the answer's text per choice (for buffered answers).
    """

    _LIMIT = 32 * 1024 * 1024  # bytes kept to parse a one-document answer at the end

    def __init__(self, *, expects_usage: bool = False, collect: bool = False) -> None:
        self.expects_usage = expects_usage
        self.collect = collect
        self.format: str | None = None  # "sse" | "jsonl" | "json"
        self.done = False
        self.finished = False
        self.openai_style = False
        self.usage: dict[str, Any] | None = None
        self.error: Any = None
        self.broken_tail = False
        self.document: Any = None
        self.total_bytes = 0
        self._pending = bytearray()
        self._raw: bytearray | None = bytearray()
        self._texts: dict[int, list[str]] = {}
        self._finish: dict[int, Any] = {}
        self._model: Any = None
        self._id: Any = None
        self._objects = 0
        self._first: Any = None

    # -- feeding
    def feed(self, data: bytes) -> None:
        self.total_bytes += len(data)
        if self._raw is not None:
            if len(self._raw) + len(data) <= self._LIMIT:
                self._raw += data
            else:
                self._raw = None
        pending = self._pending
        pending += data
        start = 0
        while True:
            end = pending.find(b"\n", start)
            if end < 0:
                break
            self._line(bytes(pending[start:end]))
            start = end + 1
        if start:
            del pending[:start]
        if len(pending) > self._LIMIT:  # a line this long is one document, kept in _raw if small enough
            pending.clear()
            self.broken_tail = True

    def finish(self) -> None:
        """The stream ended: read the last, unterminated line, or the whole body as one document."""
        if self._pending:
            tail = bytes(self._pending)
            self._pending.clear()
            if tail.strip() and not self._line(tail, last=True):
                self.broken_tail = True
        if (self.format == "jsonl" and self._objects == 1 and self.finished and not self.broken_tail
                and isinstance(self._first, dict) and not str(self._first.get("object", "")).endswith("chunk")):
            self.format, self.document = "json", self._first  # one line, one finished answer: a document
        if self.format is None and self._raw:
            try:
                document = json.loads(bytes(self._raw))
            except ValueError:
                self.broken_tail = True
            else:
                if isinstance(document, dict):
                    self.format = "json"
                    self.broken_tail = False
                    self.document = document
                    self._observe(document, whole=True)

    def _line(self, line: bytes, last: bool = False) -> bool:
        """Process one line; True if it was understood."""
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip():
            return True
        if line.startswith(b"data:"):
            self.format = "sse"
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                return True
            return self._json(payload)
        if line[:1] == b":" or line.startswith((b"event:", b"id:", b"retry:")):
            self.format = self.format or "sse"
            return True
        if line.lstrip()[:1] == b"{":
            understood = self._json(line)
            if understood and self.format is None:
                self.format = "jsonl"
            return understood
        return False

    def _json(self, payload: bytes) -> bool:
        try:
            obj = json.loads(payload)
        except ValueError:
            return False
        if isinstance(obj, dict):
            self._objects += 1
            if self._first is None:
                self._first = obj
            self._observe(obj)
        return True

    def _observe(self, obj: dict, whole: bool = False) -> None:
        if obj.get("object") == "error" or ("error" in obj and "choices" not in obj and "token" not in obj):
            self.error = obj.get("error", obj)
            return
        if self._id is None and isinstance(obj.get("id"), str):
            self._id = obj["id"]
        if self._model is None and isinstance(obj.get("model"), str):
            self._model = obj["model"]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = obj.get("choices")
        if isinstance(choices, list):
            self.openai_style = True
            for position, choice in enumerate(choices):
                if not isinstance(choice, dict):
                    continue
                index = choice.get("index", position)
                index = index if isinstance(index, int) and not isinstance(index, bool) else position
                if choice.get("finish_reason") is not None:
                    self.finished = True
                    self._finish[index] = choice["finish_reason"]
                if self.collect:
                    piece = None
                    for holder in (choice.get("delta"), choice.get("message")):
                        if isinstance(holder, dict) and isinstance(holder.get("content"), str):
                            piece = holder["content"]
                    if piece is None and isinstance(choice.get("text"), str):
                        piece = choice["text"]
                    if piece:
                        self._texts.setdefault(index, []).append(piece)
        token = obj.get("token")
        if isinstance(token, dict) and self.collect and isinstance(token.get("text"), str):
            if not token.get("special"):
                self._texts.setdefault(0, []).append(token["text"])
        if obj.get("generated_text") is not None:
            self.finished = True
        details = obj.get("details")
        if isinstance(details, dict) and details.get("finish_reason") is not None:
            self.finished = True
            self._finish.setdefault(0, details["finish_reason"])
            if self.usage is None and isinstance(details.get("generated_tokens"), int):
                self.usage = {"completion_tokens": details["generated_tokens"]}
        if whole:
            self.finished = True

    # -- results
    @property
    def complete(self) -> bool:
        if self.error is not None or self.broken_tail:
            return False
        if self.format == "json":
            return True
        if self.format == "sse" and self.openai_style:
            return self.done
        if self.format in ("sse", "jsonl"):
            if self.done and not self.openai_style:
                return True
            return self.finished and (self.usage is not None or not self.expects_usage)
        return False

    def _count(self, *path: str) -> int | None:
        node: Any = self.usage
        for key in path:
            if not isinstance(node, dict):
                return None
            node = node.get(key)
        if isinstance(node, int) and not isinstance(node, bool) and node >= 0:
            return node
        return None

    @property
    def prompt_tokens(self) -> int | None:
        return self._count("prompt_tokens")

    @property
    def cached_tokens(self) -> int | None:
        return self._count("prompt_tokens_details", "cached_tokens")

    @property
    def completion_tokens(self) -> int | None:
        return self._count("completion_tokens")

    def answer(self) -> dict[str, Any]:
        """The collected answer: the document itself for a one-document answer, else the text per choice."""
        if self.format == "json" and isinstance(self.document, dict):
            return self.document
        indexes = sorted(set(self._texts) | set(self._finish)) or [0]
        out: dict[str, Any] = {"object": "prefix_routing.completion"}
        if self._id is not None:
            out["id"] = self._id
        if self._model is not None:
            out["model"] = self._model
        out["choices"] = [
            {"index": i, "text": "".join(self._texts.get(i, ())), "finish_reason": self._finish.get(i)}
            for i in indexes
        ]
        out["usage"] = self.usage
        return out


# --------------------------------------------------------------------------------------------------
# Upstream errors
# --------------------------------------------------------------------------------------------------


class UpstreamError(Exception):
    """The endpoint failed the request. ``status`` is what the caller gets, ``kind`` a stable code,
    ``retryable`` whether another attempt may succeed (only ever used before the first byte)."""

    def __init__(self, status: int, kind: str, message: str, *, retryable: bool = False,
                 upstream_code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.retryable = retryable
        self.upstream_code = upstream_code

    def body(self, attempts: int | None = None) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.kind, "message": self.message, "status": self.status}
        if self.upstream_code:
            error["upstream_code"] = self.upstream_code
        if attempts:
            error["attempts"] = attempts
        return {"error": error}


_THROTTLING_CODES: Final = frozenset({
    "ThrottlingException", "Throttling", "ThrottledException", "TooManyRequestsException",
    "RequestLimitExceeded", "RequestThrottled", "SlowDown", "ProvisionedThroughputExceededException",
})
_DENIED_CODES: Final = frozenset({
    "AccessDeniedException", "AccessDenied", "UnrecognizedClientException", "ExpiredTokenException",
    "InvalidSignatureException", "IncompleteSignature", "MissingAuthenticationToken", "SignatureDoesNotMatch",
})


def _one_line(text: Any, limit: int = 300) -> str:
    text = str(text).replace("\r", " ").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def classify_error(exc: BaseException) -> UpstreamError:
    """Map an exception from the runtime call or from reading its stream to an :class:`UpstreamError`.

    Recognised by class name (botocore and urllib3 are not imported here): ``ClientError`` codes
    (throttling → 429 retryable; ``ModelNotReadyException``/``ServiceUnavailable`` → 503 retryable;
    ``InternalFailure``/``InternalDependencyException``/``InternalStreamFailure``/other 5xx → 502
    retryable; ``ModelError``/``ModelStreamError`` → 502; ``ValidationError`` and access errors → 502),
    read timeouts → 504, connection failures (connect timeout, refused, closed, dropped mid-body,
    corrupt event stream) → 502 retryable.
    """
    if isinstance(exc, UpstreamError):
        return exc
    names = {cls.__name__ for cls in type(exc).__mro__}
    response = getattr(exc, "response", None)
    if "ClientError" in names and isinstance(response, Mapping):
        error = response.get("Error") or {}
        code = str(error.get("Code") or "Unknown")
        message = _one_line(error.get("Message") or code)
        http = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if code in _THROTTLING_CODES:
            return UpstreamError(429, "throttled", f"the endpoint is throttling requests: {message}",
                                 retryable=True, upstream_code=code)
        if code == "ModelNotReadyException":
            return UpstreamError(503, "model_not_ready", f"the model is not ready: {message}", retryable=True,
                                 upstream_code=code)
        if code == "ServiceUnavailable":
            return UpstreamError(503, "upstream_unavailable", f"the endpoint is unavailable: {message}",
                                 retryable=True, upstream_code=code)
        if code == "ModelError":
            original = response.get("OriginalStatusCode")
            detail = f" (the model answered {original})" if isinstance(original, int) else ""
            return UpstreamError(502, "model_error", f"the model failed the request{detail}: {message}",
                                 upstream_code=code)
        if code == "ModelStreamError":
            return UpstreamError(502, "model_stream_error", f"the model's stream failed: {message}",
                                 upstream_code=code)
        if code == "InternalStreamFailure":
            return UpstreamError(502, "stream_failure", f"the endpoint's stream failed: {message}", retryable=True,
                                 upstream_code=code)
        if code in ("InternalFailure", "InternalDependencyException", "InternalServerError", "ServiceFailure") or (
            isinstance(http, int) and http >= 500
        ):
            return UpstreamError(502, "upstream_error", f"the endpoint failed: {code}: {message}", retryable=True,
                                 upstream_code=code)
        if code in _DENIED_CODES:
            return UpstreamError(502, "upstream_denied", f"the front door may not invoke the endpoint: {code}",
                                 upstream_code=code)
        return UpstreamError(502, "upstream_rejected", f"the endpoint rejected the request: {code}: {message}",
                             upstream_code=code)
    if "ReadTimeoutError" in names or "ReadTimeout" in names:
        return UpstreamError(504, "timeout", "the model did not answer in time (read timeout)")
    if names & {"ConnectTimeoutError", "EndpointConnectionError", "ConnectionClosedError", "ProtocolError",
                "ConnectionError", "ParserError", "IncompleteRead", "ChecksumMismatch"}:
        return UpstreamError(502, "upstream_connection",
                             f"the connection to the endpoint failed: {type(exc).__name__}", retryable=True)
    if isinstance(exc, TimeoutError):
        return UpstreamError(504, "timeout", "the model did not answer in time")
    return UpstreamError(500, "internal", f"internal error calling the endpoint: {type(exc).__name__}")


# --------------------------------------------------------------------------------------------------
# Telemetry
# --------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class RequestRecord:
    """Everything measured about one request; becomes one EMF document and one log line.

    ``sent``: the request went to the endpoint. ``origin``: ``"client"`` (rejected here, 4xx),
    ``"upstream"`` (the endpoint failed it), ``"internal"``, or None. Everything but ``arrival_ms`` is
    optional (None, or ``()``/``False``/``0`` for ``block_hashes``/``sent``/``attempts``).
    """

    arrival_ms: int
    request_id: str | None = None
    tenant: str | None = None
    application: str | None = None
    routing_id: str | None = None
    body_kind: str | None = None
    fingerprint: str | None = None
    block_hashes: tuple[str, ...] = ()
    body_bytes: int | None = None
    normalize_ms: float | None = None
    sent: bool = False
    attempts: int = 0
    ttft_ms: float | None = None
    total_ms: float | None = None
    wall_ms: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    status: int | None = None
    error_kind: str | None = None
    error_field: str | None = None
    origin: str | None = None


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


_SAFE_FIELD_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.[]-")


def _loggable_field(field_path: str | None) -> str | None:
    """A field path for the log only if it is made of plain names and indexes: object keys are the
    client's data (a key could be anything, even prompt text), and no client text goes to the log."""
    if field_path is None:
        return None
    if len(field_path) <= 80 and all(c in _SAFE_FIELD_CHARS for c in field_path):
        return field_path
    return "(redacted)"


def log_record(record: RequestRecord, config: InvokeConfig) -> dict[str, Any]:
    """The request log line (a JSON object with the :class:`telemetry.LogField` fields)."""
    F = telemetry.LogField
    settings = config.settings
    return {
        F.MESSAGE: telemetry.REQUEST_LOG_MESSAGE,
        F.TIMESTAMP_MS: record.arrival_ms,
        LOG_REQUEST_ID: record.request_id,
        F.TENANT: record.tenant,
        LOG_APPLICATION: record.application,
        F.ROUTING_ID: record.routing_id,
        F.COMPONENT: config.metric_component,
        LOG_BODY_KIND: record.body_kind,
        F.PREFIX_FINGERPRINT: record.fingerprint,
        F.PREFIX_LENGTH: settings.prefix_length,
        F.BLOCK_HASHES: list(record.block_hashes),
        F.BLOCK_BYTES: settings.block_bytes,
        F.BODY_BYTES: record.body_bytes,
        F.PROMPT_TOKENS: record.prompt_tokens,
        F.CACHED_TOKENS: record.cached_tokens,
        F.OUTPUT_TOKENS: record.output_tokens,
        F.TTFT_MS: _ms(record.ttft_ms),
        F.TOTAL_MS: _ms(record.total_ms),
        F.NORMALIZE_MS: _ms(record.normalize_ms),
        LOG_WALL_MS: _ms(record.wall_ms),
        LOG_ATTEMPTS: record.attempts,
        F.STATUS: record.status,
        F.ERROR_KIND: record.error_kind,
        LOG_ERROR_FIELD: _loggable_field(record.error_field),
    }


def _metric_values(record: RequestRecord) -> list[tuple[telemetry.MetricSpec, float]]:
    values: list[tuple[telemetry.MetricSpec, float]] = [
        (telemetry.REQUESTS, 1.0 if record.sent else 0.0),
        (telemetry.CLIENT_ERRORS, 1.0 if record.origin == "client" else 0.0),
        (telemetry.UPSTREAM_ERRORS, 1.0 if record.origin == "upstream" else 0.0),
    ]
    optional = (
        (telemetry.TTFT, record.ttft_ms),
        (telemetry.END_TO_END, record.total_ms),
        (telemetry.NORMALIZATION_TIME, record.normalize_ms),
        (telemetry.PROMPT_TOKENS, record.prompt_tokens),
        (telemetry.CACHED_TOKENS, record.cached_tokens),
    )
    values.extend((spec, float(value)) for spec, value in optional if value is not None)
    return values


def emf_document(record: RequestRecord, config: InvokeConfig, timestamp_ms: int | None = None) -> dict[str, Any]:
    """The request's metrics as one CloudWatch Embedded Metric Format document, serialized by
    Powertools' EMF provider (what ``Metrics`` flushes), written through our own emitter.

    Namespace :data:`telemetry.NAMESPACE`, exactly one dimension set ``[["InferenceComponent"]]``: the
    stacks' alarms and dashboards use exactly this one, so ``POWERTOOLS_SERVICE_NAME`` must stay
    unset (Powertools would add a ``service`` dimension; the normalizer stack never sets it). Every
    metric is high resolution (``StorageResolution: 1``) with its unit from :mod:`telemetry`.
    A fresh provider per request: Powertools' ``Metrics`` keeps shared state across instances.

    Powertools is imported here, at the first request's end, not with the module: the document is
    written after the answer has streamed, so its import (about a quarter of boto3's) stays off the
    cold start's path to the first token (``bench/bench_handler_import.py``).
    """
    from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider

    provider = AmazonCloudWatchEMFProvider(namespace=telemetry.NAMESPACE)
    provider.add_dimension(name=telemetry.DIMENSION_COMPONENT, value=config.metric_component)
    for spec, value in _metric_values(record):
        provider.add_metric(name=spec.name, unit=spec.unit, value=value, resolution=HIGH_RESOLUTION)
    if timestamp_ms is not None:
        provider.set_timestamp(timestamp_ms)
    return provider.serialize_metric_set()


HIGH_RESOLUTION: Final = 1  # seconds: MetricResolution.High

_OUTPUT_LOCK: Final = threading.Lock()


def _stdout_line(line: str) -> None:
    with _OUTPUT_LOCK:  # one write per line: concurrent requests never interleave within a line
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Telemetry:
    """Writes each request's EMF document and log line (standard output → CloudWatch Logs in Lambda)."""

    def __init__(self, config: InvokeConfig, emit: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.emit = emit or _stdout_line

    def publish(self, record: RequestRecord) -> None:
        compact = {"separators": (",", ":"), "ensure_ascii": False}
        self.emit(json.dumps(emf_document(record, self.config), **compact))
        self.emit(json.dumps(log_record(record, self.config), **compact))


# --------------------------------------------------------------------------------------------------
# The exchange
# --------------------------------------------------------------------------------------------------


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


def _in_band_error(fmt: str | None, error: UpstreamError, last_byte: bytes) -> bytes:
    """The error event appended to a stream whose 200 head was already sent."""
    payload = _json_bytes({"error": {"message": error.message, "type": error.kind, "code": error.status}})
    if fmt == "sse" or fmt is None:
        separator = b"" if last_byte == b"\n\n" else b"\n" if last_byte.endswith(b"\n") else b"\n\n"
        return separator + b"data: " + payload + b"\n\n"
    return (b"" if last_byte.endswith(b"\n") else b"\n") + payload + b"\n"


class _State:
    """Where an exchange is: what was opened and sent, and whether its telemetry is written."""

    __slots__ = ("opened", "reader", "head_sent", "concluded")

    def __init__(self) -> None:
        self.opened: _Opened | None = None
        self.reader: StreamReader | None = None
        self.head_sent = False
        self.concluded = False


class _Opened:
    __slots__ = ("response", "events", "first", "started", "first_at", "content_type")

    def __init__(self, response, events, first, started, first_at, content_type):
        self.response = response
        self.events = events
        self.first = first
        self.started = started
        self.first_at = first_at
        self.content_type = content_type


def _close_body(response: Any) -> None:
    body = response.get("Body") if isinstance(response, Mapping) else None
    close = getattr(body, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - best effort
            pass


def _jitter() -> float:
    return int.from_bytes(os.urandom(4), "big") / 2**32  # no need to import random for this


def _payload_chunks(events: Iterator[Any]) -> Iterator[bytes]:
    """The bytes of each ``PayloadPart`` (empty parts skipped); other events are ignored."""
    for event in events:
        part = event.get("PayloadPart") if isinstance(event, Mapping) else None
        if isinstance(part, Mapping):
            data = part.get("Bytes")
            if data:
                yield bytes(data)


class Invoker:
    """The front door: :meth:`stream` for the Function URL, :meth:`buffered` for direct invocations.

    ``client`` is a boto3 ``sagemaker-runtime`` client (create it with botocore retries off:
    ``Config(retries={"total_max_attempts": 1})``; the invoker retries itself, before the first byte
    only). ``key`` is the tenant HMAC key. ``sleep`` and ``jitter`` (a number in [0, 1) per backoff)
    are for tests.
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
    ) -> None:
        self.client = client
        self.config = config
        self.key = key
        self.telemetry = telemetry_sink or Telemetry(config, emit)
        self.sleep = sleep
        self.clock = time.monotonic  # FrontRequest.arrival and deadlines are on this clock
        self.jitter = jitter or _jitter

    # -- helpers
    def _deadline(self, request: FrontRequest) -> float:
        deadline = request.arrival + self.config.request_timeout_s
        if request.deadline is not None:
            deadline = min(deadline, request.deadline)
        return deadline

    def _backoff(self, attempt: int) -> float:
        ceiling = min(self.config.backoff_max_s, self.config.backoff_base_s * (2 ** (attempt - 1)))
        return ceiling * (0.5 + 0.5 * self.jitter())  # "equal jitter": never less than half

    def params(self, prepared: Prepared) -> dict[str, Any]:
        """The exact ``InvokeEndpointWithResponseStream`` parameters of a prepared request."""
        params: dict[str, Any] = {"EndpointName": self.config.endpoint_name}
        if self.config.component_name:
            params["InferenceComponentName"] = self.config.component_name
        params["PrefixAwareId"] = prepared.identity.prefix_aware_id
        params["ContentType"] = "application/json"
        params["Body"] = prepared.normalized.body
        return params

    def _open(self, prepared: Prepared, record: RequestRecord, deadline: float) -> _Opened:
        """Call the endpoint until the first payload part arrives; retries what is retryable."""
        params = self.params(prepared)
        attempt = 0
        while True:
            attempt += 1
            record.attempts = attempt
            started = self.clock()
            response = None
            try:
                response = self.client.invoke_endpoint_with_response_stream(**params)
                events = _payload_chunks(iter(response["Body"]))
                first = next(events, None)
                if first is None:
                    raise UpstreamError(502, "truncated", "the model's stream ended before any output")
                content_type = response.get("ContentType") or "application/octet-stream"
                return _Opened(response, events, first, started, self.clock(), content_type)
            except Exception as exc:  # noqa: BLE001 - classified below
                if response is not None:
                    _close_body(response)
                error = classify_error(exc)
                if error.kind == "internal":
                    raise error from exc
                now = self.clock()
                if not error.retryable or attempt >= self.config.max_attempts:
                    raise error from None
                delay = self._backoff(attempt)
                if now + delay >= deadline:
                    raise error from None
                self.sleep(delay)

    # -- the streaming interface
    def stream(self, request: FrontRequest, *, collect: bool = False) -> Iterator[Head | bytes | Outcome]:
        """Yield a :class:`Head`, the answer's bytes as they arrive, then an :class:`Outcome`.

        The request's metrics and log line are written before the :class:`Outcome` is yielded. Close
        the generator (``.close()``) if the caller goes away mid-answer: the upstream stream is closed
        and the request is logged with status 499 (``client_closed``).
        """
        record = RequestRecord(arrival_ms=request.arrival_ms, request_id=request.request_id)
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
                yield Head(500, dict(JSON_HEADERS))
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
            _close_body(state.opened.response)
        record.wall_ms = (self.clock() - request.arrival) * 1000.0
        if record.status is None:
            record.status = 500
        self.telemetry.publish(record)

    def _exchange(self, request: FrontRequest, record: RequestRecord, state: _State,
                  collect: bool) -> Iterator[Head | bytes | Outcome]:
        try:
            prepared = prepare(request, self.config, self.key)
        except RequestError as error:
            record.normalize_ms = error.normalize_ms
            record.status, record.error_kind, record.error_field = error.status, error.code, error.field
            record.origin = "client"
            headers = dict(JSON_HEADERS)
            if error.status == 405:
                headers["allow"] = "POST"
            state.head_sent = True
            yield Head(error.status, headers)
            yield _json_bytes(error.body())
            self._conclude(request, record, state)
            yield Outcome(error.status, error.body()["error"], record)
            return
        record.tenant, record.application = prepared.tenant, prepared.application
        record.routing_id = prepared.identity.prefix_aware_id
        record.body_kind = prepared.normalized.kind
        record.fingerprint = prepared.normalized.prefix_fingerprint
        record.block_hashes = prepared.normalized.block_hashes
        record.body_bytes = len(prepared.normalized.body)
        record.normalize_ms = prepared.normalize_ms
        deadline = self._deadline(request)
        record.sent = True
        try:
            opened = state.opened = self._open(prepared, record, deadline)
        except UpstreamError as error:
            record.status, record.error_kind = error.status, error.kind
            record.origin = "internal" if error.kind == "internal" else "upstream"
            headers = dict(JSON_HEADERS)
            if error.status == 429:
                headers["retry-after"] = str(max(1, math.ceil(self.config.backoff_max_s)))
            body = error.body(record.attempts)
            state.head_sent = True
            yield Head(error.status, headers)
            yield _json_bytes(body)
            self._conclude(request, record, state)
            yield Outcome(error.status, body["error"], record)
            return
        record.ttft_ms = (opened.first_at - opened.started) * 1000.0
        reader = state.reader = StreamReader(expects_usage=prepared.expects_usage, collect=collect)
        headers = {
            "content-type": opened.content_type,
            "cache-control": "no-cache",
            "x-prefix-aware-id": prepared.identity.prefix_aware_id,
            "x-prefix-fingerprint": prepared.normalized.prefix_fingerprint,
        }
        record.status = 200
        state.head_sent = True
        yield Head(200, headers)
        failure: UpstreamError | None = None
        last = opened.first[-2:]
        reader.feed(opened.first)
        yield opened.first
        try:
            for chunk in opened.events:
                reader.feed(chunk)
                last = (last + chunk)[-2:]
                yield chunk
                if self.clock() > deadline:
                    failure = UpstreamError(504, "timeout", "the answer took longer than the front door's limit "
                                            f"of {self.config.request_timeout_s:g} s")
                    break
        except Exception as exc:  # noqa: BLE001 - a mid-stream failure (GeneratorExit is not an Exception)
            failure = classify_error(exc)
        record.total_ms = (self.clock() - opened.started) * 1000.0
        reader.finish()
        record.prompt_tokens, record.cached_tokens = reader.prompt_tokens, reader.cached_tokens
        record.output_tokens = reader.completion_tokens
        reported_by_model = False
        if failure is None and reader.error is not None:
            detail = reader.error.get("message") if isinstance(reader.error, Mapping) else reader.error
            failure = UpstreamError(502, "model_stream_error",
                                    f"the model reported an error mid-stream: {_one_line(detail, 200)}")
            reported_by_model = True  # the caller already has the model's own error event
        if failure is None and not reader.complete:
            failure = UpstreamError(502, "truncated", "the model's answer ended before its final chunk "
                                    "(truncated): do not use it as complete")
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

    # -- the buffered interface
    def buffered(self, request: FrontRequest) -> Buffered:
        """The whole answer as one JSON object (for direct invocations and buffered HTTP events).

        Success: the model's own JSON document if it answered with one, else the streamed chunks
        assembled (``choices[].text``, ``finish_reason``, ``usage``). Failure: ``{"error": {...}}``,
        plus ``partial`` (what arrived) if the stream failed after it began.
        """
        head: Head | None = None
        for item in self.stream(request, collect=True):
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
