"""The lab's tenants and their limits, rule by rule: :class:`LimitModel`'s counts, leases and
Retry-After, :class:`TenantBook`, the tenant choice and the dominant tenant. Expected values are hand
computations from the modules' docstrings and docs/lab.md."""

from __future__ import annotations

import json

import pytest

from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.simulate import Simulator
from prefix_routing.lab.tenant_limits import (
    UNLIMITED,
    LimitModel,
    Refusal,
    Ticket,
    describe_limits,
    load_limits,
    stage_limits,
)
from prefix_routing.lab.tenant_sim import TenantBook, new_limit_model
from prefix_routing.lab.tenants import (
    UNNAMED_TENANT,
    conversation_key,
    dominant_tenant,
    tenant_for,
    tenant_name,
    tenant_summary,
    tenants_of,
    trace_dominance,
    with_tenants,
)
from prefix_routing.lab.traces import Trace
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.limits import LimitSettings, TenantLimits
from prefix_routing.stage.config import load_stage

ONE_COPY = FleetConfig(instances=1, strategy=Strategy.RANDOM)


def model(lease_s=30, origin_s=0.0, bytes_per_token=4.0, **limits) -> LimitModel:
    return LimitModel(LimitSettings(default=TenantLimits(**limits), lease_s=lease_s), origin_s=origin_s,
                      bytes_per_token=bytes_per_token)


# --------------------------------------------------------------------------- LimitModel: what a ticket holds


def test_a_ticket_holds_its_lease_minute_and_charge():
    limits = model(requests_per_minute=10, tokens_per_minute=1000, concurrent_streams=3, origin_s=120.0)
    first = limits.admit("a", 5.0, 100)  # clock 125: minute 2; 100 tokens × 4 bytes ÷ 4 = 100
    second = limits.admit("a", 6.0, 30)
    assert (first.tenant, first.window, first.charge, first.charges_tokens) == ("a", 2, 100, True)
    assert (second.tenant, second.window, second.charge, second.charges_tokens) == ("a", 2, 30, True)
    assert first.lease is not None and second.lease is not None and first.lease != second.lease  # one lease each


def test_a_streams_only_ticket_has_no_minute_and_charges_no_tokens():
    ticket = model(concurrent_streams=2).admit("a", 0.0, 100)
    assert (ticket.tenant, ticket.window, ticket.charge, ticket.charges_tokens) == ("a", None, 0, False)
    assert ticket.lease is not None


def test_a_minute_only_ticket_has_no_lease():
    assert model(requests_per_minute=2).admit("a", 61.0, 8) == Ticket("a", None, 1, 8, False)


def test_the_charge_is_the_bytes_per_token_times_the_prompt_divided_by_four():
    # 400 prompt tokens at 2 bytes each: 800 bytes, estimated at 200 tokens; 0.5 tokens: 1 byte, at least 1
    limits = model(tokens_per_minute=1000, bytes_per_token=2.0)
    assert limits.admit("a", 0.0, 400).charge == 200
    assert limits.admit("b", 0.0, 0.5).charge == 1


def test_the_minutes_counts_fill_up_to_the_limit_and_start_again_each_minute():
    limits = model(tokens_per_minute=1000)
    assert isinstance(limits.admit("a", 0.0, 600), Ticket)
    assert isinstance(limits.admit("a", 1.0, 400), Ticket)  # 1,000 exactly
    assert limits.admit("a", 2.0, 1) == Refusal("tokens_per_minute", 58)
    assert isinstance(limits.admit("a", 60.0, 1000), Ticket)  # a new minute: empty again
    assert isinstance(limits.admit("b", 2.0, 1000), Ticket)  # another tenant's minute is its own


def test_a_request_of_exactly_tokens_per_minute_is_admitted_and_one_more_is_refused_for_good():
    limits = model(tokens_per_minute=250)
    assert isinstance(limits.admit("a", 0.0, 250), Ticket)
    refused = limits.admit("b", 10.0, 251)
    assert refused == Refusal("tokens_per_minute", 50, final=True)


