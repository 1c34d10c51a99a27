"""Replica steering at the front door with a store in memory (prefix_routing.frontdoor.steering_store and
its use by Replicas and the invoker).

Expected replicas are worked out by hand from rules/steering.py: the fewest in flight, then the fewest
sent, then the lowest slot; a replica's first answer with cached ≥ 0.9 × the key's tokens is a
collision and its slot gets the next fresh number. k comes from rules/replication.py as in
test_replicas.py: with n requests of one prefix (min_requests 1, fixed clock), share = n / 32 and
k = min(4, ceil(share × 4 copies ÷ factor)).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest

from prefix_routing import frontdoor
from prefix_routing.frontdoor.record import RequestRecord
from prefix_routing.frontdoor.steering_store import MAX_ROUNDS, Steering, item_key, state_from_item, state_to_item
from prefix_routing.rules import telemetry
from prefix_routing.rules.steering import HotPrefixState, ReplicaSlot
from tests.prefix_routing.frontdoor.conftest import KEY, FakeRuntime, sse_chunks, url_event
from tests.prefix_routing.frontdoor.test_replicas import TENANT_ID, replicating, sent_ids

S = telemetry.SteeringLogField


class FakeStore:
    """The SteeringStore contract in memory: counts its calls; ``fail`` makes every call raise,
    ``races`` makes that many next writes lose their race (another environment wrote first)."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[HotPrefixState, int, float]] = {}
        self.calls: list[str] = []
        self.fail = False
        self.races = 0

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.fail:
            raise TimeoutError("read timeout")

    def read(self, key, *, answer=False):
        self._call("read")
        found = self.items.get(key)
        return None if found is None else (copy.deepcopy(found[0]), found[1])

    def write(self, key, state, version, expires_at, *, answer=False):
        self._call("write")
        if self.races:
            self.races -= 1
            held = self.items.get(key)
            self.items[key] = (held[0] if held else HotPrefixState(), (held[1] if held else 0) + 1, expires_at)
            return False
        held = self.items.get(key)
        if (held[1] if held else None) != version:
            return False
        self.items[key] = (copy.deepcopy(state), (version or 0) + 1, expires_at)
        return True

    def release(self, key, index, number, *, judge, must_be_judged, expires_at):
        self._call("release")
        held = self.items.get(key)
        if held is None or index >= len(held[0].slots):
            return False
        slot = held[0].slots[index]
        if slot.number != number or slot.in_flight <= 0 or (must_be_judged and not slot.judged):
            return False
        slot.in_flight -= 1
        slot.judged = slot.judged or judge
        self.items[key] = (held[0], held[1] + 1, expires_at)
        return True

    def state(self, key: str) -> HotPrefixState:
        return self.items[key][0]


def steered(store, factor=0.1, **overrides) -> tuple[frontdoor.Replicas, frontdoor.InvokeConfig]:
    cfg = replicating(factor, steering_table="state", **overrides)
    return frontdoor.Replicas(cfg, clock=lambda: 0.0, steering=Steering(store, cfg.replication, clock=lambda: 1000.0)), cfg


def record(fingerprint="fp-a", body_bytes=8192) -> RequestRecord:
    return RequestRecord(arrival_ms=0, fingerprint=fingerprint, body_bytes=body_bytes, status=200)


def answer(replicas, rec, prompt=1000, cached=None, status=200):
    rec.prompt_tokens, rec.cached_tokens, rec.status = prompt, cached, status
    replicas.answered(rec)


KEY_A = item_key("tid", "fp-a")


