"""Drive the fleet model over a trace in simulated time and report hit rate, TTFT, throughput and load."""

from __future__ import annotations

import gc
import math
from array import array
from dataclasses import dataclass, field, replace
from heapq import heappop, heappush
from typing import Sequence

from prefix_routing.lab import fast_loop
from prefix_routing.lab.fleet import Fleet
from prefix_routing.lab.fleet_config import FleetConfig, autoscaling_error, autoscaling_modelled
from prefix_routing.lab.overload import WAIT_S
from prefix_routing.lab.percentiles import percentiles
from prefix_routing.lab.progress import progress_bar
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.slot_cache import LLAMACPP_SLOTS
from prefix_routing.lab.tenant_report import tenant_rows
from prefix_routing.lab.tenant_sim import TenantBook, feed_limited, new_limit_model
from prefix_routing.lab.trace_data import Trace
from prefix_routing.lab.trace_keys import trace_keys
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.limits import LimitSettings

_CHUNK = 4096  # requests per pass of the loop (and per update of the progress bar)


@dataclass
class SimResult:
    """One strategy over one trace. ``as_dict`` is what ``simulate --json`` prints."""

    strategy: str
    config: FleetConfig
    requests: int
    hit_rate: float
    ttft: list  # per request, seconds; a timed-out request counts as the timeout
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    throughput_tok_s: float
    throughput_req_s: float
    instance_requests: list[int]
    instance_prompt_tokens: list[float]
    instance_hit_rates: list[float]
    max_mean_requests: float
    max_mean_tokens: float
    spills: int
    timeouts: int
    hit_over_time: list[tuple[float, float]]  # (bin start s, hit rate)
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)
    replicated_requests: int = 0  # sent to a replica j > 0 of a hot prefix (replication on)
    rekeyed_requests: int | None = None  # client bytes keyed differently (None: the trace cannot tell)
    as_sent: bool = False  # routed on the clients' own bytes (no front door)
    misses: dict = field(default_factory=dict)  # uncached tokens by cause (lab/misses.py)
    copy_hours: float = 0.0  # provisioned copies × time (the cost), first arrival to last token
    hotspot_seconds: float = 0.0  # minutes any copy's mean in-flight count was above the hotspot threshold
    autoscaling: dict | None = None  # CopyPool.summary(): events, copies over time, hotspot seconds
    # Requests that waited more than WAIT_S for a copy beyond their own prefill, or timed out (lab/overload.py).
    waited_share: float = 0.0
    # Instances the max/mean figures count: all, or with autoscaling those that held a provisioned copy.
    max_mean_instances: int = 0
    notes: list[str] = field(default_factory=list)  # e.g. autoscaling not modelled for this strategy
    # Per tenant (lab/tenant_report.py), when the trace names tenants or limits are modelled; the 429s.
    tenants: list[dict] | None = None
    throttled: int = 0
    cached_tokens: Sequence[float] = ()  # per request, in the trace's order (the simulator's own array)
    copy_of: Sequence[int] = ()  # per request, the copy that served it (or failed it)

    def as_dict(self) -> dict:
        total_req = sum(self.instance_requests) or 1
        total_tok = sum(self.instance_prompt_tokens) or 1
        cfg = self.config
        return {
            "strategy": self.strategy,
            "requests": self.requests,
            "hit_rate": self.hit_rate,
            "ttft_p50_s": self.ttft_p50_s,
            "ttft_p90_s": self.ttft_p90_s,
            "ttft_p99_s": self.ttft_p99_s,
            "throughput_tok_s": self.throughput_tok_s,
            "throughput_req_s": self.throughput_req_s,
            "max_mean_requests": self.max_mean_requests,
            "max_mean_tokens": self.max_mean_tokens,
            "max_mean_instances": self.max_mean_instances,
            "spills": self.spills,
            "timeouts": self.timeouts,
            "waited_share": self.waited_share,
            "wait_threshold_s": WAIT_S,
            "misses": self.misses,
            **({"rekeyed_requests": self.rekeyed_requests, "as_sent": self.as_sent}
               if self.rekeyed_requests is not None else {}),
            "copy_hours": self.copy_hours,
            "hotspot_seconds": self.hotspot_seconds,
            **({"autoscaling": self.autoscaling} if self.autoscaling is not None else {}),
            "instance_request_share": [r / total_req for r in self.instance_requests],
            "instance_token_share": [t / total_tok for t in self.instance_prompt_tokens],
            "instance_hit_rate": self.instance_hit_rates,
            "prefix_length": cfg.prefix_length,
            "key_blocks": cfg.key_blocks,
            "concurrency_threshold": cfg.concurrency_threshold,
            "cache_policy": cfg.cache_policy,
            **({"slots": cfg.preset.max_num_seqs, "slot_prompt_similarity": cfg.slot_prompt_similarity,
                "cache_ram_mib": cfg.cache_ram_mib} if cfg.cache_policy == LLAMACPP_SLOTS else {}),
            **({"replication": {"target_share_factor": cfg.replication.target_share_factor,
                                "max_replicas": cfg.replication.max_replicas,
                                "half_life_s": cfg.replication.half_life_s,
                                "min_requests": cfg.replication.min_requests,
                                "steering": cfg.replication.steering},
                "replicated_requests": self.replicated_requests,
                **self.extra.get("steering", {})} if cfg.replicating else {}),
            **({"notes": list(self.notes)} if self.notes else {}),
            **({"sample": self.extra["sample"]} if "sample" in self.extra else {}),
            **({"throttled": self.throttled, "tenants": self.tenants} if self.tenants is not None else {}),
            "wall_s": self.wall_s,
        }


