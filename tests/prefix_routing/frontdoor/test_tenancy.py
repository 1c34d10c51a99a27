"""Who is calling: tenants by tenancy mode (prefix_routing.frontdoor.tenancy)."""

from __future__ import annotations

import json

import pytest
from prefix_routing import frontdoor
from tests.prefix_routing.frontdoor.conftest import BODY, CHAT, ROLE_ARN, ROLE_TENANT, config, url_event


@pytest.mark.parametrize(
    ("arn", "caller", "account", "tenant"),
    [
        (ROLE_ARN, None, None, ROLE_TENANT),
        ("arn:aws:sts::111122223333:assumed-role/ChatApp/another-session", None, None, ROLE_TENANT),
        ("arn:aws-cn:sts::111122223333:assumed-role/R/s", None, None, "arn:aws-cn:iam::111122223333:role/R"),
        ("arn:aws:iam::111122223333:user/dev/alice", None, None, "arn:aws:iam::111122223333:user/dev/alice"),
        ("arn:aws:iam::111122223333:root", None, None, "arn:aws:iam::111122223333:root"),
        (None, "AROAEXAMPLE:session", None, "AROAEXAMPLE"),
        (None, "AIDAEXAMPLE", None, "AIDAEXAMPLE"),
        (None, None, "111122223333", "account:111122223333"),
        (None, None, None, None),
        ("", "", "", None),
    ],
)
def test_principal_tenant(arn, caller, account, tenant):
    assert frontdoor.principal_tenant(arn, caller, account) == tenant


def test_iam_tenant_from_function_url_and_rest_api_contexts():
    cfg = config()
    request = frontdoor.request_from_event(url_event())
    assert frontdoor.identify_tenant(request, cfg) == (ROLE_TENANT, None)
    rest = {"httpMethod": "POST", "headers": {"Content-Type": "application/json"}, "body": BODY.decode(),
            "requestContext": {"requestId": "r", "identity": {
                "userArn": "arn:aws:iam::111122223333:user/bob", "caller": "AIDABOB", "accountId": "111122223333"}}}
    request = frontdoor.request_from_event(rest)
    assert request.source == "http" and request.headers["content-type"] == "application/json"
    assert frontdoor.identify_tenant(request, cfg) == ("arn:aws:iam::111122223333:user/bob", None)


def test_missing_iam_identity_is_401():
    event = url_event()
    del event["requestContext"]["authorizer"]
    with pytest.raises(frontdoor.RequestError) as caught:
        frontdoor.identify_tenant(frontdoor.request_from_event(event), config())
    assert caught.value.status == 401 and caught.value.code == "unauthenticated"


def test_header_tenancy_and_application_header():
    cfg = config(tenancy="header", tenant_header="X-Tenant-Id")
    request = frontdoor.request_from_event(url_event(headers={"X-Tenant-Id": "acme", "x-application-id": "support-bot"}))
    assert frontdoor.identify_tenant(request, cfg) == ("acme", "support-bot")
    for headers, code in (({}, "missing_tenant"), ({"x-tenant-id": "a b"}, "invalid_tenant"),
                          ({"x-tenant-id": "t" * 129}, "invalid_tenant"),
                          ({"x-tenant-id": "acme", "x-application-id": "bad app!"}, "invalid_application")):
        with pytest.raises(frontdoor.RequestError) as caught:
            frontdoor.identify_tenant(frontdoor.request_from_event(url_event(headers=headers)), cfg)
        assert caught.value.status == 400 and caught.value.code == code
        assert caught.value.message  # names the problem


def test_none_tenancy_shares_one_tenant_and_direct_invocations_name_theirs():
    assert frontdoor.identify_tenant(frontdoor.request_from_event(url_event()), config(tenancy="none")) == (
        frontdoor.SHARED_TENANT, None)
    direct = frontdoor.request_from_event({"body": CHAT, "tenant": "acme", "application": "bot"})
    assert direct.source == "direct"
    assert frontdoor.identify_tenant(direct, config()) == ("acme", "bot")
    with pytest.raises(frontdoor.RequestError, match="tenant") as caught:
        frontdoor.identify_tenant(frontdoor.request_from_event({"body": CHAT}), config())
    assert caught.value.code == "missing_tenant"
    assert frontdoor.identify_tenant(frontdoor.request_from_event({"body": CHAT}), config(tenancy="none"))[0] == "shared"


def test_a_direct_invocation_shaped_like_the_urls_cannot_be_told_from_it_which_is_why_iam_is_the_wall():
    """What the function cannot tell (docs/normalizer-lambda.md, "One way in"): a direct lambda:Invoke whose
    event copies a Function URL event's shape, request context and IAM identity included, is the same
    event as the URL's own, so it is served as the tenant it names. Only IAM keeps it out: tenants get
    lambda:InvokeFunction only with lambda:InvokedViaFunctionUrl (TenantInvokePolicy), which verify checks."""
    from prefix_routing.frontdoor.tenancy import check_way_in

    victim = "arn:aws:iam::111122223333:role/victim"
    real = frontdoor.request_from_event(url_event(user_arn=victim))
    forged = frontdoor.request_from_event(json.loads(json.dumps(url_event(user_arn=victim))))  # written by hand
    check_way_in(forged, config())  # not refused: nothing in it says it did not come through the URL
    assert forged.source == real.source == "http"
    assert frontdoor.identify_tenant(forged, config()) == frontdoor.identify_tenant(real, config()) == (victim, None)


def test_a_direct_invocation_is_refused_with_how_to_call_unless_tenancy_is_none_or_the_stage_allows_it():
    # docs/normalizer-lambda.md: 403 direct_invocation_refused under the iam or header tenancy, unless
    # normalizer.allow_direct_invoke; the answer says to call the Function URL.
    from prefix_routing.frontdoor.tenancy import check_way_in

    direct = frontdoor.request_from_event({"body": CHAT, "tenant": "acme"})
    for tenancy in ("iam", "header"):
        with pytest.raises(frontdoor.RequestError) as refused:
            check_way_in(direct, config(tenancy=tenancy))
        error = refused.value
        assert (error.status, error.code, error.field) == (403, "direct_invocation_refused", "event")
        assert error.message.startswith("direct invocations are refused: call the function's URL (signed with SigV4)")
        assert error.message.endswith("sets normalizer.allow_direct_invoke")
        check_way_in(direct, config(tenancy=tenancy, allow_direct_invoke=True))
    check_way_in(direct, config(tenancy="none"))
