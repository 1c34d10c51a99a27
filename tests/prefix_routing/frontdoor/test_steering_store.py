"""Replica steering against a real DynamoDB-compatible store on 127.0.0.1 (dynalite): two execution
environments (two Replicas over one table) steer one hot prefix; the conditional writes, the
version and the release's update expression are the store's own semantics, not a stub's.

k by hand as in test_replicas.py: factor 0.1 on 4 copies, min_requests 1, fixed clock: each
environment's own tracker gives k = 2, 3, 4, 4, ... to its 1st, 2nd, 3rd, ... request of the prefix.
"""

from __future__ import annotations

import socket
import uuid

import pytest

from prefix_routing import frontdoor
from prefix_routing.frontdoor.local import create_limits_table, limits_client
from prefix_routing.frontdoor.record import RequestRecord
from prefix_routing.frontdoor.steering_store import KEY, DynamoSteeringStore, Steering, item_key
from tests.prefix_routing.frontdoor.test_replicas import replicating

NOW = 1_795_999_990.0
PREFIX = item_key("tid", "fp-a")


@pytest.fixture
def table(local_dynamo):
    name = f"steer-{uuid.uuid4().hex[:8]}"  # a table per test: no state carried over
    create_limits_table(limits_client(local_dynamo.url, 5000), name)
    return name


def environment(url: str, table: str, timeout_ms: int = 2000) -> frontdoor.Replicas:
    cfg = replicating(0.1, steering_table=table)
    store = DynamoSteeringStore(limits_client(url, timeout_ms), table, answer_client=limits_client(url, timeout_ms))
    return frontdoor.Replicas(cfg, clock=lambda: 0.0, steering=Steering(store, cfg.replication, clock=lambda: NOW))


def send(replicas: frontdoor.Replicas) -> RequestRecord:
    record = RequestRecord(arrival_ms=0, fingerprint="fp-a", body_bytes=8192, status=200)
    replicas.route("tid", record)
    return record


def end(replicas, record, cached, prompt=1000):
    record.prompt_tokens, record.cached_tokens = prompt, cached
    replicas.answered(record)


def test_two_environments_steer_one_prefix_over_distinct_replicas(local_dynamo, table):
    a, b = environment(local_dynamo.url, table), environment(local_dynamo.url, table)
    # A's 1st (k 2): slots 0 1, → 0. B's 1st (k 2): 0 has 1 in flight → 1. A's 2nd (k 3): slot 2 → 2.
    # B's 2nd (k 3) → all 1 in flight, 1 sent: the lowest, 0. In turn each would have sent 0, 1, 0, 1.
    sent = [send(a), send(b), send(a), send(b)]
    assert [r.replica for r in sent] == [0, 1, 2, 0]
    assert {r.steering for r in sent} == {"least_loaded"}
    item = limits_client(local_dynamo.url, 2000).get_item(TableName=table, Key={KEY: {"S": PREFIX}},
                                                          ConsistentRead=True)["Item"]
    assert item["v"] == {"N": "4"} and int(item["expires_at"]["N"]) == int(NOW + 900)
    assert [(int(s["M"]["m"]["N"]), int(s["M"]["f"]["N"])) for s in item["s"]["L"]] == [(0, 2), (1, 1), (2, 1)]
    end(b, sent[3], cached=0)
    end(a, sent[0], cached=0)
    nxt = send(a)  # A's 3rd (k 4): slots 0 (0 in flight, 2 sent), 1 (1), 2 (1), 3 new (0, 0) → 3
    assert nxt.replica == 3


def test_a_collision_one_environment_reports_the_other_sees(local_dynamo, table):
    a, b = environment(local_dynamo.url, table), environment(local_dynamo.url, table)
    first, second = send(a), send(a)  # replicas 0, 1 (k 2 then 3: slots 0 1 2)
    end(a, second, cached=950)  # key 500 of 1000 tokens: cached ≥ 450, replica 1's copy had the prefix
    assert second.replica_collision is True
    # B's 1st (k 2): slots 0 (1 in flight) and 3 (the fresh number in place of 1) → 3.
    seen = send(b)
    assert seen.replica == 3
    end(b, seen, cached=100)  # a first answer without the key cached: judged, no collision
    assert seen.replica_collision is False
    end(a, first, cached=1000)
    assert first.replica_collision is False  # replica 0 is never retired


def test_a_store_that_times_out_falls_back_to_turns_and_is_counted(local_dynamo, table):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers: every call runs into its read timeout
    try:
        replicas = environment(f"http://127.0.0.1:{silent.getsockname()[1]}", table, timeout_ms=50)
        sent = [send(replicas) for _ in range(3)]
        assert [r.replica for r in sent] == [0, 1, 2]  # the tracker's turns: 0 of k 2, 1 of k 3, 2 of k 4
        assert {(r.steering, r.steering_store_error) for r in sent} == {("turns_store_unavailable", True)}
        # Bounded: the read's 50 ms timeout, then no more calls (the send's budget is 100 ms).
        assert all(40 <= r.steering_ms < 150 for r in sent)
    finally:
        silent.close()
