"""Hot-prefix replication: decayed shares in bounded memory, replica counts, equal replica shares, ids."""

from __future__ import annotations

import math
import string

import pytest
from hypothesis import given, strategies as st

from prefix_routing.rules.replication import (
    MAX_ROUTING_ID,
    HotPrefixes,
    ReplicationSettings,
    replica_count,
    replica_id,
)

SETTINGS = ReplicationSettings(enabled=True, max_replicas=4, target_share_factor=2.0, half_life_s=60.0, capacity=64)


def test_replica_count_follows_the_formula_by_hand():
    # 8 copies, factor 2: a prefix is replicated above 2/8 = 25 % of the requests.
    assert replica_count(0.25, 8, SETTINGS) == 1  # exactly 2 fair shares: 8 × 0.25 / 2 = 1
    assert replica_count(0.26, 8, SETTINGS) == 2  # ceil(1.04)
    assert replica_count(0.60, 8, SETTINGS) == 3  # ceil(2.4)
    assert replica_count(0.99, 8, SETTINGS) == 4  # ceil(3.96), and max_replicas caps it there
    # More replicas than copies still spread a prefix: each is hashed to a copy on its own.
    assert replica_count(1.0, 8, ReplicationSettings(max_replicas=64, target_share_factor=0.5)) == 16
    assert replica_count(0.9, 1, SETTINGS) == 1 and replica_count(0.0, 8, SETTINGS) == 1


def test_shares_decay_by_half_every_half_life():
    hot = HotPrefixes(SETTINGS)
    for _ in range(200):
        hot.observe("a", 0.0)
    # 200 requests of "a" at t=0 weigh 200; one of "b" one half-life later weighs 2 (in units of t=0).
    assert hot.observe("b", 60.0) == pytest.approx(2 / 202)
    assert hot.share("a") == pytest.approx(200 / 202)
    assert hot.observe("b", 120.0) == pytest.approx((2 + 4) / (202 + 4))


def test_a_quiet_endpoints_next_request_is_not_hot():
    hot = HotPrefixes(SETTINGS)
    for t in range(100):
        hot.observe(t, float(t))
    # Ten half-lives of silence: the decayed traffic is ~0.1 request, but shares count against at
    # least 32 recent requests, so the newcomer has 1/32 of the traffic, not all of it.
    assert hot.assign("newcomer", 700.0, copies=8) == (0, 1)
    assert hot.share("newcomer") == pytest.approx(1 / 32, rel=0.01)


def test_a_hot_prefix_gets_replicas_in_turn_and_replica_zero_keeps_its_id():
    hot = HotPrefixes(SETTINGS)
    assigned = [hot.assign("hot", t * 0.01, copies=8) for t in range(48)]
    # Alone, the prefix has n/32 of the traffic after n requests (the evidence floor), then all of
    # it: k = min(4, ceil(8 × share / 2)) grows 1, 2, 3, 4 and stays at 4.
    ks = [k for _, k in assigned]
    assert ks[:4] == [1, 1, 1, 1] and ks == sorted(ks) and ks[-16:] == [4] * 16
    turns = [j for j, _ in assigned[-8:]]
    assert sorted(turns) == [0, 0, 1, 1, 2, 2, 3, 3] and turns[4:] == turns[:4]
    assert replica_id("tenant-a", 0) == "tenant-a" and replica_id("tenant-a", 3) == "tenant-a-r3"
    assert replica_id(None, 2) == "r2" and replica_id(None, 0) is None


def test_a_long_id_is_cut_to_stay_within_64_characters():
    long = "t" * 64
    assert replica_id(long, 12) == "t" * 60 + "-r12" and len(replica_id(long, 12)) == MAX_ROUTING_ID


def test_bad_settings_name_the_field_the_value_and_what_is_allowed():
    with pytest.raises(ValueError, match=r"replication.max_replicas: got number 0; allowed: an integer from 1 to 64"):
        ReplicationSettings(max_replicas=0)
    with pytest.raises(ValueError, match=r"replication.target_share_factor: got .*nan.*; allowed: a number"):
        ReplicationSettings(target_share_factor=math.nan)
    with pytest.raises(ValueError, match=r"replication.half_life_s"):
        ReplicationSettings(half_life_s=0.5)
    with pytest.raises(ValueError, match=r"replication.enabled"):
        ReplicationSettings(enabled="yes")


fingerprints = st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=400)


