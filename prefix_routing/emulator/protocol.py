"""The runtime's wire protocol: operations, error codes and their statuses, limits, paths, and the request as parsed."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

OP_INVOKE = "InvokeEndpoint"
OP_INVOKE_STREAM = "InvokeEndpointWithResponseStream"
#: Our name for the OpenAI-compatible chat-completions call (not a boto3 operation).
OP_CHAT_COMPLETIONS = "ChatCompletions"

#: HTTP status of each error code, from the service model (``ThrottlingException`` is AWS's common
#: error, not in the model; 400 as in AWS's common-errors table).
ERROR_STATUS: dict[str, int] = {
    "ValidationError": 400,
    "ModelError": 424,
    "ModelNotReadyException": 429,
    "InternalFailure": 500,
    "ServiceUnavailable": 503,
    "InternalDependencyException": 530,
    "ThrottlingException": 400,
}

#: Members of each error shape besides ``Message`` that the server puts in the JSON body.
_ERROR_EXTRA_MEMBERS = {"ModelError": ("OriginalStatusCode", "OriginalMessage", "LogStreamArn")}

STREAM_ERROR_KINDS = ("ModelStreamError", "InternalStreamFailure")

#: ``Body`` of InvokeEndpoint / InvokeEndpointWithResponseStream: at most 6 MiB (service model).
MAX_BODY_BYTES = 6 * 1024 * 1024
READ_LIMIT = 64 * 1024 * 1024  # beyond this the server answers 413 and closes

NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
COMPONENT_RE = re.compile(r"^[a-zA-Z0-9]([\-a-zA-Z0-9]*[a-zA-Z0-9])?$")
PRINTABLE_ID_RE = re.compile(r"^[!-~][ -~]*$")  # \A\S[\p{Print}]*\z, ASCII
SESSION_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")

_PATHS = (
    (re.compile(r"^/endpoints/([^/]+)/invocations$"), OP_INVOKE),
    (re.compile(r"^/endpoints/([^/]+)/invocations-response-stream$"), OP_INVOKE_STREAM),
    (re.compile(r"^/endpoints/([^/]+)/openai/v1/chat/completions$"), OP_CHAT_COMPLETIONS),
)


#: ``GET``: the OpenAI-compatible model list of an endpoint (what ``GET {base}/v1/models`` asks).
MODELS_PATH = re.compile(r"^/endpoints/([^/]+)/openai/v1/models$")


def route_path(path: str) -> tuple[re.Match[str], str] | None:
    for pattern, operation in _PATHS:
        match = pattern.match(path)
        if match:
            return match, operation
    return None


# --------------------------------------------------------------------------- the request


@dataclass(frozen=True)
class RequestHeaders:
    """Every request header botocore sends for the two invoke operations, as named fields.

    Field names are boto3's parameter names in snake case. ``accept`` comes from ``Accept`` for
    ``InvokeEndpoint`` and from ``X-Amzn-SageMaker-Accept`` for the streaming call.
    """

    content_type: str | None = None
    accept: str | None = None
    custom_attributes: str | None = None
    target_model: str | None = None
    target_variant: str | None = None
    target_container_hostname: str | None = None
    inference_id: str | None = None
    enable_explanations: str | None = None
    inference_component: str | None = None
    session_id: str | None = None
    prefix_aware_id: str | None = None
    authorization: str | None = None

    #: field -> HTTP header (``accept`` depends on the operation, see :meth:`from_http`).
    HTTP_NAMES = {
        "content_type": "Content-Type",
        "custom_attributes": "X-Amzn-SageMaker-Custom-Attributes",
        "target_model": "X-Amzn-SageMaker-Target-Model",
        "target_variant": "X-Amzn-SageMaker-Target-Variant",
        "target_container_hostname": "X-Amzn-SageMaker-Target-Container-Hostname",
        "inference_id": "X-Amzn-SageMaker-Inference-Id",
        "enable_explanations": "X-Amzn-SageMaker-Enable-Explanations",
        "inference_component": "X-Amzn-SageMaker-Inference-Component",
        "session_id": "X-Amzn-SageMaker-Session-Id",
        "prefix_aware_id": "X-Amzn-SageMaker-Prefix-Aware-Id",
        "authorization": "Authorization",
    }

    @classmethod
    def from_http(cls, operation: str, headers: Any) -> RequestHeaders:
        """Read the named fields from an ``email.message.Message``-like mapping (case-insensitive)."""
        values = {name: headers.get(http) for name, http in cls.HTTP_NAMES.items()}
        accept_header = "X-Amzn-SageMaker-Accept" if operation == OP_INVOKE_STREAM else "Accept"
        values["accept"] = headers.get(accept_header)
        return cls(**values)

    @property
    def bearer_token(self) -> str | None:
        """The token of an ``Authorization: Bearer <token>`` header."""
        if self.authorization and self.authorization[:7].lower() == "bearer ":
            return self.authorization[7:].strip() or None
        return None


@dataclass(frozen=True)
class RuntimeRequest:
    """One parsed request, as the backend sees it."""

    operation: str  # OP_INVOKE, OP_INVOKE_STREAM or OP_CHAT_COMPLETIONS
    endpoint_name: str
    body: bytes
    headers: RequestHeaders
    #: Every header as received, in order (names as the client spelled them).
    raw_headers: tuple[tuple[str, str], ...]
    #: ``time.monotonic()`` when the request was read completely; all server timings use it.
    arrival: float
    #: ``time.time()`` at the same moment.
    arrival_wall: float
    request_id: str
    #: 0, 1, 2, ... in order of arrival at the server (all operations together).
    index: int
    #: Whether the answer is a stream: always for the streaming call, ``"stream": true`` on the
    #: OpenAI path, never for ``InvokeEndpoint``.
    stream: bool
    path: str

    def json(self) -> Any:
        """The body parsed as JSON (raises ``ValueError`` if it is not)."""
        return json.loads(self.body.decode("utf-8"))


def log_stream_arn(endpoint_name: str) -> str:
    return f"arn:aws:logs:us-east-1:000000000000:log-group:/aws/sagemaker/Endpoints/{endpoint_name}"
