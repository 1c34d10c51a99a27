"""Fuzz run: 100,000+ random and mutated bodies; the normalizer raises NormalizationError or succeeds.

Anything else (KeyError, TypeError, RecursionError, UnicodeEncodeError, ...) is a bug: for the
Lambda it would be a 5xx for a bad request. Every success is also checked: valid UTF-8 JSON within the
size limit, and idempotent. Deterministic (seeded), one test, runs by default.
"""

from __future__ import annotations

import json
import random
import time

import pytest

from prefix_routing.rules.body import normalize_body
from prefix_routing.rules.errors import NormalizationError
from prefix_routing.rules.identity import routing_identity
from prefix_routing.rules.settings import FreezeRule, NormalizerSettings

CASES = 100_000
SEED = 20261130

SEEDS = [
    {"messages": [{"role": "system", "content": "Today is 2026-11-30. User: Alice.\n\nBe brief.  \r\n"},
                  {"role": "user", "content": "Hi e\u0301 \u65e5\u672c"}], "temperature": 0.2, "max_tokens": 64},
    {"messages": [{"role": "developer", "content": [{"type": "text", "text": "ref 4711 \u27e6x:1\u27e7"}]},
                  {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url",
                                                                             "image_url": {"url": "http://x"}}]},
                  {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function",
                                                                         "function": {"name": "f", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "1", "content": "42"}],
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "stream": True},
    {"prompt": "Head 2026-11-30\n\nQ: x\nA:", "max_tokens": 5, "stop": ["\n"], "cache_salt": "abc"},
    {"prompt": [[1, 2, 3], [4]], "n": 2},
    {"prompt": ["a\r\n", "b 2026-01-01\n\nc"]},
    {"inputs": "Hello\r\n\r\nworld 2026-11-30", "parameters": {"max_new_tokens": 5, "details": True}},
    {"inputs": ["x", "y"], "stream": True},
    {"messages": [{"role": "system", "content": "Values of the placeholders \u27e6\u2026\u27e7 used above:\n"
                                                "\u27e6date:1\u27e7 = \"2026\""},
                  {"role": "system", "content": "x 2026-11-30"}, {"role": "user", "content": "q"}]},
]

TOKENS = [
    b"NaN", b"-Infinity", b"Infinity", b"1e999", b"-1e-999", b"1" * 30, b'"\\ud800"', b'"\\udc00\\ud800"',
    b"\\u0000", b"\\", b'"', b"{", b"}", b"[", b"]", b",", b":", b"null", b"true", b"false", b"0", b"-0.0",
    b'"messages"', b'"prompt"', b'"inputs"', b'"parameters"', b'"role"', b'"content"', b'"type"', b'"text"',
    b'"cache_salt"', b'"system"', b'"user"', b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xef\xbb\xbf", b"\r\n",
    b"\xe2\x9f\xa6", b"\xe2\x9f\xa7", b"[" * 80, b"{\"a\":" * 40, b'{"a":1,"a":2}', b"\t", b" " * 5, b"\n",
    b"2026-11-30", b"\\n\\n", b"e\xcc\x81",
]