def test_a_stream_refusal_retries_after_one_second_and_a_minutes_after_the_rest_of_it():
    limits = model(requests_per_minute=1, concurrent_streams=1)
    limits.admit("a", 0.0, 10)
    assert limits.admit("a", 75.5, 10) == Refusal("concurrent_streams", 1)  # a new minute, but the stream is held
    limits2 = model(requests_per_minute=1)
    limits2.admit("a", 0.0, 10)
    assert limits2.admit("a", 15.5, 10) == Refusal("requests_per_minute", 45)  # ceil(60 - 15.5)


def test_a_lease_is_held_until_its_answer_ends_not_lease_s():
    limits = model(concurrent_streams=1, lease_s=10)
    ticket = limits.admit("a", 0.0, 10)  # renewed while its answer streams
    assert isinstance(limits.admit("a", 10.0, 10), Refusal)
    assert limits.in_flight("a", 500.0) == 1
    limits.end(ticket, 600.0, None)
    assert limits.in_flight("a", 599.999) == 1 and limits.in_flight("a", 600.0) == 0


def test_an_answer_ending_at_now_frees_its_slot():
    limits = model(concurrent_streams=1)
    ticket = limits.admit("a", 0.0, 10)
    limits.end(ticket, 3.0, 20)
    assert limits.in_flight("a", 2.999) == 1
    assert limits.in_flight("a", 3.0) == 0
    assert isinstance(limits.admit("a", 3.0, 10), Ticket)


def test_answers_settle_in_the_order_they_end():
    limits = model(concurrent_streams=2)
    first, second = limits.admit("a", 0.0, 10), limits.admit("a", 0.0, 10)
    limits.end(first, 8.0, None)
    limits.end(second, 4.0, None)
    assert limits.in_flight("a", 5.0) == 1 and limits.in_flight("a", 8.0) == 0


def test_usage_replaces_the_estimate_in_its_own_minute_only():
    limits = model(tokens_per_minute=1000)
    ticket = limits.admit("a", 50.0, 500)  # minute 0: 500 estimated
    limits.end(ticket, 70.0, 900)  # ends in minute 1: minute 0's count no longer decides anything
    assert isinstance(limits.admit("a", 61.0, 700), Ticket)  # minute 1 holds 700
    assert isinstance(limits.admit("a", 80.0, 300), Ticket)  # after the end: still 700 (+ 300 = 1,000), not 1,100
    assert isinstance(limits.admit("a", 125.0, 1000), Ticket)  # minute 2 is fresh


def test_usage_is_counted_in_whole_tokens():
    limits = model(tokens_per_minute=1000)
    ticket = limits.admit("a", 0.0, 100)
    limits.end(ticket, 1.0, 599.9)  # the minute holds 599, not 600 (nor 599.9)
    assert isinstance(limits.admit("a", 2.0, 401), Ticket)
    assert limits.admit("a", 3.0, 1) == Refusal("tokens_per_minute", 57)


def test_usage_lower_than_the_estimate_gives_tokens_back():
    limits = model(tokens_per_minute=1000)
    limits.end(limits.admit("a", 0.0, 800), 1.0, 100)  # 800 estimated, 100 used
    assert isinstance(limits.admit("a", 2.0, 900), Ticket)


def test_without_a_token_limit_the_usage_changes_nothing():
    limits = model(requests_per_minute=2)
    limits.end(limits.admit("a", 0.0, 10), 1.0, 10**9)
    assert isinstance(limits.admit("a", 2.0, 10), Ticket)


