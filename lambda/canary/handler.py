"""The isolation canary Lambda's entry point: thin, the logic is in ``prefix_routing.canary``.

Run by an EventBridge schedule (``canary.every_minutes``); the event carries nothing the run needs.
The front door's configuration comes from the environment the stack sets (the same variables as the
front door's, ``InvokeConfig.from_env``), the tenant key from Secrets Manager (``TENANT_KEY_SECRET_ARN``,
read each run: a rotated key is used at the next run), and the clients are made once per execution
environment. Each domain's verdict is one Embedded Metric Format line (``CanaryIsolationBreach``,
``CanaryCacheCold``: CloudWatch takes the metrics from the log, no PutMetricData), then one JSON
summary line.

boto3 and botocore are the asset's own (vendored, pinned as the front door's): ``PrefixAwareId``
is newer than the SDK some runtimes bundle, and the Python runtime puts ``/var/task`` first.
"""

from __future__ import annotations

import json
import os
import time

import boto3
from botocore.config import Config

from prefix_routing.canary import emf_document, run_canary, runtime_invoke
from prefix_routing.frontdoor import InvokeConfig, load_tenant_key

#: Each canary request waits at most a minute for its one output token (SageMaker's own bound is 60 s).
RUNTIME_CONFIG = Config(connect_timeout=5, read_timeout=60, retries={"mode": "standard", "max_attempts": 2})
SECRETS_CONFIG = Config(retries={"mode": "standard", "max_attempts": 3})

_clients: tuple | None = None  # (sagemaker-runtime, secretsmanager), once per execution environment


def _make_clients() -> tuple:
    return (boto3.client("sagemaker-runtime", config=RUNTIME_CONFIG),
            boto3.client("secretsmanager", config=SECRETS_CONFIG))


def handler(event, context) -> dict:
    global _clients
    config = InvokeConfig.from_env(os.environ)  # a missing variable fails the run with its name
    prompt_tokens = int(os.environ["CANARY_PROMPT_TOKENS"])
    salted = os.environ.get("CANARY_SALTED") == "true"
    if _clients is None:
        _clients = _make_clients()
    runtime, secrets = _clients
    key = load_tenant_key(secrets, os.environ["TENANT_KEY_SECRET_ARN"])
    verdicts = run_canary(runtime_invoke(runtime, config.endpoint_name), config, key, prompt_tokens=prompt_tokens,
                          salted=salted)
    now_ms = int(time.time() * 1000)
    for verdict in verdicts:
        print(emf_document(verdict, now_ms), flush=True)
    summary = {
        "isolation_breach": any(v.isolation_breach for v in verdicts),
        "cache_cold": any(v.cache_cold for v in verdicts),
        "salted": salted,
        "verdicts": [v.as_dict() for v in verdicts],
    }
    print(json.dumps({"message": "prefix_routing.canary", **summary}), flush=True)
    return summary
