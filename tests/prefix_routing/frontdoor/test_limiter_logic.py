"""The limiter's logic without a server: :class:`Limiter` over a fake store, and
:class:`DynamoLimitStore`'s requests checked with botocore's Stubber (the writes it makes, and what it
decides from the answers). tests/prefix_routing/frontdoor/test_limiter.py runs the same rule against
dynalite; these run where dynalite is not (mutmut's copy of the tree).

Expected values are hand computations from the module's docstring and docs/normalizer-lambda.md
("Per-tenant limits").
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from botocore.stub import ANY, Stubber

from prefix_routing.frontdoor.limiter import (
    Admission,
    Counted,
    DynamoLimitStore,
    Limiter,
    LimitsUnavailable,
    Refused,
    Throttled,
    _int,
    _leases,
    _num,
    admit_request,
)
from prefix_routing.frontdoor.lease_renewal import LeaseRenewer
from prefix_routing.frontdoor.local import limits_client
from prefix_routing.rules.limits import LimitSettings, TenantLimits

NOW = 1_795_999_990.0  # 10 s into minute 29,933,333 (its start: 60 × 29,933,333 = 1,795,999,980)
WINDOW = 29_933_333
RESET = 50  # seconds to the next minute (1,796,000,040)
TABLE = "limits"
KEY = {"pk": {"S": "tenant#acme"}}


class FakeStore:
    """Records the limiter's calls; answers ``admit`` with ``answers`` in turn (an exception is raised)."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.admits: list[tuple] = []
        self.finishes: list[tuple] = []
        self.renews: list[tuple] = []
        self.finish_error: Exception | None = None

    def admit(self, *args):
        self.admits.append(args)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def finish(self, *args):
        self.finishes.append(args)
        if self.finish_error is not None:
            raise self.finish_error

    def renew(self, *args):
        self.renews.append(args)
        return True


def gate(store, *, on_store_error="open", lease_s=30, tenants=(), default_max_tokens=1024, **limits) -> Limiter:
    settings = LimitSettings(default=TenantLimits(**limits), tenants=tenants, on_store_error=on_store_error,
                             lease_s=lease_s, default_max_tokens=default_max_tokens)
    renewer = LeaseRenewer(lambda *args: store.renew(*args), lease_s, clock=lambda: NOW, background=False)
    return Limiter(settings, store, clock=lambda: NOW, new_lease=lambda: "lease-1", renewer=renewer)


# --- Limiter over a fake store ---------------------------------------------------------------------------


def test_an_admission_passes_the_charge_lease_and_clock_to_the_store_and_reports_what_is_left():
    store = FakeStore(Counted(leases=3, requests=7, tokens=400))
    admission = gate(store, lease_s=20, requests_per_minute=10, tokens_per_minute=1000,
                     concurrent_streams=4).admit("acme", 2003, 200)  # 2,003 bytes: 500 tokens; 200 asked
    limits = TenantLimits(10, 1000, 4)
    assert store.admits == [("acme", limits, "lease-1", 700, NOW, 20)]
    assert (admission.tenant, admission.rule, admission.limits) == ("acme", "default", limits)
    assert (admission.lease, admission.window, admission.charge, admission.store_error) == (
        "lease-1", WINDOW, 700, False)
    assert admission.took_ms >= 0.0
    assert admission.headers == {
        "x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "50s",
        "x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "600", "x-ratelimit-reset-tokens": "50s",
        "x-ratelimit-limit-streams": "4", "x-ratelimit-remaining-streams": "1",
    }


def test_streams_only_take_a_lease_and_no_minute():
    store = FakeStore(Counted(leases=1, requests=0, tokens=0))
    admission = gate(store, concurrent_streams=2).admit("acme", 40)
    # 10 prompt tokens and the default 1,024 charged: no minute holds them, so nothing refuses them
    assert store.admits == [("acme", TenantLimits(concurrent_streams=2), "lease-1", 1034, NOW, 30)]
    assert (admission.lease, admission.window) == ("lease-1", None)
    assert admission.headers == {"x-ratelimit-limit-streams": "2", "x-ratelimit-remaining-streams": "1"}


@pytest.mark.parametrize("limits", [{"requests_per_minute": 3}, {"tokens_per_minute": 300}])
def test_a_per_minute_limit_alone_counts_the_minute_without_a_lease(limits):
    store = FakeStore(Counted(leases=0, requests=1, tokens=25))
    admission = gate(store, **limits).admit("acme", 100, 50)
    assert store.admits[0][2] is None  # no stream limit: no lease
    assert (admission.lease, admission.window) == (None, WINDOW)


def test_remaining_never_goes_below_zero():
    # the engine's usage replaced a smaller estimate: the minute holds more tokens than its limit
    admission = gate(FakeStore(Counted(0, 2, 1300)), tokens_per_minute=1000).admit("acme", 4, 10)
    assert admission.headers["x-ratelimit-remaining-tokens"] == "0"


def test_an_unlimited_tenant_is_not_counted():
    class NoStore:
        def __getattr__(self, name):
            raise AssertionError(f"the store was called: {name}")

    limiter = gate(NoStore(), tenants=(("batch-*", TenantLimits(concurrent_streams=1)),))
    assert limiter.admit("chat-app", 100) is None


def test_an_override_names_its_rule():
    store = FakeStore(Counted(1, 0, 0))
    limiter = gate(store, tenants=(("batch-*", TenantLimits(concurrent_streams=1)),), requests_per_minute=9)
    admission = limiter.admit("batch-7", 100)
    assert (admission.rule, admission.limits) == ("batch-*", TenantLimits(9, None, 1))


def test_a_request_alone_over_tokens_per_minute_is_refused_without_asking_the_store():
    store = FakeStore()
    limiter = gate(store, tokens_per_minute=1000, concurrent_streams=2)
    with pytest.raises(Throttled) as refused:
        limiter.admit("acme", 3204, 200)  # 801 prompt tokens + 200 asked: 1,001
    assert store.admits == []
    error = refused.value
    assert (error.limit, error.value, error.retry_after_s) == ("tokens_per_minute", 1000, RESET)
    assert error.message == ("tokens_per_minute: this request alone (about 801 prompt tokens + 200 output tokens "
                             "asked) exceeds the tenant's 1000; set max_tokens lower")
    assert str(error) == error.message
    assert error.headers == {"x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "0",
                             "x-ratelimit-reset-tokens": "50s", "x-ratelimit-limit-streams": "2",
                             "x-ratelimit-remaining-streams": "0"}


