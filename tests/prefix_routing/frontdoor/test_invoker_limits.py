"""The invoker under per-tenant limits, with a real store (dynalite on 127.0.0.1): the 429 a caller
gets, the headers on every answer, the log line and metrics, and the slot freed however an answer ends."""

from __future__ import annotations

import json
import uuid

import pytest

from prefix_routing import frontdoor
from prefix_routing.frontdoor.local import create_limits_table, limits_client
from prefix_routing.rules.limits import LimitSettings, TenantLimits
from tests.prefix_routing.frontdoor.conftest import CHAT, KEY, ROLE_TENANT, FakeRuntime, config, sse_chunks, url_event


@pytest.fixture
def make(local_dynamo, lines):
    table = f"limits-{uuid.uuid4().hex[:8]}"
    create_limits_table(limits_client(local_dynamo.url, 5000), table)

    def build(runtime=None, **limits):
        settings = LimitSettings(default=TenantLimits(**limits), store_timeout_ms=2000)
        store = frontdoor.DynamoLimitStore(limits_client(local_dynamo.url, 2000), table)
        runtime = runtime or FakeRuntime()
        invoker = frontdoor.Invoker(runtime, config(limits=settings, limits_table=table), KEY, emit=lines,
                                    limiter=frontdoor.Limiter(settings, store))
        return invoker, runtime

    return build


def request() -> frontdoor.FrontRequest:
    return frontdoor.request_from_event(url_event())


def test_over_the_limit_a_caller_gets_429_with_retry_after_and_the_endpoint_is_not_called(make, lines):
    invoker, runtime = make(concurrent_streams=1)
    first = invoker.stream(request())
    head = next(first)  # the first request is streaming: it holds the tenant's one slot
    assert head.status == 200 and head.headers["x-ratelimit-remaining-streams"] == "0"
    refused = invoker.buffered(request())
    assert refused.status == 429 and refused.headers["retry-after"] == "1"
    assert refused.headers["x-ratelimit-limit-streams"] == "1"
    assert refused.body["error"] == {"code": "rate_limited", "limit": "concurrent_streams", "retry_after_s": 1,
                                     "status": 429, "message": refused.body["error"]["message"]}
    assert len(runtime.calls) == 1  # the refused request never reached the endpoint
    log = lines.requests[-1]
    assert (log["status"], log["throttled_by"], log["limit_rule"], log["tenant"]) == (
        429, "concurrent_streams", "default", ROLE_TENANT)
    emf = lines.emf[-1]
    assert (emf["ThrottledRequests"], emf["ClientErrors"], emf["Requests"]) == (1, 1, 0)
    list(first)  # the first answer ends: its slot is free again
    assert invoker.buffered(request()).status == 200


def test_the_slot_is_free_before_the_answers_end_reaches_the_caller(make):
    # A client that sends its next request the moment it reads [DONE] must not be refused: with one
    # stream allowed, a request made while the last bytes are in hand (before the generator ends) is served.
    invoker, _ = make(concurrent_streams=1)
    answer = invoker.stream(request())
    received = b""
    for item in answer:
        if isinstance(item, bytes):
            received += item
            if received.endswith(b"data: [DONE]\n\n"):
                break
    assert invoker.buffered(request()).status == 200
    answer.close()


def test_the_slot_is_held_until_the_end_marker_arrives(make):
    invoker, _ = make(concurrent_streams=1)
    answer = invoker.stream(request())
    next(answer), next(answer), next(answer)  # the head and the first two chunks: no end marker yet
    assert invoker.buffered(request()).status == 429
    answer.close()


def test_a_caller_going_away_frees_its_slot(make):
    invoker, _ = make(concurrent_streams=1)
    exchange = invoker.stream(request())
    next(exchange), next(exchange)  # the head and the first bytes
    exchange.close()  # the caller went away mid-answer (499)
    assert invoker.buffered(request()).status == 200


