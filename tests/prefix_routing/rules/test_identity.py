"""Tenant identity, fingerprints and block hashes (prefix_routing.rules.identity)."""

from __future__ import annotations

import hashlib
import os
import re

import pytest

from prefix_routing.rules.errors import NormalizationError
from prefix_routing.rules.identity import RoutingIdentity, block_hashes, prefix_fingerprint, routing_identity
from prefix_routing.rules.settings import NormalizerSettings
from prefix_routing.rules.text import normalize_text
from tests.prefix_routing.rules.conftest import DATE, KEY, chat, norm, system, user
from tests.prefix_routing.rules.test_freeze import frozen

BOTOCORE_PATTERN = re.compile(r"\A\S[\x20-\x7e]*\Z")


def test_routing_identity_shape_and_secrecy():
    identity = routing_identity("tenant-42", "chatbot", KEY)
    assert len(identity.prefix_aware_id) <= 64 and identity.prefix_aware_id.isascii()
    assert BOTOCORE_PATTERN.match(identity.prefix_aware_id) and " " not in identity.prefix_aware_id
    for secret in ("tenant-42", "chatbot", KEY.decode(), KEY.hex(), "tenant-42".encode().hex()):
        assert secret not in identity.prefix_aware_id and secret not in identity.cache_salt
    assert identity.cache_salt not in identity.prefix_aware_id
    assert routing_identity("tenant-42", "chatbot", KEY) == identity  # deterministic


def test_routing_identity_is_the_documented_hmac_construction():
    import hmac as hmac_

    def documented(tenant: str, application: str | None, key: bytes) -> tuple[str, str]:
        t = tenant.encode("utf-8")
        message = len(t).to_bytes(4, "big") + t
        if application is None:
            message += b"\x00"
        else:
            a = application.encode("utf-8")
            message += b"\x01" + len(a).to_bytes(4, "big") + a
        rid = hmac_.new(key, b"prefix_routing/prefix-aware-id/v1\x00" + message, hashlib.sha256).hexdigest()[:40]
        salt = hmac_.new(key, b"prefix_routing/cache-salt/v1\x00" + message, hashlib.sha256).hexdigest()[:32]
        return "pa-" + rid, salt

    for tenant, application in (("acme", None), ("acme", "support-bot"), ("Zoë", "écrit"), ("a" * 300, "b")):
        identity = routing_identity(tenant, application, KEY)
        assert (identity.prefix_aware_id, identity.cache_salt) == documented(tenant, application, KEY)
        assert len(identity.prefix_aware_id) == 43 and len(identity.cache_salt) == 32


def test_routing_identity_key_length_boundary_and_messages():
    assert routing_identity("t", None, b"k" * 16).prefix_aware_id.startswith("pa-")
    assert routing_identity("t", None, bytearray(b"k" * 16)) == routing_identity("t", None, memoryview(b"k" * 16))
    with pytest.raises(ValueError, match=r"^key: must be at least 16 bytes of secret key material$"):
        routing_identity("t", None, b"k" * 15)
    with pytest.raises(ValueError, match=r'^tenant: must be a non-empty string \(got string ""\)$'):
        routing_identity("", None, KEY)
    with pytest.raises(ValueError, match=r"^application: must be None or a non-empty string \(got number 5\)$"):
        routing_identity("t", 5, KEY)
    with pytest.raises(ValueError, match=r"^tenant/application: must be valid Unicode \(no unpaired surrogates\)$"):
        routing_identity("t\udc80", None, KEY)


def test_routing_identity_separates_tenants_applications_and_keys():
    identities = [
        routing_identity("a", None, KEY),
        routing_identity("a", "x", KEY),
        routing_identity("ax", None, KEY),
        routing_identity("a", "xy", KEY),
        routing_identity("ax", "y", KEY),
        routing_identity("b", None, KEY),
        routing_identity("a", None, b"q" * 32),
    ]
    assert len({i.prefix_aware_id for i in identities}) == len(identities)
    assert len({i.cache_salt for i in identities}) == len(identities)