def test_a_hot_prefix_goes_to_the_replica_with_the_fewest_in_flight():
    store = FakeStore()
    replicas, _ = steered(store)
    # k = 2, 3, 4, 4: the slots grow as k does; nothing answered yet, so each new slot (0 in flight)
    # is the least loaded: 0, 1, 2, 3.
    sent = [record() for _ in range(4)]
    assert [replicas.route("tid", r) for r in sent] == ["tid", "tid-r1", "tid-r2", "tid-r3"]
    assert [r.steering for r in sent] == ["least_loaded"] * 4
    assert store.calls == ["read", "write"] * 4  # one read and one conditional write per hot send
    answer(replicas, sent[2], cached=0)  # replica 2's answer ends: its in-flight count goes back
    assert store.calls[-1] == "release"
    assert [s.in_flight for s in store.state(KEY_A).slots] == [1, 1, 0, 1]
    nxt = record()
    assert replicas.route("tid", nxt) == "tid-r2"  # in turn it would be replica 0
    assert (nxt.replica, nxt.replicas) == (2, 4)
    assert store.items[KEY_A][1] == 6  # 5 writes and 1 release, each a new version


def test_the_line_counts_the_replicas_in_use_at_most_one_per_copy():
    store = FakeStore()
    replicas, _ = steered(store, factor=0.01, copies_min=2, copies_max=2)  # k = 4 wanted on 2 copies
    sent = [record() for _ in range(3)]
    assert [replicas.route("tid", r) for r in sent] == ["tid", "tid-r1", "tid"]
    assert [r.replicas for r in sent] == [2, 2, 2]


def test_ties_in_flight_go_to_the_replica_sent_the_fewest():
    store = FakeStore()
    replicas, _ = steered(store)
    first = [record() for _ in range(4)]
    for r in first:
        replicas.route("tid", r)
    for r in first:
        answer(replicas, r, cached=0)  # all back: 0 in flight everywhere, 1 sent each
    for r in first[1:3]:
        answer(replicas, r)  # a second answer of a request that is no more in flight changes nothing
    second = record()
    replicas.route("tid", second)
    assert second.replica == 0  # 0 in flight and 1 sent everywhere: the lowest slot
    third = record()
    replicas.route("tid", third)
    assert third.replica == 1  # slot 0 now has 1 in flight


def test_a_cold_prefix_touches_no_store():
    store = FakeStore()
    replicas, _ = steered(store, factor=2.0)  # hot only above a share of 1/2
    cold = record()
    assert replicas.route("tid", cold) == "tid"
    assert (cold.replica, cold.replicas, cold.steering, cold.steer_ticket) == (0, 1, None, None)
    answer(replicas, cold, cached=0)
    assert store.calls == []


def test_a_prefix_once_steered_stays_in_the_store_when_it_cools():
    # Factor 2 on 4 copies: k = ceil(share × 2). Prefix A 17 times: 17/32 × 2 > 1 → k = 2 at the 17th
    # only; then prefix B 20 times (hot from its 18th: 18/35 > 1/2); A again: 18/38 × 2 < 1, k = 1,
    # but A has a state in the store, written by this environment: it is steered (on slot 0).
    store = FakeStore()
    replicas, _ = steered(store, factor=2.0)
    for _ in range(17):
        replicas.route("tid", record("fp-a"))
    assert store.calls.count("write") == 1  # the 17th only
    for _ in range(20):
        replicas.route("tid", record("fp-b"))
    writes = store.calls.count("write")
    again = record("fp-a")
    assert replicas.route("tid", again) == "tid"
    assert (again.replicas, again.steering, store.calls.count("write")) == (1, "least_loaded", writes + 1)
    assert [s.in_flight for s in store.state(KEY_A).slots] == [2, 0]  # the 17th and this one, k = 1: slot 0


def test_a_first_answer_with_the_key_cached_reveals_a_collision_and_a_fresh_number():
    # body 8192 bytes, PrefixLength 4096: the key is half the prompt, 500 of 1000 tokens; a collision
    # from 0.9 × 500 = 450 cached tokens.
    store = FakeStore()
    replicas, _ = steered(store)
    sent = [record() for _ in range(4)]  # replicas 0, 1, 2, 3; next fresh number 4
    for r in sent:
        replicas.route("tid", r)
    before = len(store.calls)
    answer(replicas, sent[1], cached=449)  # just under: judged, no collision, one release
    answer(replicas, sent[2], cached=450)  # the first answer of replica 2 finds the key cached
    assert (sent[1].replica_collision, sent[2].replica_collision) == (False, True)
    assert store.calls[before:] == ["release", "release", "read", "write"]
    state = store.state(KEY_A)
    assert [s.number for s in state.slots] == [0, 1, 4, 3] and (state.collisions, state.redraws) == (1, 1)
    assert [s.judged for s in state.slots] == [False, True, False, False]
    nxt = record()
    assert replicas.route("tid", nxt) == "tid-r4"  # the fresh replica: nothing in flight, nothing sent
    answer(replicas, sent[0], cached=1000)  # replica 0 is the tenant's own id: never a collision
    assert sent[0].replica_collision is False and store.state(KEY_A).collisions == 1


