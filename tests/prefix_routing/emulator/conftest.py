"""Shared pieces of the emulator's tests: boto3 clients against the local runtime, SSE helpers, a scripted backend."""

from __future__ import annotations

import json
import threading
import time

import boto3
import pytest
from botocore.config import Config

from prefix_routing.emulator.backend import BackendResponse

CHAT = {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "alpha beta gamma"}]}
BODY = json.dumps(CHAT).encode()


_CLIENTS: list = []


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def client_for(server, attempts=1, mode="standard"):
    client = boto3.client(
        "sagemaker-runtime",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"total_max_attempts": attempts, "mode": mode}, read_timeout=10, connect_timeout=2),
    )
    _CLIENTS.append(client)
    return client


def sse_objects(text: str) -> list:
    """The JSON objects of an SSE text, with "[DONE]" kept as a string."""
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def content_of(objects: list) -> str:
    return "".join(o["choices"][0]["delta"].get("content", "") for o in objects if isinstance(o, dict) and o["choices"])


class Scripted:
    """A backend answering from a script: an ErrorReply, a chunk list, or chunks then a failure."""

    def __init__(self, result=None, chunks=(b"one", b"two"), fail=None, raise_in_handle=False):
        self.result, self.chunks, self.fail, self.raise_in_handle = result, chunks, fail, raise_in_handle
        self.closed = threading.Event()

    def handle(self, request):
        if self.raise_in_handle:
            raise RuntimeError("backend bug")
        if self.result is not None:
            return self.result
        return BackendResponse(chunks=self._gen(), content_type="application/x-test")

    def _gen(self):
        try:
            for chunk in self.chunks:
                if isinstance(chunk, float):
                    time.sleep(chunk)
                    continue
                yield chunk
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed.set()
