"""The exchange (prefix_routing.frontdoor.invoker and .upstream): retries, streaming, outcomes, our own failures."""

from __future__ import annotations

import base64
import json
import random
import pytest
from botocore.exceptions import ClientError, ReadTimeoutError
from prefix_routing import frontdoor
from prefix_routing.frontdoor import invoker as invoker_module, upstream
from prefix_routing.rules.identity import routing_identity
from tests.prefix_routing.frontdoor.conftest import (
    BODY,
    KEY,
    ROLE_TENANT,
    FakeRuntime,
    config,
    sse_chunks,
    url_event,
)

from tests.prefix_routing.frontdoor.test_upstream_errors import _client_error


def test_stream_yields_head_chunks_outcome_and_exact_params(lines):
    runtime = FakeRuntime()
    invoker = frontdoor.Invoker(runtime, config(), KEY, emit=lines)
    items = list(invoker.stream(frontdoor.request_from_event(url_event())))
    head, *chunks, outcome = items
    assert isinstance(head, frontdoor.Head) and head.status == 200
    assert head.headers["content-type"] == "text/event-stream"
    assert chunks == runtime.chunks
    assert isinstance(outcome, frontdoor.Outcome) and outcome.status == 200 and outcome.error is None
    (params,) = runtime.calls
    identity = routing_identity(ROLE_TENANT, None, KEY)
    # The canonical body written out from docs/normalizer.md: cache_salt, messages (role, content), model.
    body = (b'{"cache_salt":"' + identity.cache_salt.encode() + b'","messages":[{"role":"system","content":'
            b'"You are a terse assistant for invoices."},{"role":"user","content":"alpha beta gamma delta"}],'
            b'"model":"m"}')
    assert params == {"EndpointName": "test-prefix-llm", "InferenceComponentName": "test-prefix-llm-ic",
                      "PrefixAwareId": identity.prefix_aware_id, "ContentType": "application/json", "Body": body}
    (log,) = lines.requests
    assert log["status"] == 200 and log["prompt_tokens"] == 12 and log["cached_tokens"] == 8
    assert log["output_tokens"] == 2 and log["tenant"] == ROLE_TENANT and log["attempts"] == 1
    assert log["prefix_aware_id"] == identity.prefix_aware_id


def test_every_answer_names_its_request_id_the_key_of_its_log_line(lines):
    import dataclasses

    request = dataclasses.replace(frontdoor.request_from_event(url_event()), request_id="req-42")
    head = next(iter(frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=lines).stream(request)))
    assert head.status == 200 and head.headers["x-request-id"] == "req-42"
    bad = dataclasses.replace(frontdoor.request_from_event(url_event(b"{")), request_id="req-43")
    head = next(iter(frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=lines).stream(bad)))
    assert head.status == 400 and head.headers["x-request-id"] == "req-43"
    anonymous = dataclasses.replace(frontdoor.request_from_event(url_event()), request_id=None)
    head = next(iter(frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=lines).stream(anonymous)))
    assert "x-request-id" not in head.headers


def test_no_component_means_no_inference_component_parameter():
    runtime = FakeRuntime()
    invoker = frontdoor.Invoker(runtime, config(component_name=None), KEY, emit=lambda line: None)
    list(invoker.stream(frontdoor.request_from_event(url_event())))
    assert "InferenceComponentName" not in runtime.calls[0]


def test_truncated_stream_is_never_complete(lines):
    runtime = FakeRuntime(sse_chunks(("a", "b"), done=False))
    invoker = frontdoor.Invoker(runtime, config(), KEY, emit=lines)
    items = list(invoker.stream(frontdoor.request_from_event(url_event())))
    assert items[0].status == 200  # the head went out with the first token
    assert b'"type":"truncated"' in items[-2] and b"[DONE]" not in b"".join(items[1:-1])
    assert items[-1].status == 502 and items[-1].error["code"] == "truncated"
    assert lines.requests[0]["status"] == 502 and lines.requests[0]["error_kind"] == "truncated"
    assert lines.emf[0]["UpstreamErrors"] == 1
    answer = invoker.buffered(frontdoor.request_from_event(url_event()))
    assert answer.status == 502 and answer.body["error"]["code"] == "truncated"
    assert answer.body["partial"]["choices"][0]["text"] == "a b"


def test_empty_stream_is_truncated_before_the_head():
    invoker = frontdoor.Invoker(FakeRuntime([]), config(), KEY, emit=lambda line: None)
    answer = invoker.buffered(frontdoor.request_from_event(url_event()))
    assert answer.status == 502 and answer.body["error"]["code"] == "truncated"


