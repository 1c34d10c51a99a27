"""Hot-prefix replication's rules at their edges (prefix_routing/rules/replication.py), hand-computed
from the module docstring: k = min(max_replicas, max(1, ceil(s × copies ÷ factor))), shares against
at least 32 requests' weight, weights doubling every half-life (renormalized before they overflow),
space-saving eviction, min_requests of evidence, replicas in turn, ids within 64 characters."""

from __future__ import annotations

import math

import pytest

from prefix_routing.rules.replication import (
    MIN_EVIDENCE_REQUESTS,
    HotPrefixes,
    ReplicationSettings,
    replica_count,
    replica_id,
)

# ----------------------------------------------------------------------------- k


@pytest.mark.parametrize("share, copies, factor, max_replicas, k", [
    (0.5, 4, 1.0, 8, 2),  # exactly 2 fair shares: 2 replicas, not 3
    (0.5001, 4, 1.0, 8, 3),
    (1.0, 2, 0.5, 3, 3),  # 4 wanted, 3 allowed
    (1e-9, 8, 0.1, 8, 1),  # a tiny share is still one replica
    (0.3, 2, 1.0, 8, 1),  # 0.6 fair shares
    (0.9, 1, 0.01, 8, 1),  # one copy: nothing to spread over
    (0.0, 8, 0.1, 8, 1),
    (-0.5, 8, 0.1, 8, 1),
])
def test_replica_count_by_hand(share, copies, factor, max_replicas, k):
    settings = ReplicationSettings(max_replicas=max_replicas, target_share_factor=factor)
    assert replica_count(share, copies, settings) == k


@pytest.mark.parametrize("routing_id, replica, expected", [
    ("tenant", 0, "tenant"),
    ("tenant", 1, "tenant-r1"),
    ("", 0, ""),
    ("", 5, "r5"),  # no id: the replica alone
    (None, 12, "r12"),
    ("x" * 62, 1, "x" * 61 + "-r1"),  # 61 + 3 = 64
    ("x" * 60, 1, "x" * 60 + "-r1"),  # 63: nothing cut
    ("y" * 64, 63, "y" * 60 + "-r63"),
])
def test_replica_ids_by_hand(routing_id, replica, expected):
    assert replica_id(routing_id, replica) == expected


# ----------------------------------------------------------------------------- the settings' bounds


@pytest.mark.parametrize("kwargs", [
    dict(max_replicas=1), dict(max_replicas=64), dict(target_share_factor=0.01), dict(target_share_factor=1000),
    dict(half_life_s=1), dict(half_life_s=86_400.0), dict(min_requests=1), dict(min_requests=10_000),
    dict(capacity=1), dict(capacity=1_000_000), dict(enabled=True),
])
def test_settings_at_their_bounds_are_accepted(kwargs):
    ReplicationSettings(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(enabled=1), "replication.enabled: got number 1; allowed: true or false"),
    (dict(max_replicas=65), "replication.max_replicas: got number 65; allowed: an integer from 1 to 64"),
    (dict(max_replicas=True), "replication.max_replicas: got true; allowed: an integer from 1 to 64"),
    (dict(max_replicas=4.0), "replication.max_replicas: got number 4.0; allowed"),
    (dict(target_share_factor=0.0099), "replication.target_share_factor: got number 0.0099; allowed: a number from 0.01 to 1000"),
    (dict(target_share_factor=1000.5), "replication.target_share_factor: got number 1000.5"),
    (dict(target_share_factor=math.inf), "replication.target_share_factor: got number inf"),
    (dict(target_share_factor=False), "replication.target_share_factor: got false"),
    (dict(target_share_factor="1"), "replication.target_share_factor: got string"),
    (dict(half_life_s=86_401), "replication.half_life_s: got number 86401; allowed: seconds from 1 to 86400"),
    (dict(half_life_s=0.999), "replication.half_life_s: got number 0.999"),
    (dict(min_requests=0.9), "replication.min_requests: got number 0.9; allowed: a number from 1 to 10000"),
    (dict(min_requests=10_001), "replication.min_requests: got number 10001"),
    (dict(capacity=0), "replication.capacity: got number 0; allowed: an integer from 1 to 1000000"),
    (dict(capacity=1_000_001), "replication.capacity: got number 1000001"),
    (dict(capacity=8.0), "replication.capacity: got number 8.0"),
])
def test_settings_out_of_bounds_name_the_field_the_value_and_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError) as raised:
        ReplicationSettings(**kwargs)
    assert str(raised.value).startswith(message)


def test_the_defaults_are_the_documented_ones():
    s = ReplicationSettings()
    assert (s.enabled, s.max_replicas, s.target_share_factor, s.half_life_s, s.min_requests, s.capacity,
            s.steering) == (False, 32, 0.05, 300.0, 12.0, 256, True)
    assert MIN_EVIDENCE_REQUESTS == 32


