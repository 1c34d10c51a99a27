"""The HTTP handler: one request in, checked, routed to the SageMaker or the OpenAI-style wire, with faults applied.

Every method answers JSON: ``GET /ping``, ``GET /status`` and the OpenAI-compatible model list
(``GET /endpoints/{name}/openai/v1/models``), ``POST`` to the runtime's paths; any other
path or method is 404 ``UnknownOperationException`` (AWS's rest-json services route by method and path
together, so an unknown method is an unknown operation)."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from prefix_routing.emulator.backend import Backend, BackendResponse, ErrorReply
from prefix_routing.emulator.faults import FaultPlan, Faults
from prefix_routing.emulator.http_io import BadRequest, ConnectionHost, Disconnected, HttpIO, TimedOut, TooLarge
from prefix_routing.emulator.openai_wire import OpenAIWire
from prefix_routing.emulator.protocol import (
    COMPONENT_RE,
    MAX_BODY_BYTES,
    MODELS_PATH,
    NAME_RE,
    OP_CHAT_COMPLETIONS,
    OP_INVOKE,
    OP_INVOKE_STREAM,
    PRINTABLE_ID_RE,
    SESSION_RE,
    RequestHeaders,
    RuntimeRequest,
    log_stream_arn,
    route_path,
)
from prefix_routing.emulator.recording import RecordedRequest
from prefix_routing.emulator.sagemaker_wire import SageMakerWire

#: SageMaker's answer to an invocation of an inference-component endpoint without
#: ``InferenceComponentName`` (``ValidationError``, 400), as callers quote it (e.g.
#: aws-samples/amazon-kendra-langchain-extensions#64, garystafford/llm-langchain-sql-demo#1).
COMPONENT_REQUIRED = ("Inference Component Name header is required for endpoints to which you plan to deploy "
                      "inference components. Please include Inference Component Name header or consider using "
                      "SageMaker models.")


class RuntimeHost(ConnectionHost, Protocol):
    """What the handler and its wires need of their server (:class:`~prefix_routing.emulator.server.RuntimeServer`)."""

    backend: Backend
    faults: Faults
    endpoints: frozenset[str] | None
    bearer_token: str | None
    require_component: bool
    served_model: str
    started_wall: float

    def status(self) -> dict[str, Any]: ...

    def admit(
        self, make_request: Callable[[int], RuntimeRequest]
    ) -> tuple[RuntimeRequest, RecordedRequest, FaultPlan]: ...

    def record_outcome(
        self, record: RecordedRequest, outcome: str, status: int | None, error_code: str | None = None
    ) -> None: ...


class RuntimeHandler(SageMakerWire, OpenAIWire, HttpIO):
    """Dispatch by path: health, the SageMaker operations, the OpenAI-style routes."""

    server: RuntimeHost

    # -- GET
    def do_GET(self) -> None:
        self._answering()
        path = urlsplit(self.path).path
        if path == "/ping":
            self._simple(200, b"", "text/plain")
        elif path == "/status":
            self._simple(200, json.dumps(self.server.status()).encode(), "application/json")
        elif match := MODELS_PATH.match(path):
            self._models(unquote(match.group(1)))
        else:
            self._simple(
                404, b'{"message":"not found"}', "application/json", {"X-Amzn-ErrorType": "UnknownOperationException"}
            )

    # -- POST
    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        routed = route_path(path)
        try:
            body = self._read_body()
        except BadRequest as bad:
            self._json_error(400, str(bad))
            return
        except TooLarge:
            self._json_error(413, "Request entity too large")
            return
        except TimedOut:
            self._timed_out()
            return
        except Disconnected:
            self.close_connection = True
            return
        if routed is None:
            self._simple(
                404,
                b'{"message":"Unknown operation"}',
                "application/json",
                {"X-Amzn-ErrorType": "UnknownOperationException"},
            )
            return
        match, operation = routed
        endpoint = unquote(match.group(1))
        stream = operation == OP_INVOKE_STREAM
        openai_body: Any = None
        if operation == OP_CHAT_COMPLETIONS:
            with contextlib.suppress(ValueError):
                openai_body = json.loads(body.decode("utf-8"))
            stream = isinstance(openai_body, dict) and openai_body.get("stream") is True
        arrival, arrival_wall = time.monotonic(), time.time()
        request_id = str(uuid.uuid4())

        def make(index: int) -> RuntimeRequest:
            return RuntimeRequest(
                operation=operation,
                endpoint_name=endpoint,
                body=body,
                headers=RequestHeaders.from_http(operation, self.headers),
                raw_headers=tuple(self.headers.items()),
                arrival=arrival,
                arrival_wall=arrival_wall,
                request_id=request_id,
                index=index,
                stream=stream,
                path=path,
            )

        request, record, plan = self.server.admit(make)
        outcome, status, code = "error", 500, "InternalFailure"
        try:
            if operation == OP_CHAT_COMPLETIONS:
                outcome, status, code = self._openai(request, record, plan, openai_body)
            else:
                outcome, status, code = self._sagemaker(request, record, plan)
        except Disconnected:
            outcome, status, code = "client_disconnected", None, None
        finally:
            self.server.record_outcome(record, outcome, status, code)

    # -- the SageMaker operations
    def _validate(self, request: RuntimeRequest) -> str | None:
        h = request.headers
        name = request.endpoint_name
        if not (len(name) <= 63 and NAME_RE.match(name)):
            return f"1 validation error detected: Value '{name}' at 'endpointName' failed to satisfy constraint"
        if len(request.body) > MAX_BODY_BYTES:
            return f"Request body of {len(request.body)} bytes exceeds the maximum of {MAX_BODY_BYTES} bytes"
        if h.prefix_aware_id is not None and not (
            1 <= len(h.prefix_aware_id) <= 64 and PRINTABLE_ID_RE.match(h.prefix_aware_id)
        ):
            return ("Value at 'prefixAwareId' failed to satisfy constraint: Member must have length between 1 and 64 "
                    "and satisfy regular expression pattern: \\A\\S[\\p{Print}]*\\z")
        if h.inference_component is not None and not (
            len(h.inference_component) <= 63 and COMPONENT_RE.match(h.inference_component)
        ):
            return "Value at 'inferenceComponentName' failed to satisfy constraint"
        if h.inference_id is not None and not (
            1 <= len(h.inference_id) <= 64 and PRINTABLE_ID_RE.match(h.inference_id)
        ):
            return "Value at 'inferenceId' failed to satisfy constraint"
        if h.session_id is not None and not (
            len(h.session_id) <= 256
            and (SESSION_RE.match(h.session_id) or (h.session_id == "NEW_SESSION" and request.operation == OP_INVOKE))
        ):
            return "Value at 'sessionId' failed to satisfy constraint"
        if self.server.endpoints is not None and name not in self.server.endpoints:
            return f"Endpoint {name} of account 000000000000 not found."
        if self.server.require_component and not h.inference_component:
            return COMPONENT_REQUIRED
        return None

    def _before_backend(
        self, request: RuntimeRequest, record: RecordedRequest, plan: FaultPlan
    ) -> ErrorReply | None:
        faults = self.server.faults
        if plan.throttle:
            record.fault = "throttle"
            return ErrorReply("ThrottlingException", "Rate exceeded", status=faults.throttle_status)
        if plan.error:
            record.fault = "error"
            kind = faults.error_kind
            if kind == "ModelError":
                return ErrorReply(
                    kind,
                    'Received server error (500) from primary with message "injected fault".',
                    original_status_code=500,
                    original_message='{"object":"error","message":"injected fault","code":500}',
                    log_stream_arn=log_stream_arn(request.endpoint_name),
                )
            return ErrorReply(kind, f"Injected {kind}.")
        return None

    def _call_backend(self, request: RuntimeRequest) -> BackendResponse | ErrorReply:
        try:
            result = self.server.backend.handle(request)
        except Exception as exc:  # a backend bug: the runtime's own 500
            return ErrorReply("InternalFailure", f"backend failed: {type(exc).__name__}: {exc}")
        if not isinstance(result, (BackendResponse, ErrorReply)):
            return ErrorReply("InternalFailure", f"backend returned {type(result).__name__}")
        return result
