"""Validation and normalization of one request, and its routing identity (prefix_routing.frontdoor.prepare)."""

from __future__ import annotations

import json
import pytest
from prefix_routing import frontdoor
from prefix_routing.rules.identity import routing_identity
from tests.prefix_routing.frontdoor.conftest import CHAT, KEY, ROLE_ARN, ROLE_TENANT, FakeRuntime, config, url_event


def test_prepare_derives_the_tenant_identity_and_salts_the_body():
    prepared = frontdoor.prepare(frontdoor.request_from_event(url_event()), config(), KEY)
    expected = routing_identity(ROLE_TENANT, None, KEY)
    assert prepared.identity == expected
    assert prepared.normalized.body.startswith(b'{"cache_salt":"' + expected.cache_salt.encode() + b'","messages":')
    assert prepared.tenant == ROLE_TENANT and prepared.normalize_ms >= 0 and not prepared.expects_usage


def test_tenants_never_share_routing_ids_sessions_of_one_role_do():
    cfg = config()
    ids = {}
    for arn in (ROLE_ARN, "arn:aws:sts::111122223333:assumed-role/ChatApp/other-session",
                "arn:aws:sts::111122223333:assumed-role/OtherApp/session-1",
                "arn:aws:sts::999988887777:assumed-role/ChatApp/session-1"):
        prepared = frontdoor.prepare(frontdoor.request_from_event(url_event(user_arn=arn)), cfg, KEY)
        ids[arn] = (prepared.identity.prefix_aware_id, prepared.normalized.body[:60])
    values = list(ids.values())
    assert values[0] == values[1]  # one role, two sessions: one tenant
    assert len({v[0] for v in values[1:]}) == 3 and len({v[1] for v in values[1:]}) == 3


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        (b"", "empty", "body"),
        (b"\xff\xfe{}", "invalid_utf8", "body"),
        (b'{"messages": [', "invalid_json", "body"),
        (b"[1, 2]", "not_object", "body"),
        (b'{"temperature": 1}', "missing_field", "body"),
        (b'{"messages": [{"role": "user"}]}', "missing_field", "messages[0].content"),
        (b'{"messages": "hi"}', "invalid_field", "messages"),
        (b'{"messages": [], "messages": []}', "duplicate_key", "body"),
        (b'{"prompt": "x", "temperature": NaN}', "non_finite_number", "temperature"),
        (b'{"prompt": "x", "n": ' + b"[" * 80 + b"]" * 80 + b"}", "too_deep", None),
    ],
)
def test_bad_bodies_are_400_naming_the_problem(body, code, field):
    with pytest.raises(frontdoor.RequestError) as caught:
        frontdoor.prepare(frontdoor.request_from_event(url_event(body)), config(), KEY)
    error = caught.value
    assert error.status == 400 and error.code == code
    if field is not None:
        assert error.field == field
    assert error.body()["error"]["message"] and error.normalize_ms is not None


def test_body_over_6_mib_is_400_too_large():
    body = json.dumps({"prompt": "x" * (6 * 1024 * 1024)}).encode()
    with pytest.raises(frontdoor.RequestError) as caught:
        frontdoor.prepare(frontdoor.request_from_event(url_event(body)), config(), KEY)
    assert caught.value.status == 400 and caught.value.code == "too_large"


def test_methods_other_than_post_are_405():
    with pytest.raises(frontdoor.RequestError) as caught:
        frontdoor.prepare(frontdoor.request_from_event(url_event(method="GET")), config(), KEY)
    assert caught.value.status == 405 and caught.value.code == "method_not_allowed"