def test_a_request_of_exactly_tokens_per_minute_goes_to_the_store():
    store = FakeStore(Counted(0, 1, 1000))
    assert gate(store, tokens_per_minute=1000).admit("acme", 3600, 100) is not None  # 900 + 100: fits an empty minute
    assert len(store.admits) == 1


def test_a_request_without_max_tokens_is_charged_the_stages_default():
    store = FakeStore()
    with pytest.raises(Throttled) as refused:
        gate(store, tokens_per_minute=1000, default_max_tokens=950).admit("acme", 204)  # 51 + 950: 1,001
    assert store.admits == []
    assert refused.value.message == ("tokens_per_minute: this request alone (about 51 prompt tokens + 950 output "
                                     "tokens charged for a request without max_tokens) exceeds the tenant's 1000; "
                                     "set max_tokens lower")
    store = FakeStore(Counted(0, 1, 1000))
    assert gate(store, tokens_per_minute=1000, default_max_tokens=950).admit("acme", 200) is not None  # 50 + 950
    assert store.admits[0][3] == 1000


def test_a_stream_refusal_says_retry_in_one_second():
    limiter = gate(FakeStore(Refused("concurrent_streams")), requests_per_minute=60, concurrent_streams=4)
    with pytest.raises(Throttled) as refused:
        limiter.admit("acme", 100)
    error = refused.value
    assert (error.limit, error.value, error.retry_after_s) == ("concurrent_streams", 4, 1)
    assert error.message == "concurrent_streams: 4 streams of this tenant are in flight; retry when one ends"
    assert error.headers == {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "0",
                             "x-ratelimit-reset-requests": "50s", "x-ratelimit-limit-streams": "4",
                             "x-ratelimit-remaining-streams": "0"}


@pytest.mark.parametrize(("limit", "value"), [("requests_per_minute", 5), ("tokens_per_minute", 700)])
def test_a_minute_refusal_says_retry_at_the_next_minute(limit, value):
    limiter = gate(FakeStore(Refused(limit)), requests_per_minute=5, tokens_per_minute=700)
    with pytest.raises(Throttled) as refused:
        limiter.admit("acme", 100, 100)
    error = refused.value
    assert (error.limit, error.value, error.retry_after_s) == (limit, value, RESET)
    assert error.message == f"{limit}: the tenant's {value} for this minute are used; retry in 50 s"


def test_a_failing_store_open_serves_the_request_unchecked_and_says_so():
    store = FakeStore(RuntimeError("timeout"))
    admission = gate(store, concurrent_streams=1, requests_per_minute=5).admit("acme", 100)
    assert admission.store_error is True
    # The write may have been applied: the lease is kept to give back; no minute. The answer still says
    # the tenant's limits, that the store did not count it, and no remaining figure it cannot know.
    assert (admission.lease, admission.window) == ("lease-1", None)
    assert admission.headers == {"x-ratelimit-limit-requests": "5", "x-ratelimit-reset-requests": f"{RESET}s",
                                 "x-ratelimit-limit-streams": "1", "x-ratelimit-store": "unavailable"}
    assert admission.took_ms >= 0.0


def test_a_failing_store_closed_refuses_with_the_limits_headers():
    with pytest.raises(LimitsUnavailable, match="^the per-tenant limits could not be checked$") as refused:
        gate(FakeStore(RuntimeError("timeout")), on_store_error="closed", concurrent_streams=1).admit("acme", 100)
    assert refused.value.headers == {"x-ratelimit-limit-streams": "1", "x-ratelimit-store": "unavailable"}


def admitted(store, **limits) -> Admission:
    return gate(store, **limits).admit("acme", 400, 50)  # 100 tokens estimated, 50 asked


def test_finish_gives_the_lease_back_and_corrects_the_charge_in_one_call():
    store = FakeStore(Counted(1, 1, 150))
    limiter = gate(store, tokens_per_minute=1000, concurrent_streams=2)
    admission = limiter.admit("acme", 400, 50)  # 100 + 50 charged
    limiter.finish(admission, tokens_used=250)
    assert store.finishes == [("acme", "lease-1", WINDOW, 100)]
    assert admission.lease is None
    limiter.finish(admission, tokens_used=None)  # nothing held any more
    assert len(store.finishes) == 1


def test_finish_without_usage_gives_the_lease_back_only():
    store = FakeStore(Counted(1, 1, 100))
    limiter = gate(store, tokens_per_minute=1000, concurrent_streams=2)
    limiter.finish(limiter.admit("acme", 400, 50), tokens_used=None)
    assert store.finishes == [("acme", "lease-1", None, None)]


def test_finish_corrects_tokens_only_under_a_token_limit():
    store = FakeStore(Counted(1, 1, 100))
    limiter = gate(store, requests_per_minute=10, concurrent_streams=2)
    limiter.finish(limiter.admit("acme", 400), tokens_used=250)
    assert store.finishes == [("acme", "lease-1", None, None)]


def test_finish_with_usage_equal_to_the_charge_and_no_lease_writes_nothing():
    store = FakeStore(Counted(0, 1, 150), Counted(0, 2, 300))
    limiter = gate(store, tokens_per_minute=1000)
    limiter.finish(limiter.admit("acme", 400, 50), tokens_used=150)
    assert store.finishes == []
    limiter.finish(limiter.admit("acme", 400, 50), tokens_used=60)
    assert store.finishes == [("acme", None, WINDOW, -90)]


def test_finish_after_a_write_that_never_left_or_without_limits_writes_nothing():
    from botocore.exceptions import EndpointConnectionError

    store = FakeStore(EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))
    limiter = gate(store, tokens_per_minute=1000, concurrent_streams=1)
    limiter.finish(limiter.admit("acme", 400, 50), tokens_used=50)
    limiter.finish(None, tokens_used=50)
    assert store.finishes == []


def test_finish_after_an_unknown_store_error_gives_the_lease_back_and_books_no_tokens():
    store = FakeStore(RuntimeError("down"))  # it may have reached the table: the lease only, no minute
    limiter = gate(store, tokens_per_minute=1000, concurrent_streams=1)
    limiter.finish(limiter.admit("acme", 400, 50), tokens_used=50)
    assert store.finishes == [("acme", "lease-1", None, None)]


def test_finish_never_raises_and_forgets_the_lease():
    store = FakeStore(Counted(1, 0, 0))
    store.finish_error = RuntimeError("down")
    limiter = gate(store, concurrent_streams=1)
    admission = limiter.admit("acme", 400)
    limiter.finish(admission, tokens_used=None)
    assert store.finishes == [("acme", "lease-1", None, None)] and admission.lease is None