def random_json(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth > 6 or roll < 0.35:
        return rng.choice([None, True, False, 0, -1, 1.5, 10 ** 20, "", "x", "\r\n", "e\u0301", "\u27e6a:1\u27e7",
                           "2026-11-30", "\ud800" if rng.random() < 0.1 else "ok", rng.random()])
    if roll < 0.6:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["messages", "prompt", "inputs", "parameters", "role", "content", "type", "text", "cache_salt", "a", "b"]
    return {rng.choice(keys): random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def replace_random_node(rng: random.Random, value):
    """A structural mutation: one node somewhere replaced by random JSON."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(list(value))
        return {**value, key: replace_random_node(rng, value[key])}
    if isinstance(value, list) and value and rng.random() < 0.7:
        index = rng.randrange(len(value))
        return [*value[:index], replace_random_node(rng, value[index]), *value[index + 1:]]
    return random_json(rng)


def serialize(rng: random.Random, value) -> bytes:
    indent = rng.choice([None, None, 1, "\t"])
    text = json.dumps(value, indent=indent, ensure_ascii=rng.random() < 0.5)
    return text.encode("utf-8", "surrogatepass")


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3))):
        op = rng.randrange(7)
        position = rng.randint(0, len(data))
        if op == 0 and data:  # flip a byte
            data[min(position, len(data) - 1)] = rng.randrange(256)
        elif op == 1:  # insert a token
            data[position:position] = rng.choice(TOKENS)
        elif op == 2:  # delete a range
            del data[position:position + rng.randint(1, 8)]
        elif op == 3:  # duplicate a range
            data[position:position] = data[position:position + rng.randint(1, 40)]
        elif op == 4:  # truncate
            del data[position:]
        elif op == 5:  # random bytes
            data[position:position] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        else:  # splice with another seed
            other = serialize(rng, rng.choice(SEEDS))
            cut = rng.randint(0, len(other))
            data[position:] = other[cut:]
    return bytes(data)


def make_case(rng: random.Random):
    roll = rng.random()
    if roll < 0.1:  # valid, in some formatting
        return serialize(rng, rng.choice(SEEDS))
    if roll < 0.55:
        return mutate_bytes(rng, serialize(rng, rng.choice(SEEDS)))
    if roll < 0.8:
        return serialize(rng, replace_random_node(rng, rng.choice(SEEDS)))
    if roll < 0.9:
        body = serialize(rng, random_json(rng))
        return body if rng.random() < 0.5 else body.decode("utf-8", "replace")
    if roll < 0.97:  # parsed bodies, including Python values JSON cannot hold
        value = replace_random_node(rng, rng.choice(SEEDS))
        if isinstance(value, dict) and rng.random() < 0.3:
            value = {**value, "odd": rng.choice([float("nan"), {1: 2}, {"s"}, b"x", object(), (1, 2), 10 ** 5000])}
        return value
    return rng.choice([b"", b" ", b"\xef\xbb\xbf{}", b"[" * rng.randint(50, 100_000), b"{" * 3000,
                       b'{"prompt": "' + b"x" * rng.randint(0, 500) + b'"}'])


SETTINGS = [
    NormalizerSettings(),
    NormalizerSettings(prefix_length=1024, block_bytes=64, max_depth=8, max_body_bytes=400,
                       freeze_rules=(FreezeRule("date", r"\d{4}-\d{2}-\d{2}"), FreezeRule("num", r"\d+"))),
    NormalizerSettings(freeze_placement="first_user_message",
                       freeze_rules=(FreezeRule("cap", r"[A-Z][a-z]+"), FreezeRule("ws", r"\s{2,}"),
                                     FreezeRule("bracket", r"[\u27e6\u27e7]"))),
]
IDENTITIES = [None, routing_identity("tenant", None, b"fuzz-key-0123456789")]


@pytest.mark.fuzz
def test_fuzz_only_normalization_errors():
    rng = random.Random(SEED)
    started = time.perf_counter()
    failures = []
    outcomes = {"ok": 0, "rejected": 0}
    codes: dict[str, int] = {}
    for index in range(CASES):
        case = make_case(rng)
        normalizer = SETTINGS[index % len(SETTINGS)]
        identity = IDENTITIES[(index // len(SETTINGS)) % len(IDENTITIES)]
        try:
            result = normalize_body(case, normalizer, identity=identity)
        except NormalizationError as error:
            outcomes["rejected"] += 1
            codes[error.code] = codes.get(error.code, 0) + 1
            if "\n" in str(error) or not error.field or not error.code:
                failures.append((index, case, f"bad error: {error!r}"))
            continue
        except Exception as error:  # noqa: BLE001 - the point of the test
            failures.append((index, case, repr(error)))
            continue
        outcomes["ok"] += 1
        try:
            assert len(result.body) <= normalizer.max_body_bytes
            json.loads(result.body.decode("utf-8"))
            assert normalize_body(result.body, normalizer, identity=identity).body == result.body, "not idempotent"
        except Exception as error:  # noqa: BLE001
            failures.append((index, case, f"success but {error!r}"))
        if len(failures) >= 5:
            break
    elapsed = time.perf_counter() - started
    assert not failures, "\n".join(f"case {i}: {error}: {repr(case)[:300]}" for i, case, error in failures)
    assert outcomes["ok"] + outcomes["rejected"] == CASES
    # the generator must exercise both sides, or the run proves little
    assert outcomes["ok"] > CASES // 10 and outcomes["rejected"] > CASES // 10, outcomes
    assert len(codes) >= 10, codes  # most kinds of rejection are reached
    print(f"fuzz: {CASES} cases in {elapsed:.1f} s: {outcomes} {sorted(codes.items())}")