def test_an_unlimited_tenant_holds_nothing():
    limits = LimitModel(LimitSettings(tenants=(("noisy", TenantLimits(concurrent_streams=1)),)))
    ticket = limits.admit("quiet", 0.0, 10)
    assert ticket is UNLIMITED
    limits.end(ticket, 5.0, 10)
    assert limits._ends == [] and limits.in_flight("quiet", 1.0) == 0
    assert limits.limits_of("noisy") == TenantLimits(concurrent_streams=1)
    assert limits.limits_of("quiet") == TenantLimits()


def test_the_limits_of_a_tenant_are_its_rules():
    settings = LimitSettings(default=TenantLimits(requests_per_minute=5),
                             tenants=(("b*", TenantLimits(concurrent_streams=2)),))
    limits = LimitModel(settings)
    assert limits.limits_of("bob") == TenantLimits(5, None, 2)
    assert limits.limits_of("bob") == TenantLimits(5, None, 2)  # the same, asked again
    assert limits.limits_of("alice") == TenantLimits(requests_per_minute=5)


def test_the_models_defaults():
    limits = LimitModel(LimitSettings(default=TenantLimits(tokens_per_minute=100)))
    assert (limits.origin_s, limits.bytes_per_token) == (0.0, 4.0)
    assert limits.admit("a", 59.5, 40).charge == 40  # 160 bytes ÷ 4
    assert limits.admit("a", 59.6, 61) == Refusal("tokens_per_minute", 1)  # 40 + 61 > 100; minute 0 ends at 60


def test_new_limit_model_places_the_minutes_on_the_traces_clock():
    trace = Trace([0.0], [10], [1], [[0]], origin_s=1_795_999_990.0)
    limits = new_limit_model(LimitSettings(default=TenantLimits(requests_per_minute=1)), trace, 2.0)
    assert (limits.origin_s, limits.bytes_per_token) == (1_795_999_990.0, 2.0)
    limits.admit("a", 0.0, 10)
    assert limits.admit("a", 1.0, 10) == Refusal("requests_per_minute", 49)  # 1,795,999,991: 49 s to 1,796,000,040


# --------------------------------------------------------------------------- --limits FILE and the stage


def test_the_stages_limits_have_short_leases_whatever_its_functions_timeout(tmp_path):
    stage = load_stage("multi-tenant")
    stage = stage.model_copy(update={"normalizer": stage.normalizer.model_copy(update={"timeout_s": 300})})
    settings = stage_limits(stage)
    assert settings.lease_s == 30
    assert settings.default == TenantLimits(requests_per_minute=600, concurrent_streams=8)
    assert settings.for_tenant("arn:aws:iam::1:role/BatchJob")[1] == TenantLimits(600, None, 2)
    path = tmp_path / "limits.toml"
    path.write_text("concurrent_streams = 4\n")
    assert load_limits(path).lease_s == 30


def test_a_json_file_is_read_as_json_by_its_name_or_its_first_brace(tmp_path):
    braced = tmp_path / "limits.txt"
    braced.write_text('  {"default": {"requests_per_minute": 3}, "lease_s": 60}')
    assert load_limits(braced) == LimitSettings(default=TenantLimits(requests_per_minute=3), lease_s=60)
    named = tmp_path / "limits.json"
    named.write_text('{"limits": {"tokens_per_minute": 5000}}')
    assert load_limits(named).default == TenantLimits(tokens_per_minute=5000)


def test_a_toml_file_with_a_limits_table_or_the_table_itself(tmp_path):
    table = tmp_path / "a.toml"
    table.write_text("[limits]\nrequests_per_minute = 7\n")
    bare = tmp_path / "b.toml"
    bare.write_text("requests_per_minute = 7\n")
    assert load_limits(table).default == load_limits(bare).default == TenantLimits(requests_per_minute=7)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("a.json", "[1, 2]", "--limits {path}: expected a [limits] table"),
    ("b.json", '{"limits": 3}', None),  # not a table: read as the table itself, whose key is unknown
    ("c.json", '{"default": {"rpm": 1}}', "--limits {path}: limits: "),
    ("d.json", '{"default": {}, "lease_s": 1}', "--limits {path}: limits.lease_s: got number 1"),
    ("e.toml", "concurrent_streams = 0\n", "--limits {path}: limits.concurrent_streams: "),
    ("f.toml", "x = [", "--limits {path}: neither TOML nor JSON: "),
    ("g.json", "{", "--limits {path}: neither TOML nor JSON: "),
])
def test_a_broken_file_is_one_error_that_names_it(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UserError) as refused:
        load_limits(path)
    if message is not None:
        assert str(refused.value).startswith(message.format(path=path))
    assert "Traceback" not in str(refused.value)


