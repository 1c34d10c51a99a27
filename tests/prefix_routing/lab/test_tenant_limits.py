"""Per-tenant limits in the fleet model: the front door's rule in simulated time, on hand-computed cases."""

from __future__ import annotations

import json

import pytest

from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.simulate import simulate
from prefix_routing.lab.tenant_limits import (
    STREAM_RETRY_AFTER_S,
    UNLIMITED,
    LimitModel,
    Refusal,
    Ticket,
    describe_limits,
    load_limits,
)
from prefix_routing.lab.traces import Trace
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.limits import LimitSettings, TenantLimits

ONE_COPY = FleetConfig(instances=1, strategy=Strategy.RANDOM)  # p5 70B: one copy


def limits(**kw) -> LimitSettings:
    return LimitSettings(default=TenantLimits(**kw))


def small_trace(arrivals, prompt=100, output=10, tenants=None) -> Trace:
    """Short requests (each ends well within a second on an idle copy), all of tenant "a" by default."""
    n = len(arrivals)
    prompts = prompt if isinstance(prompt, list) else [prompt] * n
    return Trace(list(arrivals), prompts, [output] * n, [[i] for i in range(n)], tenants=tenants or ["a"] * n)


def row(result, tenant="a") -> dict:
    return next(r for r in result.tenants if r["tenant"] == tenant)


# --------------------------------------------------------------------------- concurrent_streams


def test_two_streams_five_at_once_open_loop_serves_two_and_drops_three():
    r = simulate(small_trace([0.0] * 5), ONE_COPY, limits=limits(concurrent_streams=2))
    assert r.requests == 2 and r.throttled == 3
    a = row(r)
    assert (a["requests"], a["served"], a["throttled"], a["dropped"]) == (5, 2, 3, 3)
    assert a["throttled_by"] == {"concurrent_streams": 3}


def test_two_streams_five_users_closed_loop_retry_after_one_second():
    # t=0: two admitted, three refused (Retry-After 1 s); each answer ends within 0.3 s, so at t=1 two of
    # the three are admitted and the last is refused again; at t=2 it is admitted: 4 refusals in all.
    r = simulate(small_trace([0.0] * 5), ONE_COPY, users=5, limits=limits(concurrent_streams=2))
    assert r.requests == 5 and r.throttled == 4
    a = row(r)
    assert (a["served"], a["dropped"], a["retry_wait_s"]) == (5, 0, 4 * STREAM_RETRY_AFTER_S)


def test_closed_loop_admission_times_follow_retry_after():
    from prefix_routing.lab.simulate import Simulator

    sim = Simulator(ONE_COPY, users=5, limits=limits(concurrent_streams=2))
    sim.feed(small_trace([0.0] * 5))
    assert max(e - a for e, a in zip(sim.ends, sim.arrivals)) < 1.0  # the premise: each answer ends within its second
    assert sorted(sim.arrivals) == [0.0, 0.0, 1.0, 1.0, 2.0]


def test_without_limits_every_request_is_served():
    r = simulate(small_trace([0.0] * 5), ONE_COPY, limits=None)
    assert r.requests == 5 and r.throttled == 0


# --------------------------------------------------------------------------- requests_per_minute


def test_three_requests_per_minute_over_100_seconds_of_arrivals():
    # Arrivals every 10 s from 0 to 90: minute 0 admits 0, 10, 20 and refuses 30, 40, 50; minute 1
    # admits 60, 70, 80 and refuses 90.
    from prefix_routing.lab.simulate import Simulator

    sim = Simulator(ONE_COPY, limits=limits(requests_per_minute=3))
    sim.feed(small_trace([10.0 * i for i in range(10)]))
    assert list(sim.arrivals) == [0.0, 10.0, 20.0, 60.0, 70.0, 80.0]
    r = sim.result()
    a = row(r)
    assert (a["requests"], a["served"], a["throttled"], a["dropped"]) == (10, 6, 4, 4)
    assert a["throttled_by"] == {"requests_per_minute": 4}