def config_for_trace(config: FleetConfig, trace: Trace) -> FleetConfig:
    """The config with the trace's block size (the fleet must know what one block id stands for)."""
    if config.block_tokens == trace.block_tokens and config.block_bytes == trace.block_bytes:
        return config
    return replace(config, block_tokens=trace.block_tokens, block_bytes=trace.block_bytes)


class Simulator:
    """Drives one ``Fleet`` in simulated time over one trace, or over consecutive chunks of one.

    ``feed`` may be called repeatedly with chunks whose arrivals continue the previous ones (the
    benchmark streams a million requests this way without holding them all); ``result`` reports.

    ``users``: a closed loop instead of the trace's arrival times: U clients, each sending the next
    request of the trace when its previous one has finished (how AWS's benchmark and most LLM
    benchmarks run). Throughput then measures what the fleet sustains, not what the trace offered.

    ``limits``: the front door's per-tenant limits before the router (lab/tenant_sim.py); the
    requests they refuse are counted per tenant, not served.
    """

    def __init__(self, config: FleetConfig, *, speed: float = 1.0, users: int | None = None,
                 limits: LimitSettings | None = None, explain_misses: bool = True):
        if not speed > 0:
            raise UserError(f"speed={speed}: must be > 0")
        if users is not None and (not isinstance(users, int) or isinstance(users, bool) or not 1 <= users <= 100_000):
            raise UserError(f"users={users!r}: must be an integer from 1 to 100000")
        if users is not None and speed != 1.0:
            raise UserError(f"speed={speed}: a closed loop (users={users}) ignores the trace's timing; leave speed at 1")
        self.users = users
        self._ready = [0.0] * users if users else []  # when each user sends next (a heap)
        self.config = config
        self.fleet = Fleet(config, explain_misses=explain_misses)
        self.inv = 1.0 / speed
        self.arrivals = array("d")
        self.prompts = array("d")
        self.outputs = array("d")
        self.firsts = array("d")
        self.copy_of = array("l")  # the copy each request went to
        self.ends = array("d")  # when it left the in-flight count (its last token, or the timeout)
        self.cached = array("d")
        self.last_finish = 0.0
        self.wall_s = 0.0
        self.source = ""
        self.rekeyed: int | None = None
        self.as_sent = False
        self.limits = limits if limits is not None and limits.enabled else None
        self.limit_model = None  # made by the first feed (the trace's clock places the minutes)
        self.tenant_book: TenantBook | None = None  # per tenant, when the trace names tenants or limits apply

    def feed(self, trace: Trace, *, keys: list | None = None, bar=None, as_sent: bool = False,
             chained_with_earlier: bool = False) -> float:
        """Simulate the requests of ``trace``; returns the seconds the loop took. ``as_sent``: route
        raw bodies on the clients' own bytes (no front door; their misses count as re-keyed).
        ``chained_with_earlier``: its ids and those of the traces fed before are chained together
        (a later part of one trace, a replay with fresh ids): the chain caches carry on."""
        import time

        config = self.config
        n = len(trace)
        if keys is None:
            keys = (trace_keys(trace, config.key_blocks, as_sent) if config.strategy is Strategy.PREFIX_AWARE
                    else [None] * n)
        if trace.rekeyed is not None:
            self.rekeyed = (self.rekeyed or 0) + sum(trace.rekeyed)
        self.as_sent = self.as_sent or as_sent
        if self.tenant_book is None and (trace.tenants or self.limits is not None):
            self.tenant_book = TenantBook(placed=len(self.arrivals))
        if self.limits is not None:
            if self.limit_model is None:
                self.limit_model = new_limit_model(self.limits, trace, config.bytes_per_token)
            wall = feed_limited(self, trace, keys, bar)
            self.wall_s += wall
            self.source = self.source or trace.source
            return wall
        if self.tenant_book is not None:
            self.tenant_book.placed_in_order(trace)
        arrivals, prompts, outputs, blocks = trace.arrivals, trace.prompt_tokens, trace.output_tokens, trace.blocks
        firsts = [0.0] * n
        cached = [0.0] * n
        where = [0] * n
        ends = [0.0] * n
        collecting = gc.isenabled()
        gc.disable()  # the loop makes many small tuples and no cycles: the collector only costs time
        started = time.perf_counter()
        try:
            if self.users:
                arrivals = [0.0] * n  # decided by the loop: each user's previous finish
                self._closed_loop(n, keys, arrivals, prompts, outputs, blocks, firsts, cached, bar, where, ends)
            else:
                self._choose_caches(trace, chained_with_earlier)
                self._loop(n, keys, arrivals, prompts, outputs, blocks, firsts, cached, bar, where, ends)
        finally:
            wall = time.perf_counter() - started
            if collecting:
                gc.enable()
        self.wall_s += wall
        for column, values in ((self.arrivals, arrivals), (self.prompts, prompts), (self.outputs, outputs),
                               (self.firsts, firsts), (self.cached, cached), (self.copy_of, where),
                               (self.ends, ends)):
            _append(column, values)
        self.source = self.source or trace.source
        return wall

    def _choose_caches(self, trace: Trace, chained_with_earlier: bool) -> None:
        """Chain caches (lab/chain_cache.py) for the inlined loop while the ids are chained: a first
        feed's, or a later one's chained with the earlier; OrderedDicts (converted exactly) otherwise."""
        fleet = self.fleet
        if fast_loop.eligible(fleet) and (chained_with_earlier or not self.arrivals) and trace.ids_chained():
            fleet.caches.use_chain_caches()
        else:
            fleet.caches.use_ordered_caches()

    def _loop(self, n, keys, arrivals, prompts, outputs, blocks, firsts, cached, bar, where, ends) -> None:
        inv = self.inv
        fleet = self.fleet
        place = fleet._place
        done, out = fleet._done, fleet._out
        scaled = fleet.pool is not None  # autoscaling: finishes and evaluations through advance()
        last_finish = self.last_finish
        fast = fast_loop.eligible(fleet)
        for lo in range(0, n, _CHUNK):
            hi = min(n, lo + _CHUNK)
            if fast:  # the same work with Fleet._place inlined (lab/fast_loop.py)
                last_finish = fast_loop.run(fleet, lo, hi, inv, keys, arrivals, prompts, outputs, blocks,
                                            firsts, cached, where, ends, last_finish)
            else:
                for i in range(lo, hi):
                    now = arrivals[i] * inv
                    if scaled:
                        fleet.advance(now)
                    while done and done[0][0] <= now:
                        out[heappop(done)[1]] -= 1
                    r = place(keys[i], blocks[i], prompts[i], outputs[i], now)
                    firsts[i] = r[2]
                    cached[i] = r[1]
                    where[i] = r[0]
                    ends[i] = r[4]
                    if r[4] > last_finish:
                        last_finish = r[4]
            if bar is not None:
                bar.update(hi - lo)
            self.last_finish = last_finish

    def _closed_loop(self, n, keys, arrivals, prompts, outputs, blocks, firsts, cached, bar, where, ends) -> None:
        fleet = self.fleet
        place = fleet._place
        done, out, ready = fleet._done, fleet._out, self._ready
        scaled = fleet.pool is not None
        last_finish = self.last_finish
        for i in range(n):
            now = heappop(ready)  # the user free first sends the trace's next request
            if scaled:
                fleet.advance(now)
            while done and done[0][0] <= now:
                out[heappop(done)[1]] -= 1
            r = place(keys[i], blocks[i], prompts[i], outputs[i], now)
            arrivals[i], firsts[i], cached[i], where[i], ends[i] = now, r[2], r[1], r[0], r[4]
            heappush(ready, r[4])  # its last token (or the timeout): then it sends again
            if r[4] > last_finish:
                last_finish = r[4]
            if bar is not None and (i + 1) % _CHUNK == 0:
                bar.update(_CHUNK)
        if bar is not None:
            bar.update(n % _CHUNK)
        self.last_finish = last_finish

    def result(self) -> "SimResult":
        return _result(self)


