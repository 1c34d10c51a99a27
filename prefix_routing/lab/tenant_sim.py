"""The simulator's tenants: who sent each request, and the per-tenant limits before the router.

:class:`TenantBook` is what a :class:`~prefix_routing.lab.simulate.Simulator` records per tenant (the
tenant of each request it placed, the requests each tenant sent, the 429s each got). With limits
(:class:`~prefix_routing.lab.tenant_limits.LimitModel`), :func:`feed_limited` replaces the
simulator's loops: each request is first admitted or refused by its tenant's limits, as the front
door does before it calls the endpoint. A refused request is not served: in an open loop (the
trace's arrival times) it is dropped and counted; in a closed loop (``users``) its client waits the
answer's Retry-After and sends it again (a request whose estimate alone exceeds the tenant's
``tokens_per_minute`` is given up, as no retry admits it). TTFT counts from the attempt admitted.
"""

from __future__ import annotations

import math
import time
from array import array
from collections import Counter
from heapq import heapify, heappop, heappush

from prefix_routing.lab.tenant_limits import LimitModel, Refusal
from prefix_routing.lab.tenants import UNNAMED_TENANT, tenants_of
from prefix_routing.lab.trace_data import Trace


class TenantBook:
    """Per tenant: the requests sent, the 429s by limit, the requests dropped, the seconds waited
    after 429s; per request placed: its tenant (``tenant_of``, in the simulator's order)."""

    def __init__(self, placed: int = 0) -> None:
        """``placed``: requests the simulator placed before it met a tenant (one unnamed tenant's)."""
        self.names: list[str] = []
        self._index: dict[str, int] = {}
        self.tenant_of = array("l")
        self.sent: Counter = Counter()  # tenant index → requests of the trace
        self.throttled: Counter = Counter()  # (tenant index, limit) → 429 answers
        self.dropped: Counter = Counter()  # tenant index → requests never served (refused, not retried)
        self.waited_s: Counter = Counter()  # tenant index → seconds its clients waited after 429s
        if placed:
            unnamed = self.index(UNNAMED_TENANT)
            self.tenant_of.extend([unnamed] * placed)
            self.sent[unnamed] += placed

    def index(self, tenant: str) -> int:
        i = self._index.get(tenant)
        if i is None:
            i = self._index[tenant] = len(self.names)
            self.names.append(tenant)
        return i

    def indexes(self, trace: Trace) -> list[int]:
        return [self.index(t) for t in tenants_of(trace)]

    def placed_in_order(self, trace: Trace) -> None:
        """Without limits: every request of the trace placed, in the trace's order."""
        indexes = self.indexes(trace)
        self.tenant_of.extend(indexes)
        self.sent.update(indexes)

    @property
    def throttled_total(self) -> int:
        return sum(self.throttled.values())


def feed_limited(sim, trace: Trace, keys: list, bar=None) -> float:
    """Simulate ``trace`` through the limits and then the fleet; records into ``sim`` as its loops
    do, only the requests admitted. Returns the seconds the loop took."""
    book, model = sim.tenant_book, sim.limit_model
    tenants = book.indexes(trace)
    names = book.names
    prompts, outputs, blocks = trace.prompt_tokens, trace.output_tokens, trace.blocks
    # Per request placed: arrival, prompt, output, first token, cached, copy, end, tenant.
    rec: tuple[list, ...] = ([], [], [], [], [], [], [], [])
    fleet = sim.fleet
    place, advance = fleet._place, fleet.advance
    started = time.perf_counter()

    def attempt(i: int, now: float, arrival: float):
        """Admit and place request i at ``now``: its finish, or the refusal. ``arrival`` is recorded as
        the simulator's loops record it: the trace's time (``_result`` scales it by 1/speed)."""
        t = tenants[i]
        decision = model.admit(names[t], now, prompts[i], outputs[i])  # a trace records no max_tokens: what it got
        if decision.__class__ is Refusal:
            book.throttled[(t, decision.limit)] += 1
            return decision
        advance(now)
        r = place(keys[i], blocks[i], prompts[i], outputs[i], now)
        served = r[2] != math.inf
        model.end(decision, r[4], prompts[i] + outputs[i] if served else None)  # a failed answer reports no usage
        for column, value in zip(rec, (arrival, prompts[i], outputs[i], r[2], r[1], r[0], r[4], t)):
            column.append(value)
        if r[4] > sim.last_finish:
            sim.last_finish = r[4]
        return r[4]

    n = len(trace)
    if sim.users:
        _closed(sim, n, tenants, book, attempt, bar)
    else:
        inv = sim.inv
        for i, a in enumerate(trace.arrivals):
            book.sent[tenants[i]] += 1
            if attempt(i, a * inv, a).__class__ is Refusal:
                book.dropped[tenants[i]] += 1
            if bar is not None:
                bar.update(1)
    wall = time.perf_counter() - started
    for column, values in zip((sim.arrivals, sim.prompts, sim.outputs, sim.firsts, sim.cached, sim.copy_of, sim.ends,
                               book.tenant_of), rec):
        column.extend(values)
    return wall


def _closed(sim, n: int, tenants: list[int], book: TenantBook, attempt, bar) -> None:
    """U clients: a free client sends the trace's next request; a refused one waits Retry-After and
    sends the same request again."""
    ready = [(t, k, -1) for k, t in enumerate(sorted(sim._ready))]  # (when, order, request to retry or -1)
    heapify(ready)
    order, nxt, idle = len(ready), 0, []
    while ready:
        now, _, i = heappop(ready)
        if i < 0:
            if nxt >= n:
                idle.append(now)
                continue
            i, nxt = nxt, nxt + 1
            book.sent[tenants[i]] += 1
            if bar is not None:
                bar.update(1)
        outcome = attempt(i, now, now)  # a closed loop runs at speed 1
        if outcome.__class__ is Refusal:
            if outcome.final:  # no retry admits it: the client gives up on it
                book.dropped[tenants[i]] += 1
                heappush(ready, (now, order, -1))
            else:
                book.waited_s[tenants[i]] += outcome.retry_after_s
                heappush(ready, (now + outcome.retry_after_s, order, i))
        else:
            heappush(ready, (outcome, order, -1))  # its last token (or the timeout): then it sends again
        order += 1
    heapify(idle)
    sim._ready = idle


def new_limit_model(settings, trace: Trace, bytes_per_token: float) -> LimitModel:
    """The limits' counts for a run that starts with ``trace`` (its clock's origin places the minutes)."""
    return LimitModel(settings, origin_s=trace.origin_s, bytes_per_token=bytes_per_token)