def test_requests_per_minute_closed_loop_waits_for_the_next_minute():
    # Five users at t=0, two per minute: two at 0, two at 60 (Retry-After 60 s), the last at 120.
    from prefix_routing.lab.simulate import Simulator

    sim = Simulator(ONE_COPY, users=5, limits=limits(requests_per_minute=2))
    sim.feed(small_trace([0.0] * 5))
    assert sorted(sim.arrivals) == [0.0, 0.0, 60.0, 60.0, 120.0]
    a = row(sim.result())
    assert (a["served"], a["throttled"], a["retry_wait_s"]) == (5, 4, 3 * 60 + 60)


def test_minutes_are_calendar_minutes_of_the_traces_clock():
    model = LimitModel(limits(requests_per_minute=1), origin_s=30.0)
    assert isinstance(model.admit("a", 0.0, 10), Ticket)  # clock 30: minute 0
    refused = model.admit("a", 29.0, 10)  # clock 59: still minute 0, one second to the next
    assert refused == Refusal("requests_per_minute", 1)
    assert isinstance(model.admit("a", 30.0, 10), Ticket)  # clock 60: minute 1


# --------------------------------------------------------------------------- tokens_per_minute


def _two_admitted(tokens_used):
    model = LimitModel(limits(tokens_per_minute=1300))
    for now in (0.0, 0.001):
        ticket = model.admit("a", now, 400)  # 400 prompt tokens: 1,600 bytes, estimated at 400
        assert isinstance(ticket, Ticket) and ticket.charge == 400
        model.end(ticket, 5.0, tokens_used)
    return model


def test_tokens_are_charged_by_estimate_then_corrected_at_the_answers_end():
    # Before the answers end the minute holds 800 estimated tokens: a third request of 400 fits 1,300.
    assert isinstance(_two_admitted(600).admit("a", 4.0, 400), Ticket)
    # After they end it holds their usage, 2 × (400 + 200) = 1,200: the third no longer fits.
    refused = _two_admitted(600).admit("a", 30.0, 400)
    assert refused == Refusal("tokens_per_minute", 30)
    # A failed answer reports no usage: the estimates stay (800 + 400 fits).
    assert isinstance(_two_admitted(None).admit("a", 30.0, 400), Ticket)


def test_a_request_alone_over_tokens_per_minute_is_given_up():
    model = LimitModel(limits(tokens_per_minute=300))
    refused = model.admit("a", 0.0, 400)
    assert isinstance(refused, Refusal) and refused.final and refused.limit == "tokens_per_minute"
    # In a closed loop the client gives up on it (no retry admits it) and sends the next one.
    r = simulate(small_trace([0.0, 0.0], prompt=[400, 100]), ONE_COPY, users=1, limits=limits(tokens_per_minute=300))
    a = row(r)
    assert (a["requests"], a["served"], a["throttled"], a["dropped"]) == (2, 1, 1, 1)


# --------------------------------------------------------------------------- the rule's details


def test_a_refusal_takes_nothing_and_the_minute_is_named_first():
    model = LimitModel(limits(requests_per_minute=3, concurrent_streams=1))
    first = model.admit("a", 0.0, 10)
    model.end(first, 5.0, 20)
    assert model.admit("a", 1.0, 10) == Refusal("concurrent_streams", STREAM_RETRY_AFTER_S)
    assert model.admit("a", 2.0, 10) == Refusal("concurrent_streams", STREAM_RETRY_AFTER_S)
    # The two refused did not count in the minute: two more are admitted (3 in all) ...
    second = model.admit("a", 6.0, 10)
    assert isinstance(second, Ticket)
    model.end(second, 7.0, 20)
    assert isinstance(model.admit("a", 8.0, 10), Ticket)  # still in flight
    # ... and the next is over both limits: the minute's is named, with its Retry-After.
    assert model.admit("a", 9.0, 10) == Refusal("requests_per_minute", 51)


