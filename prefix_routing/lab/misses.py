"""Why a prompt's tokens were not cached: last block, first touch, re-keyed by the client, routed away, evicted.

Every uncached token of a served request falls in exactly one class, judged when the request is
routed (block ids are chained, and a copy caches a prompt's blocks from its first one on, so
"cached on copy h" is the number of leading blocks h holds):

- **last block**: tokens the copy holds that vLLM still computes: it serves whole blocks of its KV
  block size only, and never the prompt's last token (a full repeat of a prompt recomputes its
  partial last block, or one block when the prompt fills whole blocks);

- **first touch**: blocks no request of the workload had before: no routing could have cached them;
- **re-keyed**: requests routed on the client's own bytes (``simulate --as-sent`` on raw bodies:
  no front door), where those bytes keyed routing differently from the normalized body (their key
  is a :class:`ClientKey`; the front door counts such requests as ``RekeyedRequests`` and logs
  ``rekeyed``); behind a front door they are re-keyed and this class is 0;
- **routed away**: blocks another copy held when this one did not (a spill, a replica, another
  strategy's choice): the most of them any other copy holds;
- **evicted**: blocks seen before but held by no copy: the caches were too small (or the prompt's
  blocks were pushed out between its turns).

Token counts: the uncached tokens ``prompt − cached`` are split in that order (last block, first
touch, then routed away, then evicted; the ledger's ``book`` takes the tokens held, the fleet adds
the last block's), a block counting ``block_tokens`` (the new blocks: the prompt's tokens
past the blocks seen before). With the llama.cpp slot policy the copies' holdings are the slots' sequences.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import filterfalse
from typing import Hashable


class ClientKey(tuple):
    """A routing key made of the client's own bytes, which the normalized body would have keyed
    differently: the fleet books the misses of a request routed on one as re-keyed."""

    __slots__ = ()


class MissLedger:
    """The four classes' token totals over a simulation.

    ``seen`` holds every block seen ("seen before" is membership, C-speed ``set.update``); where
    a seen block is held now is asked of the copies only when a seen block was not cached, which a
    prefix-aware fleet rarely meets. Memory is bounded by two generations of ``limit`` blocks: a
    block unseen for that long (many times what the whole fleet caches) is forgotten, and if it
    comes back it counts as a first touch, not as evicted.
    """

    __slots__ = ("seen", "older", "limit", "last_block", "first_touch", "rekeyed", "routed_away", "evicted")

    def __init__(self, limit: int = 2_000_000) -> None:
        self.seen: set = set()  # this generation
        self.older: set = set()  # the one before
        self.limit = limit
        self.last_block = 0.0
        self.first_touch = 0.0
        self.rekeyed = 0.0
        self.routed_away = 0.0
        self.evicted = 0.0

    @classmethod
    def for_fleet(cls, copies: int, capacity_tokens: float, block_tokens: float) -> "MissLedger":
        """A ledger that remembers blocks for about 8 fleets' worth of cache (200,000 to 2,000,000)."""
        blocks_cached = math.inf if math.isinf(capacity_tokens) else copies * capacity_tokens / block_tokens
        return cls(int(min(2_000_000, max(200_000, 4 * blocks_cached))))

    def _known(self, rest: Sequence[Hashable]) -> int:
        seen, older = self.seen, self.older
        known = sum(map(seen.__contains__, rest))
        if older and known < len(rest):
            known += sum(map(older.__contains__, filterfalse(seen.__contains__, rest)))  # in C
        return known

    def book(self, blocks: Sequence[Hashable], g: int, m: int, prompt_tokens: float, held_tokens: float,
             block_tokens: float, held_elsewhere: Callable[[int, Sequence[Hashable]], int],
             rekeyed: bool = False) -> None:
        """One served request on copy ``g``, which held its ``m`` leading blocks, ``held_tokens`` of
        the prompt (what of them the engine still computed is the fleet's ``last_block``);
        ``held_elsewhere(g, rest)`` is the most of ``rest`` any other copy holds (asked only when a
        seen block was not cached)."""
        seen = self.seen
        uncached_tokens = prompt_tokens - held_tokens
        if uncached_tokens > 0:
            rest = blocks[m:] if m else blocks
            if rekeyed:  # the client's bytes sent it elsewhere: the whole miss is the client's
                self.rekeyed += uncached_tokens
            else:
                new = len(rest) - self._known(rest)
                # New blocks are a chain's tail: their tokens are the prompt past the blocks seen
                # before (so a partial last block counts what it holds, not a whole block).
                first = min(uncached_tokens, max(0.0, prompt_tokens - (len(blocks) - new) * block_tokens)) if new else 0.0
                self.first_touch += first
                remaining = uncached_tokens - first
                if remaining > 0:
                    away = min(remaining, held_elsewhere(g, rest) * block_tokens)
                    self.routed_away += away
                    self.evicted += remaining - away
            seen.update(rest)
        elif m < len(blocks):
            seen.update(blocks[m:])
        # (the m cached blocks were seen when they entered the cache)
        if len(seen) > self.limit:
            self.older, self.seen = seen, set()

    def record(self, blocks: Sequence[Hashable], g: int, held: int, prompt_tokens: float, held_tokens: float,
               cached_tokens: float, block_tokens: float, held_elsewhere: Callable[[int, Sequence[Hashable]], int],
               rekeyed: bool) -> None:
        """One served request, as the fleet model records it: what the copy held but its engine still
        computed (``held_tokens − cached_tokens``, the last block), then :meth:`book`, with its
        common cases inline (nothing new, or all new)."""
        self.last_block += held_tokens - cached_tokens  # held, but not whole blocks short of the last token
        if held < len(blocks):
            rest = blocks[held:] if held else blocks
            seen = self.seen
            first_block = rest[0]
            if held_tokens < prompt_tokens and (first_block in seen or first_block in self.older or rekeyed):
                self.book(blocks, g, held, prompt_tokens, held_tokens, block_tokens, held_elsewhere, rekeyed)
            else:  # the uncached part starts with a block never seen: chained ids, so all of it is new
                self.first_touch += prompt_tokens - held_tokens
                seen.update(rest)
                if len(seen) > self.limit:
                    self.older, self.seen = seen, set()

    def as_dict(self) -> dict[str, float]:
        return {"last_block": self.last_block, "first_touch": self.first_touch, "rekeyed": self.rekeyed,
                "routed_away": self.routed_away, "evicted": self.evicted}
