"""Validation and normalization of one request: the canonical body and the tenant's routing identity."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from prefix_routing.frontdoor.config import InvokeConfig
from prefix_routing.frontdoor.request import FrontRequest, RequestError
from prefix_routing.frontdoor.tenancy import check_way_in, identify_tenant
from prefix_routing.rules.body import Normalized, normalize_body
from prefix_routing.rules.errors import NormalizationError
from prefix_routing.rules.identity import RoutingIdentity, routing_identity
from prefix_routing.rules.stream_usage import usage_request, with_include_usage


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
    #: The raw body's first PrefixLength bytes differ from the normalized body's: without the front
    #: door, routing would have keyed this request elsewhere (``RekeyedRequests``).
    rekeyed: bool = False
    #: With trust domains: the tenant's domain and the component that serves it.
    domain: str | None = None
    component: str | None = None


def _wants_usage(normalized: Normalized) -> tuple[bool, bool]:
    """(the body streams and asks for usage, the body streams without saying) for chat/completion."""
    if normalized.kind == "lmi" or b'"stream":true' not in normalized.body:
        return False, False
    return usage_request(json.loads(normalized.body))


def prepare(request: FrontRequest, config: InvokeConfig, key: bytes) -> Prepared:
    """Identify the tenant, validate and normalize the body; raises :class:`RequestError` (4xx).

    The normalization time covers parsing, validation and canonical serialization.
    """
    check_way_in(request, config)
    if request.problem is not None:
        raise request.problem
    if request.source == "http" and request.method != "POST":
        raise RequestError(405, "method_not_allowed", f"method {request.method[:16]}: only POST is accepted",
                           "method")
    tenant, application = identify_tenant(request, config)
    domain = component = None
    if config.domains is not None:
        domain = config.domains.domain_for(tenant)
        if domain is None:
            raise RequestError(403, "unknown_tenant", "this caller is in no trust domain of this deployment, which "
                               "refuses tenants its stage does not name", "tenant")
        component = config.domains.component_of(domain)
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
                data = with_include_usage(json.loads(normalized.body))
                normalized = normalize_body(data, config.settings, identity=identity)
                expects_usage = True
        elif normalized.kind != "lmi" and b'"include_usage":true' in normalized.body:
            expects_usage = _wants_usage(normalized)[0]
    except NormalizationError as error:
        rejected = RequestError(400, error.code, str(error), error.field)
        rejected.normalize_ms = (time.perf_counter() - started) * 1000.0
        raise rejected from None
    normalize_ms = (time.perf_counter() - started) * 1000.0
    rekeyed = _rekeyed(_raw_bytes(request.body), normalized.body, identity, config.settings.prefix_length)
    return Prepared(tenant, application, identity, normalized, normalize_ms, expects_usage, rekeyed, domain, component)


def _rekeyed(raw: bytes, canonical: bytes, identity: RoutingIdentity, length: int) -> bool:
    """Whether the client's own bytes would have keyed routing differently from their canonical
    form. The tenant's ``cache_salt``, which the front door itself puts first, is left out of the
    comparison: it is ours, not the client's (every unsalted body would otherwise count)."""
    salt = b'{"cache_salt":' + json.dumps(identity.cache_salt).encode() + b","
    if canonical.startswith(salt) and not raw.startswith(salt):
        canonical = b"{" + canonical[len(salt):]
    return raw[:length] != canonical[:length]


def _raw_bytes(body) -> bytes:
    """The bytes a client would have sent SageMaker: the body as received, or for a direct
    invocation's JSON value what ``json.dumps`` makes of it (what a Python client sends)."""
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8", "surrogatepass")
    try:
        return json.dumps(body).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError):
        return b""
