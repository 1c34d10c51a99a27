"""Tenants in the lab: the choice of a request's tenant, the request log's tenant, the per-tenant
table and the dominant-tenant flag."""

from __future__ import annotations

import json

import pytest

from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.simulate import simulate
from prefix_routing.lab.tenant_report import tenant_table
from prefix_routing.lab.tenants import (
    UNNAMED_TENANT,
    dominant_tenant,
    tenant_for,
    tenants_of,
    trace_dominance,
    with_tenants,
)
from prefix_routing.lab.traces import Trace, read_request_log
from prefix_routing.rules.errors import UserError


def test_the_tenant_choice_is_a_stable_spread():
    # One tenant takes everything; a key keeps its tenant; 2,000 keys fall on all of 7 tenants.
    assert tenant_for("17", 1) == "tenant-0001"
    assert tenant_for("17", 7) == tenant_for("17", 7)
    spread = [tenant_for(str(k), 7) for k in range(2000)]
    assert sorted(set(spread)) == [f"tenant-{i:04d}" for i in range(1, 8)]
    assert max(spread.count(t) for t in set(spread)) < 2000 / 7 * 1.25


def test_a_conversation_keeps_its_tenant_and_each_tenant_its_routing_id():
    # Requests 0 and 2 share their second block (one conversation); 1 and 3 another.
    trace = Trace([0.0, 1.0, 2.0, 3.0], [10] * 4, [1] * 4, [[0, 1, 2], [0, 5], [0, 1, 3], [0, 5, 6]])
    spread = with_tenants(trace, 1000)
    assert spread.tenants[0] == spread.tenants[2] == tenant_for("1", 1000)
    assert spread.tenants[1] == spread.tenants[3] == tenant_for("5", 1000)
    assert spread.tenants[0] != spread.tenants[1]  # (two of 1,000: distinct for these keys)
    assert spread.routing_ids == spread.tenants and trace.tenants is None
    with_ids = with_tenants(Trace([0.0], [10], [1], [[0, 1]], routing_ids=["own"]), 3)
    assert with_ids.routing_ids == ["own"]  # a trace's own routing ids stay
    with pytest.raises(UserError, match="names its tenants already"):
        with_tenants(spread, 2)
    with pytest.raises(UserError, match="1 to 1000"):
        with_tenants(trace, 1001)


def test_the_request_logs_tenant_is_read_as_is(tmp_path):
    def line(ts, tenant):
        record = {"message": "prefix_routing.request", "request_ts_ms": 1_700_000_000_000 + ts, "block_bytes": 2048,
                  "block_hashes": ["h1", f"h{ts}"], "prompt_tokens": 1000, "output_tokens": 10,
                  "prefix_aware_id": "id", "status": 200}
        if tenant is not None:
            record["tenant"] = tenant
        return json.dumps(record)

    path = tmp_path / "log.jsonl"
    path.write_text("\n".join([line(2000, "arn:aws:iam::1:role/B"), line(0, "arn:aws:iam::1:role/A"),
                               line(1000, None)]) + "\n")
    trace = read_request_log(path)
    assert trace.tenants == ["arn:aws:iam::1:role/A", None, "arn:aws:iam::1:role/B"]  # sorted by time with the rows
    assert tenants_of(trace) == ["arn:aws:iam::1:role/A", UNNAMED_TENANT, "arn:aws:iam::1:role/B"]
    assert trace.head(1).tenants == ["arn:aws:iam::1:role/A"]


# --------------------------------------------------------------------------- the dominant tenant


def test_a_tenant_with_most_of_the_tokens_is_flagged():
    # tokens: a 200, b 100, c 800 of 1,100 (73 %); requests: a has 2 of 4 (50 %: not more than half).
    found = dominant_tenant(["a", "a", "b", "c"], [100, 100, 100, 700], [0, 0, 0, 100])
    assert found["tenant"] == "c"
    assert found["tokens_share"] == pytest.approx(800 / 1100) and found["requests_share"] == 0.25
    assert found["text"] == ("tenant c sends 73 % of the tokens: one tenant's burst becomes everyone's latency; "
                             "consider [limits]")


