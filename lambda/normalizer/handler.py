"""The normalizer Lambda's entry points: thin, the logic is in ``prefix_routing.frontdoor``.

How responses stream. The Python managed runtime has no native response streaming (only Node.js
has it), so the function runs the AWS Lambda Web Adapter (LWA) as a layer: the layer's
``/opt/bootstrap`` (``AWS_LAMBDA_EXEC_WRAPPER``) executes the function's handler, ``run.sh``, which
starts ``server.py``: a standard-library ``http.server.ThreadingHTTPServer`` on 127.0.0.1:8080 (no
web framework, no new dependency). LWA turns each invocation into an HTTP request to it and, with
``AWS_LWA_INVOKE_MODE=response_stream`` and the Function URL's ``InvokeMode: RESPONSE_STREAM``,
passes the chunked answer on to the caller as it is written: every ``PayloadPart`` of
``InvokeEndpointWithResponseStream`` reaches the caller as it arrives. We chose LWA over a custom
runtime (one would have to speak the Lambda runtime API's streaming protocol ourselves) and over an
ASGI app (it would need a server and a framework in the asset, for one route); ``http.server`` is
enough for LWA's one connection.

- HTTP requests (Function URL with IAM auth): LWA puts the event's request context (who signed the
  request) in the ``x-amzn-request-context`` header, overwriting any value the client sent; the
  tenant is read from there. The status line is held back until the first token (or an error) is
  known, so throttling, model errors and timeouts before the first byte get proper 429/502/503/504
  answers; later failures are reported in-band (see ``prefix_routing.frontdoor``).
- Direct invocations (``lambda:InvokeFunction`` with ``{"body": {...}, "tenant": "..."}``): LWA
  passes non-HTTP events through as ``POST /events`` (``AWS_LWA_PASS_THROUGH_PATH``) with the
  request context ``null``; the app answers with :func:`handle_event`'s buffered JSON: a 403 under
  the ``iam`` and ``header`` tenancies (the event names its own tenant) unless ``ALLOW_DIRECT_INVOKE``. In
  ``response_stream`` mode LWA puts its HTTP metadata prelude (a JSON object and 8 zero bytes) in
  front of that payload; ``prefix_routing.frontdoor.decode_direct_payload`` strips it.
- :func:`handler` is a plain ``handler(event, context)`` for the same events without LWA (tests, or a
  deployment with the plain Python runtime and a ``BUFFERED`` Function URL): HTTP events get the
  proxy-integration result, direct invocations the JSON answer.

Cold start: the runtime and Secrets Manager clients and the tenant key (``GetSecretValue`` on the
secret named by ``TENANT_KEY_SECRET_ARN``, once per execution environment) are set up by
:func:`get_invoker`, which ``server.py`` calls before it starts listening, that is during the
function's init phase (LWA's readiness check waits for it). Metrics are written in the Embedded
Metric Format by Powertools' EMF provider (``prefix_routing.frontdoor.emf_document``).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import boto3
from botocore.config import Config

from prefix_routing import frontdoor
from prefix_routing.frontdoor import steering_store as steering
from prefix_routing.rules.limits import RELEASE_TIMEOUT_MS

_LOCK = threading.Lock()
_INVOKER: frontdoor.Invoker | None = None


def _runtime_client_config() -> Config:
    read_timeout = float(os.environ.get("UPSTREAM_READ_TIMEOUT_S") or 65)
    return Config(
        retries={"total_max_attempts": 1},  # the invoker retries, and only before the first byte
        connect_timeout=float(os.environ.get("UPSTREAM_CONNECT_TIMEOUT_S") or 5),
        read_timeout=read_timeout,
        tcp_keepalive=True,
        max_pool_connections=int(os.environ.get("UPSTREAM_POOL_CONNECTIONS") or 16),
    )


def _build_invoker() -> frontdoor.Invoker:
    config = frontdoor.InvokeConfig.from_env()
    session = boto3.session.Session()
    runtime = session.client("sagemaker-runtime", config=_runtime_client_config())
    secrets = session.client("secretsmanager", config=Config(retries={"mode": "standard", "max_attempts": 3}))
    key = frontdoor.load_tenant_key(secrets, os.environ.get("TENANT_KEY_SECRET_ARN", ""))
    copies = None
    if config.component_name:  # SageMaker publishes no copy-count metric: sample it once a minute
        control = Config(retries={"mode": "standard", "max_attempts": 2}, connect_timeout=2, read_timeout=5)
        copies = frontdoor.CopyCounts(lambda: session.client("sagemaker", config=control), config.component_name)
    replicas = None
    if config.replication.enabled:
        replicas = frontdoor.Replicas(config, copies=copies, steering=_steering(session, config))
    return frontdoor.Invoker(runtime, config, key, telemetry_sink=frontdoor.Telemetry(config, copies=copies),
                             limiter=_limiter(session, config), replicas=replicas)


def _store_client(session, table: str, timeout_ms: int):
    """A DynamoDB client whose every call is bounded by ``timeout_ms`` (no retries), its connection
    opened now, in the init phase."""
    seconds = timeout_ms / 1000.0
    client = session.client("dynamodb", config=Config(retries={"total_max_attempts": 1}, connect_timeout=seconds,
                                                      read_timeout=seconds, tcp_keepalive=True))
    try:  # TLS now rather than on the first request's path; any answer will do
        client.get_item(TableName=table, Key={"pk": {"S": "connection-warm-up"}})
    except Exception:  # noqa: BLE001 - the first request retries the connection within its own bound
        pass
    return client


def _limiter(session, config: frontdoor.InvokeConfig) -> frontdoor.Limiter | None:
    """Per-tenant limits (``LIMITS``): calls bounded by ``store_timeout_ms``, releases by their own bound."""
    if not config.limits.enabled:
        return None
    admit = _store_client(session, config.limits_table, config.limits.store_timeout_ms)
    release = _store_client(session, config.limits_table, RELEASE_TIMEOUT_MS)
    return frontdoor.Limiter(config.limits,
                             frontdoor.DynamoLimitStore(admit, config.limits_table, release_client=release))


def _steering(session, config: frontdoor.InvokeConfig) -> frontdoor.Steering | None:
    """Replica steering (``REPLICATION_STEERING`` with ``STEERING_TABLE``): the send's calls bounded by
    ``SEND_TIMEOUT_MS``, the answer's by ``ANSWER_TIMEOUT_MS``; None: replicas in turn."""
    if not (config.replication.steering and config.steering_table):
        return None
    table = config.steering_table
    store = frontdoor.DynamoSteeringStore(_store_client(session, table, steering.SEND_TIMEOUT_MS), table,
                                          answer_client=_store_client(session, table, steering.ANSWER_TIMEOUT_MS))
    return frontdoor.Steering(store, config.replication)


