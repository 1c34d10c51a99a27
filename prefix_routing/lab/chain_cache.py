"""A copy's LRU cache of chained blocks, kept as runs of blocks instead of one entry per block.

When block ids are chained (each id has one parent, the id before it, in every request: equal id =
equal prefix), an LRU that touches a prompt's blocks tail first holds a set closed under parents:
a block is always more recent than its children, so the least recent block is a leaf. The LRU order
is then a sequence of *runs*: each the blocks ``chain[lo:hi]`` of one earlier prompt ``chain``, least
recent first from its deepest block, all older than the next run's. A request only

- walks the runs its prompt passes through (it enters each at its top, ``chain[lo]``),
- takes the part it shares from each of them (their ``lo`` moves down the chain),
- appends itself as the newest run, and evicts from the oldest run's deep end,

so its cost grows with the runs it meets (one or two), not with its blocks, as an ``OrderedDict``
LRU's does (``copy_caches.touch``). It holds exactly what that ``OrderedDict`` holds, in the same order:
tests/prefix_routing/lab/test_chain_cache.py runs both on the same requests. Ids that are not
chained break the property, so the simulator uses it only for traces that pass :func:`chained`.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Iterator, Sequence

# A run is a list [chain, lo, hi]: the blocks chain[lo:hi] (a list, for speed in the hot path).
_CHAIN, _LO, _HI = 0, 1, 2


def chained(blocks: Iterable[Sequence[Hashable]]) -> bool:
    """Whether every id has one parent: the id before it in every prompt it is in (none when first).

    That also rules out an id twice in one prompt. One dict entry per distinct id."""
    parent: dict = {}
    first_seen = parent.setdefault
    root = _ROOT
    for ids in blocks:
        before = root
        for b in ids:
            if first_seen(b, before) != before:
                return False
            before = b
    return True


_ROOT = object()  # the parent of a prompt's first block: equal to no id


class ChainLRU:
    """An LRU of at most ``capacity`` chained blocks, touched a prompt at a time, tail first."""

    __slots__ = ("tops", "runs", "size", "capacity")

    def __init__(self, capacity: int) -> None:
        self.tops: dict = {}  # the top block of each run that holds blocks -> the run
        self.runs: deque = deque()  # least recent first; runs emptied by a walk wait here until evicted
        self.size = 0  # blocks held
        self.capacity = capacity

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[Hashable]:
        """The blocks held, least recent first (as iterating the ``OrderedDict`` gives them)."""
        for chain, lo, hi in self.runs:
            yield from reversed(chain[lo:hi])

    def held(self, ids: Sequence[Hashable]) -> int:
        """How many leading blocks of ``ids`` are held (no side effects)."""
        d, k, tops = 0, len(ids), self.tops
        run = tops.get(ids[0]) if k else None
        while run is not None:
            chain, hi = run[_CHAIN], run[_HI]
            e = hi if hi < k else k
            if chain is ids or chain[e - 1] == ids[e - 1]:
                d = e
            elif chain[d + 1] != ids[d + 1]:  # (most often: prompts that share only a first block)
                d += 1
            else:
                d = _divergence(chain, ids, d, e)
            if d >= k:
                break
            run = tops.get(ids[d])
        return d

    def place(self, ids: Sequence[Hashable]) -> int:
        """Touch ``ids`` (the held ones move to the front, the others enter), evict the least recent
        beyond capacity; returns how many leading blocks were held before."""
        k = len(ids)
        if not k:
            return 0
        tops = self.tops
        d = 0
        run = tops.get(ids[0])
        while run is not None:  # each run the prompt passes through gives up the part it shares
            chain, hi = run[_CHAIN], run[_HI]
            e = hi if hi < k else k
            if chain is not ids and chain[e - 1] != ids[e - 1]:
                e = d + 1 if chain[d + 1] != ids[d + 1] else _divergence(chain, ids, d, e)
            del tops[chain[d]]
            if e < hi:
                run[_LO] = e
                tops[chain[e]] = run
            else:
                run[_LO] = hi
            d = e
            if d >= k:
                break
            run = tops.get(ids[d])
        new = [ids, 0, k]
        tops[ids[0]] = new
        runs = self.runs
        runs.append(new)
        size = self.size + k - d
        extra = size - self.capacity
        if extra > 0:
            size -= extra
            while extra > 0:  # from the oldest run's deep end
                run = runs[0]
                lo, hi = run[_LO], run[_HI]
                if hi - lo <= extra:
                    extra -= hi - lo
                    runs.popleft()
                    if hi > lo:
                        del tops[run[_CHAIN][lo]]
                else:
                    run[_HI] = hi - extra
                    extra = 0
        elif len(runs) > 2 * size + 64:  # many emptied runs and no eviction to drop them
            self.runs = deque(r for r in runs if r[_HI] > r[_LO])
        self.size = size
        return d

    def to_ordered(self) -> OrderedDict:
        """The same cache as an ``OrderedDict`` (least recent first), for ids that turn out not chained."""
        return OrderedDict.fromkeys(self)


def _divergence(chain: Sequence[Hashable], ids: Sequence[Hashable], d: int, e: int) -> int:
    """The first depth in (d, e) where ``chain`` and ``ids`` differ, given that they agree at ``d``
    and ``d + 1`` and differ at ``e - 1``: chained ids that are equal at a depth are equal at every
    depth above it, so a binary search finds it."""
    lo, top = d + 2, e - 1  # (the caller has seen them agree at d + 1)
    while lo < top:
        mid = (lo + top) >> 1
        if chain[mid] == ids[mid]:
            lo = mid + 1
        else:
            top = mid
    return lo
