"""Each request's PREFIX_AWARE routing key in a trace: what the simulator routes on and the unit a
miniature simulation samples."""

from __future__ import annotations

from prefix_routing.lab.routing import routing_key
from prefix_routing.lab.trace_data import Trace
from prefix_routing.rules.errors import UserError


def trace_keys(trace: Trace, k: int, as_sent: bool = False) -> list:
    """Each request's PREFIX_AWARE key; ``as_sent``: a re-keyed raw body's own bytes instead."""
    ids = trace.routing_ids
    if ids:
        keys = [routing_key(b, k, rid) for b, rid in zip(trace.blocks, ids)]
    elif k > 0:  # routing_key without a call per request: the k-th block, or the last of a shorter list
        keys = [b[k - 1] if len(b) >= k else b[-1] if b else None for b in trace.blocks]
    else:
        keys = [routing_key(b, k) for b in trace.blocks]
    if as_sent:
        if not trace.raw_keys:
            raise UserError(f"{trace.source}: routing as sent needs raw request bodies (--format bodies)")
        keys = [key if raw is None else raw for key, raw in zip(keys, trace.raw_keys)]
    return keys
