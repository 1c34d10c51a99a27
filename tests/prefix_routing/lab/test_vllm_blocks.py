"""The lab's vLLM copy caches as vLLM does: whole blocks of the engine's block size, never the prompt's
last token (lab/copy_caches.py ``whole_blocks_cached``), and a prompt's token ids as the engine's chained blocks
(lab/token_blocks.py). Expected values: vLLM on this machine's CPU, measured (the shared reference
vllm-cpu-engine.md), and hand computations."""

from __future__ import annotations

import math

import pytest

from prefix_routing.lab.copy_caches import whole_blocks_cached
from prefix_routing.lab.fleet import Fleet, Request
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.token_blocks import token_block_ids
from prefix_routing.rules.errors import UserError
from prefix_routing.stage.presets import get_preset

# (tokens shared with a cached prompt, the prompt's tokens, block) -> cached tokens vLLM reported
MEASURED = [
    (31, 2000, 32, 0), (32, 2000, 32, 32), (33, 2000, 32, 32), (100, 2000, 32, 96), (1000, 2000, 32, 992),
    (1500, 1500, 32, 1472),  # a full repeat of 1,500 tokens
    (127, 2000, 128, 0), (128, 2000, 128, 128), (255, 2000, 128, 128), (1000, 2000, 128, 896),
    (1500, 1500, 128, 1408),
]


@pytest.mark.parametrize("shared, prompt, block, cached", MEASURED)
def test_cached_tokens_are_whole_blocks_short_of_the_last_token_as_measured(shared, prompt, block, cached):
    assert whole_blocks_cached(shared, prompt, block) == cached


def test_the_rule_at_its_edges():
    assert whole_blocks_cached(64, 64, 32) == 32  # a prompt of whole blocks: its last block is computed
    assert whole_blocks_cached(64, 65, 32) == 64  # one token more: both blocks served
    assert whole_blocks_cached(0, 100, 16) == 0 and whole_blocks_cached(1, 1, 16) == 0
    assert whole_blocks_cached(99.5, 100, 1) == 99  # fractional token counts (bytes-sized blocks)
    assert whole_blocks_cached(500, 100, 16) == 96  # held beyond the prompt: capped at its last token
    assert whole_blocks_cached(1, 5, 1) == 1 and whole_blocks_cached(5, 5, 1) == 4  # blocks of one token
    assert whole_blocks_cached(0, 0, 16) == 0  # an empty prompt: nothing, never less


def chained(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_a_copy_serves_a_repeat_in_whole_engine_blocks_and_books_the_rest_as_last_block():
    # Trace blocks of 32 tokens, the engine's too: a 1,500-token prompt is 47 ids (46 whole blocks and a
    # partial one of 28). Its repeat holds all 1,500, of which vLLM serves 46 × 32 = 1,472.
    config = FleetConfig(instances=1, cache_tokens=math.inf, block_tokens=32, engine_block_tokens=32)
    fleet = Fleet(config)
    first = fleet.submit(Request(1500, 1, chained(47)), 0.0)
    again = fleet.submit(Request(1500, 1, chained(47)), 10.0)
    assert (first.cached_tokens, again.cached_tokens) == (0, 1472)
    assert fleet.misses.as_dict() == {"last_block": 28, "first_touch": 1500, "rekeyed": 0, "routed_away": 0,
                                      "evicted": 0}
    # A prompt sharing its first 3 blocks (96 tokens) with them: 96 served.
    part = fleet.submit(Request(1000, 1, chained(3) + chained(29, start=1000)), 20.0)
    assert part.cached_tokens == 96


def test_the_engine_block_defaults_to_the_presets_and_is_checked():
    assert FleetConfig().engine_block == get_preset(FleetConfig().preset.name).engine_block_tokens == 16
    assert FleetConfig(engine_block_tokens=128).engine_block == 128
    for bad in (0, 4097, 1.5, True):
        with pytest.raises(UserError, match=rf"engine_block_tokens={bad!r}: must be an integer from 1 to 4096"):
            FleetConfig(engine_block_tokens=bad)


def test_token_ids_become_chained_ids_of_whole_blocks():
    interned: dict = {}
    a = token_block_ids([1, 2, 3, 4, 5, 6, 7], 3, interned)  # 2 whole blocks; the 7th token is not cached
    b = token_block_ids([1, 2, 3, 4, 5, 6, 8, 9, 10], 3, interned)  # the same two, then its own
    c = token_block_ids([9, 2, 3, 4, 5, 6], 3, interned)  # the second block's tokens, under another first
    assert a == [0, 1] and b == [0, 1, 2] and c == [3, 4]  # chained: equal ids, equal prefixes
    assert token_block_ids([1, 2], 3, interned) == [] and token_block_ids([], 3, interned) == []
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match=f"block {bad!r}: must be an integer >= 1"):
            token_block_ids([1], bad, {})
    assert token_block_ids([7, 8], 1, {}) == [0, 1]  # blocks of one token


def test_a_first_block_is_never_taken_for_a_later_one_with_the_same_tokens():
    """The first block's parent is a root that no id is: [z z z] first is not [x x x y y y z z z]'s third."""
    interned: dict = {}
    x, y, z = [1, 1, 1], [2, 2, 2], [3, 3, 3]
    assert token_block_ids(x + y + z, 3, interned) == [0, 1, 2]
    assert token_block_ids(z, 3, interned) == [3]
    assert token_block_ids(y, 3, interned) == [4]
