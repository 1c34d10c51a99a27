"""The canary Lambda's handler with stubbed AWS clients (botocore Stubber): the tenant key from its
secret, three requests per domain with the front door's ids, one EMF line per domain, one summary."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber

from prefix_routing.frontdoor import ConfigurationError
from prefix_routing.rules.domains import TrustDomains
from prefix_routing.rules.telemetry import NAMESPACE

HANDLER = Path(__file__).resolve().parents[2] / "lambda" / "canary" / "handler.py"
SECRET = "arn:aws:secretsmanager:us-east-1:111122223333:secret:tenant-key-AbCdEf"
DOMAINS = TrustDomains(components=(("shared", "ep-shared-ic"), ("acme", "ep-acme-ic")), default="shared")
ENV = {"ENDPOINT_NAME": "ep", "INFERENCE_COMPONENT_NAME": "ep-shared-ic", "ROUTING_STRATEGY": "PREFIX_AWARE",
       "PREFIX_LENGTH": "8192", "TENANCY": "iam", "DOMAINS": DOMAINS.to_json(), "TENANT_KEY_SECRET_ARN": SECRET,
       "CANARY_PROMPT_TOKENS": "300", "CANARY_SALTED": "false"}


@pytest.fixture
def handler_module():
    # Loaded under its own name: the other functions' handlers are also modules called "handler".
    spec = importlib.util.spec_from_file_location("canary_handler", HANDLER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _answer(prompt: int, cached: int) -> dict:
    payload = json.dumps({"choices": [{"message": {"content": "ok"}}], "usage": {
        "prompt_tokens": prompt, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": cached}}}).encode()
    return {"Body": StreamingBody(io.BytesIO(payload), len(payload)), "ContentType": "application/json"}


def _clients(answers: list[tuple[str, int, int]], *, runs: int = 1):
    session = boto3.session.Session(region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    runtime = session.client("sagemaker-runtime")
    secrets = session.client("secretsmanager")
    secret_stub, runtime_stub = Stubber(secrets), Stubber(runtime)
    for _ in range(runs):  # the key is read each run (a rotated key is used at the next)
        secret_stub.add_response("get_secret_value", {"SecretString": "k" * 64}, {"SecretId": SECRET})
    for component, prompt, cached in answers:
        runtime_stub.add_response("invoke_endpoint", _answer(prompt, cached), {
            "EndpointName": "ep", "InferenceComponentName": component, "PrefixAwareId": ANY,
            "ContentType": "application/json", "Accept": "application/json", "Body": ANY})
    secret_stub.activate()
    runtime_stub.activate()
    return (runtime, secrets), (secret_stub, runtime_stub)


def test_a_run_prints_one_emf_line_per_domain_and_a_summary(handler_module, monkeypatch, capsys):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    # No salts (LMI): each domain's second tenant is the next domain's, on that domain's copies.
    clients, stubs = _clients([("ep-shared-ic", 300, 0), ("ep-shared-ic", 300, 288), ("ep-acme-ic", 300, 16),
                               ("ep-acme-ic", 300, 0), ("ep-acme-ic", 300, 20), ("ep-shared-ic", 300, 280)])
    monkeypatch.setattr(handler_module, "_make_clients", lambda: clients)
    summary = handler_module.handler({"source": "aws.events"}, None)
    for stub in stubs:
        stub.assert_no_pending_responses()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    emf, (last,) = lines[:-1], lines[-1:]
    assert [(d["InferenceComponent"], d["CanaryIsolationBreach"], d["CanaryCacheCold"]) for d in emf] == [
        ("ep-shared-ic", 0, 0),  # its repeat 288 of 300 cached; acme's tenant found 16 (the template's)
        ("ep-acme-ic", 1, 1),  # its repeat 20 of 300: cold; shared's tenant found 280 of acme's prompt
    ]
    for document in emf:
        (directive,) = document["_aws"]["CloudWatchMetrics"]
        assert directive["Namespace"] == NAMESPACE and directive["Dimensions"] == [["InferenceComponent"]]
        assert [m["Name"] for m in directive["Metrics"]] == ["CanaryIsolationBreach", "CanaryCacheCold"]
    assert last["message"] == "prefix_routing.canary" and last["isolation_breach"] is True
    assert summary["cache_cold"] is True and summary["salted"] is False
    assert [v["domain"] for v in summary["verdicts"]] == ["shared", "acme"]
    assert "k" * 16 not in json.dumps(lines)  # the key is never logged


def test_with_salts_the_second_tenant_shares_the_domain(handler_module, monkeypatch, capsys):
    for name, value in {**ENV, "CANARY_SALTED": "true"}.items():
        monkeypatch.setenv(name, value)
    clients, stubs = _clients([("ep-shared-ic", 300, 0), ("ep-shared-ic", 300, 290), ("ep-shared-ic", 300, 16),
                               ("ep-acme-ic", 300, 0), ("ep-acme-ic", 300, 290), ("ep-acme-ic", 300, 16)])
    monkeypatch.setattr(handler_module, "_make_clients", lambda: clients)
    summary = handler_module.handler({}, None)
    for stub in stubs:
        stub.assert_no_pending_responses()
    assert not summary["isolation_breach"] and not summary["cache_cold"]
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines()][:-1]
    assert [(d["CanaryIsolationBreach"], d["CanaryCacheCold"]) for d in emf] == [(0, 0), (0, 0)]


def test_the_clients_are_made_once_per_execution_environment(handler_module, monkeypatch):
    for name, value in {**ENV, "DOMAINS": ""}.items():
        monkeypatch.setenv(name, value)
    made = []

    def make():
        clients, stubs = _clients([("ep-shared-ic", 300, 0), ("ep-shared-ic", 300, 290), ("ep-shared-ic", 300, 0)] * 2,
                                  runs=2)
        made.append(stubs)
        return clients

    monkeypatch.setattr(handler_module, "_make_clients", make)
    handler_module.handler({}, None)
    handler_module.handler({}, None)
    for stub in made[0]:
        stub.assert_no_pending_responses()
    assert len(made) == 1


def test_the_runtime_client_bounds_each_request(handler_module):
    config = handler_module.RUNTIME_CONFIG
    assert (config.connect_timeout, config.read_timeout) == (5, 60)
    assert config.retries == {"mode": "standard", "max_attempts": 2}


def test_a_missing_variable_fails_the_run_with_its_name(handler_module, monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("ENDPOINT_NAME")
    with pytest.raises(ConfigurationError, match="ENDPOINT_NAME"):
        handler_module.handler({}, None)
