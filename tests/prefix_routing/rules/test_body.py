"""The canonical body (prefix_routing.rules.body): field order, compact JSON, body shapes, and the same bytes in every process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import OrderedDict

from prefix_routing.rules.body import normalize_body
from prefix_routing.rules.constants import KNOWN_FIELD_ORDER
from prefix_routing.rules.identity import routing_identity
from prefix_routing.rules.settings import FreezeRule, NormalizerSettings
from tests.prefix_routing.rules.conftest import DATE, ROOT, chat, norm, parsed, user


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
