"""The front door's library functions (prefix_routing.invoke), called directly."""

from __future__ import annotations

import base64
import json
import random

import boto3
import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    EventStreamError,
    ReadTimeoutError,
)
from botocore.stub import Stubber
from hypothesis import given, settings, strategies as st
from urllib3.exceptions import ProtocolError

from prefix_routing import frontdoor
from prefix_routing.frontdoor import invoker as invoker_module, record as record_module, upstream
from prefix_routing.rules import telemetry
from prefix_routing.rules.settings import NormalizerSettings
from prefix_routing.rules.identity import routing_identity
from tests.lambda_normalizer.conftest import (
    BODY,
    CHAT,
    KEY,
    ROLE_ARN,
    ROLE_TENANT,
    FakeRuntime,
    config,
    sse_chunks,
    url_event,
)

# --------------------------------------------------------------------------- configuration


def test_config_from_env_defaults_and_values():
    cfg = frontdoor.InvokeConfig.from_env({"ENDPOINT_NAME": "ep", "INFERENCE_COMPONENT_NAME": "ic", "PREFIX_LENGTH": "0",
                                        "BLOCK_BYTES": "1024", "TENANCY": "header", "TENANT_HEADER": "X-Tenant"})
    assert (cfg.endpoint_name, cfg.component_name, cfg.tenancy, cfg.tenant_header) == ("ep", "ic", "header", "x-tenant")
    assert cfg.settings.prefix_length == NormalizerSettings().prefix_length  # 0: not PREFIX_AWARE, default
    assert cfg.settings.block_bytes == 1024
    assert cfg.stream_usage is True and cfg.max_attempts == 3
    cfg = frontdoor.InvokeConfig.from_env({
        "ENDPOINT_NAME": "ep", "PREFIX_LENGTH": "8192", "STREAM_USAGE": "false", "UPSTREAM_MAX_ATTEMPTS": "5",
        "NORMALIZER_SETTINGS": json.dumps({"freeze_rules": [{"name": "date", "pattern": r"\d{4}-\d{2}-\d{2}"}]}),
    })
    assert cfg.settings.prefix_length == 8192 and cfg.settings.freeze_rules[0].name == "date"
    assert cfg.component_name is None and cfg.metric_component == "ep"
    assert cfg.stream_usage is False and cfg.max_attempts == 5


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({}, "ENDPOINT_NAME"),
        ({"ENDPOINT_NAME": "ep", "TENANCY": "cookie"}, "TENANCY"),
        ({"ENDPOINT_NAME": "ep", "PREFIX_LENGTH": "lots"}, "PREFIX_LENGTH"),
        ({"ENDPOINT_NAME": "ep", "PREFIX_LENGTH": "100"}, "prefix_length"),
        ({"ENDPOINT_NAME": "ep", "NORMALIZER_SETTINGS": "{"}, "NORMALIZER_SETTINGS"),
        ({"ENDPOINT_NAME": "ep", "NORMALIZER_SETTINGS": "[]"}, "NORMALIZER_SETTINGS"),
        ({"ENDPOINT_NAME": "ep", "UPSTREAM_MAX_ATTEMPTS": "0"}, "UPSTREAM_MAX_ATTEMPTS"),
        ({"ENDPOINT_NAME": "ep", "STREAM_USAGE": "maybe"}, "STREAM_USAGE"),
        ({"ENDPOINT_NAME": "ep", "TENANCY": "header", "TENANT_HEADER": ""}, "TENANT_HEADER"),
    ],
)
def test_config_errors_name_the_variable(env, named):
    with pytest.raises(frontdoor.ConfigurationError, match=named):
        frontdoor.InvokeConfig.from_env(env)