def _append(column: array, values) -> None:
    """Extend an array column; ``fromlist`` converts a list about twice as fast as ``extend``."""
    if values.__class__ is list:
        column.fromlist(values)
    else:
        column.extend(values)


def simulate(
    trace: Trace,
    config: FleetConfig,
    *,
    speed: float = 1.0,
    progress: bool | None = False,
    keys: list | None = None,
    bar=None,
    users: int | None = None,
    as_sent: bool = False,
    limits: LimitSettings | None = None,
    explain_misses: bool = True,
) -> SimResult:
    """Replay ``trace`` through one fleet in simulated time (``users``: a closed loop, ``limits``: the
    per-tenant limits, see :class:`Simulator`; ``as_sent``: see :meth:`Simulator.feed`;
    ``explain_misses=False``: no ``misses`` by cause, a fifth faster). Deterministic for a config's seed."""
    sim = Simulator(config_for_trace(config, trace), speed=speed, users=users, limits=limits,
                    explain_misses=explain_misses)
    own_bar = bar is None
    if own_bar:
        bar = progress_bar(len(trace), config.strategy.value, progress)
    try:
        sim.feed(trace, keys=keys, bar=bar, as_sent=as_sent)
    finally:
        if own_bar and bar is not None:
            bar.close()
    return sim.result()