@pytest.mark.parametrize("tenant, application, key", [("", None, KEY), ("a", "", KEY), ("a", None, b"short"),
                                                     (None, None, KEY), ("\ud800", None, KEY)])
def test_routing_identity_rejects_bad_arguments(tenant, application, key):
    with pytest.raises(ValueError):
        routing_identity(tenant, application, key)


def test_routing_identity_validates_its_fields():
    with pytest.raises(ValueError, match="prefix_aware_id") as raised:
        RoutingIdentity("has space", "salt")
    # Stricter than SageMaker's rule, and the message says both.
    assert "allowed: 1-64 printable ASCII characters without spaces" in str(raised.value)
    assert r"\A\S[\p{Print}]*\z" in str(raised.value) and "the first not whitespace" in str(raised.value)
    with pytest.raises(ValueError, match="prefix_aware_id"):
        RoutingIdentity("x" * 65, "salt")
    with pytest.raises(ValueError, match="cache_salt"):
        RoutingIdentity("ok", "")


def test_cache_salt_is_the_first_key_for_chat_and_completion():
    identity = routing_identity("t", None, KEY)
    out = norm({"zeta": 1, "messages": [user("x")]}, identity=identity).body
    assert out == b'{"cache_salt":"' + identity.cache_salt.encode() + b'","messages":[{"role":"user","content":"x"}],"zeta":1}'
    out = norm({"prompt": "x", "cache_salt": "client"}, identity=identity)
    assert out.body.startswith(b'{"cache_salt":"' + identity.cache_salt.encode() + b'","prompt":')
    assert any("replaced" in change for change in out.changes)
    # without an identity a client's salt is kept, and stays first (idempotence)
    assert norm({"prompt": "x", "cache_salt": "client"}).body == b'{"cache_salt":"client","prompt":"x"}'


def test_lmi_bodies_get_no_salt():
    identity = routing_identity("t", None, KEY)
    result = norm({"inputs": "x"}, identity=identity)
    assert result.body == b'{"inputs":"x"}'
    assert result.changes == ()


def test_two_tenants_never_share_leading_bytes():
    body = chat(system("shared " * 1000), user("same"))
    a = norm(body, identity=routing_identity("tenant-a", "app", KEY))
    b = norm(body, identity=routing_identity("tenant-b", "app", KEY))
    assert a.body[:64] != b.body[:64]
    assert a.prefix_fingerprint != b.prefix_fingerprint
    assert a.block_hashes[0] != b.block_hashes[0]


def test_prefix_fingerprint_is_sha256_of_the_prefix():
    data = bytes(range(256)) * 40
    assert prefix_fingerprint(data, 1024) == hashlib.sha256(data[:1024]).hexdigest()[:16]
    assert prefix_fingerprint(b"abc", 1024) == hashlib.sha256(b"abc").hexdigest()[:16]
    assert prefix_fingerprint(data, 1024) == prefix_fingerprint(data[:1024] + b"different tail", 1024)
    assert prefix_fingerprint(data, 1024) != prefix_fingerprint(b"x" + data[1:], 1024)
    with pytest.raises(ValueError):
        prefix_fingerprint(data, 0)


def test_block_hashes_are_chained_over_full_blocks():
    data = os.urandom(64 * 5 + 10)
    hashes = block_hashes(data, 64)
    assert len(hashes) == 5  # the partial last block is not hashed
    previous = b""
    for index, value in enumerate(hashes):
        previous = hashlib.sha256(previous + data[index * 64:(index + 1) * 64]).digest()
        assert value == previous.hex()[:16]
    # a change in block 1 changes hashes 1.. but not 0; each hash covers everything before it
    changed = data[:70] + bytes([data[70] ^ 1]) + data[71:]
    other = block_hashes(changed, 64)
    assert other[0] == hashes[0] and all(a != b for a, b in zip(other[1:], hashes[1:]))
    assert block_hashes(b"x" * 63, 64) == ()
    with pytest.raises(ValueError):
        block_hashes(data, 0)


