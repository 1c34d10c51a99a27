"""Fuzz: at least 100,000 random and mutated bodies through the handler's validation path.

Every body goes through ``handler.handler`` exactly as a Function URL event (or a direct invocation)
would, with a fake runtime client that answers a complete stream. The only acceptable outcomes are a
400 with a JSON error naming a field, or a success: never an exception, never a 5xx. Seeded, so a
failure names the body that caused it and reproduces.
"""

from __future__ import annotations

import base64
import json
import random
import time
from collections import Counter

import handler as lambda_handler
import pytest

from prefix_routing import frontdoor
from tests.prefix_routing.frontdoor.conftest import KEY, FakeRuntime, config, iam_context

pytestmark = pytest.mark.fuzz

TOTAL = 100_000
SEED = 20261130

SEEDS = [
    {"model": "m", "messages": [{"role": "system", "content": "You are terse.\r\nBe kind.  "},
                                {"role": "user", "content": "Caf\u0065\u0301 au lait?"}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "describe"},
                                               {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}],
     "temperature": 0.2, "stream": True, "stream_options": {"include_usage": False}},
    {"prompt": "Once upon a time", "max_tokens": 16, "stop": ["\n"], "logit_bias": {"50256": -100}},
    {"prompt": [1, 2, 3, 4], "n": 2},
    {"inputs": "Translate: bonjour", "parameters": {"max_new_tokens": 8, "do_sample": False}, "stream": True},
    {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"}], "tools": []},
    {"cache_salt": "client-salt", "messages": [{"role": "developer", "content": "Rules\n\n"}]},
]
SEED_BYTES = [json.dumps(s).encode() for s in SEEDS] + [json.dumps(s, indent=2, ensure_ascii=False).encode()
                                                        for s in SEEDS]
TOKENS = [b"{", b"}", b"[", b"]", b'"', b"\\", b"\\u", b"\\ud800", b"\\udc00", b"NaN", b"Infinity", b"-Infinity",
          b"1e999", b"-0", b"9" * 5000, b"null", b"true", b",", b":", b"\x00", b"\xff", b"\xc3", b"\xef\xbb\xbf",
          b"\r\n", b"\t", b" " * 50, "\u0301".encode(), "\U0001f600".encode(), b'"messages"', b'"prompt"',
          b'"inputs"', b'"role"', b'"content"', b'"stream":true', b'"cache_salt":""', b"[" * 70, b"]" * 70]
KEYS = ["messages", "prompt", "inputs", "role", "content", "type", "text", "stream", "stream_options",
        "include_usage", "cache_salt", "parameters", "model", "temperature", "tools", "image_url", "n", "",
        "m\u0301"]


def random_value(rng: random.Random, depth: int = 0):
    choice = rng.random()
    if depth > 5 or choice < 0.35:
        if rng.random() < 0.01:
            return "lone \ud800 surrogate"
        return rng.choice([None, True, False, 0, -1, 2**70, 1.5, 1e308, "", "x", "user", "system", "text",
                           "a\r\nb ", "e\u0301", "日本語", [], {}])
    if choice < 0.65:
        return {rng.choice(KEYS): random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]


def random_structure(rng: random.Random) -> dict:
    body = {rng.choice(["messages", "prompt", "inputs"]): random_value(rng)}
    if rng.random() < 0.7:
        body["messages"] = [{"role": rng.choice(["user", "system", "assistant", "tool", "", 5]),
                             "content": random_value(rng, 3)} for _ in range(rng.randint(0, 3))]
    for _ in range(rng.randint(0, 3)):
        body[rng.choice(KEYS)] = random_value(rng, 2)
    return body


def mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        op = rng.randrange(7)
        at = rng.randint(0, len(data))
        if op == 0 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif op == 1:
            data[at:at] = rng.choice(TOKENS)
        elif op == 2:
            del data[at:at + rng.randint(1, 12)]
        elif op == 3:
            data = data[:at]
        elif op == 4:
            span = data[at:at + rng.randint(1, 30)]
            data[at:at] = span
        elif op == 5:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
        else:
            other = rng.randint(0, len(data))
            a, b = sorted((at, other))
            data = data[:a] + data[b:] + data[a:b]
    return bytes(data)


