"""Per-tenant limits against a real DynamoDB-compatible store on 127.0.0.1 (dynalite): the conditional
writes are the store's own, so exactness here is DynamoDB's semantics, not a stub's.

Times are a fixed clock the tests move; expected values are hand computations from the limits.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from prefix_routing.frontdoor.lease_renewal import LeaseRenewer
from prefix_routing.frontdoor.limiter import DynamoLimitStore, Limiter, LimitsUnavailable, Throttled
from prefix_routing.frontdoor.local import create_limits_table, limits_client
from prefix_routing.rules.limits import LimitSettings, TenantLimits

NOW = 1_795_999_990.0  # 10 s into a minute (1,795,999,980 = 60 × 29,933,333): 50 s to the next one


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def table(local_dynamo):
    name = f"limits-{uuid.uuid4().hex[:8]}"  # a table per test: no counts carried over
    create_limits_table(limits_client(local_dynamo.url, 5000), name)
    return name


def limiter(local_dynamo, table, clock, *, lease_s=60, on_store_error="open", **limits) -> Limiter:
    """A limiter on the test's clock; its leases are renewed only when a test calls ``renewer.renew_due()``."""
    settings = LimitSettings(default=TenantLimits(**limits), lease_s=lease_s, on_store_error=on_store_error,
                             store_timeout_ms=2000)
    store = DynamoLimitStore(limits_client(local_dynamo.url, 2000), table)
    return Limiter(settings, store, clock=clock, renewer=LeaseRenewer(store.renew, lease_s, clock=clock, background=False))


def test_concurrent_streams_admit_up_to_the_limit_and_a_finished_one_frees_its_slot(local_dynamo, table):
    gate = limiter(local_dynamo, table, Clock(), concurrent_streams=3)
    held = [gate.admit("acme", 400) for _ in range(3)]
    assert [a.headers["x-ratelimit-remaining-streams"] for a in held] == ["2", "1", "0"]
    with pytest.raises(Throttled) as refused:
        gate.admit("acme", 400)
    assert (refused.value.limit, refused.value.value, refused.value.retry_after_s) == ("concurrent_streams", 3, 1)
    assert gate.admit("other-tenant", 400) is not None  # another tenant's slots are its own
    gate.finish(held[0], tokens_used=None)
    assert gate.admit("acme", 400).headers["x-ratelimit-remaining-streams"] == "0"


def test_a_lease_left_by_a_dead_environment_expires(local_dynamo, table):
    clock = Clock()
    gate = limiter(local_dynamo, table, clock, concurrent_streams=2, lease_s=30)
    gate.admit("acme", 100), gate.admit("acme", 100)  # never finished: their environment died
    with pytest.raises(Throttled):
        gate.admit("acme", 100)
    clock.now += 29.5
    with pytest.raises(Throttled):
        gate.admit("acme", 100)  # not yet
    clock.now += 1.0  # both leases are past their 30 s
    assert gate.admit("acme", 100).headers["x-ratelimit-remaining-streams"] == "1"


def test_a_stream_that_renews_its_lease_keeps_its_slot_past_the_lease(local_dynamo, table):
    clock = Clock()
    gate = limiter(local_dynamo, table, clock, concurrent_streams=1, lease_s=30)
    streaming = gate.admit("acme", 100)
    for _ in range(4):  # 40 s of answer, a renewal every 10 s: each writes now + 30
        clock.now += 10.0
        assert gate.renewer.renew_due() == 1
    with pytest.raises(Throttled):
        gate.admit("acme", 100)  # 40 s after admission: still held
    gate.finish(streaming, tokens_used=None)
    assert gate.renewer.held == 0
    clock.now += 10.0
    assert gate.renewer.renew_due() == 0  # given back: nothing renews it
    admitted = gate.admit("acme", 100)
    gate.finish(admitted, tokens_used=None)


def test_a_renewal_of_a_lease_the_table_no_longer_holds_does_not_bring_it_back(local_dynamo, table):
    clock = Clock()
    gate = limiter(local_dynamo, table, clock, concurrent_streams=1, lease_s=30)
    gate.admit("acme", 100)
    clock.now += 31.0  # no renewal in time (a frozen store): expired, and a new admission cleans it
    other = limiter(local_dynamo, table, clock, concurrent_streams=1, lease_s=30)
    assert other.admit("acme", 100) is not None
    assert gate.renewer.renew_due() == 1 and gate.renewer.held == 0  # gone from the table: dropped here
    with pytest.raises(Throttled):
        other.admit("acme", 100)  # one lease, the new one: the renewal added none


def test_requests_per_minute_count_a_calendar_minute(local_dynamo, table):
    clock = Clock()
    gate = limiter(local_dynamo, table, clock, requests_per_minute=5)
    answers = [gate.admit("acme", 100) for _ in range(5)]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == ["4", "3", "2", "1", "0"]
    assert answers[0].headers["x-ratelimit-reset-requests"] == "50s"
    with pytest.raises(Throttled) as refused:
        gate.admit("acme", 100)
    assert (refused.value.limit, refused.value.retry_after_s) == ("requests_per_minute", 50)
    clock.now += 50  # the next minute
    assert gate.admit("acme", 100).headers["x-ratelimit-remaining-requests"] == "4"


