"""Where the hits went: the hit-rate bound that tenants' namespaces allow, and each tenant's loss.

A tenant's requests can reuse only what its own namespace holds: the front door salts each tenant's
body (vLLM keeps salted blocks apart) and gives it a routing id of its own (``PrefixAwareId``), so a
prefix two tenants both send is computed for each. The bound here is that of one infinite cache per
namespace: the blocks of a request's prompt, from its first, that an earlier request of the same
namespace sent. A namespace is the request's tenant, else its routing id (a hot prefix's replica
``<id>-r<j>`` is its tenant's id), else the whole trace (a log written without either: the shared
bound of ``analyze``).

A tenant's loss is the prompt tokens its namespace's bound would have cached and the engine did not
report cached (the request log's ``cached_tokens``; requests without a count are left out of both).
The fleet's part and the engine's part of the loss are on the dashboard: bound - predicted ("lost to
routing and capacity"), predicted - measured ("lost in the engine").
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Final

from prefix_routing.lab.trace_data import Trace

_REPLICA = re.compile(r"-r\d+$")
#: Tenants listed at most (the advisor's log line, ``advise``'s output).
TOP_TENANTS: Final = 5


def namespace_of(trace: Trace, index: int) -> str | None:
    """The request's cache namespace: its tenant, else its routing id without a replica suffix, else None."""
    if trace.tenants is not None and trace.tenants[index]:
        return trace.tenants[index]
    if trace.routing_ids is not None and trace.routing_ids[index]:
        return _REPLICA.sub("", trace.routing_ids[index])
    return None


def namespace_bound(trace: Trace) -> dict:
    """``bound_tokens``: the token-weighted hit rate of one infinite cache per namespace;
    ``tenants``: per namespace, prompt tokens, the bound's cached tokens, the measured cached tokens and
    the loss (bound - measured, over the requests with a measured count), most lost first."""
    seen: dict = defaultdict(set)
    prompt_total = bound_total = 0.0
    rows: dict = defaultdict(lambda: {"prompt_tokens": 0, "bound_tokens": 0, "measured_tokens": 0,
                                      "lost_tokens": 0, "requests": 0})
    block_tokens = trace.block_tokens
    for index, (blocks, prompt) in enumerate(zip(trace.blocks, trace.prompt_tokens)):
        namespace = namespace_of(trace, index)
        held = seen[namespace]
        matched = 0
        for block in blocks:
            if block not in held:
                break
            matched += 1
        held.update(blocks)
        bound = min(matched * block_tokens, prompt)
        prompt_total += prompt
        bound_total += bound
        row = rows[namespace or "(none)"]
        row["requests"] += 1
        row["prompt_tokens"] += prompt
        row["bound_tokens"] += bound
        measured = trace.cached_tokens[index] if trace.cached_tokens is not None else None
        if measured is not None:
            row["measured_tokens"] += measured
            row["lost_tokens"] += max(0.0, bound - measured)
    tenants = sorted(({"tenant": name, **{k: round(v) if isinstance(v, float) else v for k, v in row.items()}}
                      for name, row in rows.items()), key=lambda r: (-r["lost_tokens"], -r["prompt_tokens"], r["tenant"]))
    return {"bound_tokens": bound_total / prompt_total if prompt_total else 0.0, "tenants": tenants}


def top_losers(bound: dict, count: int = TOP_TENANTS) -> list[dict]:
    """The tenants that lost the most prompt tokens (those that lost some), most first."""
    return [row for row in bound["tenants"] if row["lost_tokens"] > 0][:count]
