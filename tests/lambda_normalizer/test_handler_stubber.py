"""The handler against botocore's Stubber: the exact runtime parameters, retries and error paths.

Stubber checks every request against the real service model and our expected parameters
(``EndpointName``, ``InferenceComponentName``, ``PrefixAwareId``, ``ContentType``, the canonical
``Body``). It cannot fake an event-stream body, so for successful calls an ``after-call`` hook puts a
real ``botocore.eventstream.EventStream`` in the response, over bytes framed by
``prefix_routing.eventstream``: botocore's own parser reads them.
"""

from __future__ import annotations

import json

import boto3
import handler as lambda_handler
import pytest
from botocore import parsers
from botocore.eventstream import EventStream
from botocore.stub import Stubber

from prefix_routing import frontdoor
from prefix_routing.emulator import eventstream
from prefix_routing.rules.body import normalize_body
from prefix_routing.rules.identity import routing_identity
from tests.lambda_normalizer.conftest import environment_with_a_stubbed_secret
from tests.prefix_routing.frontdoor.conftest import BODY, CHAT, KEY, ROLE_TENANT, config, sse_chunks, url_event

OPERATION = "invoke_endpoint_with_response_stream"


class _Raw:
    """What botocore's EventStream reads from: ``stream()`` yields the body in pieces."""

    def __init__(self, data: bytes, piece: int = 97) -> None:
        self.data, self.piece, self.closed = data, piece, False

    def stream(self):
        for start in range(0, len(self.data), self.piece):
            yield self.data[start:start + self.piece]

    def close(self):
        self.closed = True


class StubbedRuntime:
    """A real sagemaker-runtime client under Stubber; successful answers get real event streams."""

    def __init__(self) -> None:
        self.client = boto3.client("sagemaker-runtime", region_name="us-east-1", aws_access_key_id="test",
                                   aws_secret_access_key="test")
        self.stubber = Stubber(self.client)
        self._bodies: list[bytes] = []
        model = self.client.meta.service_model.operation_model("InvokeEndpointWithResponseStream")
        self._shape = model.output_shape.members["Body"]
        self.client.meta.events.register(
            "after-call.sagemaker-runtime.InvokeEndpointWithResponseStream", self._swap_body)
        self.stubber.activate()

    def _swap_body(self, parsed, **_):
        if "Body" in parsed:
            raw = _Raw(self._bodies.pop(0))
            parsed["Body"] = EventStream(raw, self._shape, parsers.EventStreamJSONParser(),
                                         "InvokeEndpointWithResponseStream")

    def answer(self, expected: dict, messages: list[bytes], content_type: str = "text/event-stream") -> None:
        self._bodies.append(b"".join(messages))
        self.stubber.add_response(OPERATION, {"Body": {}, "ContentType": content_type}, expected)

    def fail(self, expected: dict, code: str, status: int, **fields) -> None:
        self.stubber.add_client_error(OPERATION, service_error_code=code, service_message=f"{code} (stubbed)",
                                      http_status_code=status, expected_params=expected,
                                      response_meta=None, modeled_fields=fields or None)


def parts(chunks: list[bytes]) -> list[bytes]:
    return [eventstream.payload_part(c) for c in chunks]


def expected_params(body: bytes = BODY, tenant: str = ROLE_TENANT, application=None, cfg=None) -> dict:
    """The parameters we expect, computed without the invoker: the tenant's identity and canonical
    body come from the rules library (routing_identity, normalize_body); the front door's one change
    to a body, asking a streaming body that does not say for its usage, is applied here by hand."""
    cfg = cfg or config()
    identity = routing_identity(tenant, application, KEY)
    data = json.loads(body)
    if data.get("stream") is True and "stream_options" not in data:
        data["stream_options"] = {"include_usage": True}
    return {"EndpointName": "test-prefix-llm", "InferenceComponentName": "test-prefix-llm-ic",
            "PrefixAwareId": identity.prefix_aware_id, "ContentType": "application/json",
            "Body": normalize_body(data, cfg.settings, identity=identity).body}


def test_the_expected_body_of_the_default_request_written_out():
    # The canonical form by hand (docs/normalizer.md): cache_salt first, then messages with role before
    # content, then model; compact separators.
    salt = routing_identity(ROLE_TENANT, None, KEY).cache_salt
    assert expected_params()["Body"] == (
        b'{"cache_salt":"' + salt.encode() + b'","messages":[{"role":"system","content":"You are a terse '
        b'assistant for invoices."},{"role":"user","content":"alpha beta gamma delta"}],"model":"m"}'
    )


@pytest.fixture
def runtime():
    stubbed = StubbedRuntime()
    yield stubbed
    stubbed.stubber.deactivate()


