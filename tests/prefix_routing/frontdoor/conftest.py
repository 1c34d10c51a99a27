"""Shared pieces of the front door's tests: a tenant key and identity, request events, configurations, the
log lines the front door writes, and a fake SageMaker runtime client."""

from __future__ import annotations

import json

import pytest

from prefix_routing import frontdoor
from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE

KEY = b"0123456789abcdef-test-tenant-key"
ROLE_ARN = "arn:aws:sts::111122223333:assumed-role/ChatApp/session-1"
ROLE_TENANT = "arn:aws:iam::111122223333:role/ChatApp"
CHAT = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You are a terse assistant for invoices."},
        {"role": "user", "content": "alpha beta gamma delta"},
    ],
}
BODY = json.dumps(CHAT).encode()


def iam_context(user_arn: str = ROLE_ARN, account: str = "111122223333") -> dict:
    """A Function URL request context with IAM auth (``requestContext`` of the event)."""
    caller = "AROAEXAMPLEROLEID:" + user_arn.rsplit("/", 1)[-1]
    return {
        "accountId": "444455556666",
        "apiId": "abc123",
        "authorizer": {"iam": {"accessKey": "ASIAEXAMPLE", "accountId": account, "callerId": caller,
                               "cognitoIdentity": None, "principalOrgId": None, "userArn": user_arn,
                               "userId": caller}},
        "domainName": "abc123.lambda-url.us-east-1.on.aws",
        "http": {"method": "POST", "path": "/", "protocol": "HTTP/1.1", "sourceIp": "203.0.113.9",
                 "userAgent": "test"},
        "requestId": "req-1",
        "routeKey": "$default",
        "stage": "$default",
        "time": "30/Nov/2026:10:00:00 +0000",
        "timeEpoch": 1796032800000,
    }


def url_event(body: bytes | str = BODY, *, user_arn: str = ROLE_ARN, headers: dict | None = None,
              method: str = "POST", base64: bool = False) -> dict:
    """A Function URL (payload 2.0) event."""
    import base64 as b64

    context = iam_context(user_arn)
    context["http"]["method"] = method
    if isinstance(body, bytes):
        text = b64.b64encode(body).decode() if base64 else body.decode("utf-8", "surrogateescape")
    else:
        text = body
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": "/",
        "rawQueryString": "",
        "headers": {"content-type": "application/json", **(headers or {})},
        "requestContext": context,
        "body": text,
        "isBase64Encoded": base64,
    }


def config(**overrides) -> frontdoor.InvokeConfig:
    values = {"endpoint_name": "test-prefix-llm", "component_name": "test-prefix-llm-ic", "tenancy": "iam"}
    values.update(overrides)
    return frontdoor.InvokeConfig(**values)


class Lines:
    """Collects what the invoker writes (EMF documents and log lines) and parses it."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        assert "\n" not in line
        self.lines.append(line)

    @property
    def parsed(self) -> list[dict]:
        return [json.loads(line) for line in self.lines]

    @property
    def emf(self) -> list[dict]:
        """EMF documents, each metric's one-element value list (Powertools' form) read as its value."""
        return [
            {k: (v[0] if isinstance(v, list) and len(v) == 1 and k != "_aws" else v) for k, v in obj.items()}
            for obj in self.parsed
            if "_aws" in obj
        ]

    @property
    def requests(self) -> list[dict]:
        return [obj for obj in self.parsed if obj.get("message") == REQUEST_LOG_MESSAGE]


@pytest.fixture
def lines() -> Lines:
    return Lines()


def sse_chunks(words=("hello", "world"), usage=None, done=True, model="m") -> list[bytes]:
    """An OpenAI-style SSE answer, one chunk per word, then usage and [DONE]."""
    head = {"id": "c1", "object": "chat.completion.chunk", "model": model}
    out = []
    for i, word in enumerate(words):
        last = i == len(words) - 1
        choice = {"index": 0, "delta": {"content": word if i == 0 else " " + word},
                  "finish_reason": "stop" if last else None}
        out.append(b"data: " + json.dumps({**head, "choices": [choice]}).encode() + b"\n\n")
    if usage is not False:
        usage = usage or {"prompt_tokens": 12, "completion_tokens": len(words), "total_tokens": 12 + len(words),
                          "prompt_tokens_details": {"cached_tokens": 8}}
        out.append(b"data: " + json.dumps({**head, "choices": [], "usage": usage}).encode() + b"\n\n")
    if done:
        out.append(b"data: [DONE]\n\n")
    return out


class FakeRuntime:
    """A stand-in for the sagemaker-runtime client: records calls, answers a canned event list."""

    def __init__(self, chunks: list[bytes] | None = None, content_type: str = "text/event-stream") -> None:
        self.chunks = sse_chunks() if chunks is None else chunks
        self.content_type = content_type
        self.calls: list[dict] = []

    def invoke_endpoint_with_response_stream(self, **params):
        self.calls.append(params)
        return {"Body": iter([{"PayloadPart": {"Bytes": c}} for c in self.chunks]), "ContentType": self.content_type}
