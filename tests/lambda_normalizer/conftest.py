"""Shared pieces of the normalizer Lambda's tests.

``lambda`` is a Python keyword, so the handler's directory goes on ``sys.path`` and its modules are
imported as ``handler`` and ``server``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAMBDA_DIR = ROOT / "lambda" / "normalizer"
if str(LAMBDA_DIR) not in sys.path:
    sys.path.insert(0, str(LAMBDA_DIR))

# The front door's log-line fixture (its helpers are imported from there by each test module).
from tests.prefix_routing.frontdoor.conftest import lines  # noqa: E402, F401 - a fixture, found by name


SECRET_ARN = "arn:aws:secretsmanager:us-east-1:111122223333:secret:TenantKey-AbCdEf"


def environment_with_a_stubbed_secret(monkeypatch, env: dict) -> list:
    """Set the function's environment and make every Secrets Manager client a Stubber that answers
    ``get_secret_value`` for :data:`SECRET_ARN` once (the cold-start path); returns the stubs."""
    import boto3
    from botocore.stub import Stubber

    base = {"ENDPOINT_NAME": "ep", "INFERENCE_COMPONENT_NAME": "ic", "TENANT_KEY_SECRET_ARN": SECRET_ARN,
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t"}
    for name, value in {**base, **env}.items():
        monkeypatch.setenv(name, value)
    real_client = boto3.session.Session.client
    stubs = []

    def client(self, service, **kwargs):
        made = real_client(self, service, **kwargs)
        if service == "secretsmanager":
            stub = Stubber(made)
            stub.add_response("get_secret_value", {"SecretString": "s" * 48}, {"SecretId": SECRET_ARN})
            stub.activate()
            stubs.append(stub)
        return made

    monkeypatch.setattr(boto3.session.Session, "client", client)
    return stubs