def test_the_default_lease_ids_are_fresh():
    limiter = Limiter(LimitSettings(default=TenantLimits(concurrent_streams=9)), FakeStore())
    ids = {limiter.new_lease() for _ in range(50)}
    assert len(ids) == 50 and all(len(i) == 16 for i in ids)


# --- admit_request: the answer and the log line ----------------------------------------------------------


def record_and_state():
    return SimpleNamespace(limit_rule=None, throttled_by=None, origin=None, limiter_ms=None,
                           limiter_store_error=None), SimpleNamespace(admission="unset", limit_headers=None)


def test_admit_request_notes_the_rule_and_time_of_an_admitted_request():
    record, state = record_and_state()
    limiter = gate(FakeStore(Counted(1, 0, 0)), tenants=(("acme", TenantLimits(concurrent_streams=3)),))
    assert admit_request(limiter, "acme", b"x" * 100, record, state) is None
    assert state.admission.lease == "lease-1"
    assert (record.limit_rule, record.limiter_store_error, record.throttled_by) == ("acme", False, None)
    assert record.limiter_ms == state.admission.took_ms
    assert state.limit_headers == {"x-ratelimit-limit-streams": "3", "x-ratelimit-remaining-streams": "2"}


def test_admit_request_of_an_unlimited_tenant_notes_nothing():
    record, state = record_and_state()
    assert admit_request(gate(FakeStore()), "acme", b"x" * 100, record, state) is None
    assert state.admission is None and state.limit_headers is None
    assert (record.limit_rule, record.limiter_ms, record.limiter_store_error) == (None, None, None)


def test_admit_request_answers_429_with_retry_after():
    record, state = record_and_state()
    limiter = gate(FakeStore(Refused("concurrent_streams")), tenants=(("ac*", TenantLimits(concurrent_streams=4)),))
    status, code, body, headers = admit_request(limiter, "acme", b"x" * 100, record, state)
    assert (status, code) == (429, "rate_limited")
    assert body == {"error": {"code": "rate_limited", "status": 429, "limit": "concurrent_streams",
                              "retry_after_s": 1, "message": "concurrent_streams: 4 streams of this tenant are in "
                                                             "flight; retry when one ends"}}
    assert headers == {"retry-after": "1", "x-ratelimit-limit-streams": "4", "x-ratelimit-remaining-streams": "0"}
    assert (record.limit_rule, record.throttled_by, record.origin) == ("ac*", "concurrent_streams", "client")


def test_admit_request_with_the_store_down_and_closed_answers_503():
    record, state = record_and_state()
    limiter = gate(FakeStore(OSError("down")), on_store_error="closed", concurrent_streams=1)
    status, code, body, headers = admit_request(limiter, "acme", b"x" * 100, record, state)
    assert (status, code) == (503, "limits_unavailable")
    assert headers == {"x-ratelimit-limit-streams": "1", "x-ratelimit-store": "unavailable"}
    assert body == {"error": {"code": "limits_unavailable", "status": 503,
                              "message": "the per-tenant limits could not be checked: the request is refused "
                                         "until they can"}}
    assert (record.limiter_store_error, record.origin) == (True, "internal")


def test_admit_request_with_the_store_down_and_open_notes_the_error():
    record, state = record_and_state()
    limiter = gate(FakeStore(OSError("down")), concurrent_streams=1)
    assert admit_request(limiter, "acme", b"x" * 100, record, state) is None
    assert (record.limit_rule, record.limiter_store_error) == ("default", True)
    assert state.limit_headers == {"x-ratelimit-limit-streams": "1", "x-ratelimit-store": "unavailable"}


# --- DynamoLimitStore's writes, checked with botocore's Stubber ------------------------------------------
# Hand-computed: the minute of NOW ends at 1,796,000,040; an item is kept 600 s after the later of
# that and its newest lease's expiry (NOW + lease_s).


@pytest.fixture
def stubbed():
    client = limits_client("http://127.0.0.1:9", 200)  # never reached: the stubber answers
    with Stubber(client) as stub:
        yield DynamoLimitStore(client, TABLE), stub
        stub.assert_no_pending_responses()


def write(update, condition, names, values):
    return {"TableName": TABLE, "Key": KEY, "UpdateExpression": update, "ConditionExpression": condition,
            "ExpressionAttributeNames": names, "ExpressionAttributeValues": values, "ReturnValues": "ALL_NEW"}


def n(text):
    return {"N": text}


def attributes(leases=None, win=None, r=None, tk=None):
    item = {"pk": {"S": "tenant#acme"}}
    if leases is not None:
        item["leases"] = {"M": {name: n(value) for name, value in leases.items()}}
    for name, value in (("win", win), ("r", r), ("tk", tk)):
        if value is not None:
            item[name] = n(str(value))
    return item


def failed(stub, params):
    stub.add_client_error("update_item", service_error_code="ConditionalCheckFailedException", expected_params=params)


def read(stub, item):
    stub.add_response("get_item", {"Item": item} if item is not None else {},
                      {"TableName": TABLE, "Key": KEY, "ConsistentRead": True})


STREAMS_2 = TenantLimits(concurrent_streams=2)
LEASE_WRITE = write("SET #t = :keep, leases.#l = :e", "size(leases) < :streams", {"#t": "expires_at", "#l": "L1"},
                    {":keep": n("1796000650.0"), ":e": n("1796000050.0"), ":streams": n("2")})


def test_a_lease_is_one_conditional_write_on_the_number_of_leases(stubbed):
    store, stub = stubbed
    stub.add_response("update_item", {"Attributes": attributes({"L0": "1796000000.0", "L1": "1796000050.0"})},
                      LEASE_WRITE)
    assert store.admit("acme", STREAMS_2, "L1", 100, NOW, 60) == Counted(2, 0, 0)


MINUTE = TenantLimits(requests_per_minute=5, tokens_per_minute=1000)
FIRST_OF_MINUTE = write("SET #t = :keep, win = :w, r = :one, tk = :est", "(attribute_not_exists(win) OR win < :w)",
                        {"#t": "expires_at"},
                        {":keep": n("1796000640.0"), ":w": n("29933333"), ":one": n("1"), ":est": n("100")})


def same_minute(estimate, conditions="win = :w AND r < :rl AND tk <= :tl", **extra):
    values = {":keep": n("1796000640.0"), ":w": n("29933333"), ":one": n("1"), ":est": n(str(estimate)), **extra}
    return write("SET #t = :keep ADD r :one, tk :est", conditions, {"#t": "expires_at"}, values)


