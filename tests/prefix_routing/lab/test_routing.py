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
