"""Routing keys and stable hashes (prefix_routing.lab.routing)."""

from __future__ import annotations

from prefix_routing.lab.routing import key_blocks, routing_key, stable_hash


def test_key_blocks_maps_bytes_to_blocks():
    # 512-token blocks at 4 bytes per token are 2,048 bytes.
    assert key_blocks(1024) == 1
    assert key_blocks(2048) == 1
    assert key_blocks(2049) == 2
    assert key_blocks(4096) == 2
    assert key_blocks(65536) == 32
    assert key_blocks(4096, bytes_per_token=2) == 4
    assert key_blocks(4096, block_bytes=1000) == 5
    # JSON before the prompt eats into the key: 1,024 bytes of it leave nothing of a 1,024 key.
    assert key_blocks(1024, key_offset_bytes=1024) == 0
    assert key_blocks(4096, key_offset_bytes=100) == 2
    assert key_blocks(4196, key_offset_bytes=100) == 2
    assert key_blocks(4197, key_offset_bytes=100) == 3


def test_routing_key_uses_the_chained_id_and_the_prefix_aware_id():
    assert routing_key([7, 8, 9], 2) == 8
    assert routing_key([7], 2) == 7  # shorter than the key: its whole prompt
    assert routing_key([7, 8], 0) is None
    assert routing_key([7, 8], 1, "tenant-a") == ("tenant-a", 7)


def test_stable_hash_is_the_same_in_every_process():
    # blake2b, not the per-process salted hash(): pinned so a change shows up here.
    assert stable_hash("tenant-a") == 0x4FBA221BC5E31261
    assert stable_hash(("a", 1)) == stable_hash(("a", 1))
    assert stable_hash(5) == 5


# --------------------------------------------------------------------------- Router

import pytest  # noqa: E402

from prefix_routing.lab.fleet import Fleet  # noqa: E402
from prefix_routing.lab.fleet_config import FleetConfig  # noqa: E402
from prefix_routing.lab.routing import Router, Strategy  # noqa: E402
from prefix_routing.rules.errors import UserError  # noqa: E402


def test_router_homes_are_the_fleet_models_homes_for_the_same_seed():
    """The emulator on real engines and the lab must send a key to the same copy."""
    fleet = Fleet(FleetConfig(instances=4, copies=1, preset="g6e.xlarge-llama3.1-8b", seed=5))
    router = Router(Strategy.PREFIX_AWARE, 4, concurrency_threshold=10, seed=5)
    keys = [12345, 2**63 + 7, b"\x01" * 32, ("tenant-a", b"\x02" * 32), "text"]
    assert [router.home(k) for k in keys] == [fleet.home(k) for k in keys]
    assert len({router.home(i) for i in range(100)}) == 4


def test_router_spills_a_busy_home_to_the_least_loaded_copy_below_the_threshold():
    router = Router(Strategy.PREFIX_AWARE, 4, concurrency_threshold=2, seed=0)
    key = 99
    home = router.home(key)
    out = [0, 0, 0, 0]
    assert router.choose(key, out) == (home, False)
    out[home] = 2  # at the threshold
    out[(home + 1) % 4] = 1
    out[(home + 2) % 4] = 0
    out[(home + 3) % 4] = 1
    assert router.choose(key, out) == ((home + 2) % 4, True)
    assert router.choose(key, [2, 2, 2, 2]) == (home, False)  # everyone at the threshold: home on ties


def test_router_least_outstanding_picks_the_minimum_and_random_spreads():
    lor = Router(Strategy.LEAST_OUTSTANDING_REQUESTS, 3, concurrency_threshold=1, seed=1)
    assert all(lor.choose(None, [4, 1, 3]) == (1, False) for _ in range(20))
    rnd = Router("RANDOM", 3, concurrency_threshold=1, seed=1)
    picks = [rnd.choose(None, [0, 0, 0])[0] for _ in range(300)]
    assert all(80 <= picks.count(g) <= 120 for g in range(3))
    assert Router("PREFIX_AWARE", 1, concurrency_threshold=1).choose(7, [50]) == (0, False)


def test_router_refuses_kv_aware_and_bad_copy_counts():
    with pytest.raises(UserError, match="KV_AWARE: needs the copies' caches"):
        Router("KV_AWARE", 2, concurrency_threshold=1).choose(1, [0, 0])
    with pytest.raises(UserError, match="copies=3"):
        Router("RANDOM", 3, concurrency_threshold=1, copies_per_instance=2)


def test_with_kept_homes_a_missing_copy_moves_only_its_own_keys():
    router = Router(Strategy.PREFIX_AWARE, 4, concurrency_threshold=100, seed=3)
    keys = [f"prefix-{i}" for i in range(400)]
    idle = [0, 0, 0, 0]
    homes = {key: router.choose(key, idle)[0] for key in keys}
    assert homes == {key: router.home(key) for key in keys}  # all copies serving: the plain homes
    router.set_active([0, 1, 3], keep_homes=True)  # copy 2 is out
    moved = {key: router.choose(key, idle)[0] for key in keys}
    assert all(moved[key] == homes[key] for key in keys if homes[key] != 2)
    assert all(moved[key] in (0, 1, 3) for key in keys if homes[key] == 2)
    assert sum(homes[key] == 2 for key in keys) > 50  # the test covers keys of the missing copy
    router.set_active(None)
    assert {key: router.choose(key, idle)[0] for key in keys} == homes  # back: every key at its home