def test_tenant_key_from_secrets_manager_exact_call():
    client = boto3.client("secretsmanager", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t")
    arn = "arn:aws:secretsmanager:us-east-1:111122223333:secret:TenantKey-AbCdEf"
    with Stubber(client) as stub:
        stub.add_response("get_secret_value", {"SecretString": "k" * 64}, {"SecretId": arn})
        assert frontdoor.load_tenant_key(client, arn) == b"k" * 64
        stub.add_response("get_secret_value", {"SecretString": "short"}, {"SecretId": arn})
        with pytest.raises(frontdoor.ConfigurationError) as caught:
            frontdoor.load_tenant_key(client, arn)
        assert "short" not in str(caught.value)  # the value never appears in a message
        stub.assert_no_pending_responses()
    with pytest.raises(frontdoor.ConfigurationError, match="TENANT_KEY_SECRET_ARN"):
        frontdoor.load_tenant_key(client, "")


# --------------------------------------------------------------------------- tenants


@pytest.mark.parametrize(
    ("arn", "caller", "account", "tenant"),
    [
        (ROLE_ARN, None, None, ROLE_TENANT),
        ("arn:aws:sts::111122223333:assumed-role/ChatApp/another-session", None, None, ROLE_TENANT),
        ("arn:aws-cn:sts::111122223333:assumed-role/R/s", None, None, "arn:aws-cn:iam::111122223333:role/R"),
        ("arn:aws:iam::111122223333:user/dev/alice", None, None, "arn:aws:iam::111122223333:user/dev/alice"),
        ("arn:aws:iam::111122223333:root", None, None, "arn:aws:iam::111122223333:root"),
        (None, "AROAEXAMPLE:session", None, "AROAEXAMPLE"),
        (None, "AIDAEXAMPLE", None, "AIDAEXAMPLE"),
        (None, None, "111122223333", "account:111122223333"),
        (None, None, None, None),
        ("", "", "", None),
    ],
)
def test_principal_tenant(arn, caller, account, tenant):
    assert frontdoor.principal_tenant(arn, caller, account) == tenant


def test_iam_tenant_from_function_url_and_rest_api_contexts():
    cfg = config()
    request = frontdoor.request_from_event(url_event())
    assert frontdoor.identify_tenant(request, cfg) == (ROLE_TENANT, None)
    rest = {"httpMethod": "POST", "headers": {"Content-Type": "application/json"}, "body": BODY.decode(),
            "requestContext": {"requestId": "r", "identity": {
                "userArn": "arn:aws:iam::111122223333:user/bob", "caller": "AIDABOB", "accountId": "111122223333"}}}
    request = frontdoor.request_from_event(rest)
    assert request.source == "http" and request.headers["content-type"] == "application/json"
    assert frontdoor.identify_tenant(request, cfg) == ("arn:aws:iam::111122223333:user/bob", None)


def test_missing_iam_identity_is_401():
    event = url_event()
    del event["requestContext"]["authorizer"]
    with pytest.raises(frontdoor.RequestError) as caught:
        frontdoor.identify_tenant(frontdoor.request_from_event(event), config())
    assert caught.value.status == 401 and caught.value.code == "unauthenticated"


def test_header_tenancy_and_application_header():
    cfg = config(tenancy="header", tenant_header="X-Tenant-Id")
    request = frontdoor.request_from_event(url_event(headers={"X-Tenant-Id": "acme", "x-application-id": "support-bot"}))
    assert frontdoor.identify_tenant(request, cfg) == ("acme", "support-bot")
    for headers, code in (({}, "missing_tenant"), ({"x-tenant-id": "a b"}, "invalid_tenant"),
                          ({"x-tenant-id": "t" * 129}, "invalid_tenant"),
                          ({"x-tenant-id": "acme", "x-application-id": "bad app!"}, "invalid_application")):
        with pytest.raises(frontdoor.RequestError) as caught:
            frontdoor.identify_tenant(frontdoor.request_from_event(url_event(headers=headers)), cfg)
        assert caught.value.status == 400 and caught.value.code == code
        assert caught.value.message  # names the problem


def test_none_tenancy_shares_one_tenant_and_direct_invocations_name_theirs():
    assert frontdoor.identify_tenant(frontdoor.request_from_event(url_event()), config(tenancy="none")) == (
        frontdoor.SHARED_TENANT, None)
    direct = frontdoor.request_from_event({"body": CHAT, "tenant": "acme", "application": "bot"})
    assert direct.source == "direct"
    assert frontdoor.identify_tenant(direct, config()) == ("acme", "bot")
    with pytest.raises(frontdoor.RequestError, match="tenant") as caught:
        frontdoor.identify_tenant(frontdoor.request_from_event({"body": CHAT}), config())
    assert caught.value.code == "missing_tenant"
    assert frontdoor.identify_tenant(frontdoor.request_from_event({"body": CHAT}), config(tenancy="none"))[0] == "shared"


# --------------------------------------------------------------------------- events


def test_function_url_event_with_base64_body_and_bad_base64():
    request = frontdoor.request_from_event(url_event(BODY, base64=True))
    assert request.body == BODY and request.problem is None
    event = url_event(BODY)
    event["isBase64Encoded"] = True
    event["body"] = "not base64!!"
    request = frontdoor.request_from_event(event)
    assert request.problem is not None and request.problem.code == "invalid_base64"


@pytest.mark.parametrize(
    ("event", "code"),
    [
        ([1, 2], "invalid_event"),
        ("text", "invalid_event"),
        ({"tenant": "acme"}, "invalid_event"),
        ({"body": 5, "tenant": "acme"}, "invalid_event"),
    ],
)
def test_malformed_events_are_400(event, code):
    request = frontdoor.request_from_event(event)
    assert request.problem is not None and request.problem.status == 400 and request.problem.code == code


def test_lambda_context_gives_request_id_and_deadline():
    class Context:
        aws_request_id = "lambda-req-9"

        def get_remaining_time_in_millis(self):
            return 30_000

    request = frontdoor.request_from_event(url_event(), Context())
    assert request.request_id == "lambda-req-9"
    assert request.deadline is not None and request.deadline > request.arrival + 20


# --------------------------------------------------------------------------- validation and normalization


def test_prepare_derives_the_tenant_identity_and_salts_the_body():
    prepared = frontdoor.prepare(frontdoor.request_from_event(url_event()), config(), KEY)
    expected = routing_identity(ROLE_TENANT, None, KEY)
    assert prepared.identity == expected
    assert prepared.normalized.body.startswith(b'{"cache_salt":"' + expected.cache_salt.encode() + b'","messages":')
    assert prepared.tenant == ROLE_TENANT and prepared.normalize_ms >= 0 and not prepared.expects_usage


def test_tenants_never_share_routing_ids_sessions_of_one_role_do():
    cfg = config()
    ids = {}
    for arn in (ROLE_ARN, "arn:aws:sts::111122223333:assumed-role/ChatApp/other-session",
                "arn:aws:sts::111122223333:assumed-role/OtherApp/session-1",
                "arn:aws:sts::999988887777:assumed-role/ChatApp/session-1"):
        prepared = frontdoor.prepare(frontdoor.request_from_event(url_event(user_arn=arn)), cfg, KEY)
        ids[arn] = (prepared.identity.prefix_aware_id, prepared.normalized.body[:60])
    values = list(ids.values())
    assert values[0] == values[1]  # one role, two sessions: one tenant
    assert len({v[0] for v in values[1:]}) == 3 and len({v[1] for v in values[1:]}) == 3


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        (b"", "empty", "body"),
        (b"\xff\xfe{}", "invalid_utf8", "body"),
        (b'{"messages": [', "invalid_json", "body"),
        (b"[1, 2]", "not_object", "body"),
        (b'{"temperature": 1}', "missing_field", "body"),
        (b'{"messages": [{"role": "user"}]}', "missing_field", "messages[0].content"),
        (b'{"messages": "hi"}', "invalid_field", "messages"),
        (b'{"messages": [], "messages": []}', "duplicate_key", "body"),
        (b'{"prompt": "x", "temperature": NaN}', "non_finite_number", "temperature"),
        (b'{"prompt": "x", "n": ' + b"[" * 80 + b"]" * 80 + b"}", "too_deep", None),
    ],
)
def test_bad_bodies_are_400_naming_the_problem(body, code, field):
    with pytest.raises(frontdoor.RequestError) as caught:
        frontdoor.prepare(frontdoor.request_from_event(url_event(body)), config(), KEY)
    error = caught.value
    assert error.status == 400 and error.code == code
    if field is not None:
        assert error.field == field
    assert error.body()["error"]["message"] and error.normalize_ms is not None


