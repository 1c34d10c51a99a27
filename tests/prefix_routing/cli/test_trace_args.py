"""``--sample`` as the lab commands read it: the sample, or the whole trace where its error is not bounded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from prefix_routing.cli import trace_args
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.sampling import SamplePlan
from prefix_routing.lab.trace_data import Trace
from prefix_routing.rules.errors import UserError


def keys_trace(keys: int) -> Trace:
    """One request per routing key, ``keys`` of them alike."""
    return Trace([float(i) for i in range(keys)], [200] * keys, [10] * keys, [[k, 10**6 + k] for k in range(keys)],
                 block_tokens=100, source="t")


def test_without_sample_the_trace_is_whole_and_unplanned():
    trace = keys_trace(10)
    assert trace_args.sampled(SimpleNamespace(sample=None), trace, FleetConfig(instances=2)) == (
        trace, SamplePlan(1.0, 1.0), 10)
    assert trace_args.sampled(SimpleNamespace(), trace, FleetConfig(instances=2))[0] is trace


def test_auto_keeps_a_small_trace_whole_without_a_note():
    trace = keys_trace(10)
    assert trace_args.sampled(SimpleNamespace(sample="auto"), trace, FleetConfig(instances=2)) == (
        trace, SamplePlan(1.0, 1.0), 10)


def test_a_bounded_rate_samples_the_keys():
    trace = keys_trace(2000)  # 200 effective keys at 10 %; 10 whole instances of 100
    part, plan, whole = trace_args.sampled(SimpleNamespace(sample=0.1), trace, FleetConfig(instances=100, block_tokens=100))
    assert plan == SamplePlan(0.1, 0.1) and whole == 2000
    assert 100 < len(part) < 300 and "sampled at 0.1" in part.source


def test_an_unbounded_rate_runs_the_whole_trace_and_says_why():
    trace = keys_trace(2000)
    part, plan, whole = trace_args.sampled(SimpleNamespace(sample=0.1), trace, FleetConfig(instances=10, block_tokens=100))
    assert part is trace and whole == 2000
    assert (plan.asked, plan.rate) == (0.1, 1.0) and plan.reason.startswith("10 instances at rate 0.1 leave 1")
    # The strategies simulated decide: RANDOM alone needs 50 requests a copy, not 8 instances.
    part, plan, _ = trace_args.sampled(SimpleNamespace(sample=0.1), trace, FleetConfig(instances=4, block_tokens=100),
                                       strategies=[Strategy.RANDOM])
    assert plan == SamplePlan(0.1, 0.1) and len(part) < 2000


def test_what_a_miniature_cannot_model_is_refused_before_sampling():
    from prefix_routing.rules.limits import LimitSettings, TenantLimits

    limits = LimitSettings(default=TenantLimits(requests_per_minute=10))
    for kwargs, what in ((dict(users=4), "a closed loop"), (dict(limits=limits), "per-tenant limits"),
                         (dict(domains=2), "trust domains")):
        with pytest.raises(UserError, match=f"a sampled run does not model {what}"):
            trace_args.sampled(SimpleNamespace(sample=0.1), keys_trace(10), FleetConfig(instances=100), **kwargs)


def test_a_rate_of_1_is_the_whole_trace_whatever_the_run_models():
    trace = keys_trace(10)
    assert trace_args.sampled(SimpleNamespace(sample=1.0), trace, FleetConfig(instances=2), users=4) == (
        trace, SamplePlan(1.0, 1.0), 10)
