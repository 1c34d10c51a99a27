"""The front door on 127.0.0.1, called as its Function URL is called (``emulate --front-door PORT``).

In Lambda, the Function URL checks the caller's SigV4 signature and the Lambda Web Adapter hands the
web app the caller's identity in the ``x-amzn-request-context`` header, overwriting any value the
client sent. :class:`LocalFunctionUrlHandler` stands in for both in front of the same web app
(:mod:`prefix_routing.frontdoor.webapp`) and the same invoker, with the stage's tenancy:

- a request signed with SigV4 (``Authorization: AWS4-HMAC-SHA256 Credential=<key id>/...``) is a
  Function URL request from the IAM user ``arn:aws:iam::000000000000:user/<key id>``: each access
  key id is a tenant. The signature itself is not checked (no secret is known here); a request
  without one is refused 403 ``{"Message": "Forbidden"}``, as the Function URL refuses it;
- ``POST /events`` with ``x-amzn-request-context: null`` and no signature is a direct invocation, as
  the adapter forwards one: the body is the event. Under the ``iam`` tenancy it is refused (403)
  unless the stage sets ``normalizer.allow_direct_invoke``.

The tenant key is :data:`LOCAL_TENANT_KEY` (fixed, so that routing ids stay the same from run to
run; not a secret). Metrics and the log line go to standard output (or ``emit``), as in Lambda.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

from prefix_routing.frontdoor.config import InvokeConfig
from prefix_routing.frontdoor.invoker import Invoker
from prefix_routing.frontdoor.limiter import KEY, DynamoLimitStore, Limiter
from prefix_routing.frontdoor.record import Telemetry
from prefix_routing.frontdoor.replicas import Replicas
from prefix_routing.frontdoor.steering_store import ANSWER_TIMEOUT_MS, SEND_TIMEOUT_MS, DynamoSteeringStore, Steering
from prefix_routing.rules.limits import RELEASE_TIMEOUT_MS
from prefix_routing.frontdoor.webapp import (
    LAMBDA_CONTEXT_HEADER,
    REQUEST_CONTEXT_HEADER,
    FrontDoorHandler,
    FrontDoorServer,
    make_server,
)

#: The limits' store timeout on this machine, unless the stage sets one: dynalite (a Node.js server)
#: on a loaded 2-core machine answered slower than the stage's 50 ms default for 30 of 49 admissions,
#: which were then served unchecked; DynamoDB in Lambda answers in a few milliseconds.
LOCAL_STORE_TIMEOUT_MS: Final = 1000
#: The local front door's tenant key (not a secret: it salts local routing ids only).
LOCAL_TENANT_KEY: Final = b"prefix-routing-local-front-door-key"
LOCAL_ACCOUNT: Final = "000000000000"
DIRECT_PATH: Final = "/events"
_CREDENTIAL = re.compile(r"^AWS4-HMAC-SHA256\s+Credential=([A-Za-z0-9+=,.@_-]{1,64})/")


def caller_arn(authorization: str | None) -> str | None:
    """The local identity of a SigV4 ``Authorization`` header: the IAM user named by its access key id."""
    match = _CREDENTIAL.match(authorization or "")
    return f"arn:aws:iam::{LOCAL_ACCOUNT}:user/{match.group(1)}" if match else None


def request_context(user_arn: str, method: str, path: str, source_ip: str) -> dict[str, Any]:
    """A Function URL request context with IAM auth, as the adapter passes it on."""
    caller = "AIDALOCAL" + user_arn.rsplit("/", 1)[-1]
    request_id = str(uuid.uuid4())
    return {
        "accountId": LOCAL_ACCOUNT,
        "apiId": "local",
        "authorizer": {"iam": {"accessKey": user_arn.rsplit("/", 1)[-1], "accountId": LOCAL_ACCOUNT,
                               "callerId": caller, "userArn": user_arn, "userId": caller}},
        "domainName": "127.0.0.1",
        "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": source_ip},
        "requestId": request_id,
    }


class LocalFunctionUrlHandler(FrontDoorHandler):
    """The web app behind a stand-in for the Function URL's IAM auth and the adapter's headers."""

    #: Seconds a socket may stall (a request line or body that does not come, a client that stops
    #: reading): the thread is freed. (In Lambda the adapter is the only client; the app sets none.)
    timeout = 60

    def _front(self) -> None:
        path = self.path.split("?", 1)[0]
        direct = (path == DIRECT_PATH and "authorization" not in self.headers
                  and (self.headers.get(REQUEST_CONTEXT_HEADER) or "").strip() == "null")
        user_arn = caller_arn(self.headers.get("authorization"))
        for name in (REQUEST_CONTEXT_HEADER, LAMBDA_CONTEXT_HEADER):
            del self.headers[name]  # the adapter overwrites whatever the client sent
        if direct:
            self.headers[REQUEST_CONTEXT_HEADER] = "null"
        elif user_arn is None:
            self.close_connection = True  # the body is not read
            self._send_whole(403, {"content-type": "application/json"}, b'{"Message":"Forbidden"}')
            return
        else:
            context = request_context(user_arn, self.command, path, self.client_address[0])
            self.headers[REQUEST_CONTEXT_HEADER] = json.dumps(context)
        self.headers[LAMBDA_CONTEXT_HEADER] = json.dumps({"request_id": str(uuid.uuid4())})
        super()._front()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _front  # noqa: N815

    def do_GET(self) -> None:  # noqa: N802 - the Function URL has no health path of its own
        self._front()


def local_runtime_client(runtime_url: str, config: InvokeConfig) -> Any:
    """A ``sagemaker-runtime`` client for the emulator at ``runtime_url`` (local credentials, no retries:
    the invoker retries, before the first byte only)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "sagemaker-runtime", endpoint_url=runtime_url, region_name="us-east-1",
        aws_access_key_id="local", aws_secret_access_key="local",
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=5,
                      read_timeout=min(65.0, config.request_timeout_s), tcp_keepalive=True, max_pool_connections=64),
    )


