"""``python -m prefix_routing analyze TRACE``: prefix reuse and routing-key groups of a trace."""

from __future__ import annotations

from prefix_routing import lab
from prefix_routing.cli import flag_values, lab_args, trace_args

HELP = "analyze a trace: prefix reuse, the hit-rate bound, routing-key groups per PrefixLength"


def add_arguments(parser) -> None:
    trace_args.add_trace_arguments(parser)
    parser.add_argument(
        "--prefix-length", type=flag_values.ranged_int("--prefix-length", *lab.PREFIX_LENGTH_RANGE), action="append",
        metavar="B", help=f"PrefixLength to evaluate; repeatable (default {', '.join(map(str, lab.CANDIDATE_PREFIX_LENGTHS))})",
    )
    # The verdict simulates RANDOM and PREFIX_AWARE on this fleet (the lab's default, or the stage's).
    parser.add_argument("--stage", metavar="NAME", help="simulate the verdict on the stage's endpoint and routing settings")
    parser.add_argument("--instances", type=flag_values.ranged_int("--instances", 1, 10_000), metavar="N",
                        help="instances for the verdict's simulation (default 8; 7 for --workload long-context)")
    parser.add_argument("--preset", metavar="NAME", help="instance × model preset for the verdict's simulation")


def run(args) -> int:
    offset = trace_args.key_offset_bytes(args)  # bad flags fail before the trace is read
    trace, spec = trace_args.load_from_args(args)
    result = lab.analyze(
        trace,
        bytes_per_token=args.bytes_per_token,
        key_offset_bytes=offset,
        prefix_lengths=args.prefix_length or lab.CANDIDATE_PREFIX_LENGTHS,
    )
    result["verdict"] = verdict_for(args, trace, spec, result["prefix_reuse"])
    if args.json:
        lab_args.print_json(result)
        return 0
    print(render(result))
    return 0


def verdict_for(args, trace, spec, reuse_share: float) -> dict:
    """RANDOM and PREFIX_AWARE simulated on the fleet (the stage's PrefixLength and threshold)."""
    from prefix_routing.lab.verdict import routing_verdict

    config = lab_args.fleet_config_from_args(args, trace, spec)
    random, prefix = lab.simulate_many(trace, config, [lab.Strategy.RANDOM, lab.Strategy.PREFIX_AWARE])
    verdict = routing_verdict(prefix_aware=prefix.as_dict(), random=random.as_dict(), reuse_share=reuse_share)
    verdict["fleet"] = lab_args.describe_fleet(config) + (
        f"; PrefixLength {config.prefix_length}, ConcurrencyThreshold {config.concurrency_threshold}")
    return verdict


def render(a: dict) -> str:
    rate = f" ({a['rate_rps']:.2f} requests/s)" if a["rate_rps"] else ""
    p, s = a["prompt_tokens"], a["shared_prefix_tokens"]
    lines = [
        f"trace: {a['source']}",
        f"requests: {a['requests']:,} over {a['duration_s']:,.0f} s{rate}",
        f"prompt tokens: mean {p['mean']:,.0f}, P50 {p['p50']:,.0f}, P90 {p['p90']:,.0f}, P99 {p['p99']:,.0f}, max {p['max']:,.0f}",
        f"output tokens: mean {a['output_tokens']['mean']:,.0f}, P50 {a['output_tokens']['p50']:,.0f}",
        f"requests reusing a prefix seen before: {a['prefix_reuse']:.2%} (first block); "
        f"{a['reuse_beyond_first_block']:.2%} reuse more than the first block",
        f"hit-rate bound (one infinite shared cache): {a['hit_rate_bound']:.1%} of blocks, {a['hit_rate_bound_tokens']:.1%} of tokens",
        f"shared prefix per request (tokens): mean {s['mean']:,.0f}, P50 {s['p50']:,.0f}, P90 {s['p90']:,.0f}, P99 {s['p99']:,.0f}",
        "",
        f"routing keys (block = {a['block_tokens']:g} tokens"
        + (f" = {a['block_bytes']:g} bytes" if a["block_bytes"] else f" ≈ {a['block_tokens'] * a['bytes_per_token']:g} bytes at {a['bytes_per_token']:g} bytes/token")
        + "):",
        f"  {'PrefixLength':>12}  {'blocks':>6}  {'distinct keys':>13}  {'largest group':>13}",
    ]
    for r in a["prefix_length_groups"]:
        lines.append(f"  {r['prefix_length']:>12,}  {r['blocks']:>6}  {r['distinct']:>13,}  {r['largest_share']:>13.2%}")
    for w in a["warnings"]:
        lines.append(f"warning: {w}")
    v = a.get("verdict")
    if v:
        lines += ["", f"verdict: {v['text']}", f"  ({v['criterion']})", f"  simulated on: {v['fleet']}"]
    return "\n".join(lines)
