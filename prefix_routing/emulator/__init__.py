"""The local SageMaker runtime: the wire protocol on 127.0.0.1, with the lab's fleet model (or an echo) behind it.

Point boto3's own ``sagemaker-runtime`` client at :func:`serve_runtime`'s URL and it behaves like
the real runtime as far as botocore can tell (see :mod:`.server`). The modules:

- the protocol: :mod:`.eventstream` (AWS event-stream framing), :mod:`.protocol` (operations, error
  codes, limits, the parsed request), :mod:`.backend` (what a backend returns), :mod:`.faults`;
- the server: :mod:`.server` (:class:`RuntimeServer`), :mod:`.handler` with its parts
  :mod:`.http_io`, :mod:`.sagemaker_wire` and :mod:`.openai_wire`, :mod:`.connections` (how many
  connections, how long a caller may take) and :mod:`.recording` (a bounded record, exact counts);
- the backends: :mod:`.chat` (OpenAI-style requests and answers, token limits against the context),
  :mod:`.echo_backend`, :mod:`.fleet_backend`, the lab's fleet model in real time
  (:func:`start_emulator`), and :mod:`.engine_backend` with :mod:`.engine_health`, real engines routed
  among those that pass their health checks.

The emulator imports the rules, the stage and the lab (one fleet model, two clocks), never the load
tester.
"""

from prefix_routing.emulator.backend import Backend, BackendResponse, ErrorReply, StreamFailure
from prefix_routing.emulator.chat import SSE_DONE, ChatRequest, chat_response, parse_chat_request, sse_event
from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.faults import Faults
from prefix_routing.emulator.fleet_backend import FleetBackend, fleet_config_for_stage, preset_for_stage, start_emulator
from prefix_routing.emulator.protocol import (
    ERROR_STATUS,
    MAX_BODY_BYTES,
    OP_CHAT_COMPLETIONS,
    OP_INVOKE,
    OP_INVOKE_STREAM,
    RequestHeaders,
    RuntimeRequest,
)
from prefix_routing.emulator.recording import RecordedRequest
from prefix_routing.emulator.server import RuntimeServer, is_loopback_host, serve_runtime

__all__ = [
    "ERROR_STATUS",
    "MAX_BODY_BYTES",
    "OP_CHAT_COMPLETIONS",
    "OP_INVOKE",
    "OP_INVOKE_STREAM",
    "SSE_DONE",
    "Backend",
    "BackendResponse",
    "ChatRequest",
    "EchoBackend",
    "ErrorReply",
    "Faults",
    "FleetBackend",
    "RecordedRequest",
    "RequestHeaders",
    "RuntimeRequest",
    "RuntimeServer",
    "StreamFailure",
    "chat_response",
    "fleet_config_for_stage",
    "is_loopback_host",
    "parse_chat_request",
    "preset_for_stage",
    "serve_runtime",
    "sse_event",
    "start_emulator",
]