def test_a_stream_holds_its_slot_until_its_answer_ends_however_long_past_its_lease():
    # The front door renews a lease while its answer streams: no lease runs out under a live stream.
    model = LimitModel(LimitSettings(default=TenantLimits(concurrent_streams=1), lease_s=10))
    model.end(model.admit("a", 0.0, 10), 100.0, 20)
    assert isinstance(model.admit("a", 50.0, 10), Refusal)
    assert model.in_flight("a", 99.9) == 1 and model.in_flight("a", 100.0) == 0
    assert isinstance(model.admit("a", 100.0, 10), Ticket)


def test_tokens_are_charged_for_the_output_too():
    model = LimitModel(limits(tokens_per_minute=1000))
    ticket = model.admit("a", 0.0, 300, 400)  # 300 prompt tokens and 400 output: 700 charged
    assert ticket.charge == 700
    assert model.admit("a", 1.0, 1, 300) == Refusal("tokens_per_minute", 59)  # 700 + 301 > 1,000
    assert model.admit("a", 2.0, 600, 500) == Refusal("tokens_per_minute", 58, final=True)  # 1,100 alone
    model.end(ticket, 3.0, 500)  # its answer used 500: 200 given back
    assert isinstance(model.admit("a", 4.0, 1, 400), Ticket)  # 500 + 401 fits


def test_overrides_apply_to_their_tenants_only():
    settings = LimitSettings(tenants=(("noisy", TenantLimits(concurrent_streams=1)),))
    model = LimitModel(settings)
    assert isinstance(model.admit("noisy", 0.0, 10), Ticket)
    assert isinstance(model.admit("noisy", 0.0, 10), Refusal)
    assert all(model.admit("quiet", 0.0, 10) is UNLIMITED for _ in range(5))
    r = simulate(small_trace([0.0] * 4, tenants=["noisy", "noisy", "quiet", "quiet"]), ONE_COPY, limits=settings)
    assert (row(r, "noisy")["throttled"], row(r, "quiet")["throttled"]) == (1, 0)


def test_the_stream_retry_after_is_the_front_doors():
    from prefix_routing.frontdoor.limiter import STREAM_RETRY_AFTER_S as FRONT_DOOR  # one constant, rules/limits.py

    assert STREAM_RETRY_AFTER_S == FRONT_DOOR


# --------------------------------------------------------------------------- --limits FILE


def test_limits_file_in_the_stages_shape(tmp_path):
    path = tmp_path / "limits.toml"
    path.write_text('[limits]\nconcurrent_streams = 4\ntokens_per_minute = 100000\n'
                    '[limits.tenants."tenant-0001"]\nconcurrent_streams = 2\n')
    settings = load_limits(path)
    assert settings.default == TenantLimits(tokens_per_minute=100_000, concurrent_streams=4)
    assert settings.for_tenant("tenant-0001") == ("tenant-0001", TenantLimits(tokens_per_minute=100_000,
                                                                              concurrent_streams=2))
    assert settings.lease_s == 30  # short, renewed while an answer streams
    assert describe_limits(settings) == ("per tenant tokens_per_minute 100,000, concurrent_streams 4; "
                                         "tenant-0001: tokens_per_minute 100,000, concurrent_streams 2")
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"requests_per_minute": 3}))
    assert load_limits(bare).default == TenantLimits(requests_per_minute=3)
    front_door = tmp_path / "env.json"  # the front door's LIMITS value
    front_door.write_text(settings.to_json())
    assert load_limits(front_door) == settings


@pytest.mark.parametrize("text, problem", [
    ("[limits]\nconcurent_streams = 4\n", "concurent_streams"),
    ("[limits]\nconcurrent_streams = 0\n", "concurrent_streams"),
    ("[limits\n", "neither TOML nor JSON"),
])
def test_a_broken_limits_file_is_one_error(tmp_path, text, problem):
    path = tmp_path / "limits.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=problem):
        load_limits(path)
    with pytest.raises(UserError, match="limits"):
        load_limits(tmp_path / "missing.toml")