def test_the_first_request_of_a_minute_starts_its_counts_and_the_next_ones_add_to_them(stubbed):
    store, stub = stubbed
    stub.add_response("update_item", {"Attributes": attributes(win=WINDOW, r=1, tk=100)}, FIRST_OF_MINUTE)
    stub.add_response("update_item", {"Attributes": attributes(win=WINDOW, r=2, tk=150)},
                      same_minute(50, **{":rl": n("5"), ":tl": n("950")}))
    # the next minute (1,796,000,040 .. 1,796,000,099): its first request starts the counts again
    later = NOW + 60
    stub.add_response("update_item", {"Attributes": attributes(win=WINDOW + 1, r=1, tk=40)},
                      write("SET #t = :keep, win = :w, r = :one, tk = :est", "(attribute_not_exists(win) OR win < :w)",
                            {"#t": "expires_at"},
                            {":keep": n("1796000700.0"), ":w": n("29933334"), ":one": n("1"), ":est": n("40")}))
    assert store.admit("acme", MINUTE, None, 100, NOW, 10) == Counted(0, 1, 100)
    assert store.admit("acme", MINUTE, None, 50, NOW + 5, 10) == Counted(0, 2, 150)
    assert store.admit("acme", MINUTE, None, 40, later, 10) == Counted(0, 1, 40)


@pytest.mark.parametrize(("limits", "conditions", "extra"), [
    (TenantLimits(requests_per_minute=7), "win = :w AND r < :rl", {":rl": n("7")}),
    (TenantLimits(tokens_per_minute=300), "win = :w AND tk <= :tl", {":tl": n("200")}),
])
def test_a_minute_limit_alone_conditions_on_itself_only(stubbed, limits, conditions, extra):
    store, stub = stubbed
    first = dict(FIRST_OF_MINUTE, ExpressionAttributeValues=dict(FIRST_OF_MINUTE["ExpressionAttributeValues"],
                                                                 **{":est": n("100")}))
    stub.add_response("update_item", {"Attributes": attributes(win=WINDOW, r=1, tk=100)}, first)
    stub.add_response("update_item", {"Attributes": attributes(win=WINDOW, r=2, tk=200)},
                      same_minute(100, conditions, **extra))
    store.admit("acme", limits, None, 100, NOW, 10)
    assert store.admit("acme", limits, None, 100, NOW, 10) == Counted(0, 2, 200)


def test_lease_and_minute_are_one_write(stubbed):
    store, stub = stubbed
    limits = TenantLimits(requests_per_minute=5, concurrent_streams=2)
    stub.add_response("update_item", {"Attributes": attributes({"L1": "1796000050.0"}, WINDOW, 1, 25)},
                      write("SET #t = :keep, leases.#l = :e, win = :w, r = :one, tk = :est",
                            "size(leases) < :streams AND (attribute_not_exists(win) OR win < :w)",
                            {"#t": "expires_at", "#l": "L1"},
                            {":keep": n("1796000650.0"), ":e": n("1796000050.0"), ":streams": n("2"),
                             ":w": n("29933333"), ":one": n("1"), ":est": n("25")}))
    assert store.admit("acme", limits, "L1", 25, NOW, 60) == Counted(1, 1, 25)


def test_without_any_limit_the_write_only_needs_the_item(stubbed):
    store, stub = stubbed
    stub.add_response("update_item", {"Attributes": attributes()},
                      write("SET #t = :keep", "attribute_exists(pk)", {"#t": "expires_at"},
                            {":keep": n("1796000640.0")}))
    assert store.admit("acme", TenantLimits(), None, 1, NOW, 10) == Counted(0, 0, 0)


def created(lease, estimate):
    leases = {"L1": n("1796000050.0")} if lease else {}
    return {"TableName": TABLE, "ConditionExpression": "attribute_not_exists(#k)",
            "ExpressionAttributeNames": {"#k": "pk"},
            "Item": {"pk": {"S": "tenant#acme"}, "expires_at": n("1796000650.0"), "leases": {"M": leases},
                     "win": n("29933333"), "r": n("1"), "tk": n(str(estimate))}}


def test_a_tenants_first_request_creates_its_item(stubbed):
    store, stub = stubbed
    limits = TenantLimits(requests_per_minute=5, concurrent_streams=2)
    first = write("SET #t = :keep, leases.#l = :e, win = :w, r = :one, tk = :est",
                  "size(leases) < :streams AND (attribute_not_exists(win) OR win < :w)",
                  {"#t": "expires_at", "#l": "L1"},
                  {":keep": n("1796000650.0"), ":e": n("1796000050.0"), ":streams": n("2"),
                   ":w": n("29933333"), ":one": n("1"), ":est": n("30")})
    failed(stub, first)  # size(leases) of no item: the condition fails
    read(stub, None)
    stub.add_response("put_item", {}, created(True, 30))
    assert store.admit("acme", limits, "L1", 30, NOW, 60) == Counted(1, 1, 30)
    # it has seen this minute now: the next request adds to it
    stub.add_response("update_item", {"Attributes": attributes({"L1": "1796000050.0", "L2": "1796000050.0"},
                                                               WINDOW, 2, 60)},
                      write("SET #t = :keep, leases.#l = :e ADD r :one, tk :est",
                            "size(leases) < :streams AND win = :w AND r < :rl",
                            {"#t": "expires_at", "#l": "L2"},
                            {":keep": n("1796000650.0"), ":e": n("1796000050.0"), ":streams": n("2"),
                             ":w": n("29933333"), ":one": n("1"), ":est": n("30"), ":rl": n("5")}))
    assert store.admit("acme", limits, "L2", 30, NOW, 60) == Counted(2, 2, 60)


def test_a_first_request_without_a_lease_creates_an_empty_lease_map(stubbed):
    store, stub = stubbed
    limits = TenantLimits(requests_per_minute=5)
    params = dict(FIRST_OF_MINUTE, ExpressionAttributeValues=dict(FIRST_OF_MINUTE["ExpressionAttributeValues"],
                                                                  **{":keep": n("1796000650.0")}))
    failed(stub, params)
    read(stub, None)
    stub.add_response("put_item", {}, created(False, 100))
    assert store.admit("acme", limits, None, 100, NOW, 60) == Counted(0, 1, 100)


