"""The normalizer front door's logic: who is calling, is the body acceptable, call the endpoint, measure.

The Lambda handler (``lambda/normalizer/``) is thin: it turns a Lambda event or an HTTP request into
a :class:`FrontRequest` and hands it to an :class:`Invoker`; everything else is here, as plain
functions and small classes that tests call directly. Importing it imports only the standard library
and :mod:`prefix_routing.rules`
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

   Direct invocations (``lambda:InvokeFunction`` without the URL) name their tenant in the event's
   ``tenant`` field, which any caller could fill with another tenant's: under ``iam`` and ``header``
   they are refused with 403 (:func:`~prefix_routing.frontdoor.tenancy.check_way_in`) unless
   :attr:`InvokeConfig.allow_direct_invoke`. An optional application (header :attr:`InvokeConfig.application_header`,
   or the event's ``application``) splits one tenant's traffic further; it can never reach another
   tenant's routing id, because the tenant is part of the keyed hash.

2. **Validation and normalization** (:func:`prepare`): the body (UTF-8, JSON, at most 6 MiB, nesting
   depth, required fields) is checked by :func:`prefix_routing.rules.normalize_body`, which also
   gives the canonical bytes, the prefix fingerprint and the block hashes; the tenant's
   ``PrefixAwareId`` and ``cache_salt`` come from :func:`prefix_routing.rules.routing_identity`
   with the tenant key (a secret, never logged); a client's own ``cache_salt`` is replaced (chat,
   completion) or removed (LMI). Any problem is a :class:`RequestError`: HTTP 400 (401 for a missing
   IAM identity, 403 for a refused direct invocation, 405 for a method other than POST) with a JSON body
   ``{"error": {"code", "field", "message", "status"}}`` that names it.
   With :attr:`InvokeConfig.stream_usage` (the default), a chat or completion body that streams
   (``"stream": true``) and does not say ``stream_options.include_usage`` gets
   ``"include_usage": true`` there, so that vLLM reports token usage (and cached tokens) in a last
   chunk with empty ``choices``, as OpenAI documents it; the canonical bytes are computed after that.

3. **The call** (:meth:`Invoker.stream`): ``InvokeEndpointWithResponseStream`` with ``EndpointName``,
   ``InferenceComponentName``, ``PrefixAwareId``, ``ContentType="application/json"`` and the canonical
   ``Body``. With hot-prefix replication (:attr:`InvokeConfig.replication`, the stage's
   ``normalizer.replication``) the ``PrefixAwareId`` is that of a replica: :class:`Replicas` counts
   the request under the tenant's ``PrefixAwareId`` and prefix fingerprint, and replica j > 0 of a
   prefix that takes more than ``target_share_factor`` fair shares (1/copies) of recent requests goes
   out as ``<id>-r<j>`` (:mod:`prefix_routing.rules.replication`); off, the tenant's id. Throttling and transient errors (see :func:`classify_error`) are retried with bounded,
   jittered exponential backoff, but only until the first ``PayloadPart`` has arrived, that is before
   anything was sent to the caller; the overall deadline is never overrun by a backoff sleep.
   Persistent throttling answers 429 (with ``Retry-After``), an unavailable endpoint 503, a
   container's own 4xx that 4xx (``model_rejected``, the caller's mistake), other
   ``ModelError``/``ModelStreamError``/upstream failures 502, timeouts 504, each with a JSON error
   that says what happened.

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
   :data:`telemetry.NAMESPACE`, one dimension ``InferenceComponent``, high resolution) with TTFT (from
   the arrival to the first bytes handed to the client's socket), end-to-end latency (to the last), prompt and cached tokens,
   normalization time and the request/error counters (with replication: ``ReplicatedRequests`` and
   the ``HotPrefixes`` gauge), and one JSON log line with the :class:`telemetry.LogField` fields
   (tenant, routing id, fingerprint, block hashes, lengths, timings, status; with replication the
   :class:`telemetry.ReplicaLogField` fields too; never prompt text, never the key).

The modules, in the order of a request: :mod:`.config` (:class:`InvokeConfig`, the tenant key),
:mod:`.request` (:class:`FrontRequest`, :class:`RequestError`), :mod:`.tenancy`, :mod:`.prepare`,
:mod:`.replicas` (hot-prefix replication), :mod:`.steering` (its shared state), :mod:`.upstream` (the call and its retries),
:mod:`.upstream_errors` (:func:`classify_error`), :mod:`.stream` (:class:`StreamReader`),
:mod:`.record` (the log line and EMF document), :mod:`.copies` (the copy counts) and
:mod:`.invoker` (:class:`Invoker`, which puts them together), :mod:`.webapp` (the HTTP server the
Lambda Web Adapter talks to); for callers and local use :mod:`.sigv4` (SigV4 for the Function URL as
an ``httpx`` auth) and :mod:`.local` (the front door on 127.0.0.1). This package imports only
:mod:`prefix_routing.rules` of ours (and boto3's client is passed in).
"""

from prefix_routing.frontdoor.config import (
    JSON_HEADERS,
    SHARED_TENANT,
    TENANCY_MODES,
    ConfigurationError,
    InvokeConfig,
    load_tenant_key,
)
from prefix_routing.frontdoor.copies import CopyCounts
from prefix_routing.frontdoor.invoker import Buffered, Head, Invoker, Outcome, decode_direct_payload
from prefix_routing.frontdoor.limiter import Admission, DynamoLimitStore, Limiter, LimitsUnavailable, Throttled
from prefix_routing.frontdoor.prepare import Prepared, prepare
from prefix_routing.frontdoor.record import RequestRecord, Telemetry, emf_document, log_record
from prefix_routing.frontdoor.replicas import Replicas
from prefix_routing.frontdoor.steering_store import DynamoSteeringStore, Steering
from prefix_routing.frontdoor.request import FrontRequest, RequestError, request_from_event, request_from_http
from prefix_routing.frontdoor.stream import StreamReader
from prefix_routing.frontdoor.tenancy import identify_tenant, principal_tenant
from prefix_routing.frontdoor.upstream import Upstream
from prefix_routing.frontdoor.upstream_errors import UpstreamError, classify_error
from prefix_routing.rules import MAX_BODY_BYTES_LIMIT  # for the web app's request size check

__all__ = [
    "Admission",
    "DynamoLimitStore",
    "Limiter",
    "LimitsUnavailable",
    "Throttled",
    "JSON_HEADERS",
    "MAX_BODY_BYTES_LIMIT",
    "SHARED_TENANT",
    "TENANCY_MODES",
    "Buffered",
    "ConfigurationError",
    "CopyCounts",
    "FrontRequest",
    "Head",
    "InvokeConfig",
    "Invoker",
    "Outcome",
    "Prepared",
    "RequestError",
    "Replicas",
    "DynamoSteeringStore",
    "Steering",
    "RequestRecord",
    "StreamReader",
    "Telemetry",
    "Upstream",
    "UpstreamError",
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
