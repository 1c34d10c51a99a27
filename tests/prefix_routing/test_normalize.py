"""Example-based tests of the normalization rules (prefix_routing.normalize)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import unicodedata
from collections import OrderedDict
from pathlib import Path

import pytest

from prefix_routing.rules.constants import FREEZE_HEADER, KNOWN_FIELD_ORDER
from prefix_routing.rules.settings import FreezeRule, NormalizerSettings
from prefix_routing.rules.errors import NormalizationError, SettingsError
from prefix_routing.rules.identity import RoutingIdentity, block_hashes, prefix_fingerprint, routing_identity
from prefix_routing.rules.body import normalize_body
from prefix_routing.rules.text import normalize_text

ROOT = Path(__file__).resolve().parents[2]
KEY = b"k" * 32
DATE = FreezeRule("date", r"\d{4}-\d{2}-\d{2}")
USER = FreezeRule("user", r"(?<=User: )[A-Z][a-z]+")


def norm(body, settings: NormalizerSettings | None = None, **kwargs):
    if not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    return normalize_body(body, settings or NormalizerSettings(), **kwargs)


def parsed(result) -> dict:
    return json.loads(result.body.decode("utf-8"))


def chat(*messages, **fields) -> dict:
    return {"messages": list(messages), **fields}


def system(text):
    return {"role": "system", "content": text}


def user(text):
    return {"role": "user", "content": text}


# --------------------------------------------------------------------------------------------------
# Canonical JSON
# --------------------------------------------------------------------------------------------------


def test_prompt_first_then_known_fields_then_unknown_sorted():
    body = b'{"zeta": 1, "temperature": 0.5, "alpha": 2, "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}'
    out = norm(body).body
    assert out == (
        b'{"messages":[{"role":"user","content":"hi"}],"model":"m","max_tokens":9,"temperature":0.5,'
        b'"alpha":2,"zeta":1}'
    )


def documented_field_order() -> list[str]:
    """The known fields as docs/normalizer.md lists them (the sentence that ends in `KNOWN_FIELD_ORDER`)."""
    text = (ROOT / "docs" / "normalizer.md").read_text(encoding="utf-8")
    start = text.index("then the known fields in this order")
    sentence = text[start:text.index("(`KNOWN_FIELD_ORDER`)", start)]
    return re.findall(r"`([a-z_]+)`", sentence)


def test_known_field_order_is_the_documented_list():
    documented = documented_field_order()
    assert documented[:2] == ["model", "tools"] and documented[-1] == "metadata" and len(documented) == 30
    assert list(KNOWN_FIELD_ORDER) == documented


def test_golden_body_with_every_known_field_and_unknown_ones():
    # Every known field and four unknown ones, sent in reverse order with the prompt last. The
    # expected bytes are written out by hand from docs/normalizer.md: the prompt, the known fields in
    # the documented order, then unknown fields by code point ("A" < "_" < "z" < "é"); deeper objects
    # (metadata) keep the order they were sent in. A change here changes every routing key.
    body = (
        '{"é": 0, "zz_custom": 1, "_x": 0, "Aa": 0, "metadata": {"b": 1, "a": 2}, "user": "u-1",'
        ' "stream_options": {"include_usage": true}, "stream": true, "suffix": "!", "echo": false,'
        ' "logit_bias": {"50256": -100}, "top_logprobs": 2, "logprobs": true, "best_of": 1, "n": 1,'
        ' "stop_token_ids": [128009], "stop": ["\\n\\n"], "seed": 7, "repetition_penalty": 1.1,'
        ' "presence_penalty": 0.1, "frequency_penalty": 0.2, "min_p": 0.05, "top_k": 40, "top_p": 0.9,'
        ' "temperature": 0.2, "max_completion_tokens": 300, "max_tokens": 256, "response_format": {"type": "text"},'
        ' "function_call": "auto", "functions": [{"name": "f"}], "parallel_tool_calls": false,'
        ' "tool_choice": "auto", "tools": [{"type": "function", "function": {"name": "g"}}], "model": "llama",'
        ' "messages": [{"content": "hi", "role": "user"}]}'
    )
    assert norm(body).body == (
        b'{"messages":[{"role":"user","content":"hi"}],"model":"llama",'
        b'"tools":[{"type":"function","function":{"name":"g"}}],"tool_choice":"auto","parallel_tool_calls":false,'
        b'"functions":[{"name":"f"}],"function_call":"auto","response_format":{"type":"text"},'
        b'"max_tokens":256,"max_completion_tokens":300,"temperature":0.2,"top_p":0.9,"top_k":40,"min_p":0.05,'
        b'"frequency_penalty":0.2,"presence_penalty":0.1,"repetition_penalty":1.1,"seed":7,"stop":["\\n\\n"],'
        b'"stop_token_ids":[128009],"n":1,"best_of":1,"logprobs":true,"top_logprobs":2,"logit_bias":{"50256":-100},'
        b'"echo":false,"suffix":"!","stream":true,"stream_options":{"include_usage":true},"user":"u-1",'
        b'"metadata":{"b":1,"a":2},"Aa":0,"_x":0,"zz_custom":1,"\xc3\xa9":0}'
    )


def test_message_keys_role_content_then_sorted_and_parts_type_first():
    body = chat({"name": "bob", "content": [{"text": "a", "type": "text"}, {"image_url": {"url": "u", "detail": "low"},
                                                                           "type": "image_url"}],
                 "role": "user", "b": 1})
    out = norm(body).body
    assert out == (
        b'{"messages":[{"role":"user","content":[{"type":"text","text":"a"},'
        b'{"type":"image_url","image_url":{"url":"u","detail":"low"}}],"b":1,"name":"bob"}]}'
    )


def test_deeper_objects_keep_their_order_and_lmi_parameters_are_sorted():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "zip": {"type": "string"}, "city": {"type": "string"}}}}}]
    out = parsed(norm(chat(user("x"), tools=tools)))
    assert json.dumps(out["tools"]) == json.dumps(tools)  # order kept: guided decoding may depend on it
    lmi = norm(b'{"parameters": {"top_p": 0.9, "max_new_tokens": 5, "details": {"b": 1, "a": 2}}, "inputs": "hi", "stream": true, "a": 0}')
    assert lmi.kind == "lmi"
    assert lmi.body == (b'{"inputs":"hi","parameters":{"details":{"b":1,"a":2},"max_new_tokens":5,"top_p":0.9},'
                        b'"stream":true,"a":0}')


def test_compact_utf8_without_ascii_escapes():
    out = norm(b'{ "prompt" : "caf\\u00e9 \\u65e5\\u672c \\ud83d\\ude00" ,\n  "n" : 1 }').body
    assert out == '{"prompt":"café 日本 😀","n":1}'.encode("utf-8")


def test_every_kind_is_recognised():
    assert norm(chat(user("a"))).kind == "chat"
    assert norm({"prompt": "a"}).kind == "completion"
    assert norm({"prompt": [1, 2, 3]}).kind == "completion"
    assert norm({"prompt": [[1], [2, 3]]}).kind == "completion"
    assert norm({"prompt": ["a", "b"]}).kind == "completion"
    assert norm({"inputs": "a"}).kind == "lmi"
    assert norm({"inputs": ["a", "b"], "parameters": {}}).kind == "lmi"


def test_already_canonical_body_is_unchanged_and_reports_no_change():
    first = norm({"temperature": 1, "messages": [user("a\r\nb  \nc")]})
    again = normalize_body(first.body)
    assert again.body == first.body
    assert again.changes == ()
    assert first.changes  # the first pass did change things


def test_mapping_input_gives_the_same_bytes_as_the_serialized_body():
    body = OrderedDict([("temperature", 0.1), ("messages", (user("é\r\n"),)), ("stop", ["\n"])])
    assert normalize_body(body).body == norm(json.dumps(body)).body
    assert normalize_body(json.dumps(body)).body == norm(json.dumps(body).encode()).body


def test_byte_order_mark_is_removed():
    result = norm(b"\xef\xbb\xbf" + json.dumps(chat(user("a"))).encode())
    assert result.body == b'{"messages":[{"role":"user","content":"a"}]}'
    assert any("byte order mark" in change for change in result.changes)


# --------------------------------------------------------------------------------------------------
# Text rules
# --------------------------------------------------------------------------------------------------


def reference_text_rules(text: str, system: bool) -> str:
    """The documented rules, written the obvious (slow) way."""
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[ \t]+(?=\n)", "", text)
    return text.rstrip(" \t\n") if system else text


@pytest.mark.parametrize(
    "text, system, expected",
    [
        ("e\u0301", False, "\u00e9"),  # NFC
        ("\u212b", False, "\u00c5"),  # Angstrom sign -> A with ring (canonical singleton)
        ("a\r\nb\rc\n", False, "a\nb\nc\n"),  # CRLF and CR to LF
        ("a  \nb\t\n\nc  ", False, "a\nb\n\nc  "),  # line ends stripped; the end of a user text is kept
        ("  indented\n\ttab inside\tkept", False, "  indented\n\ttab inside\tkept"),
        ("nbsp\u00a0\nideographic\u3000\n", False, "nbsp\u00a0\nideographic\u3000\n"),  # only space and tab
        ("You are helpful.  \n\n \t", True, "You are helpful."),  # end of a system prompt
        ("\n\nlead kept", True, "\n\nlead kept"),
        ("", True, ""),
        ("x \r\n", False, "x\n"),  # CRLF first, then the space before it
        ("\r\u0301 \n\u1100\u1161", False, "\n\u0301\n\uac00"),  # combining mark after a line break
    ],
)
def test_text_rules(text, system, expected):
    assert normalize_text(text, system=system) == expected == reference_text_rules(text, system)
    long = (text + "\n") * 300  # long texts take the line-by-line path: same result
    assert len(long) >= 512 or not text
    assert normalize_text(long, system=system) == reference_text_rules(long, system)


def test_text_rules_apply_to_prompt_text_only():
    body = {
        "messages": [
            {"role": "system", "content": "sys  \r\n"},
            {"role": "developer", "content": [{"type": "text", "text": "dev\t\n"}]},
            {"role": "user", "content": [{"type": "text", "text": "u\r\n"}, {"type": "image_url", "image_url": {"url": "a \r\n"}}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"arguments": "{\"a\": \"x \\r\\n\"}"}}]},
            {"role": "tool", "content": "t \r\n", "tool_call_id": "1", "name": "n \r\n"},
        ],
        "stop": ["\r\n", " \n"],
        "user": "Cafe\u0301",
    }
    out = parsed(norm(body))
    messages = out["messages"]
    assert messages[0]["content"] == "sys"
    assert messages[1]["content"] == [{"type": "text", "text": "dev"}]  # developer = system prompt
    assert messages[2]["content"][0]["text"] == "u\n"
    assert messages[2]["content"][1]["image_url"]["url"] == "a \r\n"
    assert messages[3] == body["messages"][3]
    assert messages[4]["content"] == "t\n" and messages[4]["name"] == "n \r\n"
    assert out["stop"] == ["\r\n", " \n"]
    assert out["user"] == "Cafe\u0301"


def test_completion_and_lmi_prompts_keep_their_end():
    # The end of a completion prompt is where the model continues: a trailing space there matters.
    assert parsed(norm({"prompt": "Answer: "}))["prompt"] == "Answer: "
    assert parsed(norm({"prompt": ["a \r\nb ", "c"]}))["prompt"] == ["a\nb ", "c"]
    assert parsed(norm({"inputs": "x\t\r\ny "}))["inputs"] == "x\ny "


def test_long_text_with_a_few_decomposed_lines():
    lines = [f"line {i} caf\u00e9 \u65e5\u672c" for i in range(500)]
    lines[7] = unicodedata.normalize("NFD", lines[7]) + "  "
    lines[300] = lines[300] + "\t"
    text = "\r\n".join(lines)
    expected = "\n".join(f"line {i} caf\u00e9 \u65e5\u672c" for i in range(500))
    result = norm(chat(user(text)))
    assert parsed(result)["messages"][0]["content"] == expected
    notes = "\n".join(result.changes)
    assert "NFC" in notes and "CRLF" in notes and "spaces/tabs" in notes


# --------------------------------------------------------------------------------------------------
# Freeze rules
# --------------------------------------------------------------------------------------------------


def frozen(*rules, placement="system_message"):
    return NormalizerSettings(freeze_rules=rules, freeze_placement=placement)


def test_freeze_moves_values_to_a_message_after_the_system_prompt():
    settings = frozen(DATE, USER)
    body = chat(system("Today is 2026-11-30. User: Alice. Deadline 2026-12-24, again 2026-11-30."), user("Hi"))
    result = norm(body, settings)
    messages = parsed(result)["messages"]
    assert messages[0] == system("Today is ⟦date:1⟧. User: ⟦user:1⟧. Deadline ⟦date:2⟧, again ⟦date:1⟧.")
    assert messages[1] == system(
        FREEZE_HEADER + '\n⟦date:1⟧ = "2026-11-30"\n⟦date:2⟧ = "2026-12-24"\n⟦user:1⟧ = "Alice"'
    )
    assert messages[2] == user("Hi")
    assert any(change.startswith("freeze: date ×3, user ×1") for change in result.changes)
    assert "Alice" not in "".join(result.changes) and "2026" not in "".join(result.changes)


def test_freeze_gives_a_shared_prefix_to_requests_of_different_days():
    settings = frozen(DATE)
    shared = "You are the assistant of ACME. " * 60
    a = norm(chat(system(f"Today is 2026-11-30. {shared}"), user("question one")), settings)
    b = norm(chat(system(f"Today is 2026-12-01. {shared}"), user("question two")), settings)
    assert a.body[:1024] == b.body[:1024]
    assert prefix_fingerprint(a.body, 1024) == prefix_fingerprint(b.body, 1024)
    common = len(os.path.commonprefix([a.body, b.body]))
    assert common > len(shared)  # the whole system prompt is shared
    assert parsed(a)["messages"][1]["content"].endswith('= "2026-11-30"')  # values kept, never deleted
    assert parsed(b)["messages"][1]["content"].endswith('= "2026-12-01"')
    unfrozen = norm(chat(system(f"Today is 2026-11-30. {shared}"), user("q")))
    other = norm(chat(system(f"Today is 2026-12-01. {shared}"), user("q")))
    assert unfrozen.body[:1024] != other.body[:1024]


def test_freeze_is_idempotent_and_extends_the_values_when_the_prompt_changes():
    settings = frozen(DATE)
    first = norm(chat(system("On 2026-11-30."), user("x")), settings)
    assert normalize_body(first.body, settings).body == first.body
    edited = parsed(first)
    edited["messages"][0]["content"] += " And on 2027-01-01 or 2026-11-30."
    second = parsed(normalize_body(json.dumps(edited), settings))
    assert second["messages"][0]["content"] == "On ⟦date:1⟧. And on ⟦date:2⟧ or ⟦date:1⟧."
    assert second["messages"][1]["content"] == FREEZE_HEADER + '\n⟦date:1⟧ = "2026-11-30"\n⟦date:2⟧ = "2027-01-01"'
    assert len(second["messages"]) == 3


def test_freeze_touches_only_the_leading_system_messages():
    settings = frozen(DATE)
    body = chat(user("2026-11-30"), system("2026-11-30"))
    assert norm(body, settings).body == norm(body).body
    body = chat(system("a 2026-01-01"), {"role": "developer", "content": [{"type": "text", "text": "b 2026-01-02"}]},
                user("c 2026-01-03"))
    messages = parsed(norm(body, settings))["messages"]
    assert messages[0]["content"] == "a ⟦date:1⟧"
    assert messages[1]["content"] == [{"type": "text", "text": "b ⟦date:2⟧"}]
    assert messages[2]["role"] == "developer"  # same role as the last system-prompt message
    assert messages[3] == user("c 2026-01-03")


def test_freeze_placement_first_user_message():
    settings = frozen(DATE, placement="first_user_message")
    result = norm(chat(system("Today 2026-11-30"), user("Hi")), settings)
    messages = parsed(result)["messages"]
    assert messages == [system("Today ⟦date:1⟧"), user(FREEZE_HEADER + '\n⟦date:1⟧ = "2026-11-30"\n\nHi')]
    assert normalize_body(result.body, settings).body == result.body
    parts = norm(chat(system("Today 2026-11-30"), {"role": "user", "content": [{"type": "text", "text": "Hi"}]}), settings)
    assert parsed(parts)["messages"][1]["content"][0] == {"type": "text", "text": FREEZE_HEADER + '\n⟦date:1⟧ = "2026-11-30"'}
    assert normalize_body(parts.body, settings).body == parts.body
    # no user message right after the system prompt: a system message carries the values
    alone = parsed(norm(chat(system("Today 2026-11-30")), settings))["messages"]
    assert alone[1]["role"] == "system" and alone[1]["content"].startswith(FREEZE_HEADER)


def test_freeze_in_a_completion_prompt_keeps_the_last_paragraph_last():
    settings = frozen(DATE)
    result = norm({"prompt": "Instructions of 2026-11-30.\n\nMore 2026-11-30.\n\nQ: what day?\nA:"}, settings)
    assert parsed(result)["prompt"] == (
        "Instructions of ⟦date:1⟧.\n\nMore ⟦date:1⟧.\n\n" + FREEZE_HEADER + '\n⟦date:1⟧ = "2026-11-30"\n\nQ: what day?\nA:'
    )
    assert normalize_body(result.body, settings).body == result.body
    lmi = norm({"inputs": ["Day 2026-11-30\n\nQ?", "no blank line 2026-11-30"]}, settings)
    assert parsed(lmi)["inputs"] == ["Day ⟦date:1⟧\n\n" + FREEZE_HEADER + '\n⟦date:1⟧ = "2026-11-30"\n\nQ?',
                                     "no blank line 2026-11-30"]
    assert normalize_body(lmi.body, settings).body == lmi.body


def test_freeze_values_are_json_strings_so_multiline_values_survive():
    settings = frozen(FreezeRule("block", r"BEGIN[\s\S]*?END"))
    result = norm(chat(system('x BEGIN a\n"b"\\ END y'), user("q")), settings)
    messages = parsed(result)["messages"]
    line = messages[1]["content"].split("\n")[1]
    assert json.loads(line.split(" = ", 1)[1]) == 'BEGIN a\n"b"\\ END'
    assert normalize_body(result.body, settings).body == result.body


def test_freeze_never_rewrites_inside_a_placeholder():
    settings = frozen(DATE, FreezeRule("num", r"\d+"))
    result = norm(chat(system("2026-11-30 and 42"), user("q")), settings)
    messages = parsed(result)["messages"]
    assert messages[0]["content"] == "⟦date:1⟧ and ⟦num:1⟧"
    assert normalize_body(result.body, settings).body == result.body


# --------------------------------------------------------------------------------------------------
# Tenancy
# --------------------------------------------------------------------------------------------------

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
    with pytest.raises(ValueError, match="prefix_aware_id"):
        RoutingIdentity("has space", "salt")
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


# --------------------------------------------------------------------------------------------------
# Fingerprints
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------

BAD_BODIES = [
    (b"", "empty", "body"),
    (b"  \n", "empty", "body"),
    (b"\xff{}", "invalid_utf8", "body"),
    (b'{"prompt": "\xc3"}', "invalid_utf8", "body"),
    (b'{"prompt": "x",}', "invalid_json", "body"),
    (b'{"prompt": "a"} x', "invalid_json", "body"),
    (b"[1, 2]", "not_object", "body"),
    (b'"text"', "not_object", "body"),
    (b'{"messages": [{"role": "user", "content": "a", "role": "system"}]}', "duplicate_key", "messages[0]"),
    (b'{"prompt": "a", "prompt": "b"}', "duplicate_key", "body"),
    (b'{"prompt": "a", "temperature": NaN}', "non_finite_number", "temperature"),
    (b'{"prompt": "a", "x": [-Infinity]}', "non_finite_number", "x[0]"),
    (b'{"prompt": "a", "x": 1e400}', "non_finite_number", "x"),
    (b'{"prompt": "a", "x": 1' + b"0" * 5000 + b"}", "invalid_json", "body"),
    (b'{"prompt": "\\ud800"}', "invalid_unicode", "prompt"),
    (b'{"messages": [{"role": "user", "content": "ok", "name": "\\udfff"}]}', "invalid_unicode", "messages[0].name"),
    (b"[" * 100000, "too_deep", "body"),
    (b'{"prompt": "a", "x": ' + b"[" * 70 + b"]" * 70 + b"}", "too_deep", "x" + "[0]" * 7 + "…" + "[0]" * 8),
    # (long paths are shortened in the middle)
    (b'{"model": "m"}', "missing_field", "body"),
    (b'{"messages": [], "prompt": "a"}', "ambiguous_kind", "body"),
    (b'{"messages": []}', "invalid_field", "messages"),
    (b'{"messages": "hi"}', "invalid_field", "messages"),
    (b'{"messages": ["hi"]}', "invalid_field", "messages[0]"),
    (b'{"messages": [{"content": "hi"}]}', "missing_field", "messages[0].role"),
    (b'{"messages": [{"role": 1, "content": "hi"}]}', "invalid_field", "messages[0].role"),
    (b'{"messages": [{"role": "user"}]}', "missing_field", "messages[0].content"),
    (b'{"messages": [{"role": "user", "content": null}]}', "invalid_field", "messages[0].content"),
    (b'{"messages": [{"role": "user", "content": {"text": "a"}}]}', "invalid_field", "messages[0].content"),
    (b'{"messages": [{"role": "user", "content": ["a"]}]}', "invalid_field", "messages[0].content[0]"),
    (b'{"messages": [{"role": "user", "content": [{"text": "a"}]}]}', "missing_field", "messages[0].content[0].type"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}', "invalid_field",
     "messages[0].content[0].text"),
    (b'{"prompt": 5}', "invalid_field", "prompt"),
    (b'{"prompt": []}', "invalid_field", "prompt"),
    (b'{"prompt": ["a", 1]}', "invalid_field", "prompt"),
    (b'{"prompt": [true]}', "invalid_field", "prompt"),
    (b'{"prompt": [[1], []]}', "invalid_field", "prompt"),
    (b'{"inputs": [1, 2]}', "invalid_field", "inputs"),
    (b'{"inputs": "a", "parameters": [1]}', "invalid_field", "parameters"),
    (b'{"prompt": "a", "cache_salt": ""}', "invalid_field", "cache_salt"),
    (b'{"prompt": "a", "cache_salt": 5}', "invalid_field", "cache_salt"),
]


@pytest.mark.parametrize("body, code, field", BAD_BODIES)
def test_malformed_bodies_are_rejected_with_field_and_allowed(body, code, field):
    with pytest.raises(NormalizationError) as caught:
        normalize_body(body)
    error = caught.value
    assert (error.code, error.field) == (code, field)
    message = str(error)
    assert message.startswith(f"{field}: ") and "allowed: " in message and "\n" not in message
    assert isinstance(error, ValueError)


def test_error_shows_a_truncated_value():
    with pytest.raises(NormalizationError) as caught:
        normalize_body({"messages": [{"role": "user", "content": 5}, {"role": "x" * 0}]})
    assert "(got number 5)" in str(caught.value)
    with pytest.raises(NormalizationError) as caught:
        normalize_body({"prompt": "a", "cache_salt": ""}, identity=None)
    assert 'got string ""' in str(caught.value)
    with pytest.raises(NormalizationError) as caught:
        normalize_body({"messages": [{"role": "user", "content": "x" * 500 + "\n" + "y"}, "z" * 500]})
    assert '(got string "' + "z" * 40 + '...")' in str(caught.value)  # truncated
    assert "x" * 41 not in str(caught.value)
    with pytest.raises(NormalizationError) as caught:
        normalize_body({"messages": [{"role": "user\n" + "r" * 300, "content": True}]})
    message = str(caught.value)
    assert "got true" in message


def test_long_string_values_are_truncated_in_messages():
    with pytest.raises(NormalizationError) as caught:
        normalize_body({"messages": "m" * 300})
    message = str(caught.value)
    assert '"' + "m" * 40 + '..."' in message and "m" * 41 not in message


def test_size_limit_counts_bytes():
    settings = NormalizerSettings(max_body_bytes=100)
    body = json.dumps({"prompt": "é" * 40}, ensure_ascii=False).encode()  # 80 bytes of text, 40 characters
    assert len(body) <= 100
    assert normalize_body(body, settings)
    too_large = json.dumps({"prompt": "é" * 44}, ensure_ascii=False).encode()
    assert len(too_large) > 100
    for given in (too_large, too_large.decode()):
        with pytest.raises(NormalizationError) as caught:
            normalize_body(given, settings)
        assert caught.value.code == "too_large"
    with pytest.raises(NormalizationError) as caught:  # a mapping is measured after normalization
        normalize_body({"prompt": "é" * 44}, settings)
    assert caught.value.code == "too_large"


def test_nesting_depth_limit_is_exact():
    settings = NormalizerSettings(max_depth=8)

    def nested(levels):
        value = 1
        for _ in range(levels):
            value = [value]
        return {"prompt": "a", "x": value}

    assert normalize_body(json.dumps(nested(7)), settings)  # the body itself is level 1
    for given in (json.dumps(nested(8)), nested(8)):
        with pytest.raises(NormalizationError) as caught:
            normalize_body(given, settings)
        assert (caught.value.code, caught.value.field) == ("too_deep", "x" + "[0]" * 7)
    cyclic = {"prompt": "a"}
    cyclic["self"] = cyclic
    with pytest.raises(NormalizationError, match="deeper"):
        normalize_body(cyclic)


@pytest.mark.parametrize(
    "value, code",
    [(float("nan"), "non_finite_number"), (float("inf"), "non_finite_number"), ({1: "a"}, "invalid_field"),
     ({"a"}, "invalid_field"), (b"bytes", "invalid_field"), (10 ** 5000, "invalid_field")],
    ids=["nan", "inf", "int-key", "set", "bytes", "huge-int"],
)
def test_mapping_bodies_are_validated_like_json(value, code):
    with pytest.raises(NormalizationError) as caught:
        normalize_body({"prompt": "a", "x": value})
    assert caught.value.code == code and caught.value.field.startswith("x")


# --------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------


def test_settings_from_mapping():
    settings = NormalizerSettings.from_mapping({
        "prefix_length": 2048, "block_bytes": 256, "max_depth": 32, "max_body_bytes": 1000,
        "freeze_rules": [{"name": "date", "pattern": r"\d{4}-\d{2}-\d{2}"}], "freeze_placement": "first_user_message",
    })
    assert settings == NormalizerSettings(2048, 256, (DATE,), 1000, 32, "first_user_message")
    assert NormalizerSettings.from_mapping({}) == NormalizerSettings()


@pytest.mark.parametrize(
    "data, field, allowed",
    [
        ({"prefix_lenght": 2048}, "prefix_lenght", "prefix_length"),
        ({"prefix_length": 1023}, "prefix_length", "1024..65536"),
        ({"prefix_length": 65537}, "prefix_length", "1024..65536"),
        ({"prefix_length": "4096"}, "prefix_length", "an integer"),
        ({"prefix_length": True}, "prefix_length", "an integer"),
        ({"block_bytes": 63}, "block_bytes", "64.."),
        ({"max_depth": 3}, "max_depth", "8..256"),
        ({"max_body_bytes": 7 * 2**20}, "max_body_bytes", "6291456"),
        ({"freeze_placement": "end"}, "freeze_placement", "system_message"),
        ({"freeze_rules": {"name": "x"}}, "freeze_rules", "a list"),
        ({"freeze_rules": [{"name": "x"}]}, "freeze_rules[0]", '"pattern"'),
        ({"freeze_rules": [{"name": "x", "pattern": "a", "flags": 1}]}, "freeze_rules[0]", '"pattern"'),
        ({"freeze_rules": [{"name": "1x", "pattern": "a"}]}, "freeze_rules[0].name", "a letter"),
        ({"freeze_rules": [{"name": "x", "pattern": "("}]}, "freeze_rules[0].pattern", "regular expression"),
        ({"freeze_rules": [{"name": "x", "pattern": "a*"}]}, "freeze_rules[0].pattern", "non-empty"),
        ({"freeze_rules": [{"name": "x", "pattern": "a"}, {"name": "x", "pattern": "b"}]}, "freeze_rules[1].name",
         "unique"),
    ],
)
def test_settings_errors_name_source_field_and_allowed(data, field, allowed):
    with pytest.raises(SettingsError) as caught:
        NormalizerSettings.from_mapping(data, source="stage.json")
    message = str(caught.value)
    assert message.startswith(f"stage.json: {field}: ")
    assert "allowed: " in message and allowed in message.split("allowed: ", 1)[1]
    assert "\n" not in message


def test_settings_constructor_validates_too():
    with pytest.raises(SettingsError):
        NormalizerSettings(prefix_length=100)
    with pytest.raises(SettingsError):
        FreezeRule("x", "")
    assert NormalizerSettings(freeze_rules=[DATE]).freeze_rules == (DATE,)


def test_settings_load(tmp_path):
    path = tmp_path / "normalizer.json"
    path.write_text(json.dumps({"prefix_length": 8192, "freeze_rules": [{"name": "date", "pattern": r"\d{4}-\d{2}-\d{2}"}]}))
    assert NormalizerSettings.load(path) == NormalizerSettings(prefix_length=8192, freeze_rules=(DATE,))
    for content, expected in [(b"{", "not valid JSON"), (b'{"prefix_length": 2048, "prefix_length": 4096}', "duplicate"),
                              (b"\xff", "not UTF-8"), (b"[]", "not an object")]:
        path.write_bytes(content)
        with pytest.raises(SettingsError, match=expected) as caught:
            NormalizerSettings.load(path)
        assert str(caught.value).startswith(str(path))
    with pytest.raises(SettingsError, match="cannot read"):
        NormalizerSettings.load(tmp_path / "missing.json")


# --------------------------------------------------------------------------------------------------
# Determinism across processes
# --------------------------------------------------------------------------------------------------

DETERMINISM_SCRIPT = r"""
import json, sys
from prefix_routing.rules import FreezeRule, NormalizerSettings, normalize_body, routing_identity
settings = NormalizerSettings(prefix_length=1024, block_bytes=64,
                              freeze_rules=(FreezeRule("date", r"\d{4}-\d{2}-\d{2}"), FreezeRule("id", r"req-\w+")))