def test_a_missing_file_says_why(tmp_path):
    path = tmp_path / "none.toml"
    with pytest.raises(UserError) as refused:
        load_limits(path)
    assert str(refused.value) == f"--limits {path}: No such file or directory"


def test_describe_limits():
    assert describe_limits(LimitSettings()) == "per tenant unlimited"
    settings = LimitSettings(default=TenantLimits(requests_per_minute=1200),
                             tenants=(("a*", TenantLimits(concurrent_streams=2)), ("b", TenantLimits())))
    assert describe_limits(settings) == ("per tenant requests_per_minute 1,200; a*: requests_per_minute 1,200, "
                                         "concurrent_streams 2; b: requests_per_minute 1,200")


# --------------------------------------------------------------------------- the tenants


def test_tenant_names_count_from_one_with_four_digits():
    assert (tenant_name(0), tenant_name(41), tenant_name(999)) == ("tenant-0001", "tenant-0042", "tenant-1000")


def test_the_tenant_choice_depends_on_the_key_and_covers_every_tenant():
    two = [tenant_for(str(k), 2) for k in range(200)]
    assert set(two) == {"tenant-0001", "tenant-0002"}
    assert 60 < two.count("tenant-0001") < 140  # a spread, not one side
    assert all(tenant_for(str(k), 2) == t for k, t in zip(range(200), two))  # a key keeps its tenant
    assert tenant_for("\udc80", 3) in {"tenant-0001", "tenant-0002", "tenant-0003"}  # any string, even a lone surrogate


def test_the_conversation_key_is_the_second_block_else_the_first_else_nothing():
    assert (conversation_key([7, 9, 11]), conversation_key([7]), conversation_key([])) == ("9", "7", "")


def test_one_tenant_takes_every_request_and_the_bounds_are_one_to_a_thousand():
    trace = Trace([0.0, 1.0], [10, 10], [1, 1], [[0, 1], [0, 2]])
    assert with_tenants(trace, 1).tenants == ["tenant-0001", "tenant-0001"]
    assert len(set(with_tenants(trace, 1000).tenants)) in (1, 2)
    for bad in (0, 1001, True, 2.0):
        with pytest.raises(UserError, match=r"must be an integer from 1 to 1000"):
            with_tenants(trace, bad)


def test_tenants_of_a_trace():
    assert tenants_of(Trace([0.0, 1.0], [1, 1], [1, 1], [[0], [1]])) == [UNNAMED_TENANT, UNNAMED_TENANT]
    assert UNNAMED_TENANT == "shared"
    named = Trace([0.0, 1.0], [1, 1], [1, 1], [[0], [1]], tenants=["a", None])
    assert tenants_of(named) == ["a", "shared"]


def test_more_than_half_is_dominant_exactly_half_is_not():
    # requests: a 2 of 3 (67 %); tokens: a 20 of 40 (50 %): dominant by requests
    found = dominant_tenant(["a", "a", "b"], [5, 5, 20], [5, 5, 0])
    assert (found["tenant"], found["tokens_share"]) == ("a", 0.5)
    assert found["text"] == ("tenant a sends 67 % of the requests: one tenant's burst becomes everyone's latency; "
                             "consider [limits]")
    # tokens: b 30 of 40 (75 %), requests: a 2 of 3: the tokens' share is named first
    found = dominant_tenant(["a", "a", "b"], [5, 5, 30], [0, 0, 0])
    assert (found["tenant"], found["requests_share"], found["tokens_share"]) == ("b", pytest.approx(1 / 3), 0.75)
    assert found["text"].startswith("tenant b sends 75 % of the tokens:")