def test_body_over_6_mib_is_400_too_large():
    body = json.dumps({"prompt": "x" * (6 * 1024 * 1024)}).encode()
    with pytest.raises(frontdoor.RequestError) as caught:
        frontdoor.prepare(frontdoor.request_from_event(url_event(body)), config(), KEY)
    assert caught.value.status == 400 and caught.value.code == "too_large"


def test_methods_other_than_post_are_405():
    with pytest.raises(frontdoor.RequestError) as caught:
        frontdoor.prepare(frontdoor.request_from_event(url_event(method="GET")), config(), KEY)
    assert caught.value.status == 405 and caught.value.code == "method_not_allowed"


def test_streaming_bodies_ask_for_usage_unless_told_otherwise():
    streaming = dict(CHAT, stream=True)
    prepared = frontdoor.prepare(frontdoor.request_from_event(url_event(json.dumps(streaming))), config(), KEY)
    sent = json.loads(prepared.normalized.body)
    assert sent["stream_options"] == {"include_usage": True} and prepared.expects_usage
    assert {k: v for k, v in sent.items() if k not in ("cache_salt", "stream_options")} == streaming
    explicit = dict(streaming, stream_options={"include_usage": False})
    prepared = frontdoor.prepare(frontdoor.request_from_event(url_event(json.dumps(explicit))), config(), KEY)
    assert json.loads(prepared.normalized.body)["stream_options"] == {"include_usage": False}
    assert not prepared.expects_usage
    prepared = frontdoor.prepare(frontdoor.request_from_event(url_event(json.dumps(streaming))),
                              config(stream_usage=False), KEY)
    assert "stream_options" not in json.loads(prepared.normalized.body) and not prepared.expects_usage
    not_streaming = frontdoor.prepare(frontdoor.request_from_event(url_event()), config(), KEY)
    assert b"stream_options" not in not_streaming.normalized.body
    lmi = {"inputs": "hello", "parameters": {"max_new_tokens": 4}, "stream": True}
    prepared = frontdoor.prepare(frontdoor.request_from_event(url_event(json.dumps(lmi))), config(), KEY)
    assert b"stream_options" not in prepared.normalized.body