def test_closing_the_generator_logs_client_closed(lines):
    invoker = frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=lines)
    exchange = invoker.stream(frontdoor.request_from_event(url_event()))
    assert next(exchange).status == 200
    next(exchange)
    exchange.close()
    (log,) = lines.requests
    assert log["status"] == 499 and log["error_kind"] == "client_closed"
    assert lines.emf[0]["UpstreamErrors"] == 0 and lines.emf[0]["ClientErrors"] == 0


def test_abandoning_the_generator_after_the_outcome_keeps_its_status(lines):
    invoker = frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=lines)
    assert invoker.buffered(frontdoor.request_from_event(url_event())).status == 200
    import gc

    gc.collect()
    assert [log["status"] for log in lines.requests] == [200]


def test_backoff_is_bounded_and_jittered():
    invoker = frontdoor.Invoker(FakeRuntime(), config(backoff_base_s=0.1, backoff_max_s=1.0), KEY,
                             emit=lambda line: None, jitter=lambda: 0.999)
    delays = [invoker.upstream.backoff(attempt) for attempt in range(1, 8)]
    assert delays == sorted(delays) and max(delays) <= 1.0 and delays[0] >= 0.05
    low = frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=lambda line: None, jitter=lambda: 0.0)
    assert low.upstream.backoff(1) == pytest.approx(0.05)
    rng = random.Random(3)
    values = [upstream.random_jitter() for _ in range(200)] + [rng.random()]
    assert all(0 <= v < 1 for v in values)


def test_decode_direct_payload_with_and_without_the_adapter_prelude():
    answer = {"statusCode": 200, "body": {"choices": []}}
    raw = json.dumps(answer).encode()
    prelude = json.dumps({"statusCode": 200, "headers": {"content-type": "application/json"}, "cookies": []}).encode()
    assert frontdoor.decode_direct_payload(raw) == answer
    assert frontdoor.decode_direct_payload(prelude + b"\x00" * 8 + raw) == answer


def test_base64_helper_roundtrip_used_by_events():
    assert frontdoor.request_from_event(url_event(base64.b64decode(base64.b64encode(BODY)), base64=True)).body == BODY


def test_error_fields_from_client_keys_are_redacted_in_the_log(lines):
    invoker = frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=lines)
    body = json.dumps({"prompt": "x", "parameters": {"a": 1}, "weird": {"my secret prompt": float("nan")}})
    answer = invoker.buffered(frontdoor.request_from_event(url_event(body)))
    assert answer.status == 400 and "my secret prompt" in answer.body["error"]["field"]  # the caller is told
    assert lines.requests[0]["error_field"] == "(redacted)" and "my secret prompt" not in "".join(lines.lines)
    invoker.buffered(frontdoor.request_from_event(url_event(b'{"messages": [{"role": "user"}]}')))
    assert lines.requests[1]["error_field"] == "messages[0].content"


# A bug in the front door (not the endpoint's failure) answers 500 "internal", is logged with status
# 500 and origin internal, is never retried and is not counted as an upstream error.


class BrokenRuntime(FakeRuntime):
    """The runtime call itself fails with an exception no upstream raises (our bad parameters)."""

    def invoke_endpoint_with_response_stream(self, **params):
        self.calls.append(params)
        raise TypeError("unexpected keyword argument (a bug of ours)")


def assert_internal_telemetry(lines, *, sent: bool) -> dict:
    (log,) = lines.requests
    assert (log["status"], log["error_kind"]) == (500, "internal")
    (emf,) = lines.emf
    assert (emf["UpstreamErrors"], emf["ClientErrors"], emf["Requests"]) == (0, 0, 1 if sent else 0)
    return log


def test_a_bug_while_preparing_is_500_internal_and_not_an_upstream_error(lines, monkeypatch):
    def broken_prepare(*args, **kwargs):
        raise ZeroDivisionError("a bug of ours")

    monkeypatch.setattr(invoker_module, "prepare", broken_prepare)
    runtime = FakeRuntime()
    items = list(frontdoor.Invoker(runtime, config(), KEY, emit=lines).stream(frontdoor.request_from_event(url_event())))
    head, body, outcome = items
    assert (head.status, head.headers["content-type"]) == (500, "application/json")
    assert json.loads(body) == {"error": {"code": "internal", "message": "internal error in the front door",
                                          "status": 500}}
    assert (outcome.status, outcome.error["code"]) == (500, "internal")
    assert runtime.calls == []
    log = assert_internal_telemetry(lines, sent=False)
    assert log["error_field"] == "ZeroDivisionError"  # the exception's class, never its text