@pytest.fixture
def sleeps():
    return []


def make_invoker(runtime, lines, sleeps, **overrides) -> frontdoor.Invoker:
    return frontdoor.Invoker(runtime.client, config(**overrides), KEY, emit=lines, sleep=sleeps.append,
                          jitter=lambda: 0.5)


def test_exact_parameters_and_a_real_event_stream(runtime, lines, sleeps):
    expected = expected_params()
    assert expected["PrefixAwareId"].startswith("pa-") and len(expected["PrefixAwareId"]) <= 64
    assert expected["Body"].startswith(b'{"cache_salt":')
    runtime.answer(expected, parts(sse_chunks(("one", "two", "three"))))
    answer = make_invoker(runtime, lines, sleeps).buffered(frontdoor.request_from_event(url_event()))
    runtime.stubber.assert_no_pending_responses()
    assert answer.status == 200
    assert answer.body["choices"] == [{"index": 0, "text": "one two three", "finish_reason": "stop"}]
    assert answer.body["usage"]["prompt_tokens_details"]["cached_tokens"] == 8
    assert answer.headers["x-prefix-aware-id"] == expected["PrefixAwareId"]
    (log,) = lines.requests
    assert (log["status"], log["attempts"], log["prompt_tokens"], log["cached_tokens"]) == (200, 1, 12, 8)
    assert sleeps == []


def test_the_same_request_in_another_shape_sends_the_same_bytes(runtime, lines, sleeps):
    expected = expected_params()
    messy = ('{\r\n  "messages": [{"content": "You are a terse assistant for invoices.  ", "role": "system"},'
             ' {"content": "alpha beta gamma delta", "role": "user"}],\r\n "model": "m"}').encode()
    runtime.answer(expected, parts(sse_chunks()))
    answer = make_invoker(runtime, lines, sleeps).buffered(frontdoor.request_from_event(url_event(messy)))
    assert answer.status == 200
    runtime.stubber.assert_no_pending_responses()


def test_streaming_body_gets_include_usage_in_the_exact_body(runtime, lines, sleeps):
    body = json.dumps(dict(CHAT, stream=True)).encode()
    expected = expected_params(body)
    assert json.loads(expected["Body"])["stream_options"] == {"include_usage": True}
    runtime.answer(expected, parts(sse_chunks()))
    assert make_invoker(runtime, lines, sleeps).buffered(frontdoor.request_from_event(url_event(body))).status == 200
    runtime.stubber.assert_no_pending_responses()


def test_throttling_is_retried_with_backoff_then_succeeds(runtime, lines, sleeps):
    expected = expected_params()
    runtime.fail(expected, "ThrottlingException", 400)
    runtime.fail(expected, "ThrottlingException", 400)
    runtime.answer(expected, parts(sse_chunks()))
    answer = make_invoker(runtime, lines, sleeps, backoff_base_s=0.2, backoff_max_s=5).buffered(
        frontdoor.request_from_event(url_event()))
    runtime.stubber.assert_no_pending_responses()
    assert answer.status == 200
    assert sleeps == [pytest.approx(0.15), pytest.approx(0.3)]  # 0.2·2^(n-1), jitter 0.5 → ×0.75
    assert lines.requests[0]["attempts"] == 3 and lines.emf[0]["UpstreamErrors"] == 0


def test_persistent_throttling_is_429_with_retry_after(runtime, lines, sleeps):
    expected = expected_params()
    for _ in range(3):
        runtime.fail(expected, "ThrottlingException", 400)
    answer = make_invoker(runtime, lines, sleeps).buffered(frontdoor.request_from_event(url_event()))
    runtime.stubber.assert_no_pending_responses()
    assert answer.status == 429 and answer.headers["retry-after"].isdigit()
    assert answer.body["error"]["code"] == "throttled" and answer.body["error"]["attempts"] == 3
    assert len(sleeps) == 2
    assert lines.emf[0]["UpstreamErrors"] == 1 and lines.emf[0]["Requests"] == 1
    assert "TimeToFirstToken" not in lines.emf[0]


