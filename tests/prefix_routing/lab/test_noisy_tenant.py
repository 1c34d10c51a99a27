"""The noisy-tenant workload: one tenant's flood beside quiet ones, and what per-tenant limits do to it."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from prefix_routing.lab.simulate import simulate
from prefix_routing.lab.tenants import trace_dominance
from prefix_routing.lab.workloads import NOISY_TENANT, WORKLOADS, NoisyTenantSpec, noisy_tenant_workload
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.limits import LimitSettings, TenantLimits

SHORT = replace(NoisyTenantSpec(), duration_s=120.0)


def test_the_workload_is_deterministic_by_seed():
    a, b, c = (noisy_tenant_workload(SHORT, seed=s) for s in (0, 0, 1))
    assert (a.arrivals, a.prompt_tokens, a.output_tokens, a.blocks, a.tenants) == \
        (b.arrivals, b.prompt_tokens, b.output_tokens, b.blocks, b.tenants)
    assert a.arrivals != c.arrivals
    assert WORKLOADS["noisy-tenant"] == (NoisyTenantSpec, noisy_tenant_workload)


def test_one_tenant_sends_factor_times_as_often_as_each_quiet_one():
    spec = replace(NoisyTenantSpec(), duration_s=3600.0)
    trace = noisy_tenant_workload(spec, seed=0)
    quiet = spec.tenants - 1
    assert sorted(set(trace.tenants)) == [f"tenant-{i:04d}" for i in range(1, spec.tenants + 1)]
    # Poisson arrivals at 0.5 × (7 + 10) = 8.5 per second for an hour; the noisy share is 10/17.
    assert len(trace) == pytest.approx(spec.quiet_rate_rps * (quiet + spec.noisy_factor) * spec.duration_s, rel=0.03)
    share = trace.tenants.count(NOISY_TENANT) / len(trace)
    assert share == pytest.approx(spec.noisy_factor / (quiet + spec.noisy_factor), abs=0.02)
    assert trace.routing_ids == trace.tenants  # each tenant its own PrefixAwareId
    # Each tenant's requests start with its own system prompt (8 blocks of 250 tokens), then a unique part.
    system = spec.system_tokens // spec.block_tokens
    starts = {t: tuple(b[:system]) for t, b in zip(trace.tenants, trace.blocks)}
    assert len(set(starts.values())) == spec.tenants
    assert all(tuple(b[:system]) == starts[t] for t, b in zip(trace.tenants, trace.blocks))
    noisy = [p for t, p in zip(trace.tenants, trace.prompt_tokens) if t == NOISY_TENANT]
    assert min(noisy) >= spec.system_tokens + spec.noisy_tokens[0]
    assert trace_dominance(trace)["tenant"] == NOISY_TENANT


def test_the_workload_needs_two_tenants():
    with pytest.raises(UserError, match="2 to 1000 tenants"):
        noisy_tenant_workload(replace(SHORT, tenants=1))
    assert len(set(noisy_tenant_workload(replace(SHORT, tenants=3)).tenants)) == 3


def test_limits_on_the_noisy_tenant_give_the_quiet_ones_their_latency_back():
    trace = noisy_tenant_workload(SHORT, seed=0)
    config = SHORT.fleet_config()
    capped = LimitSettings(tenants=((NOISY_TENANT, TenantLimits(concurrent_streams=4)),))

    def quiet_p50(result):
        return statistics.median(r["ttft_p50_s"] for r in result.tenants if r["tenant"] != NOISY_TENANT)

    free, limited = simulate(trace, config), simulate(trace, config, limits=capped)
    # Without limits the flood queues everyone (modelled seconds); with the noisy tenant held to four
    # streams the quiet tenants wait for their own prefill only, and none of them is throttled.
    assert quiet_p50(free) > 1.0
    assert quiet_p50(limited) < 0.2
    assert all(r["throttled"] == 0 for r in limited.tenants if r["tenant"] != NOISY_TENANT)
    noisy = next(r for r in limited.tenants if r["tenant"] == NOISY_TENANT)
    assert noisy["throttled"] > 0 and noisy["served"] + noisy["dropped"] == noisy["requests"]