def test_a_bug_in_the_runtime_call_is_500_internal_and_never_retried(lines):
    runtime = BrokenRuntime()
    sleeps = []
    invoker = frontdoor.Invoker(runtime, config(), KEY, emit=lines, sleep=sleeps.append)
    head, body, outcome = list(invoker.stream(frontdoor.request_from_event(url_event())))
    assert head.status == 500 and json.loads(body)["error"]["code"] == "internal"
    assert outcome.status == 500
    assert len(runtime.calls) == 1 and sleeps == []
    log = assert_internal_telemetry(lines, sent=True)
    assert log["attempts"] == 1


def test_a_bug_after_the_first_byte_ends_the_stream_with_an_internal_error(lines, monkeypatch):
    real_feed = frontdoor.StreamReader.feed
    fed = []

    def feed_then_fail(reader, data):
        fed.append(data)
        if len(fed) == 2:
            raise KeyError("a bug of ours in the reader")
        return real_feed(reader, data)

    monkeypatch.setattr(frontdoor.StreamReader, "feed", feed_then_fail)
    runtime = FakeRuntime()
    head, first, *rest = list(frontdoor.Invoker(runtime, config(), KEY, emit=lines).stream(
        frontdoor.request_from_event(url_event())))
    assert head.status == 200 and first == runtime.chunks[0]  # the head and first byte were already sent
    *chunks, error_event, outcome = rest
    assert chunks == []  # the chunk being read when the bug struck is not passed on half-checked
    assert error_event.startswith(b"data: ") and error_event.endswith(b"\n\n")
    assert json.loads(error_event[len(b"data: "):])["error"]["type"] == "internal"
    assert b"[DONE]" not in b"".join(rest[:-1])  # never looks complete
    assert (outcome.status, outcome.error["code"]) == (500, "internal")
    assert_internal_telemetry(lines, sent=True)


def _named(name: str, base: type = Exception, **attributes) -> BaseException:
    """An exception of a class with this name: classify_error recognises classes by name."""
    error = type(name, (base,), {})("boom")
    for key, value in attributes.items():
        setattr(error, key, value)
    return error


@pytest.mark.parametrize(
    ("error", "status", "kind", "retryable"),
    [
        (_client_error("InternalServerError", 500), 502, "upstream_error", True),
        (_client_error("ServiceFailure", 400), 502, "upstream_error", True),  # by its code, whatever the status
        (_client_error("Odd", 500), 502, "upstream_error", True),  # unknown code, 5xx status
        (_client_error("Odd", 499), 502, "upstream_rejected", False),  # unknown code below 500
        (ClientError({"Error": {"Message": "no code"}, "ResponseMetadata": {"HTTPStatusCode": 400}}, "X"), 502,
         "upstream_rejected", False),
        (_named("ConnectionClosedError"), 502, "upstream_connection", True),
        (ConnectionResetError("reset"), 502, "upstream_connection", True),  # a builtin ConnectionError
        (_named("ParserError"), 502, "upstream_connection", True),
        (_named("IncompleteRead"), 502, "upstream_connection", True),
        (_named("ChecksumMismatch"), 502, "upstream_connection", True),
        (_named("ReadTimeout"), 504, "timeout", False),
        # Not a ClientError, though it carries a response mapping: a bug of ours, not the endpoint's.
        (_named("Weird", response={"Error": {"Code": "ThrottlingException"}}), 500, "internal", False),
    ],
)
def test_classify_error_recognises_every_documented_class(error, status, kind, retryable):
    upstream = frontdoor.classify_error(error)
    assert (upstream.status, upstream.kind, upstream.retryable) == (status, kind, retryable)


def test_classify_error_messages_say_which_timeout_and_which_code():
    assert frontdoor.classify_error(ReadTimeoutError(endpoint_url="http://x")).message == \
        "the model did not answer in time (read timeout)"
    assert frontdoor.classify_error(TimeoutError()).message == "the model did not answer in time"
    unnamed = ClientError({"Error": {"Message": "no code"}, "ResponseMetadata": {"HTTPStatusCode": 400}}, "X")
    assert frontdoor.classify_error(unnamed).upstream_code == "Unknown"
    bare = _client_error("ModelError", 424)  # no OriginalStatusCode: no status in the message
    assert frontdoor.classify_error(bare).message == "the model failed the request: ModelError happened"