def test_a_failed_answer_gives_its_count_back_without_judging():
    store = FakeStore()
    replicas, _ = steered(store)
    sent = [record() for _ in range(2)]
    for r in sent:
        replicas.route("tid", r)
    answer(replicas, sent[1], cached=1000, status=502)  # the stream failed: no judgement
    assert sent[1].replica_collision is False
    assert [(s.in_flight, s.judged) for s in store.state(KEY_A).slots] == [(1, False), (0, False), (0, False)]


def test_a_store_that_fails_falls_back_to_turns_and_says_so():
    store = FakeStore()
    replicas, _ = steered(store)
    first = record()
    replicas.route("tid", first)
    store.fail = True
    sent = [record() for _ in range(4)]
    # In turn: the tracker counted the 1st request too, so turns 1, 2, 3, 4 of k = 3, 4, 4, 4.
    assert [replicas.route("tid", r) for r in sent] == ["tid-r1", "tid-r2", "tid-r3", "tid"]
    assert {(r.steering, r.steering_store_error, r.steer_ticket) for r in sent} == {("turns_store_unavailable", True, None)}
    answer(replicas, first, cached=0)  # the answer's release fails too: counted, never raised
    assert first.steering_store_error and first.replica_collision is None


def test_a_lost_race_reads_again_and_too_many_fall_back():
    store = FakeStore()
    replicas, _ = steered(store)
    store.races = 1
    won = record()
    replicas.route("tid", won)
    assert won.steering == "least_loaded" and store.calls == ["read", "write", "read", "write"]
    store.races, store.calls[:] = MAX_ROUNDS, []
    lost = record()
    replicas.route("tid", lost)
    assert lost.steering == "turns_store_unavailable" and store.calls == ["read", "write"] * MAX_ROUNDS


def test_the_send_budget_stops_further_rounds():
    store = FakeStore()
    ticks = iter([0.0, 0.2])  # the first round took 200 ms: past the 100 ms budget, no second round
    cfg = replicating(0.1, steering_table="state")
    steering = Steering(store, cfg.replication, clock=lambda: 1000.0, timer=lambda: next(ticks))
    store.races = 1
    with pytest.raises(Exception, match="no write after 1 rounds"):
        steering.choose(KEY_A, 2, 4)
    assert store.calls == ["read", "write"]


def test_with_steering_off_or_no_store_replicas_go_in_turn_and_no_store_is_called():
    store = FakeStore()
    cfg = replicating(0.1, steering_table="state")
    off = dataclasses.replace(cfg, replication=dataclasses.replace(cfg.replication, steering=False))
    for replicas in (frontdoor.Replicas(off, clock=lambda: 0.0, steering=Steering(store, off.replication)),
                     frontdoor.Replicas(cfg, clock=lambda: 0.0)):
        sent = [record() for _ in range(5)]
        assert [replicas.route("tid", r) for r in sent] == ["tid", "tid-r1", "tid-r2", "tid-r3", "tid"]
        assert [r.steering for r in sent] == ["turns"] * 5
    assert store.calls == []


def test_the_stored_item_round_trips_and_a_damaged_one_starts_afresh():
    state = HotPrefixState(slots=[ReplicaSlot(0, 2, 5, False), ReplicaSlot(7, 0, 3, True)], next_number=8,
                           redraws=6, collisions=6)
    item = {**state_to_item(state), "v": {"N": "12"}}
    assert state_from_item(item) == (state, 12)
    for damaged in ({**item, "s": {"L": [{"M": {"m": {"N": "3"}}}]}},  # a slot without its counts
                    {**item, "n": {"N": "7"}},  # a fresh number already in use
                    {**item, "s": {"L": []}}):  # no replica 0
        assert state_from_item(damaged) == (HotPrefixState(), 12)
    assert len(state_to_item(HotPrefixState(slots=[ReplicaSlot(i) for i in range(80)]))["s"]["L"]) == 64