@given(fingerprints)
def test_memory_is_bounded_whatever_the_traffic(stream):
    hot = HotPrefixes(ReplicationSettings(capacity=16))
    for t, fingerprint in enumerate(stream):
        hot.assign(fingerprint, t * 0.1, copies=8)
        assert len(hot) <= 16 and len(hot._turns) <= 16


@given(st.integers(min_value=8, max_value=200), st.integers(min_value=2, max_value=64))
def test_uniform_traffic_replicates_nothing(prefixes, copies):
    # Each prefix has about 1/prefixes of the traffic, at most one fair share when prefixes >=
    # copies: with factor 2 none is replicated, whatever the decay does within a round.
    settings = ReplicationSettings(target_share_factor=2.0, capacity=256)
    hot = HotPrefixes(settings)
    if prefixes < copies:
        return
    for rounds in range(5):
        for p in range(prefixes):
            assert hot.assign(p, (rounds * prefixes + p) * 0.05, copies) == (0, 1)
    assert hot.hot(copies) == 0


@given(st.integers(min_value=2, max_value=6), st.integers(min_value=1, max_value=50))
def test_the_replicas_of_a_hot_prefix_get_equal_shares(k, rounds):
    settings = ReplicationSettings(max_replicas=k, target_share_factor=0.5)
    hot = HotPrefixes(settings)
    for t in range(32):  # until k is reached: the evidence floor holds it lower at first
        hot.assign("hot", t * 0.01, copies=16)
    seen = [hot.assign("hot", 1 + t * 0.01, copies=16)[0] for t in range(k * rounds)]
    assert all(seen.count(j) == rounds for j in range(k))


@given(fingerprints, st.floats(min_value=1.0, max_value=600.0))
def test_the_same_traffic_gives_the_same_replicas(stream, half_life):
    settings = ReplicationSettings(half_life_s=half_life, capacity=32, target_share_factor=1.0)
    runs = []
    for _ in range(2):
        hot = HotPrefixes(settings)
        runs.append([hot.assign(f % 7, t * 0.5, copies=8) for t, f in enumerate(stream)])
    assert runs[0] == runs[1]


@given(st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=0, max_size=64),
       st.integers(min_value=0, max_value=63))
def test_replica_ids_stay_valid_prefix_aware_ids(routing_id, replica):
    out = replica_id(routing_id or None, replica)
    if replica == 0:
        assert out == (routing_id or None)
    else:
        assert 1 <= len(out) <= MAX_ROUTING_ID and out.endswith(f"r{replica}") and out.isascii()


def test_a_prefix_that_cools_down_loses_its_replicas():
    hot = HotPrefixes(ReplicationSettings(half_life_s=10.0, target_share_factor=1.0, capacity=64))
    for t in range(50):
        hot.assign("hot", t * 0.1, copies=8)
    assert hot.hot(8) == 1
    # Then 10 minutes of uniform traffic over 40 other prefixes: "hot" decays away.
    for t in range(2400):
        hot.assign(t % 40, 5.0 + t * 0.25, copies=8)
    assert hot.assign("hot", 700.0, copies=8) == (0, 1)


def test_a_prefix_needs_min_requests_before_it_is_replicated():
    settings = ReplicationSettings(max_replicas=32, target_share_factor=0.1, min_requests=8.0)
    hot = HotPrefixes(settings)
    assigned = [hot.assign("hot", 0.0, copies=8) for _ in range(9)]
    # Alone at one instant, n requests hold n/32 of the traffic (the evidence floor). Without the
    # guard the first would get k = ceil(8 × 1/32 ÷ 0.1) = 3; with it the first 7 stay at k = 1,
    # the 8th gets k = ceil(8 × 8/32 ÷ 0.1) = 20 (turn 0) and the 9th ceil(22.5) = 23 (turn 1).
    assert assigned[:7] == [(0, 1)] * 7
    assert assigned[7:] == [(0, 20), (1, 23)]
    assert hot.hot(8) == 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_uniform_traffic_replicates_nothing_with_the_default_settings(seed):
    # The lab's long-context workload without skew: 450 prefixes at 3 requests per second on 7 copies.
    # Each has 1/450 of the traffic, a third of the 0.05 fair shares (0.71 %) that would split it;
    # its recent count (about 3 in a 300 s half-life) stays below that and below min_requests (12).
    import random

    rng = random.Random(seed)
    hot, t = HotPrefixes(ReplicationSettings()), 0.0
    for _ in range(10_000):
        t += rng.expovariate(3.0)
        assert hot.assign(rng.randrange(450), t, copies=7) == (0, 1)
    assert hot.hot(7) == 0