def test_another_environment_creating_the_item_first_means_writing_again(stubbed):
    store, stub = stubbed
    failed(stub, LEASE_WRITE)
    read(stub, None)
    stub.add_client_error("put_item", service_error_code="ConditionalCheckFailedException",
                          expected_params={**created(True, 100), "Item": {
                              "pk": {"S": "tenant#acme"}, "expires_at": n("1796000650.0"),
                              "leases": {"M": {"L1": n("1796000050.0")}}, "win": n("29933333"), "r": n("1"),
                              "tk": n("100")}})
    stub.add_response("update_item", {"Attributes": attributes({"X": "1796000000.0", "L1": "1796000050.0"})},
                      LEASE_WRITE)
    assert store.admit("acme", STREAMS_2, "L1", 100, NOW, 60) == Counted(2, 0, 0)


def test_the_read_after_a_failed_write_refuses_over_the_minutes_limit(stubbed):
    store, stub = stubbed
    stub.add_response("update_item", {"Attributes": attributes(win=WINDOW, r=1, tk=100)}, FIRST_OF_MINUTE)
    failed(stub, same_minute(100, **{":rl": n("5"), ":tl": n("900")}))
    read(stub, attributes(win=WINDOW, r=5, tk=500))
    store.admit("acme", MINUTE, None, 100, NOW, 10)
    assert store.admit("acme", MINUTE, None, 100, NOW, 10) == Refused("requests_per_minute")


def test_the_read_after_a_failed_write_refuses_over_the_tokens(stubbed):
    store, stub = stubbed
    failed(stub, FIRST_OF_MINUTE)
    read(stub, attributes(win=WINDOW, r=1, tk=901))  # 901 + 100 > 1,000
    assert store.admit("acme", MINUTE, None, 100, NOW, 10) == Refused("tokens_per_minute")


def test_an_earlier_minutes_counts_do_not_refuse_and_the_write_starts_the_minute_again(stubbed):
    store, stub = stubbed
    stub.add_response("update_item", {"Attributes": attributes(win=WINDOW, r=1, tk=100)}, FIRST_OF_MINUTE)
    failed(stub, same_minute(100, **{":rl": n("5"), ":tl": n("900")}))
    read(stub, attributes(win=WINDOW - 1, r=5, tk=1000))  # the item says: last minute, full
    stub.add_response("update_item", {"Attributes": attributes(win=WINDOW, r=1, tk=100)}, FIRST_OF_MINUTE)
    store.admit("acme", MINUTE, None, 100, NOW, 10)
    assert store.admit("acme", MINUTE, None, 100, NOW, 10) == Counted(0, 1, 100)


def test_a_refusal_by_streams_remembers_the_item_had_no_minute(stubbed):
    store, stub = stubbed
    limits = TenantLimits(requests_per_minute=5, concurrent_streams=1)
    ahead = NOW + 60  # the environment thinks the minute is a later one ...
    first = write("SET #t = :keep, leases.#l = :e, win = :w, r = :one, tk = :est",
                  "size(leases) < :streams AND (attribute_not_exists(win) OR win < :w)",
                  {"#t": "expires_at", "#l": "L1"},
                  {":keep": n("1796000710.0"), ":e": n("1796000110.0"), ":streams": n("1"),
                   ":w": n("29933334"), ":one": n("1"), ":est": n("10")})
    failed(stub, first)
    read(stub, attributes({"L0": "1796000500.0"}))  # one stream held, no minute counted yet
    assert store.admit("acme", limits, "L1", 10, ahead, 60) == Refused("concurrent_streams")
    # ... and after the refusal its next request still starts the minute (the item held none)
    stub.add_response("update_item", {"Attributes": attributes({"L1": "1796000110.0"}, WINDOW + 1, 1, 10)}, first)
    assert store.admit("acme", limits, "L1", 10, ahead, 60) == Counted(1, 1, 10)


def test_expired_leases_are_removed_when_the_map_is_full(stubbed):
    store, stub = stubbed
    failed(stub, LEASE_WRITE)
    read(stub, attributes({"dead": "1795999990.0", "live": "1796000100.0"}))  # the first expires at NOW exactly
    stub.add_response("update_item", {}, {
        "TableName": TABLE, "Key": KEY, "UpdateExpression": "REMOVE leases.#x0",
        "ConditionExpression": "leases.#x0 = :x0", "ExpressionAttributeNames": {"#x0": "dead"},
        "ExpressionAttributeValues": {":x0": n("1795999990.0")}})
    stub.add_response("update_item", {"Attributes": attributes({"live": "1796000100.0", "L1": "1796000050.0"})},
                      LEASE_WRITE)
    assert store.admit("acme", STREAMS_2, "L1", 100, NOW, 60) == Counted(2, 0, 0)


def test_two_expired_leases_go_in_one_write_each_only_if_unchanged(stubbed):
    store, stub = stubbed
    failed(stub, LEASE_WRITE)
    read(stub, attributes({"a": "1795999000.0", "b": "1795999500.5"}))
    stub.add_client_error("update_item", service_error_code="ConditionalCheckFailedException", expected_params={
        "TableName": TABLE, "Key": KEY, "UpdateExpression": "REMOVE leases.#x0, leases.#x1",
        "ConditionExpression": "leases.#x0 = :x0 AND leases.#x1 = :x1",
        "ExpressionAttributeNames": {"#x0": "a", "#x1": "b"},
        "ExpressionAttributeValues": {":x0": n("1795999000.0"), ":x1": n("1795999500.5")}})  # someone renewed one
    stub.add_response("update_item", {"Attributes": attributes({"L1": "1796000050.0"})}, LEASE_WRITE)
    assert store.admit("acme", STREAMS_2, "L1", 100, NOW, 60) == Counted(1, 0, 0)


def test_expired_leases_stay_while_the_map_has_room(stubbed):
    store, stub = stubbed
    limits = TenantLimits(concurrent_streams=3)
    params = dict(LEASE_WRITE, ExpressionAttributeValues=dict(LEASE_WRITE["ExpressionAttributeValues"],
                                                              **{":streams": n("3")}))
    failed(stub, params)
    read(stub, attributes({"a": "1795999000.0", "b": "1796000100.0"}))
    stub.add_response("update_item", {"Attributes": attributes({"a": "1795999000.0", "b": "1796000100.0",
                                                                "L1": "1796000050.0"})}, params)
    assert store.admit("acme", limits, "L1", 100, NOW, 60) == Counted(3, 0, 0)


def test_a_full_map_of_live_leases_refuses(stubbed):
    store, stub = stubbed
    failed(stub, LEASE_WRITE)
    read(stub, attributes({"a": "1795999990.001", "b": "1796000100.0"}))
    assert store.admit("acme", STREAMS_2, "L1", 100, NOW, 60) == Refused("concurrent_streams")


