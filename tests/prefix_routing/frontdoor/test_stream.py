"""Reading the model's stream: usage, in-band errors, complete or truncated (prefix_routing.frontdoor.stream)."""

from __future__ import annotations

import json
from hypothesis import given, settings, strategies as st
from prefix_routing import frontdoor
from tests.prefix_routing.frontdoor.conftest import sse_chunks


def _read(chunks, **kwargs) -> frontdoor.StreamReader:
    reader = frontdoor.StreamReader(**kwargs)
    for chunk in chunks:
        reader.feed(chunk)
    reader.finish()
    return reader


def test_reader_sse_complete_with_usage_and_text():
    reader = _read(sse_chunks(("a", "b", "c")), collect=True)
    assert reader.complete and reader.format == "sse" and reader.done
    assert (reader.prompt_tokens, reader.cached_tokens, reader.completion_tokens) == (12, 8, 3)
    assert reader.answer()["choices"] == [{"index": 0, "text": "a b c", "finish_reason": "stop"}]


def test_reader_openai_sse_without_done_is_truncated_even_after_finish_reason():
    chunks = sse_chunks(("a", "b"), done=False)
    reader = _read(chunks)
    assert reader.finished and reader.usage is not None and not reader.complete
    assert not _read(sse_chunks(("a", "b"), usage=False, done=False)).complete
    assert not _read(sse_chunks(("a", "b"))[:1]).complete


def test_reader_cut_mid_line_is_incomplete():
    whole = b"".join(sse_chunks(("a", "b")))
    assert _read([whole]).complete
    assert not _read([whole[:-20]]).complete


def test_reader_json_lines():
    lines = [json.dumps({"choices": [{"index": 0, "text": w, "finish_reason": None}]}).encode() + b"\n" for w in "ab"]
    final = json.dumps({"choices": [{"index": 0, "text": "!", "finish_reason": "length"}]}).encode() + b"\n"
    usage = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}).encode() + b"\n"
    reader = _read(lines + [final, usage], expects_usage=True, collect=True)
    assert reader.format == "jsonl" and reader.complete and reader.prompt_tokens == 3
    assert reader.answer()["choices"][0] == {"index": 0, "text": "ab!", "finish_reason": "length"}
    assert not _read(lines + [final], expects_usage=True).complete  # the usage chunk never came
    assert _read(lines + [final], expects_usage=False).complete
    assert not _read(lines).complete


def test_reader_tgi_and_lmi_token_streams():
    tokens = [json.dumps({"token": {"id": i, "text": t, "special": False}, "generated_text": None}).encode() + b"\n"
              for i, t in enumerate(["Hel", "lo"])]
    end = json.dumps({"token": {"id": 9, "text": "</s>", "special": True}, "generated_text": "Hello",
                      "details": {"finish_reason": "eos_token", "generated_tokens": 3}}).encode() + b"\n"
    reader = _read(tokens + [end], collect=True)
    assert reader.complete and reader.completion_tokens == 3
    assert reader.answer()["choices"][0]["text"] == "Hello"
    assert not _read(tokens).complete
    sse = [b"data:" + t for t in tokens + [end]]
    assert _read(sse).complete  # TGI's SSE has no [DONE]: the final chunk decides


def test_reader_one_json_document_and_pretty_printed():
    document = {"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 4}}}
    for raw in (json.dumps(document).encode(), json.dumps(document, indent=2).encode()):
        reader = _read([raw[:7], raw[7:]], collect=True)
        assert reader.complete and reader.cached_tokens == 4
        assert reader.answer() == document
        assert not _read([raw[:-3]]).complete


def test_reader_in_band_errors_are_failures():
    chunks = sse_chunks(("a",), usage=False, done=False)
    chunks.append(b'data: {"error": {"message": "engine died", "type": "server_error"}}\n\n')
    reader = _read(chunks)
    assert reader.error["message"] == "engine died" and not reader.complete
    assert not _read([b'{"object": "error", "message": "bad", "code": 400}']).complete


def test_reader_crlf_and_comments():
    raw = b": keep-alive\r\nevent: message\r\n" + b"".join(sse_chunks(("a",))).replace(b"\n", b"\r\n")
    reader = _read([raw])
    assert reader.complete and reader.prompt_tokens == 12


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_reader_does_not_depend_on_payload_part_boundaries(data):
    whole = b"".join(sse_chunks(("alpha", "beta", "gamma", "délta")))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(whole)), max_size=12)))
    pieces = [whole[a:b] for a, b in zip([0] + cuts, cuts + [len(whole)])]
    reader = _read(pieces, collect=True)
    assert reader.complete and reader.usage["prompt_tokens"] == 12
    assert reader.answer()["choices"][0]["text"] == "alpha beta gamma délta"
    done_end = whole.index(b"data: [DONE]") + len(b"data: [DONE]")  # from there on nothing is missing
    truncated = data.draw(st.integers(1, done_end - 1))
    assert not _read([whole[:truncated]]).complete
