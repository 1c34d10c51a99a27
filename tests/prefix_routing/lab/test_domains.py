"""The price of isolation in the lab: tenants dealt to domains, copies dealt to components, and the
combined figures (token-weighted hit rate, TTFT over all requests, copy-hours summed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from prefix_routing.lab.domains import domain_fleets, domain_of_tenants, price_of_isolation, subset
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.traces import Trace
from prefix_routing.rules.errors import UserError


def trace(tenants):
    n = len(tenants)
    return Trace(arrivals=[float(i) for i in range(n)], prompt_tokens=[100 * (i + 1) for i in range(n)],
                 output_tokens=[1] * n, blocks=[[i] for i in range(n)], tenants=list(tenants))


def test_subset_keeps_the_chosen_requests_in_order():
    part = subset(trace(["a", "b", "a", "c"]), [0, 2])
    assert part.tenants == ["a", "a"] and part.prompt_tokens == [100, 300] and part.arrivals == [0.0, 2.0]
    assert part.blocks == [[0], [2]]


def test_tenants_are_dealt_round_robin_in_sorted_order():
    assert domain_of_tenants(trace(["c", "a", "b", "a"]), 2) == {"a": 0, "b": 1, "c": 0}


@pytest.mark.parametrize("instances, domains, copies", [(7, 2, [4, 3]), (7, 4, [2, 2, 2, 1]), (2, 3, [1, 1, 1])])
def test_copies_are_dealt_out_at_least_one_each(instances, domains, copies):
    fleets = domain_fleets(FleetConfig(instances=instances, copies=1), domains)
    assert [f.total_copies for f in fleets] == copies


def test_the_combined_figures(monkeypatch):
    # Two tenants, two domains. Hand computation: shared hit 0.5 over 100+200+300+400 = 1,000 tokens;
    # domain 0 ("a": requests 0, 2 = 400 tokens) hits 0.25, domain 1 ("b": 600 tokens) hits 0.75:
    # (0.25*400 + 0.75*600) / 1,000 = 0.55.
    hits = {4: 0.5, 400: 0.25, 600: 0.75}

    def run(part, fleet):
        return SimpleNamespace(hit_rate=hits[len(part) if len(part) == 4 else sum(part.prompt_tokens)],
                               ttft=[float(t) for t in part.prompt_tokens], copy_hours=fleet.total_copies * 1.0,
                               timeouts=1)

    shared, walled = price_of_isolation(trace(["a", "b", "a", "b"]), FleetConfig(instances=3, copies=1), 2, run=run)
    assert (shared["layout"], shared["copies"], shared["hit_rate"], shared["copy_hours"]) == ("shared", 3, 0.5, 3.0)
    assert (walled["layout"], walled["components"], walled["copies"]) == ("2 domains", 2, 3)
    assert walled["hit_rate"] == pytest.approx(0.55)
    assert walled["copy_hours"] == 3.0 and walled["timeouts"] == 2
    assert walled["ttft_p50_s"] == pytest.approx(250.0)  # the median of 100, 200, 300, 400


def test_too_few_tenants_for_the_domains_is_a_clear_error():
    with pytest.raises(UserError, match="--domains 3: the trace has 2 tenant"):
        price_of_isolation(trace(["a", "b"]), FleetConfig(instances=3, copies=1), 3, run=lambda p, f: None)
    with pytest.raises(UserError, match="allowed 2 to 8"):
        price_of_isolation(trace(["a", "b"]), FleetConfig(instances=3, copies=1), 9, run=lambda p, f: None)
