"""The front door on 127.0.0.1 as a user calls it (prefix_routing.frontdoor.local, sigv4): the pinned
``openai`` SDK through a SigV4 auth, the stand-in for the Function URL's IAM auth, forged direct
invocations, and a container's own 4xx reaching the caller as that 4xx."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import httpx2
import pytest
from botocore.credentials import Credentials
from openai import BadRequestError, OpenAI

from prefix_routing.emulator.backend import ErrorReply
from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.server import serve_runtime
from prefix_routing.frontdoor.local import LOCAL_TENANT_KEY, LocalFrontDoor, caller_arn
from prefix_routing.frontdoor.sigv4 import FunctionUrlAuth
from prefix_routing.rules.identity import routing_identity
from prefix_routing.stage.config import load_stage
from prefix_routing.stage.front_door_env import front_door_environment
from tests.prefix_routing.frontdoor.conftest import CHAT, Lines


class _Session:
    """A botocore session stand-in with fixed credentials: the access key id names the local caller."""

    def __init__(self, access_key: str) -> None:
        self.credentials = Credentials(access_key, "secret-not-checked-locally")

    def get_credentials(self):
        return self.credentials


def _openai(door: LocalFrontDoor, access_key: str = "tenant-a") -> OpenAI:
    auth = FunctionUrlAuth(region="us-east-1", session=_Session(access_key))
    return OpenAI(base_url=f"{door.url}/v1", api_key="unused", max_retries=0,
                  http_client=httpx2.Client(auth=auth, timeout=30))


def _logged(lines: Lines, count: int) -> list[dict]:
    deadline = time.monotonic() + 5
    while len(lines.requests) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return lines.requests


@pytest.fixture
def local():
    """(runtime server, front door, log lines): the default stage's front door over the echo backend."""
    lines = Lines()
    with serve_runtime(EchoBackend(max_tokens=5)) as runtime:
        with LocalFrontDoor(runtime.url, front_door_environment(load_stage("default")), emit=lines) as door:
            yield runtime, door, lines


def test_the_openai_sdk_streams_a_chat_completion_with_usage_through_the_front_door(local):
    runtime, door, lines = local
    stream = _openai(door).chat.completions.create(
        model="default", messages=CHAT["messages"], stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split() == ["alpha", "beta", "gamma", "delta", "alpha"]  # the echo backend's answer
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].usage.prompt_tokens > 0
    # The caller is the access key's IAM user: its own routing id and salt reached the endpoint.
    tenant = "arn:aws:iam::000000000000:user/tenant-a"
    identity = routing_identity(tenant, None, LOCAL_TENANT_KEY)
    runtime.wait_until_idle()
    sent = runtime.requests[-1]
    assert sent.headers.prefix_aware_id == identity.prefix_aware_id
    assert json.loads(sent.body)["cache_salt"] == identity.cache_salt
    (log,) = _logged(lines, 1)  # written once the last event is in the socket: may trail the client by a hair
    assert log["tenant"] == tenant and log["status"] == 200


def test_two_access_keys_are_two_tenants(local):
    runtime, door, _ = local
    for key in ("tenant-a", "tenant-b"):
        _openai(door, key).chat.completions.create(model="default", messages=CHAT["messages"])
    ids = [r.headers.prefix_aware_id for r in runtime.requests]
    assert len(ids) == 2 and ids[0] != ids[1]


def test_an_unsigned_request_is_forbidden_as_the_function_url_forbids_it(local):
    runtime, door, _ = local
    request = urllib.request.Request(door.url, data=json.dumps(CHAT).encode(), method="POST",
                                     headers={"x-amzn-request-context": json.dumps(
                                         {"authorizer": {"iam": {"userArn": "arn:aws:iam::1:role/Forged"}}})})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403 and json.loads(refused.value.read()) == {"Message": "Forbidden"}
    assert runtime.requests == []


def test_a_forged_direct_invocation_gets_403(local):
    runtime, door, lines = local
    event = {"body": CHAT, "tenant": "arn:aws:iam::000000000000:user/tenant-a"}  # someone else's identity
    request = urllib.request.Request(f"{door.url}/events", data=json.dumps(event).encode(), method="POST",
                                     headers={"x-amzn-request-context": "null"})
    result = json.loads(urllib.request.urlopen(request, timeout=10).read())
    assert result["statusCode"] == 403 and result["body"]["error"]["code"] == "direct_invocation_refused"
    assert runtime.requests == [] and lines.requests[-1]["tenant"] is None


