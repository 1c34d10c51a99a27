"""The lab's trace (requests in columns) and what a reader collects on its way: rows, skips and why.

:class:`Trace` is what every reader of :mod:`.traces` returns and what the fleet model replays;
:class:`Skipped` counts the lines a reader could not use, by reason; ``Collector`` gathers one
reader's rows and skips, and builds the trace (sorted by time, within :mod:`.input_bounds`' span).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Hashable, Iterable

from prefix_routing.lab import input_bounds
from prefix_routing.lab.chain_cache import chained
from prefix_routing.rules.errors import UserError

MOONCAKE_BLOCK_TOKENS = 512
EXAMPLES_KEPT = 5


@dataclass
class Skipped:
    """Lines not turned into requests: a count per reason and the first examples."""

    reasons: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # "FILE:LINE: reason"
    ignored: Counter = field(default_factory=Counter)  # not request lines at all (log reader)

    @property
    def count(self) -> int:
        return sum(self.reasons.values())

    def add(self, where: str, reason: str, detail: str = "") -> None:
        self.reasons[reason] += 1
        if len(self.examples) < EXAMPLES_KEPT:
            self.examples.append(f"{where}: {reason}{': ' + detail if detail else ''}")

    def summary(self, lines: int | None = None) -> str:
        parts = []
        if self.reasons:
            total = f" of {lines:,} lines" if lines is not None else ""
            parts.append(
                f"skipped {self.count:,}{total}: "
                + ", ".join(f"{n:,} {reason}" for reason, n in self.reasons.most_common())
            )
        if self.ignored:
            parts.append(
                "ignored "
                + ", ".join(f"{n:,} {reason}" for reason, n in self.ignored.most_common())
            )
        return "; ".join(parts)

    def as_dict(self) -> dict:
        return {
            "count": self.count,
            "reasons": dict(self.reasons),
            "examples": list(self.examples),
            "ignored": dict(self.ignored),
        }


@dataclass
class Trace:
    """Requests in arrival order, in columns (the simulator's inner loop reads lists, not objects).

    ``blocks[i]`` are chained block ids (equal id = equal prefix up to and including that block),
    interned to ints. A block is ``block_tokens`` tokens of the prompt; when the ids hash bytes of
    the normalized body (the normalizer's log, raw bodies) ``block_bytes`` says how many.
    """

    arrivals: list[float]  # seconds from the first arrival
    prompt_tokens: list[int]
    output_tokens: list[int]
    blocks: list[list[int]]
    block_tokens: float = MOONCAKE_BLOCK_TOKENS
    block_bytes: float | None = None
    routing_ids: list[str | None] | None = None  # PrefixAwareId per request
    # Requests whose client bytes keyed routing differently from the normalized body (the log's
    # ``rekeyed``; computed for raw bodies), and for raw bodies the key of the bytes as sent.
    rekeyed: list[bool] | None = None
    raw_keys: list | None = None
    # The request log's measured cached tokens (None where the model reported none): the hit rate
    # production had, against which the lab's prediction for the same window is judged.
    cached_tokens: list[int | None] | None = None
    source: str = ""
    lines: int = 0  # lines (or log events) read
    skipped: Skipped = field(default_factory=Skipped)
    notes: list[str] = field(default_factory=list)
    # Set when the reader stopped at a bound before the end of its window (CloudWatch's max_events):
    # the trace is a sample of the log, and says how.
    sampled: str | None = None
    # The first arrival on the trace's own clock, in seconds (epoch seconds for a request log; a
    # Mooncake trace's own, usually 0): arrivals count from it.
    origin_s: float = 0.0
    # The tenant of each request (the request log's ``tenant``; ``--tenants N``; a generated workload's),
    # None when the trace names none (lab/tenants.py).
    tenants: list[str | None] | None = None
    # Whether every block id has one parent, the id before it (none for a prompt's first): the
    # readers check, generators that make them so say so; None: unknown, checked when the simulator
    # needs it (lab/chain_cache.py: chained ids are simulated three times cheaper).
    chained: bool | None = None
    _ids_chained: bool | None = field(default=None, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.arrivals)

    def ids_chained(self) -> bool:
        """Whether this trace's own ids are chained (``chained``, or checked once and remembered)."""
        if self.chained is not None:
            return self.chained
        if self._ids_chained is None:
            self._ids_chained = chained(self.blocks)
        return self._ids_chained

    @property
    def duration_s(self) -> float:
        return self.arrivals[-1] - self.arrivals[0] if self.arrivals else 0.0

    def measured_hit_rate(self) -> float | None:
        """Cached ÷ prompt tokens over the requests whose log line reports both (None: none does)."""
        if not self.cached_tokens:
            return None
        pairs = [(c, p) for c, p in zip(self.cached_tokens, self.prompt_tokens) if c is not None]
        prompt = sum(p for _, p in pairs)
        return sum(c for c, _ in pairs) / prompt if prompt else None

    def head(self, n: int) -> "Trace":
        """The first n requests (a quick look, or a fast test)."""
        return Trace(
            self.arrivals[:n],
            self.prompt_tokens[:n],
            self.output_tokens[:n],
            self.blocks[:n],
            self.block_tokens,
            self.block_bytes,
            self.routing_ids[:n] if self.routing_ids else None,
            self.rekeyed[:n] if self.rekeyed else None,
            self.raw_keys[:n] if self.raw_keys else None,
            self.cached_tokens[:n] if self.cached_tokens else None,
            self.source,
            self.lines,
            self.skipped,
            list(self.notes),
            self.sampled if n >= len(self) else f"the first {n:,} requests only",
            self.origin_s,
            self.tenants[:n] if self.tenants else None,
            self.chained,
        )

    def replay(self, times: int, gap_s: float | None = None) -> "Trace":
        """The trace ``times`` times in a row; every copy gets fresh block ids and later times.

        Each replay shares nothing with the others (ids shifted by the largest id + 1), so a cache
        warmed by one replay does not help the next: the simulated load is the trace's, repeated.
        """
        gap = (self.duration_s / max(1, len(self) - 1)) if gap_s is None else gap_s
        span = self.duration_s + gap
        shift = 1 + max((max(b) for b in self.blocks if b), default=0)
        arrivals, prompt, output, blocks, ids, rekeyed, tenants = [], [], [], [], [], [], []
        for r in range(times):
            offset_t, offset_id = r * span, r * shift
            arrivals.extend(t + offset_t for t in self.arrivals)
            prompt.extend(self.prompt_tokens)
            output.extend(self.output_tokens)
            blocks.extend([b + offset_id for b in bl] for bl in self.blocks)
            if self.routing_ids:
                ids.extend(self.routing_ids)
            if self.rekeyed:
                rekeyed.extend(self.rekeyed)
            if self.tenants:
                tenants.extend(self.tenants)
        # Raw keys are not shifted like block ids: a replay is not routed as sent.
        return Trace(
            arrivals, prompt, output, blocks, self.block_tokens, self.block_bytes, ids or None, rekeyed or None,
            source=f"{self.source} ×{times}", lines=self.lines * times, skipped=self.skipped, tenants=tenants or None,
            chained=self.chained,  # fresh ids for each replay: chained exactly when the trace's are
        )


class Collector:
    """Accumulates requests, skips and the strict-mode failure for one reader."""

    def __init__(self, source: str, strict: bool):
        self.source, self.strict = source, strict
        self.skipped = Skipped()
        self.rows: list[tuple] = []
        self.wheres: list[str] = []  # each row's file:line, for a skip decided once all are read
        self.lines = 0
        self.ids: dict[Hashable, int] = {}

    def skip(self, where: str, reason: str, detail: str = "") -> None:
        if self.strict:
            raise UserError(f"{where}: {reason}{': ' + detail if detail else ''} (--strict)")
        self.skipped.add(where, reason, detail)

    def add(self, where: str, row: tuple) -> None:
        self.rows.append(row)
        self.wheres.append(where)

    def intern(self, values: Iterable[Hashable]) -> list[int]:
        ids = self.ids
        out = []
        for v in values:
            i = ids.get(v)
            if i is None:
                i = ids[v] = len(ids)
            out.append(i)
        return out

    def _within_span(self) -> None:
        """Skip the rows further than half of ``input_bounds.MAX_SPAN_S`` from the median arrival."""
        times = sorted(row[0] for row in self.rows)
        if not times or times[-1] - times[0] <= input_bounds.MAX_SPAN_S:
            return
        median, half = times[len(times) // 2], input_bounds.MAX_SPAN_S / 2
        kept = []
        for row, where in zip(self.rows, self.wheres):
            if abs(row[0] - median) <= half:
                kept.append(row)
            else:
                self.skip(where, input_bounds.span_reason(), f"{row[0] - median:+,.0f} s")
        self.rows = kept

    def build(self, block_tokens: float, block_bytes: float | None, with_ids: bool) -> Trace:
        self._within_span()
        if not self.rows:
            detail = f" ({self.skipped.summary(self.lines)})" if self.skipped.count or self.skipped.ignored else ""
            raise UserError(f"{self.source}: no requests found{detail}")
        notes = []
        if any(self.rows[i][0] > self.rows[i + 1][0] for i in range(len(self.rows) - 1)):
            self.rows.sort(key=lambda row: row[0])  # stable: equal times keep file order
            notes.append("requests were not in arrival order; sorted by time")
        t0 = self.rows[0][0]
        blocks = [row[3] for row in self.rows]
        return Trace(
            arrivals=[row[0] - t0 for row in self.rows],
            prompt_tokens=[row[1] for row in self.rows],
            output_tokens=[row[2] for row in self.rows],
            blocks=blocks,
            block_tokens=block_tokens,
            block_bytes=block_bytes,
            routing_ids=[row[4] for row in self.rows] if with_ids else None,
            # Rows may carry (…, rekeyed, raw key): the request log's flag, raw bodies' both.
            rekeyed=[bool(row[5]) for row in self.rows] if any(len(row) > 5 and row[5] is not None for row in self.rows) else None,
            raw_keys=[row[6] for row in self.rows] if any(len(row) > 6 and row[6] is not None for row in self.rows) else None,
            cached_tokens=[row[7] for row in self.rows] if any(len(row) > 7 and row[7] is not None for row in self.rows) else None,
            tenants=[row[8] for row in self.rows] if any(len(row) > 8 and row[8] is not None for row in self.rows) else None,
            source=self.source,
            lines=self.lines,
            skipped=self.skipped,
            notes=notes,
            origin_s=t0,
            chained=chained(blocks),  # once per file: the traces made from this one (samples, heads) inherit it
        )


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
