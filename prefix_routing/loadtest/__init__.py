"""Replay requests against an endpoint and measure what a client sees: TTFT, latency, errors, hits.

Sources (:func:`trace_requests`, :func:`body_requests`): a Mooncake trace (bodies made by
:mod:`prefix_routing.lab.bodies`, arrival times from the trace) or a file of request bodies (JSON lines,
sent byte for byte). Each body may be varied as another client would send it (``vary``) and/or
normalized by :mod:`prefix_routing.rules` before it is sent (``normalize``; variation first).

Targets (all streaming):

- :class:`SageMakerTarget`: boto3's ``sagemaker-runtime`` ``InvokeEndpointWithResponseStream`` with
  ``EndpointName``, ``InferenceComponentName``, ``PrefixAwareId``; ``endpoint_url`` points it at the
  emulator or the local runtime server (loopback URLs get dummy credentials when none are
  configured). botocore's own retries are off: every attempt is visible.
- :class:`LambdaUrlTarget`: the normalizer's Function URL, SigV4-signed for service ``lambda`` with
  botocore's ``SigV4Auth``; the streamed answer is read with ``http.client``.
- :class:`OpenAITarget`: an OpenAI-compatible chat-completions URL with server-sent events and a
  bearer token (given, or for SageMaker's OpenAI-compatible API made by the ``sagemaker`` SDK's
  ``sagemaker.core.token_generator``, imported only then).

What is measured per request (:class:`RequestResult`): client-side TTFT (from when the request
goes on the wire, botocore's ``before-send`` for the sagemaker target, to the first payload byte:
the first ``PayloadPart`` or the first body bytes; the SDK's own request building and signing before
that is reported as ``client_overhead_s``),
end-to-end latency (to the end of the stream), output tokens (``usage.completion_tokens``, else the
number of content chunks), prompt and cached tokens when usage comes back
(``usage.prompt_tokens``, ``usage.prompt_tokens_details.cached_tokens``), and the server's request
id (``x-amzn-RequestId``). Every request ends exactly once, as succeeded or as failed with one kind:

==================  =========================================================================
``throttled``       throttling error (``ThrottlingException``, HTTP 429 on the HTTP targets)
``model_error``     ``ModelError`` (the container answered an error)
``stream_error``    an error event in the stream (``ModelStreamError``, ``InternalStreamFailure``,
                    an SSE ``{"error": ...}``)
``truncated``       the stream ended cleanly but without its end: no ``data: [DONE]`` on an SSE
                    stream; no finish reason (or no usage when the body asked for it) otherwise
``timeout``         connect or read timeout
``connection``      connection refused, reset or dropped mid-stream
``http_<status>``   any other error status (``http_503``, ``http_500``, ``http_401`` ...)
``client_error``    the client could not send it (e.g. botocore parameter validation)
==================  =========================================================================

The normalizer front door's own error codes (``throttled``, ``model_error``, ``model_stream_error``,
``truncated``, ``timeout``; before the stream or as an in-band SSE error) map to the same kinds. A
truncated answer is never a success. Retries are off by default; with ``retries=N`` a request
that failed before its first payload byte with ``throttled``, ``timeout``, ``connection`` or a 5xx
is sent again (full-jitter exponential backoff) and counted once, with its attempts; its TTFT and
latency then include the retries.

:func:`run_load` drives the requests with bounded concurrency, at a fixed rate, at the trace's own
pace scaled by ``speed``, or as fast as the concurrency allows; it stops issuing at ``max_requests``
or after ``duration`` seconds (requests in flight finish, bounded by the timeout) or at the end of
the input. :func:`summarize`, :func:`write_reports` (JSON, Markdown, PNG plots) report on it.

The modules: :mod:`.work` (what goes out), :mod:`.stream` (what comes back),
:mod:`.sagemaker_target` and :mod:`.http_targets` (where it goes), :mod:`.runner` (the run) and
:mod:`.report` (the numbers and plots). The load tester imports the rules, the stage, the lab's
bodies and traces, and the emulator's loopback check.
"""

from prefix_routing.loadtest.http_targets import LambdaUrlTarget, OpenAITarget, sagemaker_bearer_token
from prefix_routing.loadtest.report import percentile, plot, render_markdown, report_dict, summarize, write_reports
from prefix_routing.loadtest.runner import LoadResult, RequestResult, run_load
from prefix_routing.loadtest.sagemaker_target import TARGETS, SageMakerTarget
from prefix_routing.loadtest.stream import ERROR_KINDS, RETRYABLE, Attempt, StreamParser
from prefix_routing.loadtest.work import BodyPreparer, WorkItem, body_requests, trace_requests

__all__ = [
    "ERROR_KINDS",
    "RETRYABLE",
    "TARGETS",
    "Attempt",
    "BodyPreparer",
    "LambdaUrlTarget",
    "LoadResult",
    "OpenAITarget",
    "RequestResult",
    "SageMakerTarget",
    "StreamParser",
    "WorkItem",
    "body_requests",
    "percentile",
    "plot",
    "render_markdown",
    "report_dict",
    "run_load",
    "sagemaker_bearer_token",
    "summarize",
    "trace_requests",
    "write_reports",
]
