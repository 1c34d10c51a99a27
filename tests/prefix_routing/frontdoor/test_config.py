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


def test_replication_and_copy_bounds_from_env():
    from prefix_routing.rules.replication import ReplicationSettings

    cfg = frontdoor.InvokeConfig.from_env({"ENDPOINT_NAME": "ep"})
    assert cfg.replication == ReplicationSettings() and cfg.replication.enabled is False  # absent: off
    assert (cfg.copies_min, cfg.copies_max) == (1, None)
    cfg = frontdoor.InvokeConfig.from_env({
        "ENDPOINT_NAME": "ep", "REPLICATION_ENABLED": "true", "REPLICATION_MAX_REPLICAS": "8",
        "REPLICATION_TARGET_SHARE_FACTOR": "1.5", "REPLICATION_HALF_LIFE_S": "30.0", "COPIES_MIN": "2",
        "COPIES_MAX": "6", "REPLICATION_MIN_REQUESTS": "3",
    })
    assert cfg.replication == ReplicationSettings(enabled=True, max_replicas=8, target_share_factor=1.5,
                                                  half_life_s=30.0, min_requests=3.0)
    assert (cfg.copies_min, cfg.copies_max) == (2, 6)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"REPLICATION_ENABLED": "on"}, "REPLICATION_ENABLED: 'on' is not true or false"),
        ({"REPLICATION_MAX_REPLICAS": "0"}, "REPLICATION_MAX_REPLICAS: replication.max_replicas: got number 0"),
        ({"REPLICATION_MAX_REPLICAS": "2.5"}, "REPLICATION_MAX_REPLICAS: '2.5' is not a number"),
        ({"REPLICATION_TARGET_SHARE_FACTOR": "0.001"}, "REPLICATION_TARGET_SHARE_FACTOR: replication.target_share_factor"),
        ({"REPLICATION_TARGET_SHARE_FACTOR": "nan"}, "REPLICATION_TARGET_SHARE_FACTOR: replication.target_share_factor"),
        ({"REPLICATION_HALF_LIFE_S": "0"}, "REPLICATION_HALF_LIFE_S: replication.half_life_s"),
        ({"REPLICATION_MIN_REQUESTS": "0.5"}, "REPLICATION_MIN_REQUESTS: replication.min_requests: got number 0.5"),
        ({"COPIES_MIN": "-1"}, "COPIES_MIN"),
        ({"COPIES_MIN": "3", "COPIES_MAX": "2"}, "COPIES_MAX"),
        ({"COPIES_MAX": "many"}, "COPIES_MAX"),
    ],
)
def test_replication_config_errors_name_the_variable(env, named):
    with pytest.raises(frontdoor.ConfigurationError, match=named):
        frontdoor.InvokeConfig.from_env({"ENDPOINT_NAME": "ep", **env})
