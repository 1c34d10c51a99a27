"""The front door's configuration from the environment, and the tenant key (prefix_routing.frontdoor.config)."""

from __future__ import annotations

import json
import boto3
import pytest
from botocore.stub import Stubber
from prefix_routing import frontdoor
from prefix_routing.rules.settings import NormalizerSettings


def test_config_from_env_defaults_and_values():
    cfg = frontdoor.InvokeConfig.from_env({"ENDPOINT_NAME": "ep", "INFERENCE_COMPONENT_NAME": "ic", "PREFIX_LENGTH": "0",
                                        "BLOCK_BYTES": "1024", "TENANCY": "header", "TENANT_HEADER": "X-Tenant"})
    assert (cfg.endpoint_name, cfg.component_name, cfg.tenancy, cfg.tenant_header) == ("ep", "ic", "header", "x-tenant")
    assert cfg.settings.prefix_length == NormalizerSettings().prefix_length  # 0: not PREFIX_AWARE, default
    assert cfg.settings.block_bytes == 1024
    assert cfg.stream_usage is True and cfg.max_attempts == 3
    cfg = frontdoor.InvokeConfig.from_env({
        "ENDPOINT_NAME": "ep", "PREFIX_LENGTH": "8192", "STREAM_USAGE": "false", "UPSTREAM_MAX_ATTEMPTS": "5",
        "NORMALIZER_SETTINGS": json.dumps({"freeze_rules": [{"name": "date", "pattern": r"\d{4}-\d{2}-\d{2}"}]}),
    })
    assert cfg.settings.prefix_length == 8192 and cfg.settings.freeze_rules[0].name == "date"
    assert cfg.component_name is None and cfg.metric_component == "ep"
    assert cfg.stream_usage is False and cfg.max_attempts == 5


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({}, "ENDPOINT_NAME"),
        ({"ENDPOINT_NAME": "ep", "TENANCY": "cookie"}, "TENANCY"),
        ({"ENDPOINT_NAME": "ep", "PREFIX_LENGTH": "lots"}, "PREFIX_LENGTH"),
        ({"ENDPOINT_NAME": "ep", "PREFIX_LENGTH": "100"}, "prefix_length"),
        ({"ENDPOINT_NAME": "ep", "NORMALIZER_SETTINGS": "{"}, "NORMALIZER_SETTINGS"),
        ({"ENDPOINT_NAME": "ep", "NORMALIZER_SETTINGS": "[]"}, "NORMALIZER_SETTINGS"),
        ({"ENDPOINT_NAME": "ep", "UPSTREAM_MAX_ATTEMPTS": "0"}, "UPSTREAM_MAX_ATTEMPTS"),
        ({"ENDPOINT_NAME": "ep", "STREAM_USAGE": "maybe"}, "STREAM_USAGE"),
        ({"ENDPOINT_NAME": "ep", "TENANCY": "header", "TENANT_HEADER": ""}, "TENANT_HEADER"),
    ],
)
def test_config_errors_name_the_variable(env, named):
    with pytest.raises(frontdoor.ConfigurationError, match=named):
        frontdoor.InvokeConfig.from_env(env)


def test_tenant_key_from_secrets_manager_exact_call():
    client = boto3.client("secretsmanager", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t")
    arn = "arn:aws:secretsmanager:us-east-1:111122223333:secret:TenantKey-AbCdEf"
    with Stubber(client) as stub:
        stub.add_response("get_secret_value", {"SecretString": "k" * 64}, {"SecretId": arn})
        assert frontdoor.load_tenant_key(client, arn) == b"k" * 64
        stub.add_response("get_secret_value", {"SecretString": "short"}, {"SecretId": arn})
        with pytest.raises(frontdoor.ConfigurationError) as caught:
            frontdoor.load_tenant_key(client, arn)
        assert "short" not in str(caught.value)  # the value never appears in a message
        stub.assert_no_pending_responses()
    with pytest.raises(frontdoor.ConfigurationError, match="TENANT_KEY_SECRET_ARN"):
        frontdoor.load_tenant_key(client, "")