def test_tokens_per_minute_charge_the_most_a_request_can_use_then_the_engines_usage(local_dynamo, table):
    gate = limiter(local_dynamo, table, Clock(), tokens_per_minute=1000)
    first = gate.admit("acme", 1200, 200)  # 1,200 bytes: 300 tokens estimated, and 200 asked
    assert first.charge == 500 and first.headers["x-ratelimit-remaining-tokens"] == "500"
    gate.finish(first, tokens_used=300)  # the engine used 300: the minute holds 300
    second = gate.admit("acme", 2000, 200)  # 500 + 200 more: 1,000 exactly
    assert second.headers["x-ratelimit-remaining-tokens"] == "0"
    with pytest.raises(Throttled) as refused:
        gate.admit("acme", 4, 0)  # one token more than the limit
    assert refused.value.limit == "tokens_per_minute"
    with pytest.raises(Throttled, match="this request alone"):
        gate.admit("other", 2004, 500)  # 501 + 500 tokens: never fits


def test_a_refused_minute_gives_back_the_stream_it_took(local_dynamo, table):
    gate = limiter(local_dynamo, table, Clock(), requests_per_minute=1, concurrent_streams=1)
    first = gate.admit("acme", 100)
    gate.finish(first, tokens_used=None)
    with pytest.raises(Throttled) as refused:
        gate.admit("acme", 100)  # the minute is used up ...
    assert refused.value.limit == "requests_per_minute"
    gate.settings = LimitSettings(default=TenantLimits(concurrent_streams=1), store_timeout_ms=2000)
    assert gate.admit("acme", 100) is not None  # ... and the stream slot it took was given back


def test_concurrent_admissions_never_exceed_the_limit(local_dynamo, table):
    gate = limiter(local_dynamo, table, Clock(), concurrent_streams=25)
    admitted, refused = [], []

    def one():
        try:
            admitted.append(gate.admit("acme", 100))
        except Throttled:
            refused.append(1)

    threads = [threading.Thread(target=one) for _ in range(60)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert (len(admitted), len(refused)) == (25, 35)


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_a_store_that_cannot_be_reached_behaves_as_the_stage_says(mode):
    settings = LimitSettings(default=TenantLimits(concurrent_streams=1), on_store_error=mode, store_timeout_ms=200)
    gate = Limiter(settings, DynamoLimitStore(limits_client("http://127.0.0.1:9", 200), "t"))  # nothing listens
    if mode == "open":
        admission = gate.admit("acme", 100)
        assert admission.store_error and admission.lease is None
        gate.finish(admission, 10)  # nothing to free, nothing raised
    else:
        with pytest.raises(LimitsUnavailable):
            gate.admit("acme", 100)


def test_an_unlimited_tenant_never_touches_the_store():
    class NoStore:
        def __getattr__(self, name):
            raise AssertionError(f"the store was called: {name}")

    settings = LimitSettings(tenants=(("arn:aws:iam::1:role/Batch*", TenantLimits(concurrent_streams=1)),))
    gate = Limiter(settings, NoStore())
    assert gate.admit("arn:aws:iam::1:role/ChatApp", 100) is None


def test_a_refused_stream_gives_back_the_minutes_count_it_took(local_dynamo, table):
    gate = limiter(local_dynamo, table, Clock(), requests_per_minute=2, concurrent_streams=1)
    first = gate.admit("acme", 100)  # the minute holds 1
    with pytest.raises(Throttled) as refused:
        gate.admit("acme", 100)  # the stream is taken: refused, and its count in the minute given back
    assert refused.value.limit == "concurrent_streams"
    gate.finish(first, tokens_used=None)
    assert gate.admit("acme", 100).headers["x-ratelimit-remaining-requests"] == "0"  # 2 of 2, not 3


def test_a_stream_is_given_back_through_the_release_client(local_dynamo, table):
    # The admission client may be too tight for a release under load; the release has a client of its own.
    settings = LimitSettings(default=TenantLimits(concurrent_streams=1), store_timeout_ms=2000)
    dead = limits_client("http://127.0.0.1:9", 200)  # nothing listens: a release through it would be lost
    gate = Limiter(settings, DynamoLimitStore(limits_client(local_dynamo.url, 2000), table,
                                              release_client=limits_client(local_dynamo.url, 2000)), clock=Clock())
    gate.finish(gate.admit("acme", 10), tokens_used=None)
    assert gate.admit("acme", 10) is not None  # the slot came back
    lossy = Limiter(settings, DynamoLimitStore(limits_client(local_dynamo.url, 2000), table, release_client=dead),
                    clock=Clock())
    lossy.finish(lossy.admit("beta", 10), tokens_used=None)  # lost: the release client cannot reach the store
    with pytest.raises(Throttled):
        lossy.admit("beta", 10)