def test_a_tenant_with_most_of_the_requests_is_flagged():
    # requests: a 3 of 4 (75 %); tokens: a 30, b 30 of 60 (50 %: not more than half).
    found = dominant_tenant(["a", "a", "a", "b"], [10, 10, 10, 30], [0, 0, 0, 0])
    assert (found["tenant"], found["requests_share"], found["tokens_share"]) == ("a", 0.75, 0.5)
    assert found["text"].startswith("tenant a sends 75 % of the requests:")


def test_no_dominant_tenant_when_the_load_is_shared_or_one_tenant_sends_all():
    assert dominant_tenant(["a", "b", "a", "b"], [10, 10, 10, 10], [1, 1, 1, 1]) is None
    assert dominant_tenant(["a", "a"], [10, 10], [1, 1]) is None  # one tenant: nothing to protect from
    assert trace_dominance(Trace([0.0], [10], [1], [[0]])) is None  # no tenants named


# --------------------------------------------------------------------------- the per-tenant table


def _spaced_trace():
    """Four requests 100 s apart (no two in flight together), tenants a, b, a, a."""
    return Trace([0.0, 100.0, 200.0, 300.0], [1000, 2000, 3000, 4000], [10, 20, 30, 40],
                 [[0], [1], [2], [3]], tenants=["a", "b", "a", "a"])


def test_the_per_tenant_rows_group_the_requests_by_tenant():
    r = simulate(_spaced_trace(), FleetConfig(instances=1, strategy=Strategy.RANDOM))
    rows = {row["tenant"]: row for row in r.tenants}
    assert [row["tenant"] for row in r.tenants] == ["a", "b"]  # most requests first
    assert (rows["a"]["requests"], rows["a"]["served"], rows["a"]["throttled"]) == (3, 3, 0)
    assert (rows["b"]["requests"], rows["b"]["served"], rows["b"]["throttled"]) == (1, 1, 0)
    # a's requests are 0, 2 and 3: its median TTFT is request 2's (longer prompts take longer).
    assert r.ttft[0] < r.ttft[2] < r.ttft[3]
    assert rows["a"]["ttft_p50_s"] == pytest.approx(r.ttft[2])
    assert rows["a"]["ttft_p90_s"] == pytest.approx(r.ttft[2] + 0.8 * (r.ttft[3] - r.ttft[2]))
    assert rows["b"]["ttft_p50_s"] == pytest.approx(r.ttft[1])
    # Goodput: a's output tokens (10 + 30 + 40) per second of the run; the tenants' add up to the run's.
    span = (10 + 20 + 30 + 40) / r.throughput_tok_s
    assert rows["a"]["goodput_tok_s"] == pytest.approx(80 / span)
    assert rows["a"]["goodput_tok_s"] + rows["b"]["goodput_tok_s"] == pytest.approx(r.throughput_tok_s)
    table = tenant_table("RANDOM", r.tenants)
    assert table.splitlines()[0] == "per tenant (RANDOM):"
    a_line = table.splitlines()[2].split()
    assert a_line[:4] == ["a", "3", "3", "0"]
    assert a_line[4] == f"{r.ttft[2] * 1000:,.0f}"


def test_a_trace_without_tenants_has_no_table():
    r = simulate(Trace([0.0], [10], [1], [[0]]), FleetConfig(instances=1, strategy=Strategy.RANDOM))
    assert r.tenants is None and "tenants" not in r.as_dict()


def test_the_table_sums_the_tenants_beyond_ten():
    rows = [{"tenant": f"t{i:02d}", "requests": 20 - i, "served": 20 - i, "throttled": i % 2, "ttft_p50_s": 0.1,
             "ttft_p90_s": 0.2, "goodput_tok_s": 1.0} for i in range(13)]
    lines = tenant_table("PREFIX_AWARE", rows).splitlines()
    assert len(lines) == 2 + 10 + 1
    assert lines[-1].split()[:7] == ["3", "more", "tenants", f"{8 + 9 + 10}", f"{8 + 9 + 10}", "1", "n/a"]


def test_requests_fed_before_the_first_tenant_are_the_unnamed_tenants():
    from prefix_routing.lab.simulate import Simulator

    sim = Simulator(FleetConfig(instances=1, strategy=Strategy.RANDOM))
    sim.feed(Trace([0.0], [10], [1], [[0]]))
    sim.feed(Trace([100.0], [10], [1], [[1]], tenants=["a"]))
    rows = {row["tenant"]: row["requests"] for row in sim.result().tenants}
    assert rows == {UNNAMED_TENANT: 1, "a": 1}
