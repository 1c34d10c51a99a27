"""The OpenAI-compatible ``/v1/chat/completions`` and ``/v1/completions`` answers, whole or as SSE, and their errors."""

from __future__ import annotations

import json
import time
from typing import Any

from prefix_routing.emulator.backend import ErrorReply, StreamFailure
from prefix_routing.emulator.chat import sse_event
from prefix_routing.emulator.sagemaker_wire import _close, _stream_outcome


class OpenAIWire:
    """Mixin of the handler: OpenAI-style replies (for engines' clients and the load tester's ``openai`` target)."""

    def _openai_error(self, request_id: str, status: int, message: str, code: str) -> int:
        kind = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error"}.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        self._simple(status, json.dumps(body).encode(), "application/json", {"x-amzn-RequestId": request_id})
        return status

    # -- the OpenAI-compatible path
    def _openai(self, request, record, plan, body: Any) -> tuple[str, int, str | None]:
        rid = request.request_id
        token = request.headers.bearer_token
        expected = self.server.bearer_token
        if token is None or (expected is not None and token != expected):
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
                _close(iterator)
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
        return _stream_outcome(ended, failure)
