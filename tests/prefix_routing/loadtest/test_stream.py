"""Reading answers as they stream (prefix_routing.loadtest.stream)."""

from __future__ import annotations

import json
from prefix_routing import loadtest as L


def parse(chunks, expect_usage=False):
    parser = L.StreamParser()
    for chunk in chunks:
        parser.feed(chunk)
    parser.close()
    return parser, parser.verdict(expect_usage)


def test_stream_parser_formats_and_fragments():
    usage = {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}}
    events = [{"choices": [{"delta": {"content": "a"}, "finish_reason": None}]},
              {"choices": [{"delta": {"content": "b"}, "finish_reason": "stop"}]},
              {"choices": [], "usage": usage}]
    sse = b"".join(b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events) + b"data: [DONE]\n\n"
    parser, verdict = parse([sse[i:i + 1] for i in range(len(sse))], expect_usage=True)  # one byte at a time
    assert verdict == (None, None)
    assert (parser.output_tokens, parser.prompt_tokens, parser.cached_tokens) == (2, 9, 3)
    assert parse([sse[: sse.rindex(b"data: [DONE]")]])[1][0] == "truncated"
    jsonl = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    assert parse([jsonl], expect_usage=True)[1] == (None, None)
    assert parse([jsonl[: jsonl.rindex(b'{"choices": []')]], expect_usage=True)[1][0] == "truncated"
    assert parse([jsonl[: jsonl.rindex(b'{"choices": []')]], expect_usage=False)[1] == (None, None)
    whole = json.dumps({"choices": [{"message": {"content": "ab"}, "finish_reason": "length"}], "usage": usage},
                       indent=2).encode()
    parser, verdict = parse([whole[:10], whole[10:]], expect_usage=True)
    assert verdict == (None, None) and parser.cached_tokens == 3
    tgi = [b'data:{"token":{"text":"a"},"generated_text":null}\n\n',
           b'data:{"token":{"text":"b"},"generated_text":"ab","details":{"finish_reason":"length",'
           b'"generated_tokens":2}}\n\n']
    parser, verdict = parse(tgi)
    assert verdict == (None, None) and parser.output_tokens == 2
    assert parse(tgi[:1])[1][0] == "truncated"
    assert parse([b'data: {"error": {"message": "boom", "code": "X"}}\n\n'])[1] == ("stream_error", "X: boom")
    assert parse([b""])[1][0] == "truncated"
    assert parse([b"<html>oops</html>"])[1] == ("truncated", "unreadable answer")
