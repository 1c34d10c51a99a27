"""Parsing and validation of bodies (prefix_routing.rules.parse): every rejection names the field, the value and what is allowed."""

from __future__ import annotations

import json

import pytest

from prefix_routing.rules.body import normalize_body
from prefix_routing.rules.errors import NormalizationError
from prefix_routing.rules.settings import NormalizerSettings

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
