"""The HTTP targets: an OpenAI-compatible server, and the normalizer's Lambda Function URL (SigV4 or bearer)."""

from __future__ import annotations

import http.client
import inspect
import json
import os
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from prefix_routing.loadtest.stream import (
    FRONT_DOOR_KINDS,
    Attempt,
    StreamParser,
    classify_http,
    describe_error,
    exception_kind,
    expects_usage,
)
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.stream_usage import usage_request, with_include_usage

_ERROR_BODY_LIMIT = 64 * 1024  # bytes of an error answer's body read


class _HttpTarget:
    """A streaming POST with ``http.client`` over a pool of kept-alive connections."""

    name = "http"

    def __init__(self, url: str, *, timeout: float = 120.0, headers: dict[str, str] | None = None):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"--url {url!r}: expected an http:// or https:// URL")
        self.url = url
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port
        self.netloc = parts.netloc
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout = timeout
        self.headers = dict(headers or {})
        self._idle: list[http.client.HTTPConnection] = []  # kept-alive connections, most recent last
        self._lock = threading.Lock()
        self.connections_opened = 0

    def _acquire(self) -> tuple[http.client.HTTPConnection, bool]:
        """(a connection, whether it was used before)."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
            self.connections_opened += 1
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout), False

    def _release(self, conn: http.client.HTTPConnection, reusable: bool) -> None:
        if reusable:
            with self._lock:
                self._idle.append(conn)
        else:
            conn.close()

    def request_headers(self, body: bytes) -> dict[str, str]:
        return {"Content-Type": "application/json", "Accept": "text/event-stream, application/json", **self.headers}

    def classify_error(self, status: int, payload: bytes) -> tuple[str, str]:
        code = None
        message = payload[:300].decode("utf-8", "replace")
        try:
            data = json.loads(payload)
        except ValueError:
            data = None
        if isinstance(data, dict):
            error = data.get("error", data)
            if isinstance(error, dict):
                code = error.get("code") or error.get("type") or error.get("__type")
                message = error.get("message") or error.get("Message") or message
            elif isinstance(error, str):
                code = data.get("code") if isinstance(data.get("code"), str) else error
                message = data.get("message") or message
        code = code if isinstance(code, str) else None
        kind = FRONT_DOOR_KINDS.get(code or "") or classify_http(status, code)
        if kind.startswith("http_") and code and "throttl" in code.lower():
            kind = "throttled"
        if kind.startswith("http_") and code and code.lower() in ("modelerror", "model_error"):
            kind = "model_error"
        return kind, f"{status} {code + ': ' if code else ''}{message}".strip()

    def send(self, body: bytes) -> Attempt:
        attempt = Attempt()
        parser = StreamParser()
        expect_usage = expects_usage(body)
        call_start = time.perf_counter()
        headers = self.request_headers(body)
        start = time.perf_counter()
        attempt.client_overhead_s = start - call_start
        conn, reused = self._acquire()
        reusable = False
        try:
            try:
                conn.request("POST", self.path, body=body, headers=headers)
                response = conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                if not reused:
                    raise
                # A kept-alive connection the server had closed meanwhile: once more on a fresh one.
                conn.close()
                with self._lock:
                    self.connections_opened += 1
                conn = type(conn)(self.host, self.port, timeout=self.timeout)
                start = time.perf_counter()
                conn.request("POST", self.path, body=body, headers=headers)
                response = conn.getresponse()
            attempt.status = response.status
            attempt.request_id = response.getheader("x-amzn-RequestId") or response.getheader("x-request-id")
            if response.status >= 400:
                payload = response.read(_ERROR_BODY_LIMIT)
                attempt.kind, attempt.detail = self.classify_error(response.status, payload)
                reusable = not response.will_close and response.isclosed()
                return attempt
            while True:
                data = response.read1(65536)
                if not data:
                    break
                if attempt.ttft_s is None:
                    attempt.ttft_s = time.perf_counter() - start
                attempt.bytes_received += len(data)
                parser.feed(data)
            reusable = not response.will_close
        except Exception as error:
            attempt.kind, attempt.detail = exception_kind(error), describe_error(error)
        finally:
            attempt.e2e_s = time.perf_counter() - start
            self._release(conn, reusable)
        return attempt.finish(parser, expect_usage)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class OpenAITarget(_HttpTarget):
    """An OpenAI-compatible chat-completions URL (SSE): SageMaker's, or any server's (vLLM, llama.cpp).

    ``url``: the full ``.../chat/completions`` URL; a URL ending in ``/v1`` gets ``/chat/completions``
    appended. ``token``: the bearer token; when ``None``, SageMaker's runtime URL gets one from the
    ``sagemaker`` SDK's token generator (``sagemaker.core.token_generator.generate_token``) for
    ``region``, and any other server is called without one (a local vLLM or llama.cpp needs none).
    ``include_usage``: a streamed body that does not say ``stream_options.include_usage`` gets it
    (an OpenAI-compatible server reports usage, and so cached tokens, only then); ``notes()`` says
    how many bodies were changed.
    """

    name = "openai"

    def __init__(self, url: str, *, token: str | None = None, region: str | None = None, timeout: float = 120.0,
                 headers: dict[str, str] | None = None, include_usage: bool = True):
        if url.rstrip("/").endswith("/v1"):
            url = url.rstrip("/") + "/chat/completions"
        super().__init__(url, timeout=timeout, headers=headers)
        if not token and _is_sagemaker_runtime(self.host):
            token = sagemaker_bearer_token(region or _region_from_host(self.host))
        self.token = token or None
        self.include_usage = include_usage
        self.usage_added = 0
        self.description = f"openai-compatible {url}"

    def request_headers(self, body: bytes) -> dict[str, str]:
        headers = super().request_headers(body)
        return {**headers, "Authorization": f"Bearer {self.token}"} if self.token else headers

    def send(self, body: bytes) -> Attempt:
        return super().send(self.with_usage(body))

    def with_usage(self, body: bytes) -> bytes:
        """The body, with ``stream_options.include_usage`` added to a streamed one that does not say."""
        if not self.include_usage or b'"stream"' not in body:
            return body
        try:
            data = json.loads(body)
        except ValueError:
            return body  # sent as it is: the server answers what it answers
        if not usage_request(data)[1]:
            return body  # not streamed, or the caller decided
        with self._lock:
            self.usage_added += 1
        return json.dumps(with_include_usage(data), separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def notes(self) -> list[str]:
        if not self.usage_added:
            return []
        return [f"stream_options.include_usage added to {self.usage_added} streamed bodies that lacked it, so that "
                "the server reports usage and cached tokens (turn it off with --no-include-usage)"]


def _is_sagemaker_runtime(host: str) -> bool:
    """SageMaker's runtime (runtime.sagemaker.<region>.amazonaws.com[.cn]): its OpenAI path needs a token."""
    parts = host.lower().split(".")
    return len(parts) >= 4 and parts[0] == "runtime" and parts[1] == "sagemaker" and "amazonaws" in parts


