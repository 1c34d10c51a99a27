"""Tenants in the lab: who sent each request, and whether one tenant dominates the load.

A trace names its tenants in one of three ways: the request log's ``tenant`` field (as the front
door wrote it), ``--tenants N`` (:func:`with_tenants`: each request's conversation picks one of N
tenants, the same choice ``log --tenants N`` makes), or a generated workload's own
(``--workload noisy-tenant``). A trace that names none is one caller's: :data:`UNNAMED_TENANT`.

Each tenant has its own PrefixAwareId at the front door, so identical prompts of two tenants route
apart: :func:`with_tenants` gives a trace without routing ids its tenants' names as ids.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import replace
from typing import Sequence

from prefix_routing.lab.trace_data import Trace
from prefix_routing.rules.errors import UserError

#: The most tenants ``--tenants`` spreads a trace over (``log --tenants`` takes the same).
MAX_TENANTS = 1000
#: The tenant of a request whose trace names none: one caller, as the front door's ``tenancy = "none"``.
UNNAMED_TENANT = "shared"
#: One tenant with more than this share of the requests or of the tokens dominates the load.
DOMINANT_SHARE = 0.5


def tenant_name(index: int) -> str:
    """The name of tenant ``index`` (0-based): ``tenant-0001`` …, as ``log --tenants`` names them."""
    return f"tenant-{index + 1:04d}"


def tenant_for(key: str, tenants: int) -> str:
    """The tenant of a request whose conversation is ``key``, among ``tenants``: a hash of the key,
    so that a conversation keeps its tenant, and the same in every process and run."""
    index = int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:8], "big") % tenants
    return tenant_name(index)


def conversation_key(blocks: Sequence) -> str:
    """What picks a request's tenant: its second block id (a Mooncake trace's first block is shared by
    every request; the second starts its conversation), or its first when it has one block."""
    return str(blocks[1] if len(blocks) > 1 else blocks[0] if blocks else "")


def with_tenants(trace: Trace, tenants: int) -> Trace:
    """The trace with each request given one of ``tenants`` tenants by its conversation
    (:func:`conversation_key`), and, if it has no routing ids, its tenant's name as its id."""
    if not isinstance(tenants, int) or isinstance(tenants, bool) or not 1 <= tenants <= MAX_TENANTS:
        raise UserError(f"tenants={tenants!r}: must be an integer from 1 to {MAX_TENANTS}")
    if trace.tenants:
        raise UserError(f"{trace.source} names its tenants already (the request log's 'tenant'): leave out --tenants")
    names = [tenant_for(conversation_key(b), tenants) for b in trace.blocks]
    return replace(trace, tenants=names, routing_ids=trace.routing_ids or list(names))


def tenants_of(trace: Trace) -> list[str]:
    """Each request's tenant (:data:`UNNAMED_TENANT` where the trace names none)."""
    if not trace.tenants:
        return [UNNAMED_TENANT] * len(trace)
    return [t if t is not None else UNNAMED_TENANT for t in trace.tenants]


def dominant_tenant(tenants: Sequence[str], prompt_tokens: Sequence[float],
                    output_tokens: Sequence[float]) -> dict | None:
    """The tenant that sends more than half of the requests or of the tokens (prompt + output), with
    its shares and the line to print; None when no tenant does, or the trace has one tenant."""
    requests: Counter = Counter(tenants)
    if len(requests) < 2:
        return None
    tokens: Counter = Counter()
    for tenant, p, o in zip(tenants, prompt_tokens, output_tokens):
        tokens[tenant] += p + o
    total_requests, total_tokens = sum(requests.values()), math.fsum(tokens.values())
    by_tokens = max(tokens, key=lambda t: (tokens[t], t)) if total_tokens else None
    by_requests = max(requests, key=lambda t: (requests[t], t))
    if by_tokens is not None and tokens[by_tokens] / total_tokens > DOMINANT_SHARE:
        tenant, what = by_tokens, "tokens"
    elif requests[by_requests] / total_requests > DOMINANT_SHARE:
        tenant, what = by_requests, "requests"
    else:
        return None
    request_share = requests[tenant] / total_requests
    token_share = tokens[tenant] / total_tokens if total_tokens else 0.0
    share = token_share if what == "tokens" else request_share
    return {
        "tenant": tenant,
        "requests_share": request_share,
        "tokens_share": token_share,
        "text": f"tenant {tenant} sends {100 * share:.0f} % of the {what}: one tenant's burst becomes everyone's "
                "latency; consider [limits]",
    }


def trace_dominance(trace: Trace) -> dict | None:
    """:func:`dominant_tenant` of a trace's requests (None when the trace names no tenants)."""
    if not trace.tenants:
        return None
    return dominant_tenant(tenants_of(trace), trace.prompt_tokens, trace.output_tokens)


def tenant_summary(trace: Trace) -> dict:
    """What ``--json`` says of a trace's tenants: how many, and the dominant one."""
    return {"count": len(set(tenants_of(trace))) if trace.tenants else 0, "dominant": trace_dominance(trace)}