def test_streaming_bodies_ask_for_usage_unless_told_otherwise():
    streaming = dict(CHAT, stream=True)
    prepared = frontdoor.prepare(frontdoor.request_from_event(url_event(json.dumps(streaming))), config(), KEY)
    sent = json.loads(prepared.normalized.body)
    assert sent["stream_options"] == {"include_usage": True} and prepared.expects_usage
    assert {k: v for k, v in sent.items() if k not in ("cache_salt", "stream_options")} == streaming
    explicit = dict(streaming, stream_options={"include_usage": False})
    prepared = frontdoor.prepare(frontdoor.request_from_event(url_event(json.dumps(explicit))), config(), KEY)
    assert json.loads(prepared.normalized.body)["stream_options"] == {"include_usage": False}
    assert not prepared.expects_usage
    prepared = frontdoor.prepare(frontdoor.request_from_event(url_event(json.dumps(streaming))),
                              config(stream_usage=False), KEY)
    assert "stream_options" not in json.loads(prepared.normalized.body) and not prepared.expects_usage
    not_streaming = frontdoor.prepare(frontdoor.request_from_event(url_event()), config(), KEY)
    assert b"stream_options" not in not_streaming.normalized.body
    lmi = {"inputs": "hello", "parameters": {"max_new_tokens": 4}, "stream": True}
    prepared = frontdoor.prepare(frontdoor.request_from_event(url_event(json.dumps(lmi))), config(), KEY)
    assert b"stream_options" not in prepared.normalized.body


def test_a_body_whose_routing_bytes_the_normalizer_changes_is_rekeyed_and_a_canonical_one_is_not():
    careless = json.dumps({"temperature": 0.2, "messages": [{"content": "Be brief.", "role": "system"},
                                                             {"role": "user", "content": "hi"}]})
    first = frontdoor.prepare(frontdoor.request_from_event(url_event(careless)), config(), KEY)
    assert first.rekeyed  # key order: the raw bytes start with "temperature", the canonical with "messages"
    # The canonical body sent again (as a client that normalizes would) keys routing the same way.
    canonical = first.normalized.body
    again = frontdoor.prepare(frontdoor.request_from_event(url_event(canonical)), config(), KEY)
    assert again.normalized.body == canonical and not again.rekeyed
    # The front door's own cache_salt does not count: a canonical body without it is not re-keyed.
    salt_member = b'"cache_salt":' + json.dumps(first.identity.cache_salt).encode() + b","
    unsalted = canonical.replace(salt_member, b"", 1)
    assert unsalted != canonical
    assert not frontdoor.prepare(frontdoor.request_from_event(url_event(unsalted)), config(), KEY).rekeyed


# A client's own cache_salt never reaches the engine, whatever the body's format: chat and completion
# bodies carry the tenant's salt instead, LMI bodies (whose container takes none) carry no salt at all.
_FORGED = "another-tenants-salt"


@pytest.mark.parametrize(("body", "salt_paths"), [
    ({"cache_salt": _FORGED, "messages": CHAT["messages"]}, [("cache_salt",)]),
    ({"prompt": "Q: what is an invoice?\nA:", "cache_salt": _FORGED, "max_tokens": 4}, [("cache_salt",)]),
    ({"inputs": "Q: what is an invoice?\nA:", "cache_salt": _FORGED, "parameters": {"max_new_tokens": 4}}, []),
    ({"inputs": "Q: what is an invoice?\nA:", "parameters": {"cache_salt": _FORGED, "max_new_tokens": 4}}, []),
], ids=["chat", "completion", "lmi-top-level", "lmi-parameters"])
def test_a_clients_cache_salt_never_reaches_the_engine(body, salt_paths):
    runtime = FakeRuntime()
    invoker = frontdoor.Invoker(runtime, config(), KEY, emit=lambda line: None)
    answer = invoker.buffered(frontdoor.request_from_event(url_event(json.dumps(body).encode())))
    assert answer.status == 200
    (call,) = runtime.calls
    sent = call["Body"]
    assert _FORGED.encode() not in sent
    data = json.loads(sent)
    own = routing_identity(ROLE_TENANT, None, KEY).cache_salt
    assert [("cache_salt",)] * (data.get("cache_salt") == own) == salt_paths
    assert "cache_salt" not in data.get("parameters", {})