@pytest.mark.parametrize(
    ("code", "http", "status", "kind", "attempts"),
    [
        ("ModelError", 424, 502, "model_error", 1),
        ("ValidationError", 400, 502, "upstream_rejected", 1),
        ("AccessDeniedException", 403, 502, "upstream_denied", 1),
        ("ServiceUnavailable", 503, 503, "upstream_unavailable", 3),
        ("InternalFailure", 500, 502, "upstream_error", 3),
        ("ModelNotReadyException", 429, 503, "model_not_ready", 3),
    ],
)
def test_upstream_errors(runtime, lines, sleeps, code, http, status, kind, attempts):
    expected = expected_params()
    fields = {"OriginalStatusCode": 500, "OriginalMessage": "CUDA out of memory"} if code == "ModelError" else {}
    for _ in range(attempts):
        runtime.fail(expected, code, http, **fields)
    answer = make_invoker(runtime, lines, sleeps).buffered(frontdoor.request_from_event(url_event()))
    runtime.stubber.assert_no_pending_responses()  # exactly `attempts` calls: no retry of non-transient errors
    assert answer.status == status and answer.body["error"]["code"] == kind
    assert answer.body["error"]["upstream_code"] == code and answer.body["error"]["message"]
    assert lines.requests[0]["status"] == status and lines.requests[0]["error_kind"] == kind


def test_transient_error_then_success(runtime, lines, sleeps):
    expected = expected_params()
    runtime.fail(expected, "InternalFailure", 500)
    runtime.answer(expected, parts(sse_chunks()))
    answer = make_invoker(runtime, lines, sleeps).buffered(frontdoor.request_from_event(url_event()))
    assert answer.status == 200 and len(sleeps) == 1


def test_mid_stream_model_error_after_the_first_token(runtime, lines, sleeps):
    expected = expected_params()
    chunks = sse_chunks(("a", "b", "c"), usage=False, done=False)[:2]
    runtime.answer(expected, parts(chunks) + [eventstream.model_stream_error("model crashed", "StreamBroken")])
    invoker = make_invoker(runtime, lines, sleeps)
    items = list(invoker.stream(frontdoor.request_from_event(url_event())))
    assert items[0].status == 200
    assert items[-1].status == 502 and items[-1].error["code"] == "model_stream_error"
    error_event = json.loads(items[-2].strip().removeprefix(b"data: "))
    assert error_event["error"]["type"] == "model_stream_error" and error_event["error"]["code"] == 502
    assert sleeps == []  # never retried once the caller has bytes


def test_stream_error_before_the_first_token_is_retried(runtime, lines, sleeps):
    expected = expected_params()
    runtime.answer(expected, [eventstream.internal_stream_failure("hiccup")])
    runtime.answer(expected, parts(sse_chunks()))
    answer = make_invoker(runtime, lines, sleeps).buffered(frontdoor.request_from_event(url_event()))
    assert answer.status == 200 and len(sleeps) == 1
    runtime.stubber.assert_no_pending_responses()


def test_bad_bodies_never_reach_the_endpoint(runtime, lines, sleeps):
    invoker = make_invoker(runtime, lines, sleeps)
    for body in (b"{", b'{"messages": 3}', b"\xc3\x28", b'{"prompt": "a", "prompt": "b"}'):
        answer = invoker.buffered(frontdoor.request_from_event(url_event(body)))
        assert answer.status == 400 and answer.body["error"]["field"]
    runtime.stubber.assert_no_pending_responses()  # Stubber would raise on any call: none was made
    assert all(doc["ClientErrors"] == 1 and doc["Requests"] == 0 for doc in lines.emf)


def test_header_tenancy_routes_by_the_header(runtime, lines, sleeps):
    cfg = config(tenancy="header")
    body_request = frontdoor.request_from_event(url_event(headers={"x-tenant-id": "acme", "x-application-id": "bot"}))
    prepared = frontdoor.prepare(body_request, cfg, KEY)
    identity = routing_identity("acme", "bot", KEY)
    expected = {"EndpointName": "test-prefix-llm", "InferenceComponentName": "test-prefix-llm-ic",
                "PrefixAwareId": identity.prefix_aware_id, "ContentType": "application/json",
                "Body": prepared.normalized.body}
    runtime.answer(expected, parts(sse_chunks()))
    invoker = make_invoker(runtime, lines, sleeps, tenancy="header")
    answer = invoker.buffered(frontdoor.request_from_event(url_event(headers={"x-tenant-id": "acme",
                                                                           "x-application-id": "bot"})))
    assert answer.status == 200
    runtime.stubber.assert_no_pending_responses()


# --------------------------------------------------------------------------- the plain handler


@pytest.fixture
def installed(runtime, lines, sleeps):
    lambda_handler.configure(make_invoker(runtime, lines, sleeps))
    yield
    lambda_handler.configure(None)


def test_handler_function_url_event(runtime, lines, installed):
    runtime.answer(expected_params(), parts(sse_chunks()))
    result = lambda_handler.handler(url_event(), None)
    assert result["statusCode"] == 200 and result["isBase64Encoded"] is False
    assert json.loads(result["body"])["choices"][0]["text"] == "hello world"
    bad = lambda_handler.handler(url_event(b"{"), None)
    assert bad["statusCode"] == 400 and json.loads(bad["body"])["error"]["code"] == "invalid_json"