# --------------------------------------------------------------------------- reading the stream


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


# --------------------------------------------------------------------------- errors


def _client_error(code, status=400, operation="InvokeEndpointWithResponseStream", **extra):
    response = {"Error": {"Code": code, "Message": f"{code} happened"},
                "ResponseMetadata": {"HTTPStatusCode": status}, **extra}
    return ClientError(response, operation)


@pytest.mark.parametrize(
    ("error", "status", "kind", "retryable"),
    [
        (_client_error("ThrottlingException"), 429, "throttled", True),
        (_client_error("ModelNotReadyException", 429), 503, "model_not_ready", True),
        (_client_error("ServiceUnavailable", 503), 503, "upstream_unavailable", True),
        (_client_error("InternalFailure", 500), 502, "upstream_error", True),
        (_client_error("InternalDependencyException", 530), 502, "upstream_error", True),
        (_client_error("SomethingNew", 502), 502, "upstream_error", True),
        (_client_error("ModelError", 424, OriginalStatusCode=400), 502, "model_error", False),
        (_client_error("ValidationError"), 502, "upstream_rejected", False),
        (_client_error("AccessDeniedException", 403), 502, "upstream_denied", False),
        (EventStreamError({"Error": {"Code": "ModelStreamError", "Message": "boom"}}, "X"), 502,
         "model_stream_error", False),
        (EventStreamError({"Error": {"Code": "InternalStreamFailure", "Message": "x"}}, "X"), 502,
         "stream_failure", True),
        (ReadTimeoutError(endpoint_url="http://x"), 504, "timeout", False),
        (TimeoutError(), 504, "timeout", False),
        (ConnectTimeoutError(endpoint_url="http://x"), 502, "upstream_connection", True),
        (EndpointConnectionError(endpoint_url="http://x"), 502, "upstream_connection", True),
        (ProtocolError("Connection broken"), 502, "upstream_connection", True),
        (KeyError("x"), 500, "internal", False),
    ],
)
def test_classify_error(error, status, kind, retryable):
    upstream = frontdoor.classify_error(error)
    assert (upstream.status, upstream.kind, upstream.retryable) == (status, kind, retryable)
    assert "\n" not in upstream.message
    response = getattr(error, "response", None)
    code = response["Error"]["Code"] if isinstance(response, dict) else None
    # docs/normalizer-lambda.md: the error carries the endpoint's own code as upstream_code ...
    assert upstream.upstream_code == code
    if code is not None and kind != "upstream_denied":
        # ... and the message what the endpoint said (access errors name only the code).
        assert response["Error"]["Message"] in upstream.message
    elif kind == "upstream_denied":
        assert upstream.message == f"the front door may not invoke the endpoint: {code}"
    else:  # no response: the exception's class says what failed
        assert type(error).__name__ in upstream.message or kind == "timeout"
    if kind == "model_error":
        assert "(the model answered 400)" in upstream.message