ADD_MAP = {"TableName": TABLE, "Key": KEY, "UpdateExpression": "SET leases = if_not_exists(leases, :m)",
           "ExpressionAttributeValues": {":m": {"M": {}}}}


def test_an_item_without_a_lease_map_gets_one_then_the_lease(stubbed):
    store, stub = stubbed
    # the path leases.#l is invalid until the map exists: DynamoDB answers ValidationException
    stub.add_client_error("update_item", service_error_code="ValidationException", expected_params=LEASE_WRITE)
    stub.add_response("update_item", {}, ADD_MAP)
    read(stub, attributes({}, WINDOW, 3, 30))
    stub.add_response("update_item", {"Attributes": attributes({"L1": "1796000050.0"}, WINDOW, 3, 30)}, LEASE_WRITE)
    assert store.admit("acme", STREAMS_2, "L1", 100, NOW, 60) == Counted(1, 3, 30)


def test_the_read_finding_no_lease_map_adds_one(stubbed):
    store, stub = stubbed
    failed(stub, LEASE_WRITE)
    read(stub, attributes(win=WINDOW, r=3, tk=30))
    stub.add_response("update_item", {}, ADD_MAP)
    stub.add_response("update_item", {"Attributes": attributes({"L1": "1796000050.0"})}, LEASE_WRITE)
    assert store.admit("acme", STREAMS_2, "L1", 100, NOW, 60) == Counted(1, 0, 0)


def test_other_store_errors_are_raised(stubbed):
    store, stub = stubbed
    params = dict(FIRST_OF_MINUTE)
    stub.add_client_error("update_item", service_error_code="ValidationException", expected_params=params)
    with pytest.raises(store.client.exceptions.ClientError):
        store.admit("acme", MINUTE, None, 100, NOW, 10)  # no lease: not the missing map
    stub.add_client_error("update_item", service_error_code="ProvisionedThroughputExceededException",
                          expected_params=LEASE_WRITE)
    with pytest.raises(store.client.exceptions.ClientError):
        store.admit("acme", STREAMS_2, "L1", 100, NOW, 60)


def test_four_lost_races_are_a_store_error(stubbed):
    store, stub = stubbed
    for _ in range(4):
        failed(stub, LEASE_WRITE)
        read(stub, attributes({"x": "1796000100.0"}))  # room for one more every time, and every time lost
    with pytest.raises(RuntimeError, match=r"^tenant acme: no admission after 4 writes \(contention\)$"):
        store.admit("acme", STREAMS_2, "L1", 100, NOW, 60)


def test_finish_frees_the_lease_and_corrects_the_tokens_in_one_write(stubbed):
    store, stub = stubbed
    stub.add_response("update_item", {}, {
        "TableName": TABLE, "Key": KEY, "UpdateExpression": "REMOVE leases.#l ADD tk :d",
        "ConditionExpression": "win = :w", "ExpressionAttributeNames": {"#l": "L1"},
        "ExpressionAttributeValues": {":d": n("150"), ":w": n("29933333")}})
    store.finish("acme", "L1", WINDOW, 150)


def test_finish_in_a_new_minute_only_frees_the_lease(stubbed):
    store, stub = stubbed
    stub.add_client_error("update_item", service_error_code="ConditionalCheckFailedException", expected_params={
        "TableName": TABLE, "Key": KEY, "UpdateExpression": "REMOVE leases.#l ADD tk :d",
        "ConditionExpression": "win = :w", "ExpressionAttributeNames": {"#l": "L1"},
        "ExpressionAttributeValues": {":d": n("-20"), ":w": n("29933333")}})
    stub.add_response("update_item", {}, {"TableName": TABLE, "Key": KEY, "UpdateExpression": "REMOVE leases.#l",
                                          "ExpressionAttributeNames": {"#l": "L1"}})
    store.finish("acme", "L1", WINDOW, -20)


def test_finish_without_a_lease_corrects_the_tokens_only(stubbed):
    store, stub = stubbed
    params = {"TableName": TABLE, "Key": KEY, "UpdateExpression": "ADD tk :d", "ConditionExpression": "win = :w",
              "ExpressionAttributeValues": {":d": n("7"), ":w": n("29933333")}}
    stub.add_response("update_item", {}, params)
    store.finish("acme", None, WINDOW, 7)
    stub.add_client_error("update_item", service_error_code="ConditionalCheckFailedException", expected_params=params)
    store.finish("acme", None, WINDOW, 7)  # a new minute: nothing else to write


@pytest.mark.parametrize(("window", "delta"), [(None, None), (WINDOW, 0), (None, 40)])
def test_finish_without_a_correction_frees_the_lease_only(stubbed, window, delta):
    store, stub = stubbed
    stub.add_response("update_item", {}, {"TableName": TABLE, "Key": KEY, "UpdateExpression": "REMOVE leases.#l",
                                          "ExpressionAttributeNames": {"#l": "L1"}})
    store.finish("acme", "L1", window, delta)


def test_the_items_numbers_are_read_leniently():
    assert (_int({"N": "3.0"}), _int({"N": "12"}), _int(None), _int(None, -1)) == (3, 12, 0, -1)
    assert (_int({"S": "3"}, 5), _int({"N": "x"}, 5), _int({"N": None}, 5)) == (5, 5, 5)
    assert _leases({"leases": {"M": {"a": n("5.5"), "b": {"S": "x"}, "c": {"N": "bad"}}}}) == {
        "a": 5.5, "b": 0.0, "c": 0.0}  # unreadable leases count as expired
    assert _leases(None) == {} and _leases({"leases": {"M": None}}) == {} and _leases({}) == {}
    assert (_num(1.23456), _num(10), _num(1795999990.0)) == ("1.235", "10.0", "1795999990.0")


def test_an_earlier_minute_counts_nothing_against_a_limit_of_one(stubbed):
    store, stub = stubbed
    one = TenantLimits(requests_per_minute=1, tokens_per_minute=100)
    first = write("SET #t = :keep, win = :w, r = :one, tk = :est", "(attribute_not_exists(win) OR win < :w)",
                  {"#t": "expires_at"}, {":keep": n("1796000640.0"), ":w": n("29933333"), ":one": n("1"),
                                         ":est": n("100")})
    failed(stub, first)  # lost a race ...
    read(stub, attributes(win=WINDOW - 1, r=1, tk=100))  # ... but the item's counts are last minute's
    stub.add_response("update_item", {"Attributes": attributes(win=WINDOW, r=1, tk=100)}, first)
    assert store.admit("acme", one, None, 100, NOW, 10) == Counted(0, 1, 100)