def test_half_or_less_is_never_dominant():
    # two tenants with the same requests and tokens each have half; c's 3 of 6 requests is half; a and
    # b's 3 of 7 each are less
    assert dominant_tenant(["a", "b"], [1, 1], [0, 0]) is None
    found = dominant_tenant(["b", "a", "a", "c", "c", "c"], [0] * 6, [0] * 6)
    assert found is None  # no tokens at all, and c's 3 of 6 requests is half
    found = dominant_tenant(["a", "b", "b", "b", "a", "a", "c"], [0] * 7, [0] * 7)
    assert found is None
    found = dominant_tenant(["z", "z", "y"], [0, 0, 0], [0, 0, 0])  # no tokens: by requests, 2 of 3
    assert (found["tenant"], found["requests_share"], found["tokens_share"]) == ("z", pytest.approx(2 / 3), 0.0)


def test_a_traces_tenant_summary():
    trace = Trace([0.0, 1.0, 2.0], [10, 10, 10], [0, 0, 0], [[0], [1], [2]], tenants=["a", "a", "b"])
    summary = tenant_summary(trace)
    assert summary["count"] == 2 and summary["dominant"]["tenant"] == "a"
    assert trace_dominance(trace) == summary["dominant"]
    assert tenant_summary(Trace([0.0], [1], [1], [[0]])) == {"count": 0, "dominant": None}


# --------------------------------------------------------------------------- the book and the loops


def test_the_book_indexes_tenants_in_order_of_first_sight():
    book = TenantBook(placed=2)
    assert book.names == ["shared"] and list(book.tenant_of) == [0, 0] and book.sent == {0: 2}
    assert (book.index("x"), book.index("shared"), book.index("x")) == (1, 0, 1)
    book.placed_in_order(Trace([0.0, 1.0], [1, 1], [1, 1], [[0], [1]], tenants=["y", "x"]))
    assert book.names == ["shared", "x", "y"] and list(book.tenant_of) == [0, 0, 2, 1]
    assert book.sent == {0: 2, 1: 1, 2: 1}
    book.throttled[(1, "concurrent_streams")] += 2
    book.throttled[(2, "requests_per_minute")] += 3
    assert book.throttled_total == 5
    assert TenantBook().names == [] and list(TenantBook().tenant_of) == []


class Bar:
    def __init__(self):
        self.n = 0

    def update(self, k):
        self.n += k


@pytest.mark.parametrize("users", [None, 2])
def test_the_progress_bar_counts_each_request_once_however_often_it_is_refused(users):
    sim = Simulator(ONE_COPY, users=users, limits=LimitSettings(default=TenantLimits(concurrent_streams=1)))
    bar = Bar()
    sim.feed(Trace([0.0] * 4, [10] * 4, [1] * 4, [[i] for i in range(4)], tenants=["a"] * 4), bar=bar)
    assert bar.n == 4


def test_open_loop_records_only_the_admitted_requests_with_their_tenants():
    sim = Simulator(ONE_COPY, limits=LimitSettings(tenants=(("a", TenantLimits(concurrent_streams=1)),)))
    sim.feed(Trace([0.0, 0.0, 0.0], [10, 20, 30], [1, 2, 3], [[0], [1], [2]], tenants=["a", "a", "b"]))
    # a's second request is refused (its stream is held); b is unlimited
    assert list(sim.prompts) == [10, 30] and list(sim.outputs) == [1, 3]
    assert [sim.tenant_book.names[t] for t in sim.tenant_book.tenant_of] == ["a", "b"]
    assert sim.tenant_book.dropped == {0: 1} and sim.tenant_book.sent == {0: 2, 1: 1}
    assert sim.last_finish == max(sim.ends) > 0