def bodies(rng: random.Random):
    """(kind, body bytes or direct event) forever."""
    while True:
        roll = rng.random()
        if roll < 0.55:
            yield "mutated", mutate(rng, rng.choice(SEED_BYTES))
        elif roll < 0.80:
            structure = random_structure(rng)
            try:
                text = json.dumps(structure, ensure_ascii=rng.random() < 0.5,
                                  indent=rng.choice([None, None, 1]), allow_nan=True)
            except (ValueError, UnicodeEncodeError):
                continue
            yield "structured", text.encode("utf-8", "surrogatepass")
        elif roll < 0.88:
            yield "direct", {"body": random_structure(rng), "tenant": rng.choice(["acme", "", 5, "a b", None, "t"])}
        elif roll < 0.94:
            yield "random", bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
        elif roll < 0.97:
            depth = rng.randint(55, 75)
            edge = rng.choice([
                b'{"prompt": "x", "parameters": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}",
                b'{"prompt": "x", "n": ' + b"[" * depth + b"]" * depth + b"}",
                b'{"prompt": "x", "seed": ' + b"7" * rng.randint(4000, 5000) + b"}",
                b'{"prompt": "x", "temperature": 1e' + str(rng.randint(300, 400)).encode() + b"}",
                b'\xef\xbb\xbf{"prompt": "with a byte order mark"}',
                b'{"messages": [{"role": "user", "content": "' + b"\\u00e9" * rng.randint(1, 50) + b'"}]}',
            ])
            yield "edge", edge
        else:
            yield "valid", rng.choice(SEED_BYTES)


def test_fuzz_100k_bodies_only_400_or_success():
    context = iam_context()
    runtime = FakeRuntime()
    emitted = [0]

    def emit(line: str) -> None:
        emitted[0] += 1

    # Direct invocations are allowed here: the fuzz is about their bodies (refusing them is tested apart).
    lambda_handler.configure(frontdoor.Invoker(runtime, config(allow_direct_invoke=True), KEY, emit=emit))
    rng = random.Random(SEED)
    statuses: Counter = Counter()
    kinds: Counter = Counter()
    codes: Counter = Counter()
    started = time.monotonic()
    try:
        for index, (kind, body) in zip(range(TOTAL), bodies(rng)):
            if kind == "direct":
                event = body
            else:
                try:  # Lambda base64-encodes bodies that are not text; some text ones too, here
                    text = body.decode("utf-8")
                    encoded = rng.random() < 0.1
                except UnicodeDecodeError:
                    text, encoded = "", True
                event = {"version": "2.0", "headers": {"content-type": "application/json"},
                         "requestContext": context, "isBase64Encoded": encoded,
                         "body": base64.b64encode(body).decode() if encoded else text,
                         "rawPath": "/"}
            try:
                result = lambda_handler.handler(event, None)
            except Exception as error:  # pragma: no cover - a failure names the body
                pytest.fail(f"body #{index} ({kind}) raised {type(error).__name__}: {error}; body={body!r:.300}")
            status = result["statusCode"]
            payload = result["body"] if kind == "direct" else json.loads(result["body"])
            if status not in (200, 400):
                pytest.fail(f"body #{index} ({kind}) answered {status}: {payload}; body={body!r:.300}")
            if status == 400:
                error = payload["error"]
                assert error["code"] and error["message"] and error["status"] == 400, payload
                codes[error["code"]] += 1
            statuses[status] += 1
            kinds[kind] += 1
    finally:
        lambda_handler.configure(None)
    elapsed = time.monotonic() - started
    assert sum(statuses.values()) == TOTAL
    assert statuses[200] > 1000 and statuses[400] > 50_000  # both paths were exercised a lot
    assert len(codes) >= 8  # many different problems were named
    assert emitted[0] == 2 * TOTAL  # every request wrote its EMF document and its log line
    assert len(runtime.calls) == statuses[200]
    print(f"fuzz: {TOTAL} bodies in {elapsed:.1f} s, {dict(statuses)}, {dict(kinds)}, codes {dict(codes)}")
