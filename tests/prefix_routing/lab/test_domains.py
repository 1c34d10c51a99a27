"""The price of isolation in the lab: tenants dealt to domains, copies dealt to components, and the
combined figures (token-weighted hit rate, TTFT over all requests, copy-hours summed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from prefix_routing.lab.isolation_price import domain_fleets, domain_of_tenants, price_of_isolation, subset
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


def test_subset_takes_every_column_it_has():
    full = Trace(arrivals=[0.0, 1.0, 2.0], prompt_tokens=[10, 20, 30], output_tokens=[1, 2, 3],
                 blocks=[[0], [1], [2]], routing_ids=["r0", "r1", "r2"], rekeyed=[False, True, False],
                 raw_keys=["k0", "k1", "k2"], cached_tokens=[None, 5, 6], tenants=["a", "b", "c"], notes=["n"])
    part = subset(full, [1, 2])
    assert (part.arrivals, part.prompt_tokens, part.output_tokens, part.blocks) == ([1.0, 2.0], [20, 30], [2, 3],
                                                                                    [[1], [2]])
    assert (part.routing_ids, part.rekeyed, part.raw_keys, part.cached_tokens, part.tenants) == (
        ["r1", "r2"], [True, False], ["k1", "k2"], [5, 6], ["b", "c"])
    assert part.notes == ["n"] and part.notes is not full.notes
    bare = subset(trace(["a", "b"]), [1])
    assert (bare.routing_ids, bare.rekeyed, bare.raw_keys, bare.cached_tokens) == (None, None, None, None)


def test_a_domains_copies_sit_on_as_few_instances_as_hold_them():
    # 2 instances x 8 copies = 16 copies over 3 domains: 6, 5, 5; 8 copies per instance: one instance each.
    fleets = domain_fleets(FleetConfig(instances=2, copies=8, preset="p5.48xlarge-llama3.1-8b"), 3)
    assert [(f.instances, f.copies) for f in fleets] == [(1, 6), (1, 5), (1, 5)]
    # 5 instances x 2 copies = 10 over 2 domains: 5 each, on 3 instances of 2 (whole instances: 6 copies).
    tp4 = FleetConfig(instances=5, copies=2, preset="p5.48xlarge-llama3.1-70b-tp4")
    assert [(f.instances, f.copies) for f in domain_fleets(tp4, 2)] == [(3, 2), (3, 2)]


def test_eight_domains_are_allowed_and_each_replays_only_its_tenants():
    seen = []

    def run(part, fleet):
        seen.append(sorted(set(part.tenants)))
        return SimpleNamespace(hit_rate=0.0, ttft=[1.0] * len(part), copy_hours=0.0, timeouts=0)

    names = [f"t{i}" for i in range(8)]
    shared, walled = price_of_isolation(trace(names), FleetConfig(instances=8, copies=1), 8, run=run)
    assert seen == [names] + [[n] for n in names]
    assert shared["components"] == 1 and walled["components"] == 8 and walled["copies"] == 8


def test_no_prompt_tokens_is_no_hit_rate_and_the_p90_is_reported():
    def run(part, fleet):
        return SimpleNamespace(hit_rate=0.5, ttft=[float(i) for i in range(11)], copy_hours=0.0, timeouts=0)

    empty = Trace(arrivals=[0.0, 1.0], prompt_tokens=[0, 0], output_tokens=[1, 1], blocks=[[0], [1]],
                  tenants=["a", "b"])
    shared, _ = price_of_isolation(empty, FleetConfig(instances=2, copies=1), 2, run=run)
    assert shared["hit_rate"] == 0.0
    assert shared["ttft_p90_s"] == pytest.approx(9.0)  # 0..10: the 90th percentile


def test_without_a_runner_it_simulates():
    from prefix_routing.lab.workloads import LongContextSpec, long_context_workload

    workload = long_context_workload(LongContextSpec(prefixes=4, rate_rps=2.0, duration_s=10), seed=0)
    import dataclasses

    tenants = [f"t{i % 2}" for i in range(len(workload))]
    shared, walled = price_of_isolation(dataclasses.replace(workload, tenants=tenants),
                                        FleetConfig(instances=2, copies=1), 2)
    assert 0.0 <= walled["hit_rate"] <= 1.0 and shared["ttft_p50_s"] > 0 and walled["ttft_p50_s"] > 0