def test_handler_direct_invocation_is_refused_by_default(runtime, lines, installed):
    # Any caller that may invoke the function could name any tenant: under IAM tenancy, 403, and the
    # endpoint is never called (the Stubber has no answer queued: a call would fail the test).
    result = lambda_handler.handler({"body": CHAT, "tenant": ROLE_TENANT}, None)
    assert result["statusCode"] == 403 and result["body"]["error"]["code"] == "direct_invocation_refused"
    assert result["body"]["error"]["field"] == "event"
    runtime.stubber.assert_no_pending_responses()
    (log,) = lines.requests
    assert log["status"] == 403 and log["tenant"] is None and log["prefix_aware_id"] is None
    assert lines.emf[0]["RefusedDirectInvocations"] == 1 and lines.emf[0]["Requests"] == 0


def test_handler_direct_invocation_when_the_stage_allows_it(runtime, lines, sleeps):
    lambda_handler.configure(make_invoker(runtime, lines, sleeps, allow_direct_invoke=True))
    runtime.answer(expected_params(tenant="acme"), parts(sse_chunks()))
    try:
        result = lambda_handler.handler({"body": CHAT, "tenant": "acme"}, None)
        no_tenant = lambda_handler.handle_event({"body": CHAT}, None)
    finally:
        lambda_handler.configure(None)
    assert result["statusCode"] == 200 and result["body"]["choices"][0]["finish_reason"] == "stop"
    assert no_tenant["statusCode"] == 400  # no tenant
    runtime.stubber.assert_no_pending_responses()


def test_handler_configuration_failure_is_a_500_without_secrets(monkeypatch, capsys):
    lambda_handler.configure(None)
    monkeypatch.delenv("ENDPOINT_NAME", raising=False)
    result = lambda_handler.handler(url_event(), None)
    assert result["statusCode"] == 500 and json.loads(result["body"])["error"]["code"] == "configuration"
    logged = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert logged["message"] == "prefix_routing.configuration_error" and "ENDPOINT_NAME" in logged["error"]
    lambda_handler.configure(None)


def test_handler_builds_its_clients_from_the_environment(monkeypatch):
    """The cold-start path: configuration from the environment, the key from Secrets Manager."""
    stubs = environment_with_a_stubbed_secret(monkeypatch, {"UPSTREAM_READ_TIMEOUT_S": "42"})
    lambda_handler.configure(None)
    try:
        built = lambda_handler.get_invoker()
        assert built is lambda_handler.get_invoker()  # once per execution environment
        assert built.key == b"s" * 48 and built.config.endpoint_name == "ep"
        client_config = built.upstream.client.meta.config
        assert client_config.read_timeout == 42 and client_config.retries["total_max_attempts"] == 1
        stubs[0].assert_no_pending_responses()
    finally:
        lambda_handler.configure(None)


def test_with_limits_the_handler_builds_a_bounded_limiter_on_the_stages_table(monkeypatch, local_dynamo):
    limits = '{"default":{"concurrent_streams":2},"on_store_error":"open","store_timeout_ms":40,"lease_s":20}'
    environment_with_a_stubbed_secret(monkeypatch, {"LIMITS": limits, "LIMITS_TABLE": "tenant-limits",
                                                    "AWS_ENDPOINT_URL_DYNAMODB": local_dynamo.url})
    lambda_handler.configure(None)
    try:
        built = lambda_handler.get_invoker()
        assert built.limiter is not None and built.limiter.store.table == "tenant-limits"
        client_config = built.limiter.store.client.meta.config
        assert (client_config.connect_timeout, client_config.read_timeout) == (0.04, 0.04)
        assert client_config.retries["total_max_attempts"] == 1
        # Giving a stream back is bounded too, but by a second (not 40 ms): a lost release holds a slot.
        release_config = built.limiter.store.release_client.meta.config
        assert (release_config.connect_timeout, release_config.read_timeout) == (1.0, 1.0)
        assert release_config.retries["total_max_attempts"] == 1
        assert built.limiter.settings.default.concurrent_streams == 2
        assert built.limiter.renewer.lease_s == 20 and built.limiter.renewer.interval_s == 20 / 3
    finally:
        lambda_handler.configure(None)
    monkeypatch.delenv("LIMITS")
    lambda_handler.configure(None)
    try:
        assert lambda_handler.get_invoker().limiter is None  # no limits: no store, no call
    finally:
        lambda_handler.configure(None)