def test_classify_error_keeps_an_upstream_error_and_flattens_long_messages():
    already = frontdoor.UpstreamError(502, "truncated", "cut")
    assert frontdoor.classify_error(already) is already
    long = _client_error("ValidationError")
    long.response["Error"]["Message"] = "line one\nline two\r" + "x" * 400
    message = frontdoor.classify_error(long).message
    assert "\n" not in message and "\r" not in message and "line one line two" in message
    assert message.endswith("…") and len(message) <= 300 + len("the endpoint rejected the request: ValidationError: ")


def test_upstream_error_body_is_the_documented_shape():
    error = frontdoor.UpstreamError(429, "throttled", "slow down", retryable=True, upstream_code="ThrottlingException")
    assert error.body(3) == {"error": {"code": "throttled", "message": "slow down", "status": 429,
                                       "upstream_code": "ThrottlingException", "attempts": 3}}
    assert frontdoor.UpstreamError(504, "timeout", "late").body() == {
        "error": {"code": "timeout", "message": "late", "status": 504}}
    assert str(error) == "slow down" and error.retryable is True


# --------------------------------------------------------------------------- telemetry


def _record(**values) -> frontdoor.RequestRecord:
    record = frontdoor.RequestRecord(arrival_ms=1796032800000, request_id="r1", tenant=ROLE_TENANT,
                                  routing_id="pa-1", body_kind="chat", fingerprint="0123456789abcdef",
                                  block_hashes=("aa", "bb"), body_bytes=4100, normalize_ms=0.5, sent=True,
                                  attempts=1, ttft_ms=120.5, total_ms=900.25, prompt_tokens=1000, cached_tokens=750,
                                  output_tokens=20, status=200)
    for name, value in values.items():
        setattr(record, name, value)
    return record


def test_emf_document_namespace_names_units_one_dimension_high_resolution():
    document = json.loads(json.dumps(frontdoor.emf_document(_record(), config())))
    directive = document["_aws"]["CloudWatchMetrics"]
    assert len(directive) == 1 and directive[0]["Namespace"] == telemetry.NAMESPACE
    assert directive[0]["Dimensions"] == [[telemetry.DIMENSION_COMPONENT]]
    assert document[telemetry.DIMENSION_COMPONENT] == "test-prefix-llm-ic"
    definitions = {m["Name"]: m for m in directive[0]["Metrics"]}
    assert set(definitions) == {spec.name for spec in telemetry.ALL_METRICS}
    for spec in telemetry.ALL_METRICS:
        assert definitions[spec.name] == {"Name": spec.name, "Unit": spec.unit, "StorageResolution": 1}
    assert document[telemetry.TTFT.name] == [120.5] and document[telemetry.CACHED_TOKENS.name] == [750]
    assert (document["Requests"], document["ClientErrors"], document["UpstreamErrors"]) == ([1], [0], [0])
    assert isinstance(document["_aws"]["Timestamp"], int)
    assert "service" not in document and not any(k.lower() == "service" for k in document)