#: The table of the local front door's limits (in the local store: dynalite).
LOCAL_LIMITS_TABLE: Final = "prefix-routing-limits"


def limits_client(store_url: str, timeout_ms: int) -> Any:
    """A ``dynamodb`` client for the store at ``store_url`` with the limits' own bounded timeouts."""
    import boto3
    from botocore.config import Config

    seconds = timeout_ms / 1000.0
    return boto3.session.Session().client(
        "dynamodb", endpoint_url=store_url, region_name="us-east-1",
        aws_access_key_id="local", aws_secret_access_key="local",
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=seconds, read_timeout=seconds,
                      tcp_keepalive=True, max_pool_connections=64),
    )


def create_limits_table(client: Any, table: str) -> None:
    """The table as the Normalizer stack makes it (key ``pk``, on demand); nothing if it exists."""
    try:
        client.create_table(TableName=table, KeySchema=[{"AttributeName": KEY, "KeyType": "HASH"}],
                            AttributeDefinitions=[{"AttributeName": KEY, "AttributeType": "S"}],
                            BillingMode="PAY_PER_REQUEST")
    except client.exceptions.ResourceInUseException:
        pass


def with_store_timeout(environment: Mapping[str, str], store_timeout_ms: int | None) -> dict[str, str]:
    """The front door's environment with its limits' store timeout (``LIMITS``) set to ``store_timeout_ms``
    (None: as it is)."""
    environment = dict(environment)
    if store_timeout_ms is not None and environment.get("LIMITS"):
        limits = {**json.loads(environment["LIMITS"]), "store_timeout_ms": store_timeout_ms}
        environment["LIMITS"] = json.dumps(limits, separators=(",", ":"), sort_keys=True)
    return environment


class LocalFrontDoor:
    """The front door's web app serving on ``127.0.0.1:port`` in a thread; ``url``, ``invoker``, ``stop()``.

    With per-tenant limits in ``environment`` (``LIMITS``), ``limits_store_url`` is the DynamoDB-compatible
    store (``prefix_routing.emulator.local_store.LocalDynamo``) that holds their counts; with replication
    and its steering on, the same store holds the hot prefixes' states (in the same table, as in the
    stack). Without a store, replicas are used in turn.
    """

    def __init__(self, runtime_url: str, environment: Mapping[str, str], *, port: int = 0,
                 key: bytes = LOCAL_TENANT_KEY, emit: Callable[[str], None] | None = None,
                 limits_store_url: str | None = None, store_timeout_ms: int | None = None) -> None:
        """``store_timeout_ms``: the limits' store timeout instead of the environment's (the stage's)."""
        environment = with_store_timeout(environment, store_timeout_ms)
        if environment.get("LIMITS"):
            environment.setdefault("LIMITS_TABLE", LOCAL_LIMITS_TABLE)
        if limits_store_url is not None:
            environment.setdefault("STEERING_TABLE", LOCAL_LIMITS_TABLE)
        config = InvokeConfig.from_env(environment)
        limiter = None
        if config.limits.enabled:
            if limits_store_url is None:
                raise ValueError("the stage sets per-tenant limits: give limits_store_url (a local DynamoDB store)")
            # Creating the table is no request's business: it gets a generous timeout of its own.
            create_limits_table(limits_client(limits_store_url, 5000), config.limits_table)
            store = DynamoLimitStore(limits_client(limits_store_url, config.limits.store_timeout_ms), config.limits_table,
                                     release_client=limits_client(limits_store_url, RELEASE_TIMEOUT_MS))
            limiter = Limiter(config.limits, store)
        replicas = None
        if config.replication.enabled and config.replication.steering and limits_store_url is not None:
            create_limits_table(limits_client(limits_store_url, 5000), config.steering_table)
            store = DynamoSteeringStore(limits_client(limits_store_url, SEND_TIMEOUT_MS), config.steering_table,
                                        answer_client=limits_client(limits_store_url, ANSWER_TIMEOUT_MS))
            replicas = Replicas(config, steering=Steering(store, config.replication))
        self.invoker = Invoker(local_runtime_client(runtime_url, config), config, key,
                               telemetry_sink=Telemetry(config, emit), limiter=limiter, replicas=replicas)
        self.server: FrontDoorServer = make_server("127.0.0.1", port, lambda: self.invoker,
                                                   handler_class=LocalFunctionUrlHandler)
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="local-front-door", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    def __enter__(self) -> LocalFrontDoor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