identity = routing_identity("tenant", "app", b"0123456789abcdef0123")
out = []
for body in json.loads(sys.stdin.read()):
    result = normalize_body(body, settings, identity=identity if "prompt" in body else None)
    out.append([result.body.hex(), result.prefix_fingerprint, list(result.block_hashes), list(result.changes)])
out.append([identity.prefix_aware_id, identity.cache_salt])
print(json.dumps(out))
"""

DETERMINISM_BODIES = [
    {"z": {"b": 1, "a": [3, 2]}, "y": None, "temperature": 0.3, "messages": [
        {"name": "n", "content": "On 2026-11-30 req-abc \u00e9\u0301 \r\n" * 30, "role": "system"},
        {"role": "user", "content": [{"text": "2026-01-01 x  \n", "type": "text"}]}]},
    {"prompt": "Head 2026-11-30 req-1\n\nQ\r\nA: ", "b": 2, "a": 1, "cache_salt": "c"},
    {"parameters": {"z": 1, "a": 2}, "inputs": ["x \ny", "2026-11-30\n\nz"]},
]


def test_deterministic_across_processes_and_hash_seeds():
    payload = json.dumps(DETERMINISM_BODIES)
    outputs = []
    for seed in ("0", "1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        run = subprocess.run([sys.executable, "-c", DETERMINISM_SCRIPT], input=payload, capture_output=True,
                             text=True, env=env, cwd=ROOT, timeout=60, check=True)
        outputs.append(run.stdout)
    assert outputs[0] == outputs[1] == outputs[2]
    results = json.loads(outputs[0])
    # ... and the same as in this process
    settings = NormalizerSettings(prefix_length=1024, block_bytes=64,
                                  freeze_rules=(DATE, FreezeRule("id", r"req-\w+")))
    identity = routing_identity("tenant", "app", b"0123456789abcdef0123")
    for body, (body_hex, fingerprint, hashes, changes) in zip(DETERMINISM_BODIES, results):
        here = normalize_body(body, settings, identity=identity if "prompt" in body else None)
        assert (here.body.hex(), here.prefix_fingerprint, list(here.block_hashes), list(here.changes)) == (
            body_hex, fingerprint, hashes, changes)
    assert results[-1] == [identity.prefix_aware_id, identity.cache_salt]
