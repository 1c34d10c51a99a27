"""Bodies for text-less traces: block ids decide the bytes; client variation keeps the meaning."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import unicodedata

import pytest

from prefix_routing.lab import bodies
from prefix_routing.lab.bodies import (
    BLOCK_BYTES,
    block_text,
    chat_body,
    common_prefix_length,
    prompt_text,
    serialize,
    vary,
)
from prefix_routing.rules.body import normalize_body
from prefix_routing.rules.settings import NormalizerSettings


def nfc(value):
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, list):
        return [nfc(v) for v in value]
    if isinstance(value, dict):
        return {k: nfc(v) for k, v in value.items()}
    return value


def lf(value):
    if isinstance(value, str):
        return value.replace("\r\n", "\n")
    if isinstance(value, list):
        return [lf(v) for v in value]
    if isinstance(value, dict):
        return {k: lf(v) for k, v in value.items()}
    return value


def record(ids, input_length=None, output_length=64):
    return {"hash_ids": ids, "input_length": input_length or 512 * len(ids), "output_length": output_length}


# --------------------------------------------------------------------------- blocks and prompts


def test_block_text_is_exactly_sized_and_well_formed():
    for block_id in range(300):
        for size in (1, 2, 3, 7, 100, 777, BLOCK_BYTES, 5000):
            text = block_text(block_id, size)
            assert len(text.encode("utf-8")) == size
            assert text.endswith("\n")
            assert " \n" not in text and "\t" not in text and "\r" not in text
            assert unicodedata.normalize("NFC", text) == text
    assert block_text(0, 0) == ""
    with pytest.raises(ValueError):
        block_text(1, -1)


def test_blocks_read_like_text_with_accents():
    text = prompt_text(list(range(40)))
    words = text.split()
    assert 300 < len(words) / 40 < 500  # about 400 words per 2,048-byte block
    assert any(not w.isascii() for w in words)  # accented words, so NFD variation matters
    assert unicodedata.normalize("NFD", text) != text
    assert ". " in text and ".\n" in text


def test_prompt_text_deterministic_in_another_process():
    ids = [3, 17, 123456, 7]
    here = prompt_text(ids, 1800)
    code = (
        "import sys, hashlib; sys.path.insert(0, sys.argv[1]);"
        "from prefix_routing.lab.bodies import prompt_text;"
        "print(hashlib.sha256(prompt_text([3, 17, 123456, 7], 1800).encode()).hexdigest())"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out = subprocess.run(
        [sys.executable, "-c", code, root], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    ).stdout.strip()
    import hashlib

    assert out == hashlib.sha256(here.encode()).hexdigest()
    assert prompt_text(ids, 1800) == here


def test_prompt_sizes_follow_input_length():
    assert len(prompt_text([1, 2, 3]).encode()) == 3 * BLOCK_BYTES
    assert len(prompt_text([1, 2, 3], 1025).encode()) == 2 * BLOCK_BYTES + 4  # 1 token in the last block
    assert len(prompt_text([1, 2, 3], 1536).encode()) == 3 * BLOCK_BYTES
    assert prompt_text([], 0) == ""
    with pytest.raises(ValueError, match="expected ceil"):
        prompt_text([1, 2, 3], 1024)  # two blocks' worth for three ids
    with pytest.raises(ValueError):
        prompt_text([1], 513)


def test_shared_leading_blocks_iff_shared_byte_prefix():
    rng = random.Random(7)
    for _ in range(200):
        n_a, n_b = rng.randint(1, 8), rng.randint(1, 8)
        shared = rng.randint(0, min(n_a, n_b))
        common = [rng.randrange(10**6) for _ in range(shared)]
        a_ids = common + [10**6 + rng.randrange(10**6) for _ in range(n_a - shared)]
        b_ids = common + [2 * 10**6 + rng.randrange(10**6) for _ in range(n_b - shared)]
        a, b = prompt_text(a_ids).encode(), prompt_text(b_ids).encode()
        prefix = common_prefix_length(a, b)
        assert prefix >= shared * BLOCK_BYTES
        if shared < min(n_a, n_b):  # they differ in block `shared`: within its first few words
            assert prefix < shared * BLOCK_BYTES + 64, (shared, prefix)
        else:  # one is a prefix of the other
            assert prefix == min(len(a), len(b))


def test_chat_bodies_share_bytes_exactly_as_far_as_blocks():
    # Conversations: each turn extends the previous prompt (chained ids), as in the Mooncake trace.
    base = [0, 11, 12, 13, 14]
    first = chat_body(record(base, 2400))
    assert first["messages"][0] == {"role": "system", "content": block_text(0)[:-1]}
    assert first["messages"][1]["role"] == "user"
    assert first["max_tokens"] == 64 and first["stream"] is True
    assert first["stream_options"] == {"include_usage": True}
    assert list(first) == ["messages", "max_tokens", "stream", "stream_options"]

    cases = [
        (base, 5),  # identical
        ([0, 11, 12, 99, 98], 3),
        ([0, 11, 12, 13, 14, 15, 16], 5),
        ([0, 50, 51], 1),
        ([7, 11, 12], 0),
    ]
    a = serialize(chat_body(record(base)))
    for ids, shared in cases:
        b = serialize(chat_body(record(ids)))
        prefix = common_prefix_length(a, b)
        head = len(b'{"messages":[{"role":"system","content":"')
        if a == b:
            continue
        # the bytes of the shared blocks (JSON-escaped, so at least their raw size) are shared...
        assert prefix >= head + shared * BLOCK_BYTES - 1, (ids, prefix)
        # ...and not much beyond: the next block differs within its first words (its JSON escaping
        # adds at most one byte per line feed, the message boundary ~30 bytes).
        assert prefix < head + shared * BLOCK_BYTES * 1.05 + 100, (ids, prefix)


def test_chat_body_options_and_record_shapes():
    class Row:
        blocks = [1, 2, 3]
        prompt_tokens = 1500
        output_tokens = 0

    body = chat_body(Row(), system_blocks=2, model="llama", include_usage=False, temperature=0.2)
    assert body["messages"][0]["content"] == prompt_text([1, 2])[:-1]
    assert body["messages"][1]["content"].encode() == prompt_text([1, 2, 3], 1500).encode()[2 * BLOCK_BYTES:]
    assert body["model"] == "llama" and body["max_tokens"] == 1 and body["temperature"] == 0.2
    assert "stream_options" not in body
    no_system = chat_body(record([4, 5]), system_blocks=0)
    assert [m["role"] for m in no_system["messages"]] == ["user"]
    with pytest.raises(ValueError):
        chat_body({"input_length": 3})
    with pytest.raises(ValueError):
        chat_body(record([1, 2]), system_blocks=-1)


# --------------------------------------------------------------------------- client variation


def sample_bodies():
    yield chat_body(record([0, 1, 2], 1300), model="m", temperature=0.7, top_p=0.9, seed=3)
    yield {"messages": [{"role": "user", "content": "Café crème à Zürich\nligne deux"}], "max_tokens": 5}
    yield {"prompt": "naïve résumé", "max_tokens": 3, "temperature": 0}
    yield {"inputs": "Ångström señor", "parameters": {"max_new_tokens": 4, "top_p": 0.5}}


def test_vary_keeps_meaning():
    rng = random.Random(1)
    for body in sample_bodies():
        for _ in range(40):
            varied = vary(body, rng)
            assert isinstance(varied, bytes)
            assert nfc(json.loads(varied)) == body
            crlf = vary(body, rng, text_line_endings=True)
            assert lf(nfc(json.loads(crlf))) == body


def test_vary_really_varies():
    body = next(sample_bodies())
    original = json.dumps(body)
    rng = random.Random(2)
    outputs = [vary(body, rng) for _ in range(60)]
    assert len(set(outputs)) > 40
    assert any(b"\r\n" in o for o in outputs)  # CRLF layout
    assert any(b"\n  " in o or b"\n\t" in o for o in outputs)  # indentation
    assert any(b"\\u" in o for o in outputs)  # ASCII escapes
    assert any(unicodedata.normalize("NFD", "é").encode() in o for o in outputs)  # NFD text
    assert any(o.index(b'"messages"') > o.index(b'"temperature"') for o in outputs)  # parameters first
    assert any(list(json.loads(o)) != list(body) for o in outputs)  # key order
    assert json.dumps(body) == original  # the input is not modified
    text_crlf = [vary(body, random.Random(s), text_line_endings=True) for s in range(20)]
    assert any("\r\n" in json.loads(o)["messages"][1]["content"] for o in text_crlf)
    assert vary(body, random.Random(5)) == vary(body, random.Random(5))


def test_normalized_variants_have_identical_bytes():
    settings = NormalizerSettings(prefix_length=4096)
    rng = random.Random(3)
    for body in sample_bodies():
        canonical = normalize_body(serialize(body), settings).body
        for _ in range(25):
            for text_line_endings in (False, True):
                got = normalize_body(vary(body, rng, text_line_endings=text_line_endings), settings).body
                assert got == canonical
    # and without the normalizer, variation does break the shared leading bytes
    body = next(sample_bodies())
    raw = {vary(body, random.Random(s))[:4096] for s in range(20)}
    assert len(raw) > 5


def test_common_prefix_length():
    assert common_prefix_length(b"", b"abc") == 0
    assert common_prefix_length(b"abc", b"abd") == 2
    assert common_prefix_length(b"abc", b"abc") == 3
    assert common_prefix_length("abcd", "ab") == 2
    assert bodies.BLOCK_BYTES == 2048
