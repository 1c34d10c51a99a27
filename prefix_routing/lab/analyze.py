"""How much prefix reuse a trace has, and how the routing keys of each PrefixLength would group it (no fleet)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable

from prefix_routing.lab.grids import CANDIDATE_PREFIX_LENGTHS, KEY_GROUP_BLOCKS, SPREAD_SHARE
from prefix_routing.lab.percentiles import distribution
from prefix_routing.lab.routing import PREFIX_LENGTH_RANGE, key_blocks, routing_key
from prefix_routing.lab.traces import Trace
from prefix_routing.rules.errors import UserError


def key_groups(trace: Trace, k: int) -> tuple[int, float]:
    """(distinct keys, share of the largest group) when keying on the first k blocks."""
    ids = trace.routing_ids or [None] * len(trace)
    counts = Counter(routing_key(b, k, rid) for b, rid in zip(trace.blocks, ids))
    if not counts:
        return 0, 0.0
    return len(counts), counts.most_common(1)[0][1] / len(trace)


def analyze(
    trace: Trace,
    *,
    bytes_per_token: float = 4.0,
    key_offset_bytes: int = 0,
    prefix_lengths: Iterable[int] = CANDIDATE_PREFIX_LENGTHS,
    group_blocks: Iterable[int] = KEY_GROUP_BLOCKS,
) -> dict:
    """Prefix reuse in a trace, and how routing keys of each PrefixLength would group it.

    ``hit_rate_bound``: the share of blocks (block-weighted) that a single infinite cache shared by
    all requests would already hold when the request arrives: an upper bound for any routing.
    ``hit_rate_bound_tokens`` is the same weighted by tokens, as simulated hit rates are.
    """
    n = len(trace)
    if not n:
        raise UserError(f"{trace.source}: the trace has no requests")
    seen: set = set()
    first_reuse = beyond_first = 0
    blocks_total = blocks_hit = 0
    tokens_total = tokens_hit = 0.0
    shared_tokens = []
    bt = trace.block_tokens
    contains = seen.__contains__
    for blocks, prompt in zip(trace.blocks, trace.prompt_tokens):
        m = 0
        for b in blocks:
            if not contains(b):
                break
            m += 1
        if m >= 1:
            first_reuse += 1
        if m >= 2:
            beyond_first += 1
        blocks_total += len(blocks)
        blocks_hit += m
        cached = min(m * bt, prompt)
        tokens_total += prompt
        tokens_hit += cached
        shared_tokens.append(cached)
        seen.update(blocks)

    groups = []
    for k in sorted(set(group_blocks)):
        distinct, largest = key_groups(trace, k)
        block_bytes = trace.block_bytes or trace.block_tokens * bytes_per_token
        low = max(PREFIX_LENGTH_RANGE[0], math.floor((k - 1) * block_bytes + key_offset_bytes) + 1)
        high = min(PREFIX_LENGTH_RANGE[1], math.floor(k * block_bytes + key_offset_bytes))
        row = {"blocks": k, "distinct": distinct, "largest_share": largest}
        row["prefix_lengths"] = [low, high] if low <= high else None
        groups.append(row)

    by_length = []
    for pl in sorted(set(prefix_lengths)):
        k = key_blocks(pl, bytes_per_token, trace.block_tokens, trace.block_bytes, key_offset_bytes)
        distinct, largest = key_groups(trace, k)
        by_length.append({"prefix_length": pl, "blocks": k, "distinct": distinct, "largest_share": largest})

    duration = trace.duration_s
    result = {
        "source": trace.source,
        "requests": n,
        "duration_s": duration,
        "rate_rps": n / duration if duration > 0 else None,
        "prompt_tokens": distribution(trace.prompt_tokens),
        "output_tokens": distribution(trace.output_tokens),
        "block_tokens": bt,
        "block_bytes": trace.block_bytes,
        "bytes_per_token": bytes_per_token,
        "first_block_reuse": first_reuse / n,
        "prefix_reuse": first_reuse / n,
        "reuse_beyond_first_block": beyond_first / n,
        "hit_rate_bound": blocks_hit / blocks_total if blocks_total else 0.0,
        "hit_rate_bound_tokens": tokens_hit / tokens_total if tokens_total else 0.0,
        "shared_prefix_tokens": distribution(shared_tokens),
        "key_groups": groups,
        "prefix_length_groups": by_length,
        "skipped": trace.skipped.as_dict(),
        "notes": list(trace.notes),
    }
    result["warnings"] = _analysis_warnings(result)
    return result


def _analysis_warnings(a: dict) -> list[str]:
    warnings = []
    # Whether prefix-aware routing pays is the simulation's verdict (lab/verdict.py), not the reuse share's.
    if a["hit_rate_bound"] < 0.10:
        warnings.append(
            f"even one infinite cache shared by all requests would hold only {a['hit_rate_bound']:.1%} "
            "of the blocks: little to gain from prefix-aware routing"
        )
    rows = a["prefix_length_groups"]
    hot = [r for r in rows if r["largest_share"] >= 0.5]
    spread = [r for r in rows if r["largest_share"] < SPREAD_SHARE]
    if hot:
        worst = max(r["prefix_length"] for r in hot)
        share = hot[-1]["largest_share"]
        advice = f"; use at least {spread[0]['prefix_length']}" if spread else ""
        warnings.append(
            f"a PrefixLength of {worst} bytes or less keys {share:.0%} of requests alike (a shared "
            f"leading block): they would all go to one copy{advice}"
        )
    return warnings