def get_invoker() -> frontdoor.Invoker:
    """The execution environment's invoker, built once (clients, configuration, tenant key)."""
    global _INVOKER
    if _INVOKER is None:
        with _LOCK:
            if _INVOKER is None:
                _INVOKER = _build_invoker()
    return _INVOKER


def configure(invoker: frontdoor.Invoker | None) -> None:
    """Use this invoker (tests); ``None`` builds one from the environment on the next request."""
    global _INVOKER
    with _LOCK:
        _INVOKER = invoker


def _configuration_failure(error: Exception) -> frontdoor.Buffered:
    # ConfigurationError messages name the variable, never a secret; other errors by type and code only.
    detail = str(error) if isinstance(error, frontdoor.ConfigurationError) else type(error).__name__
    response = getattr(error, "response", None)
    code = (response.get("Error") or {}).get("Code") if isinstance(response, dict) else None
    print(json.dumps({"message": "prefix_routing.configuration_error", "error": detail, "code": code}), flush=True)
    body = {"error": {"code": "configuration", "message": "the front door is misconfigured", "status": 500}}
    return frontdoor.Buffered(500, dict(frontdoor.JSON_HEADERS), body)


def handle_request(request: frontdoor.FrontRequest) -> frontdoor.Buffered:
    """The buffered answer to one request."""
    try:
        invoker = get_invoker()
    except Exception as error:  # noqa: BLE001 - answered as a 500 and logged
        return _configuration_failure(error)
    return invoker.buffered(request)


def handle_event(event: Any, context: Any = None) -> dict[str, Any]:
    """A direct invocation's result: ``{"statusCode", "headers", "body": <JSON object>}``."""
    request = frontdoor.request_from_event(event, context)
    answer = handle_request(request)
    return {"statusCode": answer.status, "headers": answer.headers, "body": answer.body}


def handler(event: Any, context: Any = None) -> dict[str, Any]:
    """Plain Lambda handler (buffered): Function URL / API Gateway events or direct invocations."""
    request = frontdoor.request_from_event(event, context)
    answer = handle_request(request)
    if request.source == "http":
        return {
            "statusCode": answer.status,
            "headers": answer.headers,
            "body": answer.body_bytes().decode("utf-8"),
            "isBase64Encoded": False,
        }
    return {"statusCode": answer.status, "headers": answer.headers, "body": answer.body}
