"""The SageMaker runtime's answers: ``InvokeEndpoint`` (one body) and ``InvokeEndpointWithResponseStream``
(event-stream frames), AWS-style JSON errors, and how a stream ended."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import socket
import time
import uuid
from typing import Any

from prefix_routing.emulator import eventstream
from prefix_routing.emulator.backend import BackendResponse, ErrorReply, StreamFailure
from prefix_routing.emulator.faults import FaultPlan
from prefix_routing.emulator.protocol import OP_INVOKE, RuntimeRequest
from prefix_routing.emulator.recording import RecordedRequest


class SageMakerWire:
    """Mixin of the handler: the SageMaker runtime's replies, whole and streamed."""

    def _aws_error(self, request_id: str, error: ErrorReply) -> int:
        status = error.http_status
        self._simple(
            status,
            json.dumps(error.body()).encode(),
            "application/json",
            {"X-Amzn-ErrorType": error.code, "x-amzn-RequestId": request_id},
        )
        return status

    def _response_headers(self, request: RuntimeRequest, response: BackendResponse) -> dict[str, str]:
        out = {
            "x-Amzn-Invoked-Production-Variant": response.invoked_variant
            or request.headers.target_variant
            or "AllTraffic",
            "x-amzn-RequestId": request.request_id,
        }
        if response.custom_attributes is not None:
            out["X-Amzn-SageMaker-Custom-Attributes"] = response.custom_attributes
        return out

    def _sagemaker(
        self, request: RuntimeRequest, record: RecordedRequest, plan: FaultPlan
    ) -> tuple[str, int, str | None]:
        problem = self._validate(request)
        error = ErrorReply("ValidationError", problem) if problem else self._before_backend(request, record, plan)
        result = error or self._call_backend(request)
        if isinstance(result, ErrorReply):
            return "error", self._aws_error(request.request_id, result), result.code
        if request.operation == OP_INVOKE:
            return self._invoke(request, record, plan, result)
        return self._invoke_stream(request, record, plan, result)

    def _invoke(self, request, record, plan, response: BackendResponse) -> tuple[str, int, str | None]:
        iterator = iter(response.chunks)
        try:
            if plan.first_chunk_delay:
                record.fault = "slow_first_chunk"
                time.sleep(plan.first_chunk_delay)
            body = b"".join(iterator)
        except StreamFailure as failure:
            error = ErrorReply(
                "ModelError",
                f'Received server error (500) from primary with message "{failure.message}".',
                original_status_code=500,
                original_message=failure.message,
            )
            return "error", self._aws_error(request.request_id, error), "ModelError"
        except Exception as exc:
            error = ErrorReply("InternalFailure", f"backend failed: {type(exc).__name__}: {exc}")
            return "error", self._aws_error(request.request_id, error), "InternalFailure"
        finally:
            close_iterator(iterator)
        headers = self._response_headers(request, response)
        session = request.headers.session_id
        new_session = response.new_session_id
        if new_session is None and session == "NEW_SESSION":
            expires = (_dt.datetime.now(_dt.UTC) + _dt.timedelta(minutes=20)).strftime("%Y-%m-%dT%H:%M:%SZ")
            new_session = f"{uuid.uuid4().hex}; Expires={expires}"
        if new_session:
            headers["X-Amzn-SageMaker-New-Session-Id"] = new_session
        if response.closed_session_id:
            headers["X-Amzn-SageMaker-Closed-Session-Id"] = response.closed_session_id
        now = time.monotonic()
        record.headers_sent_at = record.first_chunk_at = now
        record.chunks_sent, record.bytes_sent = 1, len(body)
        self._simple(200, body, response.content_type, headers)
        return "ok", 200, None

    def _start_stream(self, record: RecordedRequest, content_type: str, headers: dict[str, str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()  # flushes the status line and headers
        record.headers_sent_at = time.monotonic()

    def _pump(
        self, record: RecordedRequest, plan: FaultPlan, response: BackendResponse, frame
    ) -> tuple[str, StreamFailure | None]:
        """Send chunks through ``frame`` until the end or a fault; returns (how it ended, failure)."""
        iterator = iter(response.chunks)
        fragment = self.server.faults.fragment_bytes
        stops = [
            (plan.truncate_after, "truncate"),
            (plan.stream_error_after, "stream_error"),
            (plan.drop_after, "drop"),
        ]
        try:
            if plan.first_chunk_delay:
                record.fault = "slow_first_chunk"
                time.sleep(plan.first_chunk_delay)
            while True:
                for limit, fault in stops:
                    if limit is not None and record.chunks_sent >= limit:
                        record.fault = fault
                        return fault, None
                try:
                    chunk = next(iterator)
                except StopIteration:
                    if plan.stream_error_after is not None:  # fewer chunks than M: the error ends it
                        record.fault = "stream_error"
                        return "stream_error", None
                    return "end", None
                except StreamFailure as failure:
                    return "backend_failure", failure
                except Exception as exc:
                    return "backend_failure", StreamFailure("InternalStreamFailure", f"{type(exc).__name__}: {exc}")
                if not chunk:
                    continue
                pieces = [chunk[i : i + fragment] for i in range(0, len(chunk), fragment)] if fragment else [chunk]
                self._send_chunk(b"".join(frame(piece) for piece in pieces))
                if record.first_chunk_at is None:
                    record.first_chunk_at = time.monotonic()
                record.chunks_sent += 1
                record.bytes_sent += len(chunk)
        finally:
            close_iterator(iterator)

    def _end_stream(self, ended: str) -> None:
        if ended == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._send(b"0\r\n\r\n")

    def _invoke_stream(self, request, record, plan, response: BackendResponse) -> tuple[str, int, str | None]:
        headers = self._response_headers(request, response)
        headers["X-Amzn-SageMaker-Content-Type"] = response.content_type
        self._start_stream(record, eventstream.CONTENT_TYPE, headers)
        ended, failure = self._pump(record, plan, response, eventstream.payload_part)
        faults = self.server.faults
        if ended == "stream_error":
            code = faults.stream_error_code if faults.stream_error_kind == "ModelStreamError" else None
            failure = StreamFailure(faults.stream_error_kind, "Injected mid-stream failure.", code)
        if failure is not None:
            if failure.kind == "ModelStreamError":
                event = eventstream.model_stream_error(failure.message, failure.error_code)
            else:
                event = eventstream.internal_stream_failure(failure.message)
            self._send_chunk(event)
        self._end_stream(ended)
        return stream_outcome(ended, failure)


def stream_outcome(ended: str, failure: StreamFailure | None) -> tuple[str, int, str | None]:
    if failure is not None:
        return "stream_error", 200, failure.kind
    if ended == "truncate":
        return "truncated", 200, None
    if ended == "drop":
        return "dropped", 200, None
    return "ok", 200, None


def close_iterator(iterator: Any) -> None:
    close = getattr(iterator, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()
