"""The engines' admission: slots and the KV budget (prefix_routing.lab.engine_model, through the fleet)."""

from __future__ import annotations

import pytest

from prefix_routing.lab.fleet import Fleet, Request
from prefix_routing.lab.fleet_config import REQUEST_OVERHEAD_S
from prefix_routing.lab.routing import ROUTING_OVERHEAD_S
from tests.prefix_routing.lab.conftest import cfg


def test_a_request_waits_for_kv_budget_first_come_first_served():
    # One copy whose KV budget is 10,000 tokens. A reserves 4,000 + 4,000 = 8,000 while it runs.
    fleet = Fleet(cfg(instances=1, cache_tokens=10_000))
    overhead = REQUEST_OVERHEAD_S + ROUTING_OVERHEAD_S
    a = fleet.submit(Request(4000, 4000, list(range(1, 9))), 0.0)
    a_engine_done = a.finish_s - overhead
    # B needs 4,010: 8,000 + 4,010 > 10,000, so it starts when A's engine work ends.
    b = fleet.submit(Request(4000, 10, list(range(20, 28))), 0.001)
    assert b.start_s == pytest.approx(a_engine_done, rel=1e-12) and b.queued_s > 1.0
    # C would fit beside A, but arrives after B: first come, first served, it never overtakes B.
    c = fleet.submit(Request(100, 10, [40]), 0.002)
    assert c.start_s >= b.start_s


def test_a_request_that_just_fits_the_kv_budget_starts_at_once():
    fleet = Fleet(cfg(instances=1, cache_tokens=10_000))
    fleet.submit(Request(4000, 4000, list(range(1, 9))), 0.0)
    d = fleet.submit(Request(1990, 10, [50, 51, 52, 53]), 0.001)  # 8,000 + 2,000 = 10,000: fits exactly
    assert d.start_s == 0.001
    # It decodes beside A: batch 2, the copy's reserved context 10,000 tokens.
    assert d.per_token_s == pytest.approx(fleet.latency.step_s(2, 10_000), rel=1e-12)


def test_a_finished_request_gives_its_kv_budget_back():
    fleet = Fleet(cfg(instances=1, cache_tokens=10_000))
    a = fleet.submit(Request(4000, 4000, list(range(1, 9))), 0.0)
    later = a.finish_s + 1.0
    b = fleet.submit(Request(4000, 4000, list(range(20, 28))), later)  # 8,000 again: fits once A is done
    assert b.start_s == later and b.queued_s == 0.0
    assert b.per_token_s == pytest.approx(fleet.latency.step_s(1, 8000), rel=1e-12)  # A's tokens are gone
    c = fleet.submit(Request(100, 2, [40]), later + 0.5)
    assert c.finish_s == pytest.approx(c.first_token_s + c.per_token_s, rel=1e-12)  # 2 tokens: one step after


def test_a_request_that_times_out_waiting_leaves_the_running_ones_in_place():
    # A runs for about a minute holding 8,000 of 10,000 tokens; B needs 4,010 and would wait for A, past
    # the 5 s timeout, so it fails. A is still running: C, which fits beside it, decodes at batch 2.
    fleet = Fleet(cfg(instances=1, cache_tokens=10_000, timeout_s=5.0))
    a = fleet.submit(Request(4000, 4000, list(range(1, 9))), 0.0)
    assert a.finish_s > 30
    b = fleet.submit(Request(4000, 10, list(range(20, 28))), 0.001)
    assert b.timed_out
    c = fleet.submit(Request(100, 10, [40]), 0.002)
    assert not c.timed_out and c.start_s == 0.002
    assert c.per_token_s == pytest.approx(fleet.latency.step_s(2, 8110), rel=1e-12)