def test_a_lost_race_in_the_same_minute_with_room_adds_to_it(stubbed):
    store, stub = stubbed
    stub.add_response("update_item", {"Attributes": attributes(win=WINDOW, r=1, tk=100)}, FIRST_OF_MINUTE)
    add = same_minute(100, **{":rl": n("5"), ":tl": n("900")})
    failed(stub, add)  # another environment wrote between
    read(stub, attributes(win=WINDOW, r=2, tk=200))  # still room: 2 of 5, 200 + 100 of 1,000
    stub.add_response("update_item", {"Attributes": attributes(win=WINDOW, r=3, tk=300)}, add)
    store.admit("acme", MINUTE, None, 100, NOW, 10)
    assert store.admit("acme", MINUTE, None, 100, NOW, 10) == Counted(0, 3, 300)


def test_an_answer_without_attributes_counts_nothing(stubbed):
    store, stub = stubbed
    stub.add_response("update_item", {}, LEASE_WRITE)
    assert store.admit("acme", STREAMS_2, "L1", 100, NOW, 60) == Counted(0, 0, 0)


def test_the_minutes_seen_are_forgotten_at_ten_thousand_tenants(stubbed):
    store, stub = stubbed
    stub.add_response("update_item", {"Attributes": attributes(win=WINDOW, r=1, tk=100)}, FIRST_OF_MINUTE)
    store.admit("acme", MINUTE, None, 100, NOW, 10)  # acme's minute is known here: its next write adds
    store._minute_seen.update({f"t{i}": WINDOW for i in range(9_999)})  # 10,000 tenants seen: the bound
    other = {**FIRST_OF_MINUTE, "Key": {"pk": {"S": "tenant#new"}}}
    stub.add_response("update_item", {"Attributes": attributes(win=WINDOW, r=1, tk=100)}, other)
    store.admit("new", MINUTE, None, 100, NOW, 10)  # one more: what was seen is forgotten first
    assert len(store._minute_seen) == 1
    stub.add_response("update_item", {"Attributes": attributes(win=WINDOW, r=2, tk=200)}, FIRST_OF_MINUTE)
    assert store.admit("acme", MINUTE, None, 100, NOW, 10) == Counted(0, 2, 200)  # starts the minute again


def test_the_admissions_time_is_measured_around_the_store_call():
    import time

    for answer in (Counted(1, 0, 0), RuntimeError("down")):
        limiter = gate(FakeStore(answer), concurrent_streams=1)
        started = time.perf_counter()
        admission = limiter.admit("acme", 100)
        assert 0.0 <= admission.took_ms <= (time.perf_counter() - started) * 1000.0


def test_a_created_item_is_kept_past_the_minutes_end_when_its_lease_ends_sooner(stubbed):
    store, stub = stubbed
    failed(stub, FIRST_OF_MINUTE)
    read(stub, None)
    item = created(False, 100)
    item["Item"]["expires_at"] = n("1796000640.0")  # 1,796,000,040 (the minute's end) + 600; the lease: NOW + 10
    stub.add_response("put_item", {}, item)
    assert store.admit("acme", MINUTE, None, 100, NOW, 10) == Counted(0, 1, 100)


class Ticks:
    """A stand-in for time.perf_counter: 10 s, then 10.25 s."""

    def __init__(self):
        self.values = iter([10.0, 10.25])

    def __call__(self):
        return next(self.values)


@pytest.mark.parametrize("answer", [Counted(1, 0, 0), RuntimeError("down")])
def test_the_admissions_time_is_in_milliseconds(monkeypatch, answer):
    import time

    limiter = gate(FakeStore(answer), concurrent_streams=1)
    monkeypatch.setattr(time, "perf_counter", Ticks())
    admission = limiter.admit("acme", 100)
    monkeypatch.undo()
    assert admission.took_ms == 250.0


def test_a_minute_refusal_carries_the_minutes_headers():
    limiter = gate(FakeStore(Refused("requests_per_minute")), requests_per_minute=5, concurrent_streams=2)
    with pytest.raises(Throttled) as refused:
        limiter.admit("acme", 100)
    assert refused.value.headers == {"x-ratelimit-limit-requests": "5", "x-ratelimit-remaining-requests": "0",
                                     "x-ratelimit-reset-requests": "50s", "x-ratelimit-limit-streams": "2",
                                     "x-ratelimit-remaining-streams": "0"}


def test_a_refusal_remembers_the_minute_the_item_holds(stubbed):
    store, stub = stubbed
    limits = TenantLimits(requests_per_minute=5, concurrent_streams=1)

    def lease_write(lease, first):
        if first:
            return write("SET #t = :keep, leases.#l = :e, win = :w, r = :one, tk = :est",
                         "size(leases) < :streams AND (attribute_not_exists(win) OR win < :w)",
                         {"#t": "expires_at", "#l": lease},
                         {":keep": n("1796000650.0"), ":e": n("1796000050.0"), ":streams": n("1"),
                          ":w": n("29933333"), ":one": n("1"), ":est": n("10")})
        return write("SET #t = :keep, leases.#l = :e ADD r :one, tk :est",
                     "size(leases) < :streams AND win = :w AND r < :rl", {"#t": "expires_at", "#l": lease},
                     {":keep": n("1796000650.0"), ":e": n("1796000050.0"), ":streams": n("1"),
                      ":w": n("29933333"), ":one": n("1"), ":est": n("10"), ":rl": n("5")})

    stub.add_response("update_item", {"Attributes": attributes({"L1": "1796000050.0"}, WINDOW, 1, 10)},
                      lease_write("L1", True))
    assert store.admit("acme", limits, "L1", 10, NOW, 60) == Counted(1, 1, 10)  # this minute, seen here
    failed(stub, lease_write("L2", False))
    read(stub, attributes({"X": "1796000500.0"}, WINDOW - 1, 3, 30))  # the item: a live stream, last minute
    assert store.admit("acme", limits, "L2", 10, NOW, 60) == Refused("concurrent_streams")
    # what was seen is now the item's minute, an earlier one: the next write starts this minute
    stub.add_response("update_item", {"Attributes": attributes({"L3": "1796000050.0"}, WINDOW, 1, 10)},
                      lease_write("L3", True))
    assert store.admit("acme", limits, "L3", 10, NOW, 60) == Counted(1, 1, 10)


