"""The price of isolation: one shared component against one component per trust domain.

A trust domain's copies serve its tenants only (``[domains.<name>]``), so two domains never share a
KV cache, and never share capacity either: a domain's burst queues on its own copies while another
domain's stand idle, and a prefix common to tenants in two domains is computed twice. This module
replays one trace both ways on the same fleet and says what the wall costs:

- **shared**: the fleet as one component, every tenant's requests routed over all of its copies;
- **K domains**: the trace's tenants dealt round-robin (in sorted order) to K domains, each domain a
  component with its share of the copies (dealt out, at least one each), each replaying its own
  tenants' requests.

Hit rate is token-weighted over all requests (cached ÷ prompt tokens), TTFT percentiles over all
requests, copy-hours summed over the components.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from prefix_routing.lab.percentiles import percentiles
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.simulate import SimResult, simulate
from prefix_routing.lab.tenants import tenants_of
from prefix_routing.lab.traces import Trace
from prefix_routing.rules.domains import MAX_DOMAINS
from prefix_routing.rules.errors import UserError


def subset(trace: Trace, indexes: list[int]) -> Trace:
    """The requests at ``indexes`` (in order), with their own columns."""
    def pick(column):
        return [column[i] for i in indexes] if column else None

    return dataclasses.replace(
        trace, arrivals=pick(trace.arrivals) or [], prompt_tokens=pick(trace.prompt_tokens) or [],
        output_tokens=pick(trace.output_tokens) or [], blocks=pick(trace.blocks) or [],
        routing_ids=pick(trace.routing_ids), rekeyed=pick(trace.rekeyed), raw_keys=pick(trace.raw_keys),
        cached_tokens=pick(trace.cached_tokens), tenants=pick(trace.tenants), notes=list(trace.notes),
    )


def domain_of_tenants(trace: Trace, domains: int) -> dict[str, int]:
    """Each tenant's domain: tenants in sorted order, dealt round-robin."""
    return {tenant: i % domains for i, tenant in enumerate(sorted(set(tenants_of(trace))))}


def domain_fleets(config: FleetConfig, domains: int) -> list[FleetConfig]:
    """Each domain's component: the fleet's copies dealt out (the first ``total % domains`` domains
    get one more; at least one each), each on as few instances as hold its copies."""
    total = config.total_copies
    return [fleet_for_copies(config, max(1, total // domains + (1 if d < total % domains else 0)))
            for d in range(domains)]


def fleet_for_copies(config: FleetConfig, copies: int, per_instance: int | None = None) -> FleetConfig:
    """``config`` holding ``copies`` copies on as few instances as hold them (``per_instance`` copies
    at most on one; default the config's own), the copies spread evenly over those instances."""
    instances = math.ceil(copies / (per_instance or config.copies))
    return dataclasses.replace(config, instances=instances, copies=math.ceil(copies / instances))


def price_of_isolation(trace: Trace, config: FleetConfig, domains: int, *,
                       run: Callable[[Trace, FleetConfig], SimResult] | None = None) -> list[dict]:
    """Rows for the shared layout and for ``domains`` domains: ``layout``, ``components``, ``copies``,
    ``hit_rate``, ``ttft_p50_s``, ``ttft_p90_s``, ``copy_hours``, ``timeouts``."""
    if not 2 <= domains <= MAX_DOMAINS:
        raise UserError(f"--domains {domains}: allowed 2 to {MAX_DOMAINS}")
    tenants = tenants_of(trace)
    if len(set(tenants)) < domains:
        raise UserError(f"--domains {domains}: the trace has {len(set(tenants))} tenant(s); give --tenants N with N "
                        f"at least {domains} (or a request log that names its tenants)")
    run = run or (lambda part, fleet: simulate(part, fleet))
    shared = run(trace, config)
    owner = domain_of_tenants(trace, domains)
    parts = [subset(trace, [i for i, t in enumerate(tenants) if owner[t] == d]) for d in range(domains)]
    fleets = domain_fleets(config, domains)
    results = [(part, run(part, fleet)) for part, fleet in zip(parts, fleets)]
    return [_row("shared", 1, config.total_copies, [(trace, shared)]),
            _row(f"{domains} domains", domains, sum(f.total_copies for f in fleets), results)]


def _row(layout: str, components: int, copies: int, results: list[tuple[Trace, SimResult]]) -> dict:
    prompt = sum(sum(part.prompt_tokens) for part, _ in results)
    cached = sum(result.hit_rate * sum(part.prompt_tokens) for part, result in results)
    ttft = [t for _, result in results for t in result.ttft]
    p = percentiles(ttft, (50, 90))
    return {"layout": layout, "components": components, "copies": copies,
            "hit_rate": cached / prompt if prompt else 0.0, "ttft_p50_s": p["p50"], "ttft_p90_s": p["p90"],
            "copy_hours": sum(result.copy_hours for _, result in results),
            "timeouts": sum(result.timeouts for _, result in results)}


def isolation_table(rows: list[dict]) -> str:
    lines = ["| layout | components | copies | hit rate | P50 TTFT (s) | P90 TTFT (s) | copy-hours | timeouts |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['layout']} | {r['components']} | {r['copies']} | {r['hit_rate']:.1%} | {r['ttft_p50_s']:.2f} | "
              f"{r['ttft_p90_s']:.2f} | {r['copy_hours']:.2f} | {r['timeouts']:,} |" for r in rows]
    return "\n".join(lines)
