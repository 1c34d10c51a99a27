"""A minimal PREFIX_AWARE + LRU simulation, written for the benchmark as the yardstick of the lab's speed.

Independent of ``prefix_routing.lab`` (it imports nothing of it): the least a simulation of the same
policy on the same input must do per request, written plainly:

- the routing key is the id of the request's k-th block (its last if shorter); its home copy is a
  Fibonacci hash of the key, mod the copies; a home with ``threshold`` or more requests in flight
  sends the request to the least loaded copy instead (ConcurrencyThreshold);
- each copy caches blocks in an LRU of ``capacity_blocks``; a request's cached tokens are its
  blocks found there × the block size (at most its prompt); its blocks are then touched, tail
  first, and the least recently used evicted;
- each copy runs prefills one after another at ``prefill_s_per_token`` per uncached token, and every
  output token takes ``decode_s_per_token``; a request is in flight from arrival to its last token.

It reports the hit rate and the median time to first token, so a reader can see it simulates what
the lab does (the figures differ where the lab models more: slots, the KV budget, chunked
prefill, timeouts, why tokens were missed).
"""

from __future__ import annotations

from collections import OrderedDict
from heapq import heappop, heappush

_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


class MinimalPrefixSim:
    def __init__(self, copies: int, key_blocks: int, threshold: int, block_tokens: int, capacity_blocks: int,
                 prefill_s_per_token: float = 2e-5, decode_s_per_token: float = 0.02) -> None:
        self.copies, self.k, self.threshold = copies, key_blocks, threshold
        self.block_tokens, self.capacity = block_tokens, capacity_blocks
        self.prefill, self.decode = prefill_s_per_token, decode_s_per_token
        self.caches = [OrderedDict() for _ in range(copies)]
        self.out = [0] * copies
        self.free = [0.0] * copies  # when each copy's prefill queue is free
        self.done: list = []  # heap of (last token, copy)
        self.cached_tokens = 0.0
        self.prompt_tokens = 0.0
        self.ttfts: list[float] = []

    def feed(self, arrivals, prompts, outputs, blocks) -> None:
        copies, k, threshold, bt, capacity = self.copies, self.k, self.threshold, self.block_tokens, self.capacity
        caches, out, free, done, ttfts = self.caches, self.out, self.free, self.done, self.ttfts
        prefill, decode = self.prefill, self.decode
        cached_total = prompt_total = 0.0
        for now, prompt, output, ids in zip(arrivals, prompts, outputs, blocks):
            while done and done[0][0] <= now:
                out[heappop(done)[1]] -= 1
            n = len(ids)
            key = ids[(k if k < n else n) - 1] if n else 0
            g = ((key * _GOLDEN) & _MASK) % copies
            if out[g] >= threshold:
                g = min(range(copies), key=out.__getitem__)
            cache = caches[g]
            found = 0
            for b in ids:
                if b in cache:
                    found += 1
            cached = min(prompt, found * bt)
            for b in reversed(ids):
                if b in cache:
                    cache.move_to_end(b)
                else:
                    cache[b] = None
            while len(cache) > capacity:
                cache.popitem(last=False)
            start = now if now > free[g] else free[g]
            first = start + (prompt - cached) * prefill
            free[g] = first
            out[g] += 1
            heappush(done, (first + output * decode, g))
            ttfts.append(first - now)
            cached_total += cached
            prompt_total += prompt
        self.cached_tokens += cached_total
        self.prompt_tokens += prompt_total

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def ttft_p50_s(self) -> float:
        values = sorted(self.ttfts)
        return values[len(values) // 2] if values else 0.0
