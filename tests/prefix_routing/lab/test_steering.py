"""The lab's replica steering: the front door's rule, with answers at the modelled finish."""

from __future__ import annotations

from prefix_routing.lab.simulate import simulate
from prefix_routing.lab.steered_replicas import SteeredReplicas
from prefix_routing.lab.workloads import LongContextSpec, long_context_workload
from prefix_routing.lab.routing import Strategy
from prefix_routing.rules.replication import ReplicationSettings

HOT = ReplicationSettings(enabled=True, min_requests=1.0, target_share_factor=0.01)


def test_a_cold_prefix_keeps_its_key_and_no_state():
    steered = SteeredReplicas(ReplicationSettings(enabled=True))
    assert steered.route("cold", 0.0, copies=4) == 0  # one request is no evidence (min_requests)
    steered.sent("cold", 0, 1.0, 0, 1000)
    assert steered.states == {} and steered._answers == []


def test_an_answer_counts_only_once_the_modelled_finish_has_passed():
    steered = SteeredReplicas(HOT)
    # One prefix: its first request holds 1/32 of the evidence = 0.125 fair shares on 4 copies, over
    # the 0.01 of a replica: 13 replicas wanted, capped at the 4 copies.
    numbers = [steered.route("p", 0.0, copies=4) for _ in range(4)]
    assert numbers == [0, 1, 2, 3]  # each in flight once: equal turns
    for j in numbers:
        # Replica 2's first answer reports the key cached: it landed where the prefix already was.
        steered.sent("p", j, 10.0, 1000 if j == 2 else 0, 1000)
    assert steered.route("p", 5.0, copies=4) == 0  # before the answers: still 4 in flight, replica 0 first
    assert steered.collisions == 0
    steered.sent("p", 0, 10.0, 1000, 1000)
    # At 10 s the answers are in: replica 2 was retired for the fresh number 4, which now has nothing
    # in flight and nothing sent, so it goes first.
    assert steered.route("p", 10.0, copies=4) == 4
    assert (steered.collisions, steered.redraws) == (1, 1)
    assert [s.number for s in steered.states["p"].slots] == [0, 1, 4, 3]


def _run(seed: int, steering: bool):
    spec = LongContextSpec(zipf=1.1)
    trace = long_context_workload(spec, seed=seed)
    replication = ReplicationSettings(enabled=True, steering=steering)
    return simulate(trace, spec.fleet_config(strategy=Strategy.PREFIX_AWARE, seed=seed, replication=replication))


def test_steering_bounds_the_hotspot_that_random_placement_of_replicas_leaves():
    # Zipf 1.1 long-context, seed 0: replicas used in turn leave one instance with far more than its
    # share (max/mean above 1.25); steered, every instance is within 1.25 of the mean.
    turns, steered = _run(0, steering=False), _run(0, steering=True)
    assert turns.max_mean_requests > 1.25
    assert steered.max_mean_requests <= 1.25
    assert steered.extra["steering"]["replica_collisions"] > 0
    assert steered.hit_rate >= 0.98 * turns.hit_rate


def test_a_replica_is_keyed_as_the_front_door_sends_it_so_the_lab_and_the_emulator_agree():
    from prefix_routing.lab.fleet import replica_key
    from prefix_routing.lab.misses import ClientKey

    digest = b"\x01" * 32
    # With a PrefixAwareId: the same prefix under <id>-r<j>, the emulator's key for that request.
    assert replica_key(("pa-tenant", digest), 3) == ("pa-tenant-r3", digest)
    # Without one: the front door sends r<j> as the id.
    assert replica_key(1234, 2) == ("r2", 1234)
    # A client's own bytes stay a ClientKey (its misses are booked as re-keyed).
    client = ClientKey(("as-sent", "abc"))
    assert replica_key(client, 1).__class__ is ClientKey
