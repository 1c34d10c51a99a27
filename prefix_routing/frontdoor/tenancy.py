"""Who is calling: the tenant by the configured tenancy mode (IAM principal, trusted header, or shared)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from prefix_routing.frontdoor.config import SHARED_TENANT, InvokeConfig
from prefix_routing.frontdoor.request import FrontRequest, RequestError


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


#: The error code of a direct invocation refused under the ``iam`` or ``header`` tenancy.
DIRECT_INVOCATION_REFUSED: Final = "direct_invocation_refused"
_MAX_HEADER_VALUE: Final = 128
_TENANT_CHARS: Final = frozenset(chr(c) for c in range(0x21, 0x7F))  # printable ASCII, no space
_APPLICATION_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-/")
_TENANT_ALLOWED: Final = "1-128 printable ASCII characters without spaces"
_APPLICATION_ALLOWED: Final = "1-64 characters among letters, digits and . _ : - /"


def check_way_in(request: FrontRequest, config: InvokeConfig) -> None:
    """Refuse a direct invocation (403) unless the tenancy is ``none`` or the stage allows them.

    A direct invocation's event is whatever the caller wrote: its ``tenant`` would let anyone who may
    invoke the function take another tenant's routing id, cache salt, log lines and metrics. Checked
    before anything else of the request, so a refused caller learns nothing about its event.
    """
    if request.source == "direct" and config.tenancy != "none" and not config.allow_direct_invoke:
        raise RequestError(403, DIRECT_INVOCATION_REFUSED,
                           "direct invocations are refused: call the function's URL (signed with SigV4), which "
                           "identifies the caller; a stage that trusts every direct caller with the tenant it "
                           "names sets normalizer.allow_direct_invoke", "event")


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