# ----------------------------------------------------------------------------- shares


def test_a_first_request_holds_one_32nd_then_its_count_over_the_total():
    hot = HotPrefixes(ReplicationSettings(half_life_s=10.0))
    assert hot.share("a") == 0.0 and len(hot) == 0  # nothing seen: no share, no division by zero
    assert hot.observe("a", 5.0) == pytest.approx(1 / 32)
    for _ in range(39):
        hot.observe("a", 5.0)
    assert hot.observe("b", 5.0) == pytest.approx(1 / 41)  # 41 requests now: above the floor
    assert hot.share("a") == pytest.approx(40 / 41) and hot.share("c") == 0.0


def test_weights_double_every_half_life_from_the_first_request():
    hot = HotPrefixes(ReplicationSettings(half_life_s=10.0))
    for _ in range(200):
        hot.observe("a", 100.0)  # the origin: weight 1
    # Two half-lives later a request weighs 4: b has 4 / 204, a 200 / 204 (the floor is 32 × 4 = 128).
    assert hot.observe("b", 120.0) == pytest.approx(4 / 204)
    assert hot.share("a") == pytest.approx(200 / 204)
    # With fewer requests the floor counts in the weight of now: 32 × 4, not 32.
    few = HotPrefixes(ReplicationSettings(half_life_s=10.0))
    for _ in range(40):
        few.observe("a", 100.0)
    assert few.observe("b", 120.0) == pytest.approx(4 / 128)


def test_weights_are_renormalized_before_they_overflow_and_shares_survive_it():
    # Half-life 1 s: 2^(t) passes 2^500 at t = 500 and a float's range at t = 1024. Requests a thousand
    # seconds apart stay finite, and each newcomer holds 1/32 (the old ones weigh nothing).
    hot = HotPrefixes(ReplicationSettings(half_life_s=1.0))
    for t in (0.0, 600.0, 1200.0, 1800.0, 2400.0):
        share = hot.observe(("p", t), t)
        assert share == pytest.approx(1 / 32) and math.isfinite(share)
    assert hot.share(("p", 0.0)) == pytest.approx(0.0, abs=1e-100)
    # 40 requests at 3000 s: the same shares as at the origin.
    for _ in range(40):
        last = hot.observe("q", 3000.0)
    assert last == pytest.approx(40 / 40, rel=1e-9)
    assert hot.observe("r", 3000.0) == pytest.approx(1 / 41)


def test_a_rescale_keeps_the_ratio_of_older_counts():
    # a at 0 (x40), b at 501 (x100): b's requests would weigh 2^501 each; after the rescale at 501
    # the counts are 40 × 2^-501 and 100: a's share is nothing, b's all; c one half-life later weighs 2.
    hot = HotPrefixes(ReplicationSettings(half_life_s=1.0))
    for _ in range(40):
        hot.observe("a", 0.0)
    for _ in range(100):
        hot.observe("b", 501.0)
    assert hot.share("b") == pytest.approx(1.0) and hot.share("a") < 1e-100
    assert hot.observe("c", 502.0) == pytest.approx(2 / (100 + 2))


def test_space_saving_evicts_the_smallest_and_the_newcomer_inherits_its_count():
    hot = HotPrefixes(ReplicationSettings(capacity=2))
    for fingerprint in ("a", "a", "a", "b"):
        hot.observe(fingerprint, 0.0)
    # c's count is b's 1 + its own 1, but its share is what it surely had: its own 1.
    assert hot.observe("c", 0.0) == pytest.approx(1 / 32)
    assert len(hot) == 2 and hot.share("b") == 0.0 and hot.share("a") == pytest.approx(3 / 32)
    assert hot.observe("c", 0.0) == pytest.approx(2 / 32)


def test_many_cold_prefixes_churning_through_the_slots_make_none_hot_but_a_hot_one_stays_hot():
    # 4 slots, 1,000 fingerprints in turn on 100 copies (factor 0.05): every slot's count is about a
    # quarter of the traffic, 0.25 x 100 / 0.05 = 500 fair shares if read as the prefix's own. Each
    # newcomer surely had only its own request: never 12 of them (min_requests), never hot.
    hot = HotPrefixes(ReplicationSettings(capacity=4))
    assert all(hot.assign(f"cold-{i}", 0.0, 100) == (0, 1) for i in range(1000))
    assert hot.hot(100) == 0 and len(hot._errors) <= 4  # an evicted prefix's error goes with it
    # One prefix in every other request keeps its slot (its count is never the smallest) and its own
    # requests: from its 12th on (min_requests) it is hot.
    got = []
    for i in range(40):
        hot.assign(f"more-{i}", 0.0, 100)
        got.append(hot.assign("hot", 0.0, 100)[1] > 1)
    assert got == [False] * 11 + [True] * 29 and hot.hot(100) == 1