def test_closed_loop_gives_up_a_request_no_retry_admits_and_goes_on():
    sim = Simulator(ONE_COPY, users=1, limits=LimitSettings(default=TenantLimits(tokens_per_minute=100)))
    sim.feed(Trace([0.0] * 3, [500, 20, 30], [1, 1, 1], [[0], [1], [2]], tenants=["a"] * 3))
    book = sim.tenant_book
    assert list(sim.prompts) == [20, 30]
    assert book.dropped == {0: 1} and book.waited_s == {} and book.throttled == {(0, "tokens_per_minute"): 1}
    assert sim.arrivals[0] == 0.0  # the given-up request cost its client no wait


def test_a_trace_run_under_limits_that_refuse_nothing_is_the_run_without_limits():
    # the limited loops record what the simulator's own loops record, at any speed: the same trace gives
    # the same figures (a bug recorded the scaled arrival, so that --speed 2 with limits inflated TTFT)
    n = 40
    trace = Trace([0.5 * i for i in range(n)], [500 + 37 * i for i in range(n)], [20 + i for i in range(n)],
                  [[0, i % 5, 100 + i] for i in range(n)], tenants=[f"t{i % 3}" for i in range(n)])
    never = LimitSettings(default=TenantLimits(requests_per_minute=10**9))
    cfg = FleetConfig(instances=2, strategy=Strategy.PREFIX_AWARE)
    for kwargs in ({"speed": 2.0}, {"speed": 0.5}, {"users": 3}):
        plain, limited = Simulator(cfg, **kwargs), Simulator(cfg, limits=never, **kwargs)
        plain.feed(trace)
        limited.feed(trace)
        for column in ("arrivals", "prompts", "outputs", "firsts", "cached", "copy_of", "ends"):
            assert list(getattr(limited, column)) == list(getattr(plain, column)), (kwargs, column)
        assert len(set(limited.copy_of)) == 2 and limited.last_finish == plain.last_finish == max(plain.ends)
        assert limited.result().ttft == plain.result().ttft


def test_a_failed_answer_keeps_its_charge_a_served_one_counts_its_usage():
    limits = LimitSettings(default=TenantLimits(tokens_per_minute=1000))
    trace = Trace([0.0, 10.0], [400, 500], [500, 1], [[0], [1]], tenants=["a", "a"])
    # 2 bytes per token: the first is charged 400 × 2 ÷ 4 = 200 for its prompt + 500 output = 700, the
    # second 250 + 1 = 251. Every request times out (10 ms for a first token): the 700 stay, 251 more fit.
    failing = Simulator(FleetConfig(instances=1, strategy=Strategy.RANDOM, timeout_s=0.01, bytes_per_token=2.0),
                        limits=limits)
    failing.feed(trace)
    assert list(failing.prompts) == [400, 500] and failing.fleet.timeouts == 2
    # served: the first counts its usage, 400 + 500, by the second's arrival, and 900 + 251 > 1,000
    served = Simulator(FleetConfig(instances=1, strategy=Strategy.RANDOM, bytes_per_token=2.0), limits=limits)
    served.feed(trace)
    assert served.ends[0] < 10.0  # the premise: the first answer ended before the second arrived
    assert list(served.prompts) == [400]
    assert served.tenant_book.throttled == {(0, "tokens_per_minute"): 1}


