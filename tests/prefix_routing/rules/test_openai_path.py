"""The OpenAI-compatible path's routing key and the request prepared for it (prefix_routing.rules.openai_path)."""

import json

import pytest

from prefix_routing.rules import NormalizationError, NormalizerSettings, routing_identity
from prefix_routing.rules.openai_path import (
    PROMPT_CACHE_KEY,
    messages_text,
    prepare_openai_request,
    routing_id,
    routing_prefix,
)
from prefix_routing.rules.settings import FreezeRule

KEY = b"k" * 32


def test_messages_text_is_every_messages_text_in_order_without_roles():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "image_url", "image_url": {"url": "x"}},
                                     {"type": "text", "text": "there"}]},
        {"role": "assistant", "tool_calls": [{"id": "1"}]},  # no text
    ]
    assert messages_text(messages) == "Be brief.Hi there"
    assert messages_text("not a list") == "" and messages_text([1, {"content": 3}]) == ""


def test_prefix_length_counts_characters_not_bytes():
    body = {"messages": [{"role": "user", "content": "é" * 10 + "a" * 10}]}
    assert routing_prefix(body, 12) == "é" * 10 + "aa"  # 12 characters, 22 UTF-8 bytes
    assert routing_prefix({"messages": []}, 5) == ""


def test_routing_id_is_prompt_cache_key():
    assert routing_id({PROMPT_CACHE_KEY: "tenant-a"}) == "tenant-a"
    for value in (None, "", 7):
        assert routing_id({PROMPT_CACHE_KEY: value}) is None
    assert routing_id({}) is None


def test_prepared_request_applies_the_text_rules_and_names_the_tenant():
    identity = routing_identity("tenant-42", "bot", KEY)
    body = {"temperature": 0.2, "messages": [{"content": "Cafe\u0301 hours?\r\n", "role": "user"}], "stream": True}
    prepared = prepare_openai_request(body, NormalizerSettings(), identity)
    assert prepared["messages"] == [{"role": "user", "content": "Café hours?\n"}]  # NFC, CRLF to LF
    assert prepared[PROMPT_CACHE_KEY] == identity.prefix_aware_id
    assert prepared["cache_salt"] == identity.cache_salt
    assert prepared["temperature"] == 0.2 and prepared["stream"] is True


def test_json_layout_is_irrelevant_but_text_and_tenant_are_not():
    identity = routing_identity("tenant-42", None, KEY)
    a = {"messages": [{"role": "user", "content": "same text"}], "max_tokens": 5}
    b = json.dumps({"max_tokens": 5, "messages": [{"content": "same text", "role": "user"}]}, indent=3)
    assert prepare_openai_request(a, identity=identity) == prepare_openai_request(b, identity=identity)
    other = prepare_openai_request(a, identity=routing_identity("tenant-7", None, KEY))
    assert other[PROMPT_CACHE_KEY] != prepare_openai_request(a, identity=identity)[PROMPT_CACHE_KEY]
    assert PROMPT_CACHE_KEY not in prepare_openai_request(a)  # no identity: no routing id


def test_freeze_rules_apply_to_message_text():
    settings = NormalizerSettings(freeze_rules=(FreezeRule("date", r"\d{4}-\d{2}-\d{2}"),))
    day1 = {"messages": [{"role": "system", "content": "Today is 2026-12-01. Be brief."},
                         {"role": "user", "content": "hi"}]}
    day2 = {"messages": [{"role": "system", "content": "Today is 2026-12-02. Be brief."},
                         {"role": "user", "content": "hi"}]}
    key1 = routing_prefix(prepare_openai_request(day1, settings), 20)
    assert key1 == routing_prefix(prepare_openai_request(day2, settings), 20)
    assert "2026-12-01" not in key1


def test_a_completion_body_is_refused_with_what_is_allowed():
    with pytest.raises(NormalizationError, match="the OpenAI-compatible path takes chat bodies") as raised:
        prepare_openai_request({"prompt": "hi"})
    assert raised.value.code == "not_chat" and "messages" in raised.value.allowed
