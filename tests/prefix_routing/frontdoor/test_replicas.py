"""Hot-prefix replication at the front door (prefix_routing.frontdoor.replicas and the invoker's use of it).

The expected replica sequences are worked out by hand from the rule in
``prefix_routing/rules/replication.py``: with n requests of one prefix and nothing else, its share
is n / 32 (shares count against at least 32 requests) until n reaches 32, and
k = min(max_replicas, ceil(share × copies ÷ target_share_factor)); replicas are used in turn (a
counter of the requests that had k > 1), replica 0 keeping the tenant's own id.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import Counter

import pytest

from prefix_routing import frontdoor
from prefix_routing.rules import telemetry
from prefix_routing.rules.identity import routing_identity
from prefix_routing.rules.replication import ReplicationSettings
from tests.prefix_routing.frontdoor.conftest import CHAT, KEY, ROLE_TENANT, FakeRuntime, config, url_event

R = telemetry.ReplicaLogField
TENANT_ID = routing_identity(ROLE_TENANT, None, KEY).prefix_aware_id
OTHER_ARN = "arn:aws:sts::111122223333:assumed-role/OtherApp/session-9"
OTHER_ID = routing_identity("arn:aws:iam::111122223333:role/OtherApp", None, KEY).prefix_aware_id
OTHER_BODY = json.dumps(dict(CHAT, messages=[{"role": "user", "content": "a different prefix altogether"}])).encode()


def replicating(factor: float = 0.1, *, enabled: bool = True, copies_min: int = 4, copies_max: int | None = 4,
                **overrides) -> frontdoor.InvokeConfig:
    settings = ReplicationSettings(enabled=enabled, max_replicas=4, target_share_factor=factor, half_life_s=60.0,
                                   min_requests=1.0)  # replicated from the first request: k by hand
    return config(replication=settings, copies_min=copies_min, copies_max=copies_max, **overrides)


def invoker_for(cfg, lines, runtime=None, clock=lambda: 0.0, copies=None) -> tuple[frontdoor.Invoker, FakeRuntime]:
    runtime = runtime or FakeRuntime()
    replicas = frontdoor.Replicas(cfg, copies=copies, clock=clock)  # a fixed clock: no decay, exact shares
    return frontdoor.Invoker(runtime, cfg, KEY, emit=lines, replicas=replicas), runtime


def sent_ids(runtime: FakeRuntime) -> list[str]:
    return [call["PrefixAwareId"] for call in runtime.calls]


def send(invoker, times: int = 1, **event) -> None:
    for _ in range(times):
        assert invoker.buffered(frontdoor.request_from_event(url_event(**event))).status == 200


def test_a_hot_prefix_goes_to_its_replicas_in_turn(lines):
    # 4 copies, factor 0.1: request n has k = ceil(n/32 × 4 / 0.1) = ceil(1.25 n), capped at 4:
    # k = 2, 3, 4, 4, ...; turns 0, 1, 2, 3, ... → j = 0, 1, 2, 3, 0, 1, 2, 3.
    invoker, runtime = invoker_for(replicating(0.1), lines)
    send(invoker, 8)
    assert sent_ids(runtime) == [TENANT_ID, f"{TENANT_ID}-r1", f"{TENANT_ID}-r2", f"{TENANT_ID}-r3"] * 2
    logs = lines.requests
    assert [(log[R.REPLICA], log[R.REPLICAS]) for log in logs] == [(0, 2), (1, 3), (2, 4), (3, 4),
                                                                   (0, 4), (1, 4), (2, 4), (3, 4)]
    assert all(log["prefix_aware_id"] == TENANT_ID for log in logs)  # the tenant's id; the replica beside it
    assert [doc[telemetry.REPLICATED_REQUESTS.name] for doc in lines.emf] == [0, 1, 1, 1, 0, 1, 1, 1]
    assert [doc[telemetry.HOT_PREFIXES.name] for doc in lines.emf] == [1] * 8


def test_a_cold_prefix_keeps_the_tenants_id_beside_a_hot_one(lines):
    # Factor 2 on 4 copies: hot above a share of 1/2. Prefix A: n/32 × 2 > 1 from n = 17 on, then
    # k = 2 (20/32 × 2 = 1.25); prefix B after them: 1/32 × 2: k = 1.
    invoker, runtime = invoker_for(replicating(2.0), lines)
    send(invoker, 20)
    send(invoker, body=OTHER_BODY)
    ids = sent_ids(runtime)
    assert ids[:16] == [TENANT_ID] * 16 and ids[16:20] == [TENANT_ID, f"{TENANT_ID}-r1"] * 2
    assert ids[20] == TENANT_ID
    cold = lines.requests[20]
    assert (cold[R.REPLICA], cold[R.REPLICAS]) == (0, 1) and cold["prefix_fingerprint"] != lines.requests[0][
        "prefix_fingerprint"]
    assert lines.emf[20][telemetry.REPLICATED_REQUESTS.name] == 0 and lines.emf[20][telemetry.HOT_PREFIXES.name] == 1
    assert [doc[telemetry.HOT_PREFIXES.name] for doc in lines.emf[:16]] == [0] * 16


LMI_BODY = json.dumps({"inputs": "Translate: bonjour", "parameters": {"max_new_tokens": 8}}).encode()


@pytest.mark.parametrize("body", [json.dumps(CHAT).encode(), LMI_BODY], ids=["chat", "lmi"])
def test_each_tenant_counts_apart_even_with_the_same_body(lines, body):
    # Two tenants, the same body, 12 requests each, interleaved: each (id, fingerprint) has 12/32 of
    # the recent requests, 12/32 × 2 = 0.75 fair shares: never hot. Counted together (24/32 × 2 =
    # 1.5) they would be.
    invoker, runtime = invoker_for(replicating(2.0), lines)
    for _ in range(12):
        send(invoker, body=body)
        send(invoker, body=body, user_arn=OTHER_ARN)
    assert sent_ids(runtime) == [TENANT_ID, OTHER_ID] * 12
    assert {log[R.REPLICAS] for log in lines.requests} == {1}
    fingerprints = {log["tenant"]: log["prefix_fingerprint"] for log in lines.requests}
    # Chat bodies carry the tenant's cache_salt, so their fingerprints differ anyway; LMI bodies have
    # no salt: the same fingerprint for both tenants, kept apart only by the PrefixAwareId.
    assert (len(set(fingerprints.values())) == 1) == (body == LMI_BODY)


def test_two_prefixes_of_one_tenant_count_apart(lines):
    # Prefix A and B of one tenant, 12 each, interleaved: neither is hot (as above).
    invoker, runtime = invoker_for(replicating(2.0), lines)
    for _ in range(12):
        send(invoker)
        send(invoker, body=OTHER_BODY)
    assert set(sent_ids(runtime)) == {TENANT_ID}


def test_replication_off_sends_the_tenants_id_and_writes_what_it_wrote_before(lines):
    off, runtime = invoker_for(replicating(0.1, enabled=False), lines)
    send(off, 8)
    assert sent_ids(runtime) == [TENANT_ID] * 8 and off.replicas is None
    plain = type(lines)()
    send(frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=plain), 1)
    first = lines.requests[0]
    assert not {R.REPLICA, R.REPLICAS} & set(first)
    assert set(first) == set(plain.requests[0])  # the same fields as a configuration without replication
    for doc in lines.emf:
        names = {m["Name"] for m in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
        assert not names & {spec.name for spec in telemetry.REPLICATION_METRICS}


def test_the_default_invoker_builds_its_tracker_only_when_enabled(lines):
    runtime = FakeRuntime()
    on = frontdoor.Invoker(runtime, replicating(0.1), KEY, emit=lines)
    assert isinstance(on.replicas, frontdoor.Replicas)
    send(on, 2)
    assert sent_ids(runtime) == [TENANT_ID, f"{TENANT_ID}-r1"]
    assert frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=lines).replicas is None


def test_rejected_requests_are_not_counted_but_carry_the_gauge(lines):
    invoker, runtime = invoker_for(replicating(0.1), lines)
    send(invoker)
    assert invoker.buffered(frontdoor.request_from_event(url_event(b"{"))).status == 400
    send(invoker)
    assert sent_ids(runtime) == [TENANT_ID, f"{TENANT_ID}-r1"]  # the 400 took no turn
    rejected = lines.requests[1]
    assert rejected["status"] == 400 and R.REPLICA not in rejected
    assert lines.emf[1][telemetry.REPLICATED_REQUESTS.name] == 0 and lines.emf[1][telemetry.HOT_PREFIXES.name] == 1


def test_retries_keep_the_replica(lines):
    from tests.prefix_routing.frontdoor.test_upstream_errors import _client_error

    class Flaky(FakeRuntime):
        def invoke_endpoint_with_response_stream(self, **params):
            if len(self.calls) == 1:  # the second request's first attempt is throttled
                self.calls.append(params)
                raise _client_error("ThrottlingException", 400)
            return super().invoke_endpoint_with_response_stream(**params)

    cfg = replicating(0.1)
    invoker = frontdoor.Invoker(Flaky(), cfg, KEY, emit=lines, sleep=lambda s: None,
                                replicas=frontdoor.Replicas(cfg, clock=lambda: 0.0))
    send(invoker, 2)
    assert sent_ids(invoker.upstream.client) == [TENANT_ID, f"{TENANT_ID}-r1", f"{TENANT_ID}-r1"]
    assert lines.requests[1]["attempts"] == 2 and lines.requests[1][R.REPLICA] == 1


class Readings:
    """A CopyCounts stand-in: only its latest reading matters to the replicas."""

    def __init__(self, current=None):
        self.current = current

    def sample(self):  # what the telemetry calls: no new reading
        return None


def test_copies_are_the_latest_reading_at_most_copies_max_else_copies_min():
    readings = Readings()
    replicas = frontdoor.Replicas(replicating(copies_min=2, copies_max=6), copies=readings)
    assert replicas.copies() == 2  # no reading yet: copies_min
    readings.current = 5
    assert replicas.copies() == 5
    readings.current = 9  # more than the stage allows (an update in flight): at most copies_max
    assert replicas.copies() == 6
    readings.current = 0  # scaled to zero: nothing to replicate over
    assert replicas.copies() == 0 and replicas.assign("pa-x", "f") == (0, 1)
    assert frontdoor.Replicas(replicating(copies_min=3, copies_max=None), copies=Readings(40)).copies() == 40
    assert frontdoor.Replicas(replicating(copies_min=3, copies_max=None)).copies() == 3  # no component: never read


def test_before_the_first_reading_one_copy_at_rest_replicates_nothing(lines):
    readings = Readings()
    invoker, runtime = invoker_for(replicating(0.1, copies_min=1, copies_max=4), lines, copies=readings)
    send(invoker, 3)
    assert sent_ids(runtime) == [TENANT_ID] * 3  # copies_min = 1: one copy, no replica
    readings.current = 4
    send(invoker, 2)
    # n = 4: 4/32 × 4 / 0.1 = 5 → k = 4, the first turn: j = 0; n = 5: j = 1.
    assert sent_ids(runtime)[3:] == [TENANT_ID, f"{TENANT_ID}-r1"]


def test_the_tracker_uses_the_telemetrys_copy_readings(lines):
    readings = Readings(current=4)
    telemetry_sink = frontdoor.Telemetry(replicating(copies_min=1), lines, copies=readings)
    invoker = frontdoor.Invoker(FakeRuntime(), replicating(0.1, copies_min=1), KEY, telemetry_sink=telemetry_sink)
    send(invoker, 2)
    assert sent_ids(invoker.upstream.client) == [TENANT_ID, f"{TENANT_ID}-r1"]


def test_concurrent_requests_each_take_one_turn(lines):
    invoker, runtime = invoker_for(replicating(0.1), lines)
    errors: list[BaseException] = []

    def worker():
        try:
            send(invoker, 25)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    # 100 requests, turns 0..99 (k = 4 from the third on, and turns 0-2 give j = 0-2): j = turn mod 4.
    assert Counter(log[R.REPLICA] for log in lines.requests) == {0: 25, 1: 25, 2: 25, 3: 25}


def test_log_line_and_emf_document_carry_the_replica():
    cfg = replicating(0.1)
    record = frontdoor.RequestRecord(arrival_ms=1796032800000, routing_id="pa-1", sent=True, status=200,
                                     replica=2, replicas=3, hot_prefixes=5)
    line = frontdoor.log_record(record, cfg)
    assert (line[R.REPLICA], line[R.REPLICAS], line["prefix_aware_id"]) == (2, 3, "pa-1")
    document = frontdoor.emf_document(record, cfg)
    definitions = {m["Name"]: m for m in document["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    for spec in telemetry.REPLICATION_METRICS:
        assert definitions[spec.name] == {"Name": spec.name, "Unit": spec.unit, "StorageResolution": 1}
    assert document[telemetry.REPLICATED_REQUESTS.name] == [1] and document[telemetry.HOT_PREFIXES.name] == [5]
    zero = frontdoor.emf_document(dataclasses.replace(record, replica=0), cfg)
    assert zero[telemetry.REPLICATED_REQUESTS.name] == [0]


@pytest.mark.parametrize("name", [spec.name for spec in telemetry.REPLICATION_METRICS])
def test_replication_metric_names_are_new(name):
    assert name not in {spec.name for spec in telemetry.ALL_METRICS}