def test_closed_loop_retries_the_same_request_and_counts_each_given_up_one():
    # one user, one request per minute per tenant; a second feed's clients carry on from the first's
    sim = Simulator(ONE_COPY, users=1, limits=LimitSettings(default=TenantLimits(requests_per_minute=1)))
    sim.feed(Trace([0.0, 0.0], [10, 20], [1, 1], [[0], [1]], tenants=["a", "b"]))
    sim.feed(Trace([0.0, 0.0], [30, 40], [1, 1], [[2], [3]], tenants=["b", "b"]))
    # a's 10 and b's 20 within the first second; b's 30 (the second feed's request 0) is refused when
    # the 20 ends, Retry-After ceil(60 - end) = 60 s, and sent again; the 40 likewise a minute later
    assert list(sim.prompts) == [10, 20, 30, 40]
    assert sim.ends[1] < 1.0 and 60.0 < sim.ends[2] < 61.0
    assert list(sim.arrivals)[2:] == [sim.ends[1] + 60, sim.ends[2] + 60]
    book = sim.tenant_book
    assert book.waited_s[book.index("b")] == 120 and book.throttled_total == 2
    given_up = Simulator(ONE_COPY, users=2, limits=LimitSettings(default=TenantLimits(tokens_per_minute=100)))
    given_up.feed(Trace([0.0] * 3, [500, 600, 20], [1, 1, 1], [[0], [1], [2]], tenants=["a"] * 3))
    assert given_up.tenant_book.dropped == {0: 2} and list(given_up.prompts) == [20]


def test_closed_loop_refused_first_request_is_retried_not_skipped():
    # two users, one stream: request 0 is admitted, request 1 refused and retried after 1 s
    sim = Simulator(ONE_COPY, users=2, limits=LimitSettings(default=TenantLimits(concurrent_streams=1)))
    sim.feed(Trace([0.0] * 3, [10, 20, 30], [1, 1, 1], [[0], [1], [2]], tenants=["a"] * 3))
    assert sorted(sim.prompts) == [10, 20, 30] and sim.tenant_book.dropped == {}


def test_the_limited_loop_returns_its_own_wall_time():
    import time

    sim = Simulator(ONE_COPY, limits=LimitSettings(default=TenantLimits(concurrent_streams=1)))
    started = time.perf_counter()
    wall = sim.feed(Trace([0.0, 1.0], [10, 10], [1, 1], [[0], [1]], tenants=["a", "a"]))
    assert 0.0 <= wall <= time.perf_counter() - started and sim.wall_s == wall


def test_a_limits_files_problems_are_listed_with_their_place(tmp_path):
    path = tmp_path / "limits.toml"
    path.write_text('concurrent_streams = 0\nrequests_per_minute = 0\n[tenants."x"]\ntokens_per_minute = 0\n')
    with pytest.raises(UserError) as refused:
        load_limits(path)
    message = str(refused.value)
    assert message.startswith(f"--limits {path}: limits.")
    assert "; limits." in message and "limits.tenants.x.tokens_per_minute: " in message


def test_closed_loop_retries_come_back_in_the_order_they_were_refused():
    # three users, one request per minute: request 0 at 0; 1 and 2 refused at 0 (Retry-After 60 s), in
    # that order; at 60 request 1 goes first and is admitted, request 2 is refused again until 120;
    # request 3, sent when request 0 ended (e < 1 s), waits for each minute after it: admitted at e + 180
    sim = Simulator(ONE_COPY, users=3, limits=LimitSettings(default=TenantLimits(requests_per_minute=1)))
    sim.feed(Trace([0.0] * 4, [10, 20, 30, 40], [1] * 4, [[0], [1], [2], [3]], tenants=["a"] * 4))
    e = sim.ends[0]
    assert e < 1.0
    assert list(sim.prompts) == [10, 20, 30, 40]
    assert list(sim.arrivals) == [0.0, 60.0, 120.0, e + 180.0]


def test_the_dominant_tenant_by_tokens_is_the_one_with_the_most_tokens_not_the_last_name():
    # requests 1 of 2 each; tokens: a 90 of 100
    found = dominant_tenant(["a", "b"], [80, 10], [10, 0])
    assert (found["tenant"], found["tokens_share"], found["requests_share"]) == ("a", 0.9, 0.5)