def _hotspot_seconds(sim: Simulator, arr: list[float], config: FleetConfig) -> float:
    """Seconds (whole periods) in which some copy's time-averaged in-flight count was above the
    hotspot threshold (the stage alarm's ``hotspot_factor`` × the scaling target; the defaults
    2 × 4 without autoscaling), from each request's interval in the in-flight count."""
    from prefix_routing.lab.autoscaling import AutoscalingSettings

    if not arr:
        return 0.0
    settings = config.autoscaling or AutoscalingSettings()
    threshold, period = settings.hotspot_factor * settings.target_per_copy, settings.period_s
    # ∫ in-flight dt over a period is the sum of the requests' overlaps with it: no sorting needed.
    areas: dict[int, dict[int, float]] = {}
    for g, start, end in zip(sim.copy_of, arr, sim.ends):
        if end <= start:
            continue
        area = areas.get(g)
        if area is None:
            area = areas[g] = {}
        b = int(start // period)
        edge = (b + 1) * period
        while end > edge:  # the part in period b, then the next
            area[b] = area.get(b, 0.0) + (edge - start)
            start, b = edge, b + 1
            edge = (b + 1) * period
        area[b] = area.get(b, 0.0) + (end - start)
    hot = {b for area in areas.values() for b, a in area.items() if a / period > threshold}
    return float(len(hot) * period)


def _waited_share(sim: Simulator, ttft: list[float], ok: list[bool]) -> float:
    """The share of requests that waited more than WAIT_S beyond their own prefill on an idle copy
    (its uncached tokens, one step per chunk, the request overheads), the timed-out ones included."""
    if not ttft:
        return 0.0
    fleet = sim.fleet
    prefill, overhead = fleet.latency.prefill_s, fleet._ttft_overhead
    waited = fleet.timeouts
    for t, p, c, good in zip(ttft, sim.prompts, sim.cached, ok):
        if good and t - overhead - prefill(p - c, c) > WAIT_S:
            waited += 1
    return waited / len(ttft)


def _result(sim: Simulator) -> SimResult:
    """The summary of a run, in pure Python (the advisor's Lambda has no numpy)."""
    config, fleet = sim.config, sim.fleet
    if fleet.pool is not None:
        fleet.advance(sim.last_finish)  # the evaluations up to the last token
    n = len(sim.arrivals)
    inv = sim.inv
    arr = [a * inv for a in sim.arrivals]
    timeout = config.timeout_s if config.timeout_s is not None else math.inf
    isfinite = math.isfinite
    ok = [isfinite(f) for f in sim.firsts]  # False: failed (timed out, or no copy serving)
    ttft = [f - a if good else timeout for f, a, good in zip(sim.firsts, arr, ok)]
    prompts, cached_tokens = sim.prompts, sim.cached
    served_prompt = math.fsum(p for p, good in zip(prompts, ok) if good)
    hit = math.fsum(cached_tokens) / served_prompt if served_prompt else 0.0
    p = percentiles(ttft) if n else {"p50": 0.0, "p90": 0.0, "p99": 0.0}
    rows = fleet.instance_totals()
    req = [r["requests"] for r in rows]
    tok = [r["prompt_tokens"] for r in rows]
    # max/mean over the instances that could serve: with autoscaling, those that held a provisioned
    # copy at some time (copy slots never provisioned would only lower the mean).
    counted = sorted({g // config.copies for g in fleet.pool.ever}) if fleet.pool is not None else range(len(rows))
    req_counted, tok_counted = [req[i] for i in counted], [tok[i] for i in counted]
    mean_req = sum(req_counted) / len(req_counted) if req_counted else 0
    mean_tok = sum(tok_counted) / len(tok_counted) if tok_counted else 0
    span = sim.last_finish - (arr[0] if n else 0.0)
    served_out = math.fsum(o for o, good in zip(sim.outputs, ok) if good)
    served = sum(ok)
    # Hit rate over time: 60 bins over the trace (at least 1 s each).
    duration = arr[-1] - arr[0] if n else 0.0
    bin_s = max(1.0, duration / 60.0)
    bins = int((arr[-1] - arr[0]) // bin_s) + 1 if n else 0
    hit_num, hit_den = [0.0] * bins, [0.0] * bins
    for a, c, pr, good in zip(arr, cached_tokens, prompts, ok):
        if good:
            b = int((a - arr[0]) // bin_s)
            hit_num[b] += c
            hit_den[b] += pr
    over_time = [(b * bin_s, hit_num[b] / hit_den[b] if hit_den[b] else 0.0) for b in range(bins)]
    scaling = None
    if fleet.pool is not None:
        scaling = fleet.pool.summary()
        scaling["no_capacity_failures"] = fleet.no_capacity
        # The hit rate of the requests that arrive in the 10 minutes after each scale-out.
        outs = [t for t, before, to in fleet.pool.events if to > before]
        after = [any(t <= a < t + 600.0 for t in outs) for a in arr] if outs else [False] * n
        den = math.fsum(pr for pr, x, good in zip(prompts, after, ok) if x and good)
        num = math.fsum(c for c, x in zip(cached_tokens, after) if x)
        scaling["hit_rate_10min_after_scale_out"] = num / den if den else None
    copy_hours = scaling["copy_hours"] if scaling else config.total_copies * max(span, 0.0) / 3600.0
    hotspot_s = scaling["hotspot_seconds"] if scaling else _hotspot_seconds(sim, arr, config)
    return SimResult(
        strategy=config.strategy.value,
        config=config,
        requests=n,
        copy_hours=copy_hours,
        hotspot_seconds=hotspot_s,
        autoscaling=scaling,
        hit_rate=hit,
        ttft=ttft,
        ttft_p50_s=p["p50"],
        ttft_p90_s=p["p90"],
        ttft_p99_s=p["p99"],
        throughput_tok_s=served_out / span if span > 0 else 0.0,
        throughput_req_s=served / span if span > 0 else 0.0,
        instance_requests=req,
        instance_prompt_tokens=tok,
        instance_hit_rates=[r["hit_rate"] for r in rows],
        max_mean_requests=max(req_counted) / mean_req if mean_req else 0.0,
        max_mean_tokens=max(tok_counted) / mean_tok if mean_tok else 0.0,
        max_mean_instances=len(counted),
        waited_share=_waited_share(sim, ttft, ok),
        spills=fleet.spills,
        timeouts=fleet.timeouts,
        hit_over_time=over_time,
        wall_s=sim.wall_s,
        replicated_requests=fleet.replicated,
        extra=fleet.steering_summary(),
        rekeyed_requests=sim.rekeyed,
        as_sent=sim.as_sent,
        misses=fleet.misses.as_dict() if fleet.misses is not None else {},
        tenants=None if sim.tenant_book is None else tenant_rows(sim.tenant_book, ttft, ok, sim.outputs, span),
        throttled=0 if sim.tenant_book is None else sim.tenant_book.throttled_total,
        cached_tokens=sim.cached,
        copy_of=sim.copy_of,
    )


def simulate_many(
    trace: Trace,
    config: FleetConfig,
    strategies: Sequence[Strategy],
    *,
    speed: float = 1.0,
    progress: bool | None = None,
    users: int | None = None,
    as_sent: bool = False,
    limits: LimitSettings | None = None,
) -> list[SimResult]:
    """The same trace and fleet under each strategy, with one progress bar for all. With autoscaling,
    a strategy it does not model runs at fixed copies (``for_strategy``; its result says so)."""
    check_autoscaling(config, strategies)
    bar = progress_bar(len(trace) * len(strategies), "simulate", progress)
    try:
        results = []
        for s in strategies:
            cfg = for_strategy(config, s)
            result = simulate(trace, cfg, speed=speed, bar=bar, users=users, as_sent=as_sent, limits=limits)
            if config.autoscaling is not None and cfg.autoscaling is None:
                result.notes.append(fixed_copies_note(s, cfg))
            results.append(result)
        return results
    finally:
        if bar is not None:
            bar.close()


def for_strategy(config: FleetConfig, strategy: Strategy) -> FleetConfig:
    """The config for one strategy: autoscaling off (all copies, fixed) where it is not modelled."""
    if config.autoscaling is not None and not autoscaling_modelled(strategy, config.cache_policy):
        return replace(config, strategy=strategy, autoscaling=None)
    return replace(config, strategy=strategy)


def fixed_copies_note(strategy: Strategy, config: FleetConfig) -> str:
    return (f"{strategy.value}: autoscaling is not modelled for it: it ran on all {config.total_copies} copies, "
            "fixed, while the others scaled; its figures are those of the fleet at its largest")


def check_autoscaling(config: FleetConfig, strategies: Sequence[Strategy]) -> None:
    """With autoscaling on, at least one strategy it models (else the run would model none of it)."""
    if config.autoscaling is None or any(autoscaling_modelled(s, config.cache_policy) for s in strategies):
        return
    raise autoscaling_error(strategies, config.cache_policy)