def test_the_invoker_steers_releases_after_the_answer_and_logs_it(lines):
    # Each answer ends before the next request: 0 in flight everywhere, so the fewest sent decides.
    # The engine reports the whole prompt cached (12 of 12; the body is shorter than PrefixLength, so
    # the key is the whole prompt): every replica > 0 collides on its first answer and is redrawn.
    store = FakeStore()
    cfg = replicating(0.1, steering_table="state")
    chunks = sse_chunks(usage={"prompt_tokens": 12, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 12}})
    runtime = FakeRuntime(chunks)
    replicas = frontdoor.Replicas(cfg, clock=lambda: 0.0, steering=Steering(store, cfg.replication))
    invoker = frontdoor.Invoker(runtime, cfg, KEY, emit=lines, replicas=replicas)
    for _ in range(3):
        assert invoker.buffered(frontdoor.request_from_event(url_event())).status == 200
    # 1st: k 2, slots 0 1 → 0. 2nd: k 3, slot 2 added → 1 (fewest sent, lowest); collides → 1 becomes 3.
    # 3rd: k 4, slot 4 added; slots 0(1 sent) 3(0) 2(0) 4(0) → 3; collides → becomes 5.
    assert sent_ids(runtime) == [TENANT_ID, f"{TENANT_ID}-r1", f"{TENANT_ID}-r3"]
    logs = lines.requests
    assert [(log["replica"], log[S.STEERING], log[S.COLLISION], log[S.STORE_ERROR]) for log in logs] == [
        (0, "least_loaded", False, False), (1, "least_loaded", True, False), (3, "least_loaded", True, False)]
    assert all(log[S.STEERING_MS] >= 0 for log in logs)
    assert [doc[telemetry.REPLICA_COLLISIONS.name] for doc in lines.emf] == [0, 1, 1]
    assert [doc[telemetry.STEERING_FALLBACKS.name] for doc in lines.emf] == [0, 0, 0]
    key = item_key(TENANT_ID, logs[0]["prefix_fingerprint"])
    assert [s.number for s in store.state(key).slots] == [0, 5, 2, 4]
    assert all(s.in_flight == 0 for s in store.state(key).slots)  # every answer gave its count back


def test_the_invoker_gives_the_count_back_when_the_call_fails(lines):
    store = FakeStore()
    cfg = replicating(0.1, steering_table="state", max_attempts=1)

    class Failing(FakeRuntime):
        def invoke_endpoint_with_response_stream(self, **params):
            self.calls.append(params)
            raise ConnectionError("reset")

    replicas = frontdoor.Replicas(cfg, clock=lambda: 0.0, steering=Steering(store, cfg.replication))
    invoker = frontdoor.Invoker(Failing(), cfg, KEY, emit=lines, replicas=replicas)
    assert invoker.buffered(frontdoor.request_from_event(url_event())).status >= 500
    (state,) = [held[0] for held in store.items.values()]
    assert [s.in_flight for s in state.slots] == [0, 0] and lines.requests[0][S.COLLISION] is False


def test_without_steering_the_log_line_has_no_steering_store_fields(lines):
    cfg = replicating(0.1)
    invoker = frontdoor.Invoker(FakeRuntime(), cfg, KEY, emit=lines, replicas=frontdoor.Replicas(cfg, clock=lambda: 0.0))
    assert invoker.buffered(frontdoor.request_from_event(url_event())).status == 200
    line, doc = lines.requests[0], lines.emf[0]
    assert line[S.STEERING] == "turns" and S.COLLISION not in line and S.STORE_ERROR not in line
    assert not {spec.name for spec in telemetry.STEERING_METRICS} & set(doc)