def test_a_client_header_cannot_pose_as_the_adapters_request_context(local):
    runtime, door, lines = local
    # Signed by tenant-b, with a request context naming tenant-a: the stand-in, like the adapter, overwrites it.
    forged = {"authorizer": {"iam": {"userArn": "arn:aws:iam::000000000000:user/tenant-a"}}}
    client = _openai(door, "tenant-b")
    client.chat.completions.create(model="default", messages=CHAT["messages"],
                                   extra_headers={"x-amzn-request-context": json.dumps(forged)})
    assert _logged(lines, 1)[-1]["tenant"] == "arn:aws:iam::000000000000:user/tenant-b"


class _ContextTooLong(EchoBackend):
    """A container that refuses every prompt as too long, as vLLM does (HTTP 400 from the container)."""

    def handle(self, request):
        message = json.dumps({"object": "error", "type": "BadRequestError", "code": 400,
                              "message": "This model's maximum context length is 8192 tokens."})
        return ErrorReply("ModelError", f'Received client error (400) from primary with message "{message}".',
                          original_status_code=400, original_message=message)


def test_a_containers_400_reaches_the_caller_as_a_400_with_the_engines_words():
    lines = Lines()
    with serve_runtime(_ContextTooLong()) as runtime:
        with LocalFrontDoor(runtime.url, front_door_environment(load_stage("default")), emit=lines) as door:
            with pytest.raises(BadRequestError) as rejected:
                _openai(door).chat.completions.create(model="default", messages=CHAT["messages"], stream=True)
    error = rejected.value.body["error"] if "error" in rejected.value.body else rejected.value.body
    assert rejected.value.status_code == 400 and error["code"] == "model_rejected"
    assert "maximum context length is 8192 tokens" in error["message"]
    (log,) = _logged(lines, 1)
    assert log["status"] == 400 and log["error_kind"] == "model_rejected"
    assert lines.emf[0]["ClientErrors"] == 1 and lines.emf[0]["UpstreamErrors"] == 0  # the caller's mistake


def test_caller_arn_reads_the_access_key_id_of_a_sigv4_header():
    header = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261202/us-east-1/lambda/aws4_request, SignedHeaders=host, Signature=0"
    assert caller_arn(header) == "arn:aws:iam::000000000000:user/AKIDEXAMPLE"
    assert caller_arn("Bearer abc") is None and caller_arn(None) is None
    assert caller_arn("AWS4-HMAC-SHA256 Credential=bad key/20261202/") is None


def test_a_stalled_body_does_not_hold_a_thread_for_ever(local, monkeypatch):
    import socket

    from prefix_routing.frontdoor.local import LocalFunctionUrlHandler

    runtime, door, _ = local
    monkeypatch.setattr(LocalFunctionUrlHandler, "timeout", 0.3)
    stalled = socket.create_connection(("127.0.0.1", door.server.server_address[1]), timeout=5)
    stalled.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\nauthorization: AWS4-HMAC-SHA256 "
                    b"Credential=a/20261202/us-east-1/lambda/aws4_request, Signature=0\r\n\r\n{")  # 99 bytes missing
    assert stalled.recv(1024) == b""  # the server gave up on the body and closed the connection
    stalled.close()
    assert runtime.requests == []


def test_with_replication_and_a_store_the_local_front_door_steers_in_it(local_dynamo):
    from prefix_routing.frontdoor.local import LOCAL_LIMITS_TABLE, LocalFrontDoor

    env = {"ENDPOINT_NAME": "ep", "INFERENCE_COMPONENT_NAME": "ic", "REPLICATION_ENABLED": "true"}
    with LocalFrontDoor("http://127.0.0.1:9", env, limits_store_url=local_dynamo.url, emit=lambda line: None) as door:
        assert door.invoker.replicas.steering.store.table == LOCAL_LIMITS_TABLE
    with LocalFrontDoor("http://127.0.0.1:9", env, emit=lambda line: None) as door:
        assert door.invoker.replicas.steering is None  # no store: replicas in turn
