"""Property tests (hypothesis) of the normalization rules (prefix_routing.rules).

- idempotence, for every kind of body, with and without freeze rules and identities;
- meaning kept: the output parses to the same messages and parameters up to the documented text
  rules (checked against a slow reference implementation), and frozen values can be put back;
- equivalent variants (key order, JSON whitespace and escapes, CRLF/CR, NFD, trailing spaces,
  parameters before the prompt) give identical first N bytes for N in {1024, 4096, 65536};
- different system prompts give different first N bytes exactly when they differ within N bytes;
- different tenants never share first bytes.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata

import pytest
from hypothesis import HealthCheck, assume, event, find, given, settings, strategies as st

from prefix_routing.rules.body import normalize_body
from prefix_routing.rules.constants import FREEZE_HEADER
from prefix_routing.rules.identity import prefix_fingerprint, routing_identity
from prefix_routing.rules.settings import FreezeRule, NormalizerSettings

PREFIX_LENGTHS = (1024, 4096, 65536)
KEY = b"property-test-key-0123456789"
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.data_too_large])

# Characters that exercise the rules: combining marks, canonical singletons, Hangul jamo, every
# kind of whitespace and line break, JSON's special characters, the placeholder brackets.
TRICKY = list("e\u0301\u0327\u0308\u0323a\u00e9\u212b\u2126\u1100\u1161\u11a8\uac00 \t\n\r\u00a0\u3000\u2028"
              "\u65e5\U0001f600\"\\{}[]:,\u27e6\u27e7\u0000\u001f\u007f") + ["\r\n", "  \n", "\t\r\n", "2026-11-30"]
CHARS = st.one_of(st.sampled_from(TRICKY), st.characters(blacklist_categories=("Cs",)))
TEXT = st.lists(CHARS, max_size=30).map("".join)
WORD = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x24F, blacklist_categories=("Cs",)),
               min_size=1, max_size=12)


def reference_text(text: str, system: bool = False) -> str:
    """The documented text rules, the slow and obvious way."""
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[ \t]+(?=\n)", "", text)
    return text.rstrip(" \t\n") if system else text


@st.composite
def long_text(draw, sizes=(0, 1500, 5000, 70000)):
    """Arbitrary text, often repeated on many lines so that it reaches 65 KB and more."""
    size = draw(st.sampled_from(sizes))
    if size == 0:
        return draw(TEXT)
    base = draw(st.lists(CHARS, min_size=1, max_size=30).map("".join))
    lines, length, index = [], 0, 0
    while length < size:
        line = f"{index} {base}"
        lines.append(line)
        length += len(line.encode("utf-8", "surrogatepass")) + 1
        index += 1
    return "\n".join(lines)


PARAMETERS = st.fixed_dictionaries(
    {},
    optional={
        "model": WORD,
        "temperature": st.floats(0, 2, allow_nan=False),
        "max_tokens": st.integers(1, 10_000),
        "stop": st.lists(TEXT, max_size=3),
        "stream": st.booleans(),
        "tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.dictionaries(
            WORD, st.one_of(WORD, st.integers(), st.none()), max_size=4)}), max_size=2),
        "zeta_custom": st.dictionaries(WORD, st.integers(), max_size=4),
        "alpha_custom": TEXT,
        "user": TEXT,
    },
)


@st.composite
def message(draw, role):
    content_kind = draw(st.sampled_from(["str", "parts"]))
    if content_kind == "str":
        content = draw(long_text(sizes=(0, 300, 1500)))
    else:
        parts = draw(st.lists(st.one_of(
            TEXT.map(lambda t: {"type": "text", "text": t}),
            WORD.map(lambda u: {"image_url": {"url": u, "detail": "low"}, "type": "image_url"}),
        ), max_size=3))
        content = parts
    result = {"role": role, "content": content}
    if draw(st.booleans()):
        result["name"] = draw(WORD)
    return result


@st.composite
def chat_body(draw, system_text=None):
    system = draw(long_text()) if system_text is None else system_text
    messages = [{"role": "system", "content": system}]
    for index in range(draw(st.integers(1, 3))):
        messages.append(draw(message("user" if index % 2 == 0 else "assistant")))
    return {"messages": messages, **draw(PARAMETERS)}


@st.composite
def completion_body(draw):
    prompt = draw(st.one_of(long_text(), st.lists(TEXT, min_size=1, max_size=3)))
    return {"prompt": prompt, **draw(PARAMETERS)}


@st.composite
def lmi_body(draw):
    inputs = draw(st.one_of(long_text(), st.lists(TEXT, min_size=1, max_size=3)))
    body = {"inputs": inputs}
    if draw(st.booleans()):
        body["parameters"] = draw(st.dictionaries(WORD, st.one_of(st.integers(), st.booleans(), WORD), max_size=5))
    if draw(st.booleans()):
        body["stream"] = True
    return body


BODY = st.one_of(chat_body(), completion_body(), lmi_body())

FREEZE_RULES = [
    FreezeRule("date", r"\d{4}-\d{2}-\d{2}"),
    FreezeRule("num", r"\d+"),
    FreezeRule("cap", r"[A-Z][a-z]+"),
    FreezeRule("ws", r"\s{2,}"),
    FreezeRule("bracket", r"[\u27e6\u27e7:]"),
    FreezeRule("header", r"placeholders|Values"),
]
NORMALIZER_SETTINGS = st.builds(
    NormalizerSettings,
    prefix_length=st.sampled_from(PREFIX_LENGTHS),
    block_bytes=st.sampled_from([64, 2048]),
    freeze_rules=st.lists(st.sampled_from(FREEZE_RULES), unique_by=lambda r: r.name, max_size=3).map(tuple),
    freeze_placement=st.sampled_from(["system_message", "first_user_message"]),
)
IDENTITY = st.one_of(st.none(), st.tuples(WORD, st.one_of(st.none(), WORD)).map(
    lambda t: routing_identity(t[0], t[1], KEY)))


# --------------------------------------------------------------------------------------------------
# Idempotence
# --------------------------------------------------------------------------------------------------


@SETTINGS
@given(BODY, NORMALIZER_SETTINGS, IDENTITY)
def test_idempotent(body, normalizer, identity):
    once = normalize_body(json.dumps(body), normalizer, identity=identity)
    event(f"kind={once.kind}, over 64 KiB={len(once.body) > 65536}")
    event(f"frozen={any(c.startswith('freeze:') for c in once.changes)}")
    twice = normalize_body(once.body, normalizer, identity=identity)
    assert twice.body == once.body
    assert twice.prefix_fingerprint == once.prefix_fingerprint and twice.block_hashes == once.block_hashes
    assert twice.changes == ()
    # the parsed form and the serialized form are the same request
    assert normalize_body(body, normalizer, identity=identity).body == once.body


# --------------------------------------------------------------------------------------------------
# Meaning kept
# --------------------------------------------------------------------------------------------------


def expected_message(message):
    system = message["role"] in ("system", "developer")
    result = dict(message)
    if isinstance(message["content"], str):
        result["content"] = reference_text(message["content"], system)
    else:
        result["content"] = [
            {**part, "text": reference_text(part["text"], system)} if part["type"] == "text" else part
            for part in message["content"]
        ]
    return result


def ordered(value):
    """Compare with key order (json.dumps keeps it): deeper objects must keep the order sent."""
    return json.dumps(value, ensure_ascii=False)


@SETTINGS
@given(BODY, IDENTITY)
def test_meaning_kept(body, identity):
    out = json.loads(normalize_body(json.dumps(body), identity=identity).body)
    if identity is not None and "inputs" not in body:
        assert list(out)[0] == "cache_salt" and out.pop("cache_salt") == identity.cache_salt
    assert set(out) == set(body)
    assert list(out)[0] in ("messages", "prompt", "inputs")  # the prompt-bearing field comes first
    for key, value in body.items():
        if key == "messages":
            assert out[key] == [expected_message(m) for m in value]
            for got, sent in zip(out[key], value):
                assert list(got)[:2] == ["role", "content"]
                for name in sent:
                    if name not in ("role", "content"):
                        assert ordered(got[name]) == ordered(sent[name])
        elif key in ("prompt", "inputs"):
            expected = [reference_text(t) for t in value] if isinstance(value, list) else reference_text(value)
            assert out[key] == expected
        elif key == "parameters":
            assert out[key] == value and list(out[key]) == sorted(value)
            assert all(ordered(out[key][k]) == ordered(value[k]) for k in value)
        else:
            assert ordered(out[key]) == ordered(value)  # parameters untouched, nested order kept


PLACEHOLDER = re.compile(r"⟦[A-Za-z][A-Za-z0-9_-]*:[0-9]+⟧")


def thaw(text: str, block: str) -> str:
    values = {}
    for line in block.split("\n")[1:]:
        placeholder, _, literal = line.partition(" = ")
        values[placeholder] = json.loads(literal)
    return PLACEHOLDER.sub(lambda m: values.get(m.group(0), m.group(0)), text)


@SETTINGS
@given(chat_body(), st.lists(st.sampled_from(FREEZE_RULES[:3]), min_size=1, unique_by=lambda r: r.name).map(tuple))
def test_frozen_values_are_moved_never_deleted(body, rules):
    body["messages"][0]["content"] = "Today is 2026-11-30, user Alice, ticket 4711.\n" + (
        body["messages"][0]["content"] if isinstance(body["messages"][0]["content"], str) else "")
    assume("⟦" not in body["messages"][0]["content"])
    out = json.loads(normalize_body(body, NormalizerSettings(freeze_rules=rules)).body)
    system, values = out["messages"][0], out["messages"][1]
    assert values["role"] == "system" and values["content"].startswith(FREEZE_HEADER)
    assert "2026-11-30" not in system["content"] or rules == (FREEZE_RULES[2],)
    assert thaw(system["content"], values["content"]) == reference_text(body["messages"][0]["content"], True)
    assert out["messages"][2:] == [expected_message(m) for m in body["messages"][1:]]


# --------------------------------------------------------------------------------------------------
# Equivalent variants share their first N bytes
# --------------------------------------------------------------------------------------------------


def canonical_texts(body):
    """The body with every prompt text already in canonical form (the variants are made from it)."""
    body = json.loads(json.dumps(body))
    if "messages" in body:
        body["messages"] = [expected_message(m) for m in body["messages"]]
    for key in ("prompt", "inputs"):
        if key in body:
            body[key] = [reference_text(t) for t in body[key]] if isinstance(body[key], list) else reference_text(body[key])
    return body


@st.composite
def text_variant(draw, text, system=False):
    """Something the text rules turn back into ``text`` (which is canonical)."""
    if draw(st.booleans()):
        text = unicodedata.normalize("NFD", text)
    spaces = draw(st.sampled_from(["", " ", "\t", "  \t "]))
    if spaces:
        text = text.replace("\n", spaces + "\n")
    ending = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    text = text.replace("\n", ending)
    if system:
        text += draw(st.sampled_from(["", "\n", "  \r\n\t \n"]))
    return text


@st.composite
def shuffled(draw, mapping, first_last=False):
    keys = draw(st.permutations(list(mapping)))
    if first_last:  # parameters before the prompt
        prompt = [k for k in keys if k in ("messages", "prompt", "inputs")]
        keys = [k for k in keys if k not in prompt] + prompt
    return {k: mapping[k] for k in keys}


@st.composite
def variant(draw, body):
    body = json.loads(json.dumps(body))
    if "messages" in body:
        messages = []
        for m in body["messages"]:
            system = m["role"] in ("system", "developer")
            m = dict(m)
            if isinstance(m["content"], str):
                m["content"] = draw(text_variant(m["content"], system))
            else:
                m["content"] = [draw(shuffled({**p, "text": draw(text_variant(p["text"], system))}))
                                if p["type"] == "text" else draw(shuffled(p)) for p in m["content"]]
            messages.append(draw(shuffled(m)))
        body["messages"] = messages
    for key in ("prompt", "inputs"):
        if key in body:
            value = body[key]
            body[key] = [draw(text_variant(t)) for t in value] if isinstance(value, list) else draw(text_variant(value))
    if "parameters" in body:
        body["parameters"] = draw(shuffled(body["parameters"]))
    body = draw(shuffled(body, first_last=draw(st.booleans())))
    indent = draw(st.sampled_from([None, 2, "\t"]))
    separators = draw(st.sampled_from([None, (",", ":"), (" , ", " : ")]))
    text = json.dumps(body, indent=indent, separators=separators, ensure_ascii=draw(st.booleans()))
    return text.encode("utf-8") if draw(st.booleans()) else text


@SETTINGS
@given(st.data(), BODY)
def test_equivalent_variants_share_the_prefix(data, body):
    base = canonical_texts(body)
    expected = normalize_body(json.dumps(base)).body
    event(f"over 64 KiB={len(expected) > 65536}")
    for _ in range(2):
        other = normalize_body(data.draw(variant(base))).body
        for n in PREFIX_LENGTHS:
            assert other[:n] == expected[:n]
            assert prefix_fingerprint(other, n) == prefix_fingerprint(expected, n)
        assert other == expected


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")  # large examples: large reprs
def test_the_strategies_reach_beyond_the_largest_prefix_length():
    """Guard for the strategies above: bodies longer than 65536 bytes and frozen segments do occur."""
    big = find(BODY, lambda b: len(json.dumps(b, ensure_ascii=False).encode()) > max(PREFIX_LENGTHS) + 1000)
    assert len(normalize_body(big).body) > max(PREFIX_LENGTHS)
    find(st.tuples(chat_body(), NORMALIZER_SETTINGS),
         lambda t: any(c.startswith("freeze:") for c in normalize_body(t[0], t[1]).changes))


# --------------------------------------------------------------------------------------------------
# Different system prompts, different tenants
# --------------------------------------------------------------------------------------------------

SYSTEM_START = len(b'{"messages":[{"role":"system","content":"')


@SETTINGS
@given(long_text(sizes=(0, 1000, 4000, 66000)), TEXT, TEXT, st.data())
def test_different_system_prompts_differ_within_the_prefix(shared, tail_a, tail_b, data):
    a_text, b_text = reference_text(shared + tail_a, True), reference_text(shared + tail_b, True)
    assume(a_text != b_text)
    rest = data.draw(st.lists(message("user"), min_size=1, max_size=1))
    params = data.draw(PARAMETERS)
    a = normalize_body({"messages": [{"role": "system", "content": shared + tail_a}, *rest], **params}).body
    b = normalize_body({"messages": [{"role": "system", "content": shared + tail_b}, *rest], **params}).body
    encoded_a = json.dumps(a_text, ensure_ascii=False)[1:].encode()
    encoded_b = json.dumps(b_text, ensure_ascii=False)[1:].encode()
    assert a.startswith(b'{"messages":[{"role":"system","content":"')  # the system prompt leads
    first_difference = SYSTEM_START + len(os.path.commonprefix([encoded_a, encoded_b]))
    for n in PREFIX_LENGTHS:
        assert (a[:n] == b[:n]) == (n <= first_difference)
    assert a != b


@SETTINGS
@given(BODY, WORD, WORD, st.one_of(st.none(), WORD))
def test_different_tenants_never_share_first_bytes(body, tenant_a, tenant_b, application):
    assume(tenant_a != tenant_b)
    id_a, id_b = routing_identity(tenant_a, application, KEY), routing_identity(tenant_b, application, KEY)
    a = normalize_body(body, identity=id_a)
    b = normalize_body(body, identity=id_b)
    assert id_a.prefix_aware_id != id_b.prefix_aware_id and id_a.cache_salt != id_b.cache_salt
    if a.kind == "lmi":  # no salt for LMI: the routing id alone keeps them apart
        assert a.body == b.body
    else:
        assert a.body[:64] != b.body[:64]
        for n in PREFIX_LENGTHS:
            assert prefix_fingerprint(a.body, n) != prefix_fingerprint(b.body, n)
    same = normalize_body(body, identity=routing_identity(tenant_a, application, KEY))
    assert same.body == a.body
