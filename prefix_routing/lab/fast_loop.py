"""The simulator's loop for the common fleet, with the fleet's hot path inlined.

``Fleet._place`` is the reference: routing (``Router.choose``), the cache lookup, the engine's
schedule (``EngineModel.schedule``), the misses ledger's common cases (``MissLedger.record``) and the LRU touch
(``copy_caches.touch``). The calls and attribute look-ups between those pieces cost about a tenth of a
simulated request (the caches' ``OrderedDict`` work is half of it, see docs/lab.md), so for a fleet
that needs none of the rarer features (autoscaling, hot-prefix replication, llama.cpp slots,
KV_AWARE, a single copy) this loop does the same work, in the same order and with the same
arithmetic, on local names. It must give exactly what ``_place`` gives:
tests/prefix_routing/lab/test_fast_loop.py runs both on the same traces and compares the state.
"""

from __future__ import annotations

from functools import partial
from heapq import heappop, heappush
from itertools import repeat as _repeat, takewhile as _takewhile

from prefix_routing.lab.copy_caches import NONES, consume, touch
from prefix_routing.lab.fleet import Fleet
from prefix_routing.lab.misses import ClientKey
from prefix_routing.lab.routing import GOLDEN, KV_AWARE, MASK, PREFIX_AWARE, spill_copy

_INF = float("inf")


def eligible(fleet: Fleet) -> bool:
    """Whether ``run`` models this fleet exactly as ``Fleet._place`` does."""
    return (fleet.pool is None and fleet._slots is None and fleet._hot is None and fleet.n > 1
            and fleet._strategy is not KV_AWARE and fleet.router.active is None)


