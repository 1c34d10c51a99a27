"""Upstream failures classified into the caller's status and JSON error (prefix_routing.frontdoor.upstream_errors)."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    EventStreamError,
    ReadTimeoutError,
)
from urllib3.exceptions import ProtocolError
from prefix_routing import frontdoor


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
        # A container's own 4xx is the caller's mistake: its status, not a 502 (but for 408 and 429).
        (_client_error("ModelError", 424, OriginalStatusCode=400), 400, "model_rejected", False),
        (_client_error("ModelError", 424, OriginalStatusCode=413), 413, "model_rejected", False),
        (_client_error("ModelError", 424, OriginalStatusCode=429), 502, "model_error", False),
        (_client_error("ModelError", 424, OriginalStatusCode=408), 502, "model_error", False),
        (_client_error("ModelError", 424, OriginalStatusCode=500), 502, "model_error", False),
        (_client_error("ModelError", 424), 502, "model_error", False),
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
    original = response.get("OriginalStatusCode") if isinstance(response, dict) else None
    if kind == "model_error" and original is not None:
        assert f"(the model answered {original})" in upstream.message
    if kind == "model_rejected":
        assert f"the model rejected the request ({original})" in upstream.message


def test_a_containers_own_4xx_carries_the_engines_words():
    # SageMaker's ModelError for a container 400: OriginalMessage is the container's body.
    engine_body = json.dumps({"object": "error", "type": "BadRequestError", "code": 400,
                              "message": "This model's maximum context length is 8192 tokens. However, you requested 9000"})
    error = _client_error("ModelError", 424, OriginalStatusCode=400, OriginalMessage=engine_body)
    upstream = frontdoor.classify_error(error)
    assert (upstream.status, upstream.kind) == (400, "model_rejected")
    assert upstream.message == ("the model rejected the request (400): This model's maximum context length is "
                                "8192 tokens. However, you requested 9000")
    nested = _client_error("ModelError", 424, OriginalStatusCode=422,
                           OriginalMessage='{"error": {"message": "bad field n", "code": 422}}')
    assert frontdoor.classify_error(nested).message == "the model rejected the request (422): bad field n"
    plain = _client_error("ModelError", 424, OriginalStatusCode=404, OriginalMessage="no such route")
    assert frontdoor.classify_error(plain).message == "the model rejected the request (404): no such route"


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


# Each server-side code is a retryable 502 by its code alone, whatever HTTP status came with it (the
# docstring's list); each connection failure by its class name; a read timeout is a 504.
@pytest.mark.parametrize("code", ["InternalFailure", "InternalDependencyException", "InternalServerError",
                                  "ServiceFailure"])
def test_each_server_failure_code_is_a_retryable_502_by_its_code(code):
    classified = frontdoor.classify_error(_client_error(code, 400))
    assert (classified.status, classified.kind, classified.retryable, classified.upstream_code) == (
        502, "upstream_error", True, code)


@pytest.mark.parametrize("name", ["ConnectTimeoutError", "EndpointConnectionError", "ConnectionClosedError",
                                  "ProtocolError", "ConnectionError", "ParserError", "IncompleteRead",
                                  "ChecksumMismatch"])
def test_each_connection_failure_is_a_retryable_502_by_its_class_name(name):
    error = type(name, (Exception,), {})("dropped")
    classified = frontdoor.classify_error(error)
    assert (classified.status, classified.kind, classified.retryable) == (502, "upstream_connection", True)
    assert classified.message == f"the connection to the endpoint failed: {name}"


@pytest.mark.parametrize("name", ["ReadTimeoutError", "ReadTimeout"])
def test_a_read_timeout_by_its_class_name_is_a_504(name):
    classified = frontdoor.classify_error(type(name, (Exception,), {})("slow"))
    assert (classified.status, classified.kind, classified.retryable) == (504, "timeout", False)
    assert classified.message == "the model did not answer in time (read timeout)"


def test_a_499_from_the_container_is_still_the_callers():
    classified = frontdoor.classify_error(_client_error("ModelError", 424, OriginalStatusCode=499,
                                                        OriginalMessage="client closed"))
    assert (classified.status, classified.kind) == (499, "model_rejected")


@pytest.mark.parametrize("original, words", [
    ('{"message": 5, "error": {"message": "the real words"}}', "the real words"),  # not text: the next one
    ('{"message": "", "error": "plain inner"}', "plain inner"),
    ('["a", "list"]', '["a", "list"]'),  # JSON but no message: the text as it came
    ('{"detail": "x"}', '{"detail": "x"}'),
])
def test_the_containers_words_are_its_first_text_message(original, words):
    classified = frontdoor.classify_error(_client_error("ModelError", 424, OriginalStatusCode=400,
                                                        OriginalMessage=original))
    assert classified.message == f"the model rejected the request (400): {words}"
