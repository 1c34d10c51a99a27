"""The bound per tenant's namespace and each tenant's loss, against a five-request trace computed by
hand (blocks of 10 tokens)."""

from __future__ import annotations

import pytest

from prefix_routing.lab.analyze import analyze
from prefix_routing.lab.losses import namespace_bound, namespace_of, top_losers
from prefix_routing.lab.trace_data import Trace


def trace() -> Trace:
    return Trace(
        arrivals=[0.0, 1.0, 2.0, 3.0, 4.0], prompt_tokens=[30, 30, 30, 20, 20], output_tokens=[1] * 5,
        blocks=[[1, 2, 3], [1, 2, 3], [1, 2, 4], [1, 5], [1, 5]], block_tokens=10,
        tenants=["A", "B", "A", None, None],
        routing_ids=["pa-a", "pa-b", "pa-a", "pa-x-r2", "pa-x"],  # a replica of pa-x's hot prefix, then pa-x
        cached_tokens=[0, 0, 10, None, 20],
    )


def test_the_namespace_is_the_tenant_else_the_routing_id_without_its_replica():
    t = trace()
    assert [namespace_of(t, i) for i in range(5)] == ["A", "B", "A", "pa-x", "pa-x"]


def test_the_bound_counts_reuse_only_within_a_namespace():
    # A: 0, then 20 (blocks 1, 2); B: 0 (A's blocks are not B's); pa-x: 0, then 20. 40 of 130 tokens.
    # One shared cache would hold 0, 30, 20, 10, 20: 80 of 130.
    bound = namespace_bound(trace())
    assert bound["bound_tokens"] == pytest.approx(40 / 130)
    assert analyze(trace(), prefix_lengths=(), group_blocks=())["hit_rate_bound_tokens"] == pytest.approx(80 / 130)


def test_each_tenants_loss_is_its_bound_less_what_the_engine_cached():
    rows = {row["tenant"]: row for row in namespace_bound(trace())["tenants"]}
    assert rows["A"] == {"tenant": "A", "prompt_tokens": 60, "bound_tokens": 20, "measured_tokens": 10,
                         "lost_tokens": 10, "requests": 2}
    assert rows["pa-x"]["lost_tokens"] == 0 and rows["pa-x"]["measured_tokens"] == 20  # the uncounted one left out
    assert [row["tenant"] for row in namespace_bound(trace())["tenants"]] == ["A", "pa-x", "B"]
    assert [row["tenant"] for row in top_losers(namespace_bound(trace()))] == ["A"]


def test_a_log_without_tenants_or_routing_ids_is_one_namespace_the_shared_bound():
    t = trace()
    t.tenants, t.routing_ids = None, None
    assert namespace_bound(t)["bound_tokens"] == pytest.approx(80 / 130)
