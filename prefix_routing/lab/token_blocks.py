"""A prompt's token ids as the chained block ids of a vLLM engine's prefix cache.

vLLM hashes a prompt in whole blocks of its KV block size, each block's hash covering the block's
tokens and the hash of the block before it (so equal hashes mean equal prefixes), and caches whole
blocks only: a trailing partial block is never cached. :func:`token_block_ids` gives the lab the same
ids: one per whole block, chained, interned to small integers, so that a simulation of those ids on
the vLLM block cache (``block_tokens`` = the engine's block) holds what the engine holds.
"""

from __future__ import annotations

from collections.abc import Sequence


def token_block_ids(tokens: Sequence[int], block: int, interned: dict) -> list[int]:
    """The ids of the whole ``block``-token blocks of ``tokens``, chained; ``interned`` maps each
    (parent id, block's tokens) to its id across calls, so that prompts sharing a prefix share ids."""
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        raise ValueError(f"block {block!r}: must be an integer >= 1")
    ids: list[int] = []
    parent = -1
    for start in range(0, len(tokens) - block + 1, block):
        key = (parent, tuple(tokens[start:start + block]))
        parent = interned.setdefault(key, len(interned))
        ids.append(parent)
    return ids
