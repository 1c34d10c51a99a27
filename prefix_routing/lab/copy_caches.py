"""Each copy's prefix cache in the fleet model (lab/fleet.py): the LRU of block ids an engine keeps.

A copy's cache is an ``OrderedDict`` of block ids (least recently used first), a ``ChainLRU``
(lab/chain_cache.py: the same contents, for ids known to be chained), or a ``set`` when the capacity
is unbounded; with llama.cpp slots (lab/slot_cache.py) the slots hold the sequences instead.
:func:`touch` is the LRU's update after a request; :class:`CopyCaches` holds the copies' caches and
answers what a copy, or the others, hold of a prompt.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from itertools import repeat
from typing import Hashable, Sequence

from prefix_routing.lab.chain_cache import ChainLRU

consume = deque(maxlen=0).extend  # runs an iterator to its end in C
NONES = repeat(None)  # endless; map() stops at the shorter iterable


class CopyCaches:
    """The prefix caches of ``n`` copies of ``capacity`` tokens each (× ``cache_scale``).

    ``caches`` is one list for the caches' whole life (changing their kind replaces its items), so
    that the fleet's hot path can hold it."""

    def __init__(self, n: int, capacity: float, cache_scale: float, block_tokens: float, slots=None) -> None:
        self.n = n
        self.infinite = math.isinf(capacity)
        self.cap_blocks = 0 if self.infinite else int(capacity * cache_scale // block_tokens)
        self.caches: list = [set() if self.infinite else OrderedDict() for _ in range(n)]
        self.chained = False  # the caches are ChainLRUs (use_chain_caches), not OrderedDicts
        self.slots = slots  # a SlotCache (llamacpp-slots), or None

    def use_chain_caches(self) -> bool:
        """Keep the LRU caches as runs of chained blocks (lab/chain_cache.py): the same contents, at
        a third of the cost, for ids that are chained (the caller's word). Only while every cache
        is still empty; False when they are not, or are not LRUs of blocks."""
        if self.chained:
            return True
        if self.infinite or self.slots is not None or any(self.caches):
            return False
        self.caches[:] = [ChainLRU(self.cap_blocks) for _ in range(self.n)]
        self.chained = True
        return True

    def use_ordered_caches(self) -> None:
        """Back to ``OrderedDict`` caches (the same contents and order), for ids not known to be chained."""
        if self.chained:
            self.caches[:] = [cache.to_ordered() for cache in self.caches]
            self.chained = False

    def cached_prefix_blocks(self, g: int, blocks: Sequence[Hashable]) -> int:
        """Leading blocks of ``blocks`` that copy ``g`` holds (no side effects)."""
        if self.slots is not None:
            return self.slots.held_prefix_blocks(g, blocks)
        if self.chained:
            return self.caches[g].held(blocks)
        contains = self.caches[g].__contains__
        m = 0
        for b in blocks:
            if not contains(b):
                break
            m += 1
        return m

    def clear_copy(self, g: int) -> None:
        """Copy ``g`` was removed (autoscaling): it loses its cache."""
        self.caches[g].clear()

    def blocks_held(self, g: int) -> float:
        """The blocks copy ``g`` holds now (its slots' with llamacpp-slots; never counted: inf)."""
        if self.slots is not None:
            return self.slots.blocks_held(g)
        return math.inf if self.infinite else len(self.caches[g])

    def held_elsewhere(self, g: int, blocks) -> int:
        """The most of ``blocks`` that a copy other than ``g`` holds (its cache, or its slots)."""
        if self.slots is None:
            # Only copies that hold the first of them are counted: caches keep a chain from its
            # first block on (the tail is evicted first), so the others hold little or none of it.
            first, best = blocks[0], 0
            for h, cache in enumerate(self.caches):
                if h != g and first in cache:
                    held = sum(map(cache.__contains__, blocks))
                    if held > best:
                        best = held
            return best
        return max((self.slots.held_prefix_blocks(h, blocks) for h in range(self.n) if h != g), default=0)

    def chained_held_elsewhere(self, blocks, m: int, g: int, rest) -> int:
        """``held_elsewhere(g, rest)`` for chain caches, ``rest`` being ``blocks[m:]``: a copy holds a
        leading part of the prompt, so its share of ``rest`` is what it holds past the first m."""
        best = 0
        for h, cache in enumerate(self.caches):
            if h != g:
                held = cache.held(blocks) - m
                if held > best:
                    best = held
        return best


def whole_blocks_cached(held_tokens: float, prompt_tokens: int, engine_block: int) -> float:
    """The tokens a vLLM engine serves from its cache when it holds the prompt's first ``held_tokens``:
    whole blocks of ``engine_block`` tokens, never the prompt's last token (vLLM computes at least
    one token to sample from): ``floor(min(held, prompt − 1) / block) × block``."""
    last = prompt_tokens - 1
    cached = held_tokens if held_tokens < last else last
    return max(0, cached - cached % engine_block)


def touch(cache, blocks: Sequence[Hashable], m: int, infinite: bool, cap_blocks: int) -> None:
    """Touch a request's blocks in a copy's cache, tail first (``m`` of them were there); evict the LRU."""
    if m < len(blocks):
        if infinite:
            cache.update(blocks)
        else:
            rest = blocks[m:]
            before = len(cache)
            consume(map(cache.__setitem__, reversed(rest), NONES))
            if len(cache) - before != len(rest):  # some were held past a missing one (ids not chained)
                consume(map(cache.move_to_end, reversed(rest)))
    if m and not infinite:
        try:
            consume(map(cache.move_to_end, reversed(blocks[:m])))
        except KeyError:  # ids that are not chained (or repeat): touch one by one
            for b in reversed(blocks[:m]):
                if b in cache:
                    cache.move_to_end(b)
                else:
                    cache[b] = None
    extra = len(cache) - cap_blocks
    if extra > 0 and not infinite:
        consume(map(cache.popitem, repeat(False, extra)))
