"""Hot-prefix replication through the handler, against botocore's Stubber: the exact ``PrefixAwareId``
of each request (the tenant's, then ``<id>-r1``, ``-r2``, ... in turn), the log line and the metrics.

Replica sequences by hand (``prefix_routing/rules/replication.py``): n requests of one prefix alone
have the share n / 32 (at least 32 requests' worth of evidence), k = min(max_replicas,
ceil(share × copies ÷ target_share_factor)); the replicas are used in turn, replica 0 being the
tenant's own id.
"""

from __future__ import annotations

import handler as lambda_handler
import pytest

from prefix_routing import frontdoor
from prefix_routing.rules import telemetry
from prefix_routing.rules.replication import ReplicationSettings
from tests.lambda_normalizer.conftest import environment_with_a_stubbed_secret
from tests.lambda_normalizer.test_handler_stubber import StubbedRuntime, expected_params, parts
from tests.prefix_routing.frontdoor.conftest import KEY, config, sse_chunks, url_event


def _config(enabled: bool = True, factor: float = 0.1, **overrides) -> frontdoor.InvokeConfig:
    replication = ReplicationSettings(enabled=enabled, max_replicas=4, target_share_factor=factor,
                                      min_requests=1.0)  # replicated from the first request: k by hand
    return config(replication=replication, copies_min=4, copies_max=4, **overrides)


@pytest.fixture
def runtime():
    stubbed = StubbedRuntime()
    yield stubbed
    stubbed.stubber.deactivate()


def _with_id(prefix_aware_id: str) -> dict:
    return dict(expected_params(), PrefixAwareId=prefix_aware_id)


def test_a_hot_prefix_is_sent_to_its_replicas_in_turn(runtime, lines):
    tenant_id = expected_params()["PrefixAwareId"]
    # 4 copies, factor 0.1: k = 2, 3, 4, 4, 4, 4 and j = 0, 1, 2, 3, 0, 1.
    expected_ids = [tenant_id, f"{tenant_id}-r1", f"{tenant_id}-r2", f"{tenant_id}-r3", tenant_id, f"{tenant_id}-r1"]
    for prefix_aware_id in expected_ids:
        runtime.answer(_with_id(prefix_aware_id), parts(sse_chunks()))
    lambda_handler.configure(frontdoor.Invoker(runtime.client, _config(), KEY, emit=lines))
    try:
        for _ in expected_ids:
            assert lambda_handler.handler(url_event(), None)["statusCode"] == 200
    finally:
        lambda_handler.configure(None)
    runtime.stubber.assert_no_pending_responses()  # Stubber checked each PrefixAwareId, in order
    assert [(log["replica"], log["replicas"]) for log in lines.requests] == [(0, 2), (1, 3), (2, 4), (3, 4),
                                                                             (0, 4), (1, 4)]
    assert [doc[telemetry.REPLICATED_REQUESTS.name] for doc in lines.emf] == [0, 1, 1, 1, 0, 1]
    assert all(doc[telemetry.HOT_PREFIXES.name] == 1 for doc in lines.emf)


def test_replication_off_always_sends_the_tenants_id(runtime, lines):
    for _ in range(4):
        runtime.answer(expected_params(), parts(sse_chunks()))
    invoker = frontdoor.Invoker(runtime.client, _config(enabled=False), KEY, emit=lines)
    for _ in range(4):
        assert invoker.buffered(frontdoor.request_from_event(url_event())).status == 200
    runtime.stubber.assert_no_pending_responses()
    assert not any("replica" in log for log in lines.requests)
    assert not any(telemetry.REPLICATED_REQUESTS.name in doc for doc in lines.emf)


def test_a_direct_invocation_of_a_cold_prefix_keeps_the_tenants_id(runtime, lines):
    # Factor 2 on 4 copies: one request of a prefix is 1/32 × 2 fair shares: not hot.
    runtime.answer(expected_params(tenant="acme"), parts(sse_chunks()))
    lambda_handler.configure(frontdoor.Invoker(runtime.client, _config(factor=2.0, allow_direct_invoke=True), KEY,
                                               emit=lines))
    try:
        result = lambda_handler.handler({"body": {"model": "m", "messages": [
            {"role": "system", "content": "You are a terse assistant for invoices."},
            {"role": "user", "content": "alpha beta gamma delta"}]}, "tenant": "acme"}, None)
    finally:
        lambda_handler.configure(None)
    assert result["statusCode"] == 200
    runtime.stubber.assert_no_pending_responses()
    (log,) = lines.requests
    assert (log["replica"], log["replicas"]) == (0, 1)


def test_the_environment_turns_replication_on_and_ties_it_to_the_copy_readings(monkeypatch):
    environment_with_a_stubbed_secret(monkeypatch, {"REPLICATION_ENABLED": "true",
                                                    "REPLICATION_TARGET_SHARE_FACTOR": "1.5", "COPIES_MIN": "2",
                                                    "COPIES_MAX": "6"})
    lambda_handler.configure(None)
    try:
        built = lambda_handler.get_invoker()
        assert built.config.replication.enabled and built.config.replication.target_share_factor == 1.5
        assert isinstance(built.replicas, frontdoor.Replicas)
        assert built.replicas.copies() == 2  # copies_min until the first DescribeInferenceComponent reading
        built.telemetry.copies.current = 5
        assert built.replicas.copies() == 5
    finally:
        lambda_handler.configure(None)


def test_with_steering_and_its_table_the_handler_builds_bounded_store_clients(monkeypatch, local_dynamo):
    environment_with_a_stubbed_secret(monkeypatch, {"REPLICATION_ENABLED": "true", "STEERING_TABLE": "front-door",
                                                    "AWS_ENDPOINT_URL_DYNAMODB": local_dynamo.url})
    lambda_handler.configure(None)
    try:
        built = lambda_handler.get_invoker()
        store = built.replicas.steering.store
        assert isinstance(store, frontdoor.DynamoSteeringStore) and store.table == "front-door"
        send, answer = store.client.meta.config, store.answer_client.meta.config
        assert (send.connect_timeout, send.read_timeout, send.retries["total_max_attempts"]) == (0.05, 0.05, 1)
        assert (answer.connect_timeout, answer.read_timeout, answer.retries["total_max_attempts"]) == (1.0, 1.0, 1)
        assert built.limiter is None  # steering alone needs no limits
    finally:
        lambda_handler.configure(None)
    for unset in ({"STEERING_TABLE": ""}, {"REPLICATION_STEERING": "false"}):
        for name, value in unset.items():
            monkeypatch.setenv(name, value)
        lambda_handler.configure(None)
        try:
            assert lambda_handler.get_invoker().replicas.steering is None  # replicas in turn, no store
        finally:
            lambda_handler.configure(None)
