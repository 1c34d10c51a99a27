"""The engine side of every copy in the fleet model: slots, the KV budget, the prefill queue, slowdowns.

Each copy admits at most ``max_num_seqs`` running requests whose prompt + output tokens fit its KV
budget, first come first served, then runs their prefills one after another (see the fleet model's
"Simplifications" in :mod:`prefix_routing.lab.fleet`). Pure computation: every call takes ``now``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from heapq import heappop, heappush

from prefix_routing.lab.latency import LatencyModel
from prefix_routing.rules.errors import UserError


class EngineModel:
    """The engines of ``n`` copies; ``schedule`` decides when one request starts, speaks and ends."""

    __slots__ = ("latency", "slots", "run_tokens", "last_start", "prefill_free", "slow", "_constants",
                 "overhead_s", "timeout_s")

    def __init__(self, n: int, latency: LatencyModel, *, budget: float, overhead_s: float,
                 timeout_s: float) -> None:
        self.latency = latency
        self.slots: list[list] = [[] for _ in range(n)]  # per copy: heap of (finish, reserved tokens)
        self.run_tokens = [0.0] * n
        self.last_start = [-math.inf] * n
        self.prefill_free = [-math.inf] * n
        self.slow = [1.0] * n  # fault injection: a factor on every step
        self.overhead_s = overhead_s  # request and routing overhead before the first token
        self.timeout_s = timeout_s
        # Flat copies for the hot path.
        self._constants = (
            latency.step_base_s,
            latency.step_s_per_context_token,
            latency.step_s_per_sequence,
            latency.chunk_tokens,
            latency.prefill_s_per_token,
            latency.attention_s_per_token_pair,
            latency.max_num_seqs,
            budget,  # KV tokens that running requests may reserve
            latency.prefill_constant_s,
        )

    def ready_s(self, g: int) -> float:
        """When copy ``g`` could start another prefill (KV_AWARE's wait estimate)."""
        ready = self.prefill_free[g]
        slots = self.slots[g]
        if len(slots) >= self.latency.max_num_seqs and slots[0][0] > ready:
            ready = slots[0][0]
        return ready

    def slow_down(self, copies: Iterable[int], factor: float) -> None:
        """Make each of ``copies`` ``factor`` times slower (fault injection)."""
        if not factor > 0:
            raise UserError(f"slowdown factor {factor}: must be > 0")
        for g in copies:
            self.slow[g] = float(factor)

    def schedule(self, g: int, prompt: int, cached: float, output: int,
                 now: float) -> tuple[float, float, float, float] | None:
        """(start, first token, per token, finish) of a request on copy ``g``, committed.

        None when its first token would come more than the timeout after ``now``: then nothing is
        committed (SageMaker gives up on the container; the request never reaches the engine).
        """
        # Wait for a slot (at most max_num_seqs running, their tokens within the KV budget), first
        # come first served, then for the copy's prefill queue.
        base, per_ctx, per_seq, chunk, a1, a2, limit, budget, a0 = self._constants
        new = prompt - cached
        slots = self.slots[g]
        run = self.run_tokens[g]
        start = self.last_start[g]
        if now > start:
            start = now
        while slots and slots[0][0] <= start:
            run -= heappop(slots)[1]
        need = prompt + output
        popped = None
        while slots and (len(slots) >= limit or run + need > budget):
            entry = heappop(slots)
            if popped is None:
                popped = []
            popped.append(entry)
            run -= entry[1]
            if entry[0] > start:
                start = entry[0]
            while slots and slots[0][0] <= start:
                entry = heappop(slots)
                popped.append(entry)
                run -= entry[1]
        batch = len(slots)
        slow = self.slow[g]
        free = self.prefill_free[g]
        begin = start if start > free else free
        chunks = -(-new // chunk) if new > 0 else 1
        end = begin + (
            a0 + new * (a1 + a2 * (cached + new * 0.5)) + chunks * (base + per_ctx * run + per_seq * batch)
        ) * slow
        overhead = self.overhead_s
        first = end + overhead
        if first - now > self.timeout_s:
            if popped:  # the slots it would have waited for are still taken
                for entry in popped:
                    heappush(slots, entry)
            return None
        self.prefill_free[g] = end
        run += need
        tpot = (base + per_ctx * run + per_seq * (batch + 1)) * slow
        engine_finish = end + (output - 1) * tpot if output > 1 else end
        heappush(slots, (engine_finish, need))
        self.run_tokens[g] = run
        self.last_start[g] = start
        return start, first, tpot, engine_finish + overhead

    def kv_aware_copy(self, caches: Sequence, out: Sequence[int], blocks: Sequence, prompt: int, now: float,
                      *, start: int, block_tokens: float, load_weight_s: float) -> int:
        """KV_AWARE: the copy with the lowest estimated wait + uncached prefill + load penalty.

        Scans from copy ``start`` (ties go to the first found); ``caches`` are the copies' KV caches.
        """
        n, lat = len(out), self.latency
        best_g, best_cost = start, math.inf
        for j in range(start, start + n):
            g = j if j < n else j - n
            m = sum(map(caches[g].__contains__, blocks))
            cached = m * block_tokens
            if cached > prompt:
                cached = prompt
            new = prompt - cached
            ready = self.ready_s(g)
            wait = ready - now if ready > now else 0.0
            cost = wait + self.slow[g] * lat.prefill_compute_s(new, cached) + load_weight_s * out[g]
            if cost < best_cost:
                best_g, best_cost = g, cost
        return best_g
