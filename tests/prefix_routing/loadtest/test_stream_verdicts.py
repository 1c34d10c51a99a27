"""The load tester's reading of an answer, line by line and verdict by verdict
(prefix_routing/loadtest/stream.py, as its docstrings define them): SSE fields and comments, error
events and the front door's error types, what complete means per format, the HTTP and exception
kinds, and whether a body asked for usage."""

from __future__ import annotations

import http.client
import json
import socket

import pytest

from prefix_routing.loadtest.stream import Attempt, StreamParser, classify_http, describe_error, _error_text, \
    exception_kind, expects_usage


def parsed(*chunks: bytes) -> StreamParser:
    parser = StreamParser()
    for chunk in chunks:
        parser.feed(chunk)
    parser.close()
    return parser


def data(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


CHUNK = {"choices": [{"delta": {"content": "a"}, "finish_reason": None}]}
LAST = {"choices": [{"delta": {"content": "b"}, "finish_reason": "stop"}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}


# ----------------------------------------------------------------------------- lines


def test_sse_fields_other_than_data_mark_an_sse_stream_and_comments_do_not():
    for field in (b"event: message\n", b"id: 7\n", b"retry: 100\n"):
        parser = parsed(field)
        assert parser.sse and parser.events == 0 and parser.unparsed == 0
    comment = parsed(b": keep-alive\n")
    assert not comment.sse and comment.events == 0 and comment.unparsed == 0
    assert comment.verdict(False) == ("truncated", "the stream ended before any answer")


def test_done_ends_an_sse_stream_and_blank_lines_are_nothing():
    parser = parsed(b"\n\r\n  \n", data(CHUNK), data(LAST), b"data:[DONE]\n")
    assert parser.done and parser.events == 2 and parser.content_chunks == 2 and parser.finish_reason == "stop"
    assert parser.verdict(True) == (None, None)  # SSE: [DONE] is the end, usage or not


def test_an_sse_stream_without_done_is_truncated_even_with_a_finish_reason():
    assert parsed(data(CHUNK), data(LAST), data(USAGE)).verdict(False) == (
        "truncated", "the stream ended without 'data: [DONE]'")


def test_a_line_that_is_no_json_is_counted_unparsed():
    parser = parsed(b"data: {not json\n", b"garbage\n", data(CHUNK))
    assert parser.unparsed == 2 and parser.events == 1


def test_the_last_line_needs_no_line_feed():
    parser = parsed(json.dumps(LAST).encode())
    assert parser.events == 1 and parser.verdict(False) == (None, None)


def test_a_pretty_printed_document_is_read_whole_only_when_no_line_was_an_event():
    whole = json.dumps({"choices": [{"message": {"content": "ab"}, "finish_reason": "length"}]}, indent=2).encode()
    parser = parsed(whole)
    assert parser.events == 1 and parser.unparsed == 0 and parser.finish_reason == "length"
    assert parser.verdict(False) == (None, None)
    broken = parsed(whole[:-3])
    assert broken.events == 0 and broken.verdict(False) == ("truncated", "unreadable answer")


# ----------------------------------------------------------------------------- events


def test_an_event_that_is_no_object_counts_but_says_nothing():
    parser = parsed(b"[1, 2]\n", b'"text"\n')
    assert parser.events == 2 and parser.content_chunks == 0 and parser.error is None
    assert parser.verdict(False) == ("truncated", "the stream ended without a finish reason")


def test_choices_give_text_from_delta_message_or_text_and_skip_what_is_not_a_choice():
    parser = parsed(b"\n".join(json.dumps(e).encode() for e in [
        {"choices": [{"delta": {"content": "a"}}, "not a choice", {"message": {"content": "b"}}]},
        {"choices": [{"text": "c"}, {"delta": {"content": ""}}, {"delta": "odd", "text": "d"}]},
        {"choices": {"0": {"text": "x"}}},
        {"choices": [{"delta": {"role": "assistant"}, "finish_reason": "length"}]},
    ]) + b"\n")
    assert parser.content_chunks == 4 and parser.finish_reason == "length"


def test_an_empty_usage_is_not_usage():
    parser = parsed(json.dumps({"choices": [{"text": "a", "finish_reason": "stop"}], "usage": {}}).encode())
    assert parser.usage is None and parser.verdict(True) == ("truncated", "the stream ended without the usage chunk")
    assert parser.verdict(False) == (None, None)


def test_tgi_tokens_and_the_final_event():
    parser = parsed(b'data:{"token":{"text":"a"},"generated_text":null}\n',
                    b'data:{"token":{"text":"b"},"generated_text":"ab","details":null}\n')
    assert parser.content_chunks == 2 and parser.final_text and parser.finish_reason == "stop"
    assert parser.generated_tokens is None and parser.verdict(True) == (None, None)  # the final event ends SSE
    detailed = parsed(b'{"generated_text":"ab","details":{"finish_reason":"eos_token","generated_tokens":"2"}}\n')
    assert detailed.finish_reason == "eos_token" and detailed.generated_tokens is None
    counted = parsed(b'{"generated_text":"ab","details":{"generated_tokens":7}}\n')
    assert counted.finish_reason == "stop" and counted.generated_tokens == 7


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("error_type, kind", [
    ("throttled", "throttled"), ("model_error", "model_error"), ("model_stream_error", "stream_error"),
    ("stream_failure", "stream_error"), ("truncated", "truncated"), ("timeout", "timeout"),
    ("something_else", "stream_error"), (None, "stream_error"),
])
def test_the_front_doors_error_type_names_the_kind(error_type, kind):
    parser = parsed(data({"error": {"type": error_type, "message": "m"}}), data(LAST), b"data: [DONE]\n")
    assert parser.verdict(False)[0] == kind


@pytest.mark.parametrize("event, detail", [
    ({"error": {"code": "E1", "message": "boom"}}, "E1: boom"),
    ({"error": {"type": "throttled", "Message": "slow down"}}, "throttled: slow down"),
    ({"error": {"message": "just this"}}, "just this"),
    ({"error": {"code": "E2"}}, 'E2: {"code": "E2"}'),
    ({"error": "plain text"}, "plain text"),
    ({"object": "error", "message": "vllm says no", "code": 400}, "400: vllm says no"),
])
def test_an_error_event_is_a_stream_error_with_its_code_and_message(event, detail):
    parser = parsed(data(event))
    assert parser.verdict(False)[1] == detail
    assert parser.verdict(False)[0] in ("stream_error", "throttled")


def test_a_long_text_error_is_cut_at_300_characters():
    parser = parsed(data({"error": "x" * 500}))
    assert parser.verdict(False) == ("stream_error", "x" * 300)


def test_a_null_error_is_no_error():
    parser = parsed(json.dumps({"error": None, "choices": [{"text": "a", "finish_reason": "stop"}]}).encode())
    assert parser.error is None and parser.verdict(False) == (None, None)


# ----------------------------------------------------------------------------- kinds


@pytest.mark.parametrize("status, code, kind", [
    (400, "ThrottlingException", "throttled"), (400, "SlowDown", "throttled"), (400, "rate_limit_exceeded", "throttled"),
    (429, None, "throttled"), (429, "Anything", "throttled"), (429, "ModelNotReadyException", "http_429"),
    (424, "ModelError", "model_error"), (400, "ModelStreamError", "stream_error"),
    (500, "InternalStreamFailure", "stream_error"), (503, "ServiceUnavailable", "http_503"), (400, None, "http_400"),
])
def test_an_http_error_is_classified_by_its_code_then_its_status(status, code, kind):
    assert classify_http(status, code) == kind


class ReadTimeoutError(Exception):
    pass


class ProtocolError(Exception):
    pass


class EndpointConnectionError(ValueError):
    pass


@pytest.mark.parametrize("error, kind", [
    (socket.timeout("t"), "timeout"), (TimeoutError("t"), "timeout"), (ReadTimeoutError("t"), "timeout"),
    (ConnectionResetError("r"), "connection"), (OSError("o"), "connection"),
    (http.client.IncompleteRead(b""), "connection"), (ProtocolError("p"), "connection"),
    (EndpointConnectionError("e"), "connection"), (ValueError("v"), "client_error"), (KeyError("k"), "client_error"),
])
def test_an_exception_is_a_timeout_a_connection_error_or_the_clients(error, kind):
    assert exception_kind(error) == kind


@pytest.mark.parametrize("body, expected", [
    (b'{"stream_options": {"include_usage": true}}', True),
    (b'{"stream_options": {"include_usage": false}}', False),
    (b'{"stream_options": {"include_usage": "true"}}', False),
    (b'{"stream_options": ["include_usage"]}', False),
    (b'["include_usage"]', False),
    (b'{"include_usage": true', False),
    (b'{"messages": []}', False),
])
def test_a_body_asks_for_usage_only_with_stream_options_include_usage_true(body, expected):
    assert expects_usage(body) is expected


@pytest.mark.parametrize("name", ["ProtocolError", "ConnectionClosedError", "EndpointConnectionError",
                                  "HTTPClientError", "IncompleteRead", "NewConnectionError",
                                  "ResponseStreamingError"])
def test_the_http_libraries_connection_errors_are_connection_errors_by_name(name):
    # botocore's and urllib3's own classes derive from neither OSError nor http.client's exceptions
    stand_in = type(name, (Exception,), {})
    assert exception_kind(stand_in("lost")) == "connection"
    assert exception_kind(type(name + "Wrapper", (stand_in,), {})("lost")) == "connection"  # a subclass too


def test_a_tgi_final_event_with_odd_details_still_ends_with_stop():
    parser = parsed(b'data:{"token":{"text":"a"},"generated_text":"a","details":"odd"}\n')
    assert parser.final_text and parser.finish_reason == "stop" and parser.generated_tokens is None
    assert parser.verdict(True) == (None, None)


def test_closing_twice_changes_nothing():
    parser = parsed(b"not json")
    parser.close()
    assert (parser.unparsed, parser.events) == (1, 0) and parser.verdict(False) == ("truncated", "unreadable answer")
    done = parsed(data(LAST), b"data: [DONE]")
    done.close()
    assert (done.events, done.content_chunks, done.unparsed) == (1, 1, 0) and done.verdict(False) == (None, None)


def test_a_document_with_a_line_that_is_an_event_by_itself_is_not_read_whole():
    # "read whole only when no line was an event": the middle line is JSON on its own
    parser = parsed(b'{"choices":\n[{"text": "a", "finish_reason": "stop"}]\n}')
    assert (parser.events, parser.unparsed) == (1, 2)
    assert parser.verdict(False) == ("truncated", "the stream ended without a finish reason")


def test_a_whole_document_is_kept_up_to_16_mib_only():
    mib = 1024 * 1024
    # pretty-printed (no line is an event): read whole at the end, if the parser kept all of it
    document = json.dumps({"choices": [{"message": {"content": "x" * (20 * mib)}, "finish_reason": "stop"}]},
                          indent=1).encode()
    small = json.dumps({"choices": [{"message": {"content": "x" * (15 * mib)}, "finish_reason": "stop"}]},
                       indent=1).encode()
    kept = parsed(small[: 8 * mib], small[8 * mib:])
    assert kept.verdict(False) == (None, None)  # 15 MiB: kept, read whole
    # 8 + 8 MiB reach the limit: the rest is not kept, so the document cannot be read whole
    cut = parsed(document[: 8 * mib], document[8 * mib: 16 * mib], document[16 * mib:])
    assert cut.verdict(False) == ("truncated", "unreadable answer")


def test_an_error_without_a_message_is_shown_as_json_cut_at_200_characters():
    error = {"code": "E3", "detail": "d" * 400}
    assert _error_text(error) == "E3: " + json.dumps(error)[:200]
    assert _error_text({"type": "throttled"}) == 'throttled: {"type": "throttled"}'


def test_an_exception_is_described_by_its_class_and_its_text_on_one_line():
    assert describe_error(ValueError("first\nsecond ")) == "ValueError: first second"
    assert describe_error(ConnectionResetError()) == "ConnectionResetError"
    assert describe_error(OSError("o" * 400)) == "OSError: " + "o" * 300


def test_an_attempt_takes_the_parsers_figures_and_its_verdict_unless_it_failed_already():
    def jsonl(*objects):
        parser = StreamParser()
        parser.feed(b"".join(json.dumps(o).encode() + b"\n" for o in objects))
        return parser

    usage = {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}}
    done = Attempt().finish(jsonl(LAST, {"choices": [], "usage": usage}), expect_usage=True)
    assert (done.kind, done.detail, done.output_tokens, done.prompt_tokens, done.cached_tokens,
            done.finish_reason) == (None, None, 2, 9, 4, "stop")
    no_usage = Attempt().finish(jsonl(LAST), expect_usage=True)
    assert (no_usage.kind, no_usage.detail) == ("truncated", "the stream ended without the usage chunk")
    failed = Attempt(kind="throttled", detail="slow down").finish(jsonl(LAST), expect_usage=False)
    assert (failed.kind, failed.detail, failed.finish_reason, failed.output_tokens) == (
        "throttled", "slow down", "stop", 1)
