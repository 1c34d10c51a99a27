"""The OpenAI-compatible ``/v1/chat/completions`` and ``/v1/completions`` answers, whole or as SSE, their errors,
and the model list (``GET /v1/models``) that benchmark clients such as AIPerf read before they start."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from prefix_routing.emulator.backend import ErrorReply, StreamFailure
from prefix_routing.emulator.chat import sse_event
from prefix_routing.emulator.protocol import OP_CHAT_COMPLETIONS, RequestHeaders
from prefix_routing.emulator.sagemaker_wire import close_iterator, stream_outcome


class OpenAIWire:
    """Mixin of the handler: OpenAI-style replies (for engines' clients and the load tester's ``openai`` target)."""

    def _openai_error(self, request_id: str, status: int, message: str, code: str) -> int:
        kind = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error"}.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        self._simple(status, json.dumps(body).encode(), "application/json", {"x-amzn-RequestId": request_id})
        return status

    def _authorized(self, token: str | None) -> bool:
        """A bearer token is present and, when the server was given one, is that one."""
        expected = self.server.bearer_token
        return token is not None and (expected is None or token == expected)

    # -- GET .../openai/v1/models
    def _models(self, endpoint: str) -> None:
        """The served model, as vLLM lists it: one entry whose ``id`` is the name clients put in ``model``.
        The same bearer token as the chat path; an endpoint the server does not serve is a 400 as there."""
        rid = str(uuid.uuid4())
        token = RequestHeaders.from_http(OP_CHAT_COMPLETIONS, self.headers).bearer_token
        if not self._authorized(token):
            self._openai_error(rid, 401, "Missing or invalid bearer token.", "invalid_api_key")
            return
        if self.server.endpoints is not None and endpoint not in self.server.endpoints:
            self._openai_error(rid, 400, f"Endpoint {endpoint} not found.", "ValidationError")
            return
        model: dict[str, Any] = {"id": self.server.served_model, "object": "model",
                                 "created": int(self.server.started_wall), "owned_by": "vllm",
                                 "root": self.server.served_model, "parent": None}
        context = getattr(self.server.backend, "context_tokens", None)
        if isinstance(context, int):
            model["max_model_len"] = context
        body = {"object": "list", "data": [model]}
        self._simple(200, json.dumps(body).encode(), "application/json", {"x-amzn-RequestId": rid})

    # -- the OpenAI-compatible path
    def _openai(self, request, record, plan, body: Any) -> tuple[str, int, str | None]:
        rid = request.request_id
        if not self._authorized(request.headers.bearer_token):
            return (
                "error",
                self._openai_error(rid, 401, "Missing or invalid bearer token.", "invalid_api_key"),
                "Unauthorized",
            )
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return (
                "error",
                self._openai_error(rid, 400, "Body must be a JSON object with a 'messages' list.", "invalid_request"),
                "ValidationError",
            )
        error = self._before_backend(request, record, plan) or None
        if error is None and self.server.endpoints is not None and request.endpoint_name not in self.server.endpoints:
            error = ErrorReply("ValidationError", f"Endpoint {request.endpoint_name} not found.")
        result = error or self._call_backend(request)
        if isinstance(result, ErrorReply):
            status = (
                429
                if result.code == "ThrottlingException"
                else (
                    result.original_status_code
                    if result.code == "ModelError" and result.original_status_code
                    else result.http_status
                )
            )
            return "error", self._openai_error(rid, status, result.message, result.code), result.code
        response = result
        headers = {"x-amzn-RequestId": rid}
        if not request.stream:
            iterator = iter(response.chunks)
            try:
                if plan.first_chunk_delay:
                    record.fault = "slow_first_chunk"
                    time.sleep(plan.first_chunk_delay)
                data = b"".join(iterator)
            except Exception as exc:
                message = exc.message if isinstance(exc, StreamFailure) else f"{type(exc).__name__}: {exc}"
                return "error", self._openai_error(rid, 500, message, "ModelError"), "ModelError"
            finally:
                close_iterator(iterator)
            record.headers_sent_at = record.first_chunk_at = time.monotonic()
            record.chunks_sent, record.bytes_sent = 1, len(data)
            self._simple(200, data, response.content_type, headers)
            return "ok", 200, None
        headers["Cache-Control"] = "no-cache"
        self._start_stream(record, "text/event-stream; charset=utf-8", headers)
        ended, failure = self._pump(record, plan, response, lambda piece: piece)
        faults = self.server.faults
        if ended == "stream_error":
            failure = StreamFailure(faults.stream_error_kind, "Injected mid-stream failure.", faults.stream_error_code)
        if failure is not None:
            error_body = {
                "error": {
                    "message": failure.message,
                    "type": "server_error",
                    "code": failure.error_code or failure.kind,
                }
            }
            self._send_chunk(sse_event(error_body))
        self._end_stream(ended)
        return stream_outcome(ended, failure)