def run(fleet: Fleet, lo: int, hi: int, inv: float, keys, arrivals, prompts, outputs, blocks,
        firsts, cached_out, where, ends, last_finish: float) -> float:
    """Requests ``lo`` to ``hi`` (exclusive) of a chunk, as ``Simulator._loop`` with ``Fleet._place``
    would run them; returns the latest finish."""
    n = fleet.n
    out, done, caches = fleet._out, fleet._done, fleet._caches
    router = fleet.router
    prefix_aware = fleet._strategy is PREFIX_AWARE
    choose, seed_mix, home_of = router.choose, router.seed_mix, router.home
    threshold, copies = router.threshold, router.copies_per_instance
    requests_, prompt_, cached_, spills_in, timeouts_ = (fleet._requests, fleet._prompt, fleet._cached,
                                                         fleet._spills_in, fleet._timeouts)
    bt, eb, infinite, cap = fleet._bt, fleet._eb, fleet._infinite, fleet._cap_blocks
    chain = fleet.caches.chained  # the caches are ChainLRUs (ids known to be chained), not OrderedDicts
    misses = fleet.misses  # None: causes not asked for
    if misses is not None:
        seen, older, limit = misses.seen, misses.older, misses.limit
        book, held_elsewhere, chained_held_elsewhere = (misses.book, fleet.caches.held_elsewhere,
                                                        fleet.caches.chained_held_elsewhere)
    timeout = fleet._timeout
    engines = fleet.engines
    eslots, run_tokens, last_start, prefill_free, slow = (engines.slots, engines.run_tokens, engines.last_start,
                                                          engines.prefill_free, engines.slow)
    base, per_ctx, per_seq, chunk, a1, a2, max_seqs, budget, a0 = engines._constants
    overhead, engine_timeout = engines.overhead_s, engines.timeout_s
    sure_wait = _sure_wait(engines, prompts[lo:hi]) if chain else -_INF
    spills = timeouts = 0
    for i in range(lo, hi):
        now = arrivals[i] * inv
        while done and done[0][0] <= now:
            out[heappop(done)[1]] -= 1
        key = keys[i]
        # Routing: Router.choose (PREFIX_AWARE's home and ConcurrencyThreshold spill inline).
        if prefix_aware:
            if key.__class__ is int:
                g = ((((key ^ seed_mix) * GOLDEN) & MASK) >> 16) % n
            else:
                g = home_of(key)
            if out[g] >= threshold:
                s = spill_copy(out, g, threshold, copies)
                if s != g:
                    spills += 1
                    spills_in[s] += 1
                    g = s
        else:
            g, spilled = choose(key, out)
            if spilled:
                spills += 1
                spills_in[g] += 1
        ids, prompt, output = blocks[i], prompts[i], outputs[i]
        requests_[g] += 1
        out[g] += 1
        # EngineModel.schedule: a slot, then the copy's prefill queue.
        slots = eslots[g]
        run_ = run_tokens[g]
        start = last_start[g]
        if now > start:
            start = now
        while slots and slots[0][0] <= start:
            run_ -= heappop(slots)[1]
        need = prompt + output
        popped = None
        while slots and (len(slots) >= max_seqs or run_ + need > budget):
            entry = heappop(slots)
            if popped is None:
                popped = []
            popped.append(entry)
            run_ -= entry[1]
            if entry[0] > start:
                start = entry[0]
            while slots and slots[0][0] <= start:
                entry = heappop(slots)
                popped.append(entry)
                run_ -= entry[1]
        batch = len(slots)
        sl = slow[g]
        free = prefill_free[g]
        begin = start if start > free else free
        # The leading blocks held (Fleet._place). A chain cache looks them up and touches them in
        # one walk when the request cannot time out; else it looks now and touches once served.
        cache = caches[g]
        placed = chain and begin - now <= sure_wait
        m = (cache.place(ids) if placed else cache.held(ids)) if chain else \
            len(list(_takewhile(cache.__contains__, ids)))
        held = m * bt
        if held > prompt:
            held = prompt
        # whole_blocks_cached: vLLM's whole blocks, never the last token
        cached = held if held < prompt - 1 else prompt - 1
        cached -= cached % eb
        if cached < 0:
            cached = 0
        new = prompt - cached
        chunks = -(-new // chunk) if new > 0 else 1
        end = begin + (
            a0 + new * (a1 + a2 * (cached + new * 0.5)) + chunks * (base + per_ctx * run_ + per_seq * batch)
        ) * sl
        first = end + overhead
        if first - now > engine_timeout:  # the request fails: see Fleet._place
            if popped:
                for entry in popped:
                    heappush(slots, entry)
            timeouts += 1
            timeouts_[g] += 1
            finish = now + timeout
            heappush(done, (finish, g))
            firsts[i] = _INF
            cached_out[i] = 0
            where[i] = g
            ends[i] = finish
            if finish > last_finish:
                last_finish = finish
            continue
        prefill_free[g] = end
        run_ += need
        tpot = (base + per_ctx * run_ + per_seq * (batch + 1)) * sl
        engine_finish = end + (output - 1) * tpot if output > 1 else end
        heappush(slots, (engine_finish, need))
        run_tokens[g] = run_
        last_start[g] = start
        finish = engine_finish + overhead
        heappush(done, (finish, g))
        prompt_[g] += prompt
        cached_[g] += cached
        # The misses ledger (Fleet._place's common cases; MissLedger.book otherwise).
        if misses is not None:
            misses.last_block += held - cached
        if m < len(ids):
            rest = ids[m:] if m else ids
            if misses is not None:
                if held < prompt and (rest[0] in seen or rest[0] in older or key.__class__ is ClientKey):
                    book(ids, g, m, prompt, held, bt,
                         partial(chained_held_elsewhere, ids, m) if chain else held_elsewhere,
                         key.__class__ is ClientKey)
                    seen, older = misses.seen, misses.older
                else:
                    misses.first_touch += prompt - held
                    seen.update(rest)
                    if len(seen) > limit:
                        misses.older, misses.seen = seen, set()
                        seen, older = misses.seen, misses.older
            # The LRU touch (copy_caches.touch): the new blocks tail first, then the cached ones.
            if chain:
                if not placed:
                    cache.place(ids)
            elif infinite:
                cache.update(ids)
            else:
                before = len(cache)
                consume(map(cache.__setitem__, reversed(rest), NONES))
                if len(cache) - before != len(rest):  # ids not chained: see copy_caches.touch
                    consume(map(cache.move_to_end, reversed(rest)))
                if m:
                    try:
                        consume(map(cache.move_to_end, reversed(ids[:m])))
                    except KeyError:
                        _touch_rest(cache, ids, m)
                extra = len(cache) - cap
                if extra > 0:
                    consume(map(cache.popitem, _repeat(False, extra)))
        elif chain:
            if not placed:
                cache.place(ids)
        elif not infinite:
            touch(cache, ids, m, False, cap)
        firsts[i] = first
        cached_out[i] = cached
        where[i] = g
        ends[i] = finish
        if finish > last_finish:
            last_finish = finish
    fleet.spills += spills
    fleet.timeouts += timeouts
    return last_finish


def _sure_wait(engines, prompts) -> float:
    """The longest wait for the prefill queue after which any of ``prompts`` still gets its first
    token within the timeout: the engine model's prefill time bounded above (the whole prompt
    uncached, the copy's whole KV budget running, every sequence slot taken, the slowest copy)."""
    if engines.timeout_s == _INF:
        return _INF
    base, per_ctx, per_seq, chunk, a1, a2, max_seqs, budget, a0 = engines._constants
    p = max(prompts)  # (a chunk is never empty)
    chunks = -(-p // chunk) + 1
    worst = (a0 + p * (a1 + a2 * p * 0.5) + chunks * (base + per_ctx * budget + per_seq * max_seqs)) \
        * max(engines.slow)  # (a factor for each copy: never empty)
    return engines.timeout_s - engines.overhead_s - worst * 1.001 - 1e-6  # the margin: rounding


def _touch_rest(cache, ids, m: int) -> None:
    """``copy_caches.touch``'s fallback for ids that are not chained: the first m touched one by one."""
    for b in reversed(ids[:m]):
        if b in cache:
            cache.move_to_end(b)
        else:
            cache[b] = None