class _FailingStore:
    """Admits nothing: each write fails with ``error``, which a real store may have applied all the same."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.released: list[tuple] = []

    def admit(self, *args, **kwargs):
        raise self.error

    def finish(self, tenant, lease, window, tokens_delta):
        self.released.append((tenant, lease, window, tokens_delta))


def _read_timeout():
    from botocore.exceptions import ReadTimeoutError
    return ReadTimeoutError(endpoint_url="http://127.0.0.1:1")


def _not_connected():
    from botocore.exceptions import EndpointConnectionError
    return EndpointConnectionError(endpoint_url="http://127.0.0.1:1")


@pytest.mark.parametrize("on_store_error", ["open", "closed"])
def test_a_lease_whose_write_timed_out_is_given_back_all_the_same(on_store_error):
    # The write may have reached the table after the client gave up: left there, it would hold a slot
    # until its lease expires.
    store = _FailingStore(_read_timeout())
    settings = LimitSettings(default=TenantLimits(concurrent_streams=2), on_store_error=on_store_error)
    gate = Limiter(settings, store, clock=lambda: 1_795_999_990.0, new_lease=lambda: "lease-1")
    if on_store_error == "open":
        admission = gate.admit("acme", 10)
        assert admission.store_error and store.released == []  # served; given back when the answer ends
        gate.finish(admission, tokens_used=99)
    else:
        with pytest.raises(LimitsUnavailable):
            gate.admit("acme", 10)
    assert store.released == [("acme", "lease-1", None, None)]  # the lease only: no minute was counted


def test_a_write_that_never_left_is_not_given_back():
    store = _FailingStore(_not_connected())
    gate = Limiter(LimitSettings(default=TenantLimits(concurrent_streams=2)), store, clock=lambda: 1_795_999_990.0,
                   new_lease=lambda: "lease-1")
    gate.finish(gate.admit("acme", 10), tokens_used=None)
    assert store.released == []


def test_the_release_goes_through_the_release_client():
    class Client:
        def __init__(self):
            self.calls = []

        def update_item(self, **params):
            self.calls.append(params)

    admit, release = Client(), Client()
    store = DynamoLimitStore(admit, "t", release_client=release)
    store.finish("acme", "lease-1", None, None)
    assert admit.calls == [] and len(release.calls) == 1
    assert release.calls[0]["UpdateExpression"] == "REMOVE leases.#l"
    assert DynamoLimitStore(admit, "t").release_client is admit  # one client serves both when none is given


# --- leases renewed while an answer streams ---------------------------------------------------------------


def test_a_renewal_moves_the_leases_expiry_and_the_items_only_if_the_lease_is_still_there(stubbed):
    store, stub = stubbed
    params = {"TableName": TABLE, "Key": KEY, "UpdateExpression": "SET leases.#l = :e, #t = :keep",
              "ConditionExpression": "attribute_exists(leases.#l)",
              "ExpressionAttributeNames": {"#l": "L1", "#t": "expires_at"},
              "ExpressionAttributeValues": {":e": n("1796000020.0"), ":keep": n("1796000620.0")}}
    stub.add_response("update_item", {}, params)
    assert store.renew("acme", "L1", NOW + 30) is True
    stub.add_client_error("update_item", service_error_code="ConditionalCheckFailedException", expected_params=params)
    assert store.renew("acme", "L1", NOW + 30) is False  # expired and cleaned, or given back: not brought back
    stub.add_client_error("update_item", service_error_code="ProvisionedThroughputExceededException",
                          expected_params=params)
    with pytest.raises(store.client.exceptions.ClientError):
        store.renew("acme", "L1", NOW + 30)  # a store error: the renewer tries again later


def test_an_admitted_stream_is_renewed_until_it_is_finished():
    store = FakeStore(Counted(1, 0, 0))
    limiter = gate(store, concurrent_streams=2)
    admission = limiter.admit("acme", 100)
    assert limiter.renewer.held == 1
    limiter.finish(admission, tokens_used=None)
    assert limiter.renewer.held == 0 and store.finishes == [("acme", "lease-1", None, None)]


def test_a_stream_refused_or_unchecked_holds_nothing_to_renew():
    refused = gate(FakeStore(Refused("concurrent_streams")), concurrent_streams=1)
    with pytest.raises(Throttled):
        refused.admit("acme", 100)
    unchecked = gate(FakeStore(RuntimeError("timeout")), concurrent_streams=1)
    admission = unchecked.admit("acme", 100)
    # The write may have reached the table: given back at the end, but never renewed (it expires on its own).
    assert admission.lease == "lease-1" and unchecked.renewer.held == 0
    minute_only = gate(FakeStore(Counted(0, 1, 0)), requests_per_minute=5)
    minute_only.admit("acme", 100)
    assert minute_only.renewer.held == 0


def test_the_default_renewer_renews_through_the_store_with_the_stages_lease():
    store = FakeStore(Counted(1, 0, 0))
    limiter = Limiter(LimitSettings(default=TenantLimits(concurrent_streams=2), lease_s=12), store,
                      clock=lambda: NOW, new_lease=lambda: "lease-9")
    assert (limiter.renewer.lease_s, limiter.renewer.interval_s) == (12, 4.0)
    limiter.renewer._renew("acme", "lease-9", NOW + 12)
    assert store.renews == [("acme", "lease-9", NOW + 12)]


# --- admit_request reads the output a body asks for ------------------------------------------------------


def test_admit_request_charges_the_output_the_body_asks_for():
    import json

    record, state = record_and_state()
    store = FakeStore(Counted(0, 1, 0), Counted(0, 1, 0), Counted(0, 1, 0))
    limiter = gate(store, tokens_per_minute=5000, default_max_tokens=700)
    body = json.dumps({"prompt": "x" * 390, "max_tokens": 300}).encode()  # 423 bytes: 105 tokens
    assert admit_request(limiter, "acme", body, record, state) is None
    assert store.admits[-1][3] == 105 + 300
    body = json.dumps({"prompt": "x" * 390}).encode()  # 404 bytes: 101 tokens, no max_tokens
    admit_request(limiter, "acme", body, record, state)
    assert store.admits[-1][3] == 101 + 700
    admit_request(limiter, "acme", b"\xff not json", record, state)  # 11 bytes: 2 tokens; the default charged
    assert store.admits[-1][3] == 2 + 700


def test_admit_request_reads_the_body_only_under_a_token_limit(monkeypatch):
    import prefix_routing.frontdoor.limiter as limiter_module

    def refuse(*_):
        raise AssertionError("the body was parsed")

    monkeypatch.setattr(limiter_module.json, "loads", refuse)
    record, state = record_and_state()
    assert admit_request(gate(FakeStore(Counted(1, 0, 0)), concurrent_streams=2), "acme", b'{"max_tokens":5}',
                         record, state) is None