def test_emf_document_omits_what_is_unknown_and_counts_errors():
    client = frontdoor.emf_document(_record(sent=False, ttft_ms=None, total_ms=None, prompt_tokens=None,
                                         cached_tokens=None, status=400, origin="client"), config())
    names = {m["Name"] for m in client["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert names == {"Requests", "ClientErrors", "UpstreamErrors", "NormalizationTime"}
    assert (client["Requests"], client["ClientErrors"], client["UpstreamErrors"]) == ([0], [1], [0])
    upstream = frontdoor.emf_document(_record(status=502, origin="upstream", total_ms=None, prompt_tokens=None,
                                           cached_tokens=None), config())
    assert (upstream["Requests"], upstream["ClientErrors"], upstream["UpstreamErrors"]) == ([1], [0], [1])


def test_emf_document_is_what_powertools_metrics_flushes(monkeypatch, capsys):
    """Same document as Powertools' public ``Metrics`` API with high resolution, values and all."""
    from aws_lambda_powertools import Metrics
    from aws_lambda_powertools.metrics import MetricResolution

    monkeypatch.delenv("POWERTOOLS_SERVICE_NAME", raising=False)
    record = _record()
    ours = frontdoor.emf_document(record, config(), timestamp_ms=1796032800000)
    metrics = Metrics(namespace=telemetry.NAMESPACE)
    metrics.add_dimension(name=telemetry.DIMENSION_COMPONENT, value="test-prefix-llm-ic")
    for spec, value in record_module._metric_values(record):
        metrics.add_metric(name=spec.name, unit=spec.unit, value=value, resolution=MetricResolution.High)
    metrics.set_timestamp(1796032800000)
    metrics.flush_metrics()
    theirs = json.loads(capsys.readouterr().out)
    assert json.loads(json.dumps(ours)) == theirs


def test_log_record_has_every_log_field():
    line = frontdoor.log_record(_record(), config())
    fields = {value for name, value in vars(telemetry.LogField).items() if name.isupper()}
    assert fields <= set(line)
    assert line["message"] == telemetry.REQUEST_LOG_MESSAGE
    assert line["block_hashes"] == ["aa", "bb"] and line["block_bytes"] == 2048 and line["prefix_length"] == 4096
    assert line["inference_component"] == "test-prefix-llm-ic" and line["status"] == 200


def test_telemetry_lines_carry_no_prompt_text_and_no_key(lines):
    secret_word = "zanzibar-quokka"
    body = dict(CHAT, messages=[{"role": "system", "content": f"Never say {secret_word}."},
                                {"role": "user", "content": f"what about {secret_word}?"}])
    runtime = FakeRuntime()
    invoker = frontdoor.Invoker(runtime, config(), KEY, emit=lines)
    assert invoker.buffered(frontdoor.request_from_event(url_event(json.dumps(body)))).status == 200
    bad = dict(body, messages=[{"role": "user", "content": 5, "note": secret_word}])
    assert invoker.buffered(frontdoor.request_from_event(url_event(json.dumps(bad)))).status == 400
    output = "\n".join(lines.lines)
    assert secret_word not in output and KEY.decode() not in output
    assert routing_identity(ROLE_TENANT, None, KEY).cache_salt not in output
    assert len(lines.emf) == 2 and len(lines.requests) == 2


# --------------------------------------------------------------------------- the exchange


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
    values = [upstream._jitter() for _ in range(200)] + [rng.random()]
    assert all(0 <= v < 1 for v in values)


# --------------------------------------------------------------------------- direct payloads


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


# --------------------------------------------------------------------------- our own failures
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