def test_an_endpoint_failure_frees_the_slot_too(make):
    class Failing(FakeRuntime):
        def invoke_endpoint_with_response_stream(self, **params):
            raise RuntimeError("boom")

    invoker, _ = make(runtime=Failing(), concurrent_streams=1)
    assert invoker.buffered(request()).status == 500
    assert invoker.buffered(request()).status == 500  # not 429: the first one gave its slot back


def asking(max_tokens: int | None) -> frontdoor.FrontRequest:
    body = {**CHAT, **({"max_tokens": max_tokens} if max_tokens is not None else {})}
    return frontdoor.request_from_event(url_event(json.dumps(body).encode()))


def test_tokens_are_charged_for_the_output_asked_then_from_the_engines_usage(make, lines):
    usage = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}
    invoker, _ = make(runtime=FakeRuntime(sse_chunks(usage=usage)), tokens_per_minute=1000)
    first = invoker.stream(asking(600))
    head = next(first)  # streaming: charged its prompt and the 600 tokens it may yet produce
    remaining = int(head.headers["x-ratelimit-remaining-tokens"])
    assert remaining < 1000 - 600
    refused = invoker.buffered(asking(600))  # 2 × (prompt + 600) > 1,000 while the first may use its 600
    assert refused.status == 429 and refused.body["error"]["limit"] == "tokens_per_minute"
    assert "the tenant's 1000 for this minute are used" in refused.body["error"]["message"]
    list(first)  # its answer ends: the engine's 150 replace the charge
    second = invoker.buffered(asking(600))
    assert second.status == 200
    # the minute holds the first's 150 used and the second's charge (the first's, the same body)
    assert int(second.headers["x-ratelimit-remaining-tokens"]) == 1000 - 150 - (1000 - remaining)


def test_a_request_asking_more_than_the_minute_holds_is_refused_for_good(make, lines):
    invoker, runtime = make(tokens_per_minute=1000)
    refused = invoker.buffered(asking(1000))  # its prompt + 1,000 can never fit
    assert refused.status == 429 and "set max_tokens lower" in refused.body["error"]["message"]
    assert runtime.calls == []
    assert invoker.buffered(asking(None)).status == 429  # no max_tokens: the stage's 1,024 charged


def test_a_store_failure_serves_when_open(lines):
    settings = LimitSettings(default=TenantLimits(concurrent_streams=1), store_timeout_ms=100)
    store = frontdoor.DynamoLimitStore(limits_client("http://127.0.0.1:9", 100), "t")  # nothing listens
    invoker = frontdoor.Invoker(FakeRuntime(), config(limits=settings, limits_table="t"), KEY, emit=lines,
                                limiter=frontdoor.Limiter(settings, store))
    assert invoker.buffered(request()).status == 200
    assert lines.requests[-1]["limiter_store_error"] is True and lines.emf[-1]["LimiterStoreErrors"] == 1


def test_a_store_failure_refuses_when_closed(lines):
    settings = LimitSettings(default=TenantLimits(concurrent_streams=1), store_timeout_ms=100, on_store_error="closed")
    store = frontdoor.DynamoLimitStore(limits_client("http://127.0.0.1:9", 100), "t")
    runtime = FakeRuntime()
    invoker = frontdoor.Invoker(runtime, config(limits=settings, limits_table="t"), KEY, emit=lines,
                                limiter=frontdoor.Limiter(settings, store))
    answer = invoker.buffered(request())
    assert answer.status == 503 and answer.body["error"]["code"] == "limits_unavailable" and not runtime.calls


def test_limits_need_a_table_and_a_limiter():
    settings = LimitSettings(default=TenantLimits(requests_per_minute=5))
    with pytest.raises(frontdoor.ConfigurationError, match="LIMITS_TABLE"):
        config(limits=settings)
    with pytest.raises(ValueError, match="limiter"):
        frontdoor.Invoker(FakeRuntime(), config(limits=settings, limits_table="t"), KEY)