def _region_from_host(host: str) -> str | None:
    # runtime.sagemaker.<region>.amazonaws.com / <id>.lambda-url.<region>.on.aws
    parts = host.split(".")
    for marker in ("sagemaker", "lambda-url"):
        if marker in parts:
            i = parts.index(marker)
            if i + 1 < len(parts):
                return parts[i + 1]
    return None


def sagemaker_bearer_token(region: str | None) -> str:
    """A short-lived bearer token for SageMaker's OpenAI-compatible API, from the ``sagemaker`` SDK.

    The SDK is imported only here; its absence is a :class:`UserError` naming the package.
    """
    try:
        from sagemaker.core.token_generator import generate_token  # type: ignore[import-not-found]
    except ImportError:
        raise UserError(
            "the openai target needs a bearer token: pass --token, or install the SageMaker Python SDK "
            "('pip install sagemaker-core', module sagemaker.core.token_generator) to generate one"
        ) from None
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    kwargs: dict[str, Any] = {}
    try:
        accepted = inspect.signature(generate_token).parameters
    except (TypeError, ValueError):  # pragma: no cover
        accepted = {}
    if region and ("region" in accepted or not accepted):
        kwargs["region"] = region
    try:
        token = generate_token(**kwargs)
    except Exception as error:
        raise UserError(f"sagemaker.core.token_generator.generate_token failed: {describe_error(error)}") from None
    if not isinstance(token, str) or not token:
        raise UserError("sagemaker.core.token_generator.generate_token returned no token")
    return token


class LambdaUrlTarget(_HttpTarget):
    """The normalizer's Function URL, each request SigV4-signed for service ``lambda``."""

    name = "lambda-url"

    def __init__(self, url: str, *, region: str | None = None, profile: str | None = None, timeout: float = 120.0,
                 headers: dict[str, str] | None = None, credentials: Any = None):
        super().__init__(url, timeout=timeout, headers=headers)
        try:
            import boto3
            from botocore.auth import SigV4Auth
            from botocore.awsrequest import AWSRequest
            from botocore.exceptions import ProfileNotFound
        except ImportError as error:  # pragma: no cover
            raise UserError(f"the lambda-url target needs botocore: {error}") from None
        self._SigV4Auth, self._AWSRequest = SigV4Auth, AWSRequest
        if credentials is None:
            try:
                session = boto3.Session(profile_name=profile) if profile else boto3.Session()
            except ProfileNotFound as error:
                raise UserError(str(error)) from None
            credentials = session.get_credentials()
            region = region or _region_from_host(self.host) or session.region_name
        else:
            region = region or _region_from_host(self.host)
        if credentials is None:
            raise UserError("no AWS credentials found to sign requests to the Function URL")
        if not region:
            raise UserError("the lambda-url target needs --region (not found in the URL)")
        self.credentials = credentials
        self.region = region
        self.description = f"lambda function url {url}"

    @classmethod
    def local_caller(cls, url: str, caller: str, **options: Any) -> "LambdaUrlTarget":
        """The local front door (``emulate --front-door``), called as ``caller``: it names a caller by
        the SigV4 access key id and checks no secret."""
        from botocore.credentials import Credentials

        return cls(url, region="us-east-1", credentials=Credentials(caller, "not-checked-locally"), **options)

    def request_headers(self, body: bytes) -> dict[str, str]:
        headers = {**super().request_headers(body), "Host": self.netloc}
        frozen = self.credentials.get_frozen_credentials() if hasattr(self.credentials, "get_frozen_credentials") \
            else self.credentials
        request = self._AWSRequest(method="POST", url=self.url, data=body, headers=headers)
        self._SigV4Auth(frozen, "lambda", self.region).add_auth(request)
        return dict(request.headers.items())