# ----------------------------------------------------------------------------- assign and hot


def test_min_requests_of_evidence_then_replicas_in_turn():
    # min_requests 3, factor 0.5 on 4 copies, all at one instant: n requests hold n/32, so
    # k = ceil(n/32 × 4 / 0.5) = ceil(n/4): requests 1-2 lack evidence, 3-4 want 1, 5-6 want 2.
    hot = HotPrefixes(ReplicationSettings(min_requests=3.0, target_share_factor=0.5, max_replicas=8))
    assert [hot.assign("a", 0.0, 4) for _ in range(6)] == [(0, 1)] * 4 + [(0, 2), (1, 2)]


def test_evidence_is_counted_in_the_weight_of_now():
    # Half-life 10 s, min_requests 4: three requests at 0 s weigh 3; at 10 s a request weighs 2, so
    # the 4th and 5th bring a's count to 5 and 7, short of 4 × 2 = 8; the 6th (9) passes, and with a
    # factor of 0.01 wants ceil(9/64 × 8 / 0.01) = 113 replicas: the default 32.
    hot = HotPrefixes(ReplicationSettings(min_requests=4.0, target_share_factor=0.01, half_life_s=10.0))
    assert [hot.assign("a", 0.0, 8) for _ in range(3)] == [(0, 1)] * 3
    assert [hot.assign("a", 10.0, 8) for _ in range(3)] == [(0, 1), (0, 1), (0, 32)]


def test_an_evicted_prefix_starts_its_turns_again():
    # Capacity 1: b evicts a, then a evicts b; a's turns were dropped with it (k = 4 throughout).
    hot = HotPrefixes(ReplicationSettings(capacity=1, min_requests=1.0, target_share_factor=0.01, max_replicas=4))
    assert [hot.assign("a", 0.0, 8) for _ in range(3)] == [(0, 4), (1, 4), (2, 4)]
    assert hot.assign("b", 0.0, 8) == (0, 4)
    assert hot.assign("a", 0.0, 8) == (0, 4)


def test_hot_counts_the_prefixes_with_evidence_and_more_than_one_replica():
    # min_requests 2, factor 1, 4 copies: a (20 of 32) wants ceil(20/32 × 4) = 3; b has 1 request.
    hot = HotPrefixes(ReplicationSettings(min_requests=2.0, target_share_factor=1.0))
    assert hot.hot(4) == 0  # nothing seen
    for _ in range(20):
        hot.assign("a", 0.0, 4)
    hot.assign("b", 0.0, 4)
    assert hot.hot(4) == 1
    assert hot.hot(1) == 0  # one copy: nobody is replicated
    # c with 2 requests: evidence enough, but 2/32 × 4 = 0.25 fair shares: one replica.
    hot.assign("c", 0.0, 4)
    hot.assign("c", 0.0, 4)
    assert hot.hot(4) == 1
    # 12 more of b (13 of 35): ceil(13/35 × 4) = 2 replicas: hot too.
    for _ in range(12):
        hot.assign("b", 0.0, 4)
    assert hot.hot(4) == 2


def test_hot_weighs_evidence_at_the_last_requests_weight():
    # a: 2 requests at 0 s; then c, 30 requests one half-life later (weight 2). min_requests 2 at the
    # last weight is 4: a's 2 is not enough evidence any more, however large its share could be.
    hot = HotPrefixes(ReplicationSettings(min_requests=2.0, target_share_factor=0.01, half_life_s=10.0))
    hot.assign("a", 0.0, 8)
    hot.assign("a", 0.0, 8)
    assert hot.hot(8) == 1
    for _ in range(30):
        hot.assign("c", 10.0, 8)
    assert hot.hot(8) == 1  # c only


def test_what_a_count_inherited_is_rescaled_with_it():
    # Half-life 1 s, one slot: b inherits a's count 1 at 0 s. At 501 s a request weighs 2^501, past
    # the rescale point (2^500): every count and what it inherited shrink by that factor, so b surely
    # has its own requests, 1/2^501 + 1 (the inherited 1 is now 1/2^501), against the floor of 32
    # requests' worth: 1/32. Left unscaled, the inherited 1 would cancel b's request: about 0.
    hot = HotPrefixes(ReplicationSettings(capacity=1, half_life_s=1.0))
    hot.observe("a", 0.0)
    assert hot.observe("b", 0.0) == pytest.approx(1 / 32)
    assert hot.observe("b", 501.0) == pytest.approx(1 / 32)