def test_fingerprint_and_block_sizes_at_their_boundaries():
    # Exactly n full blocks: all n hashed; one byte short of that: n - 1. A size of 1 is allowed.
    assert len(block_hashes(b"x" * 128, 64)) == 2 and len(block_hashes(b"x" * 127, 64)) == 1
    assert len(block_hashes(b"abc", 1)) == 3
    assert prefix_fingerprint(b"abc", 1) == hashlib.sha256(b"a").hexdigest()[:16]
    for bad in (0, -1, True, 2.0, "64"):
        with pytest.raises(ValueError, match=rf"^block_bytes: must be a positive integer \(got {re.escape(repr(bad))}\)$"):
            block_hashes(b"x" * 100, bad)
        with pytest.raises(ValueError, match=rf"^prefix_length: must be a positive integer \(got {re.escape(repr(bad))}\)$"):
            prefix_fingerprint(b"x" * 100, bad)


def test_changes_name_each_text_rule_with_its_paths():
    body = {"messages": [system("Be brief.  \n"), user("cafe\u0301 ?\r\nyes"), user("plain")], "model": "m"}
    changes = norm(body).changes
    by_rule = {
        "NFC": "messages[1].content",
        "CRLF": "messages[1].content",
        "before line ends": "messages[0].content",
        "end of the system prompt": "messages[0].content",
    }
    for label, path in by_rule.items():
        assert any(label in line and path in line and "in 1 text:" in line for line in changes), (label, changes)
    assert not any("messages[2]" in line for line in changes)


def test_a_long_text_gets_the_same_rules_line_by_line():
    # Texts of 512 characters or more take the line-wise path; the result is the same as the short path's.
    line = "word " * 20 + "\u0065\u0301  "
    long_text = "\r\n".join([line] * 8)
    assert len(long_text) >= 512
    # Spaces go only before a line feed: the last line keeps its two (the model continues there).
    clean = "word " * 20 + "\u00e9"
    assert normalize_text(long_text) == "\n".join([clean] * 7 + [clean + "  "])
    short = line + "\r\n" + line
    assert len(short) < 512 and normalize_text(short) == clean + "\n" + clean + "  "


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "m"}, 'body: no prompt field; allowed: exactly one of "messages" (chat), "prompt" (completion) '
                         'or "inputs" (LMI/TGI)'),
        ({"prompt": "a", "inputs": "b"}, 'body: several prompt fields (prompt, inputs); allowed: exactly one of '
                                         '"messages" (chat), "prompt" (completion) or "inputs" (LMI/TGI)'),
        ({"inputs": "a", "parameters": [1]}, "parameters: not an object (got a list of 1 item); allowed: an object "
                                             "of generation parameters"),
        ({"prompt": "a", "cache_salt": ""}, 'cache_salt: not a non-empty string (got string ""); allowed: a '
                                            "non-empty string"),
    ],
)
def test_body_shape_errors_name_field_value_and_allowed(body, message):
    with pytest.raises(NormalizationError) as caught:
        norm(body)
    assert str(caught.value) == message


def test_normalized_carries_fingerprints_of_its_body():
    settings = NormalizerSettings(prefix_length=1024, block_bytes=128)
    result = norm(chat(user("word " * 1000)), settings)
    assert result.prefix_fingerprint == prefix_fingerprint(result.body, 1024)
    assert result.block_hashes == block_hashes(result.body, 128)
    assert len(result.block_hashes) == len(result.body) // 128


def test_changes_never_contain_prompt_text():
    body = {"top_p": 1, "messages": [system("SECRETWORD  \r\n2026-01-01"), user("OTHERSECRET e\u0301 \n")]}
    result = norm(body, frozen(DATE), identity=routing_identity("TENANTNAME", None, KEY))
    notes = "\n".join(result.changes)
    assert result.changes
    for secret in ("SECRETWORD", "OTHERSECRET", "2026", "TENANTNAME", "é"):
        assert secret not in notes
