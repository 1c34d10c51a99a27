"""``python -m prefix_routing simulate TRACE``: one endpoint under each routing strategy, side by side."""

from __future__ import annotations

import dataclasses
import math
import sys

from prefix_routing import lab
from prefix_routing.cli import flag_values, lab_args, tenant_args, trace_args
from prefix_routing.lab.overload import WAIT_S
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.sample_bands import ms_text, share_text
from prefix_routing.lab.tenant_report import tenant_table
from prefix_routing.lab.tenants import tenant_summary
from prefix_routing.rules.errors import UserError

HELP = "simulate an endpoint over a trace: hit rate, TTFT, load per instance for each routing strategy"

DEFAULT_STRATEGIES = (
    Strategy.RANDOM,
    Strategy.LEAST_OUTSTANDING_REQUESTS,
    Strategy.PREFIX_AWARE,
    Strategy.KV_AWARE,
)


def add_arguments(parser) -> None:
    trace_args.add_trace_arguments(parser)
    lab_args.add_fleet_arguments(parser, grid=False)
    tenant_args.add_tenant_arguments(parser)
    parser.add_argument("--users", type=flag_values.ranged_int("--users", 1, 100_000), metavar="U",
                        help="closed loop: U clients, each sending the trace's next request when its last one has "
                        "finished, instead of the trace's arrival times (how AWS's benchmark runs)")
    parser.add_argument("--domains", type=flag_values.ranged_int("--domains", 2, 8), metavar="K",
                        help="also price isolation: the same fleet as one shared component against K trust domains "
                        "(the tenants dealt round-robin, an equal share of the copies each), with PREFIX_AWARE")
    trace_args.add_sample_argument(parser)
    parser.add_argument("--as-sent", action="store_true",
                        help="raw bodies (--format bodies): route on the bytes as the clients sent them, as with no "
                        "front door; the misses of requests whose bytes key differently count as 're-keyed'")


def run(args) -> int:
    if args.preset == "list":
        print(lab_args.presets_table())
        return 0
    fixed = {}
    if args.prefix_length is not None:
        fixed["prefix_length"] = args.prefix_length
    if args.concurrency_threshold is not None:
        fixed["concurrency_threshold"] = args.concurrency_threshold
    lab_args.fleet_config_from_args(args, None, None, **fixed)  # bad flags fail before a long read
    limits = tenant_args.limits_from_args(args)
    if args.users is not None and args.speed != 1.0:
        raise UserError(f"--speed {args.speed:g} replays the trace's timing; --users {args.users} replaces it: give one")
    trace, spec = trace_args.load_from_args(args)
    config = lab_args.fleet_config_from_args(args, trace, spec, **fixed)
    strategies = list(dict.fromkeys(args.strategy or DEFAULT_STRATEGIES))
    config = lab_args.settle_autoscaling(args, config, strategies)
    warnings = lab_args.trace_warnings(config, trace)
    if args.as_sent and not trace.raw_keys:
        raise UserError(f"--as-sent routes raw request bodies on their own bytes; {trace.source} is not raw bodies "
                        "(--format bodies)")
    trace, sample_plan, whole = trace_args.sampled(args, trace, config, strategies=strategies, users=args.users,
                                                   limits=limits, domains=args.domains)
    rate = sample_plan.rate
    if rate < 1.0:  # each strategy on its own miniature (lab/sampling.py)
        from prefix_routing.lab.sampling import simulate_miniature

        results = [simulate_miniature(trace, config, s, rate, whole, speed=args.speed, as_sent=args.as_sent)
                   for s in strategies]
    else:
        results = lab.simulate_many(trace, config, strategies, speed=args.speed, progress=args.progress,
                                    users=args.users, as_sent=args.as_sent, limits=limits)
    tenants = tenant_summary(trace)
    isolation = None
    if args.domains is not None:
        from prefix_routing.lab.isolation_price import price_of_isolation

        fleet = dataclasses.replace(config, strategy=Strategy.PREFIX_AWARE)
        isolation = price_of_isolation(trace, fleet, args.domains, run=lambda part, f: lab.simulate(
            part, f, speed=args.speed, users=args.users, as_sent=args.as_sent, limits=limits))
    out = lab_args.plot_dir(args, "simulate")
    plots = [str(p) for p in lab.plot_simulation(results, out)] if out else []
    if args.json:
        lab_args.print_json(
            {
                "trace": {"source": trace.source, "requests": len(trace), "duration_s": trace.duration_s, "skipped": trace.skipped.as_dict()},
                **({"sample": {"asked": sample_plan.asked, "rate": rate, "note": sample_plan.note()}}
                   if args.sample is not None else {}),
                "fleet": {**fleet_dict(config, args.speed), "users": args.users, **lab_args.settings_dict(args, config)},
                "warnings": warnings + [w for r in results for w in result_warnings(r)],
                "tenants": {**tenants, "by_strategy": {r.strategy: r.tenants for r in results if r.tenants is not None}},
                "results": [r.as_dict() for r in results],
                "domains": isolation,
                "plots": plots,
            }
        )
        return 0
    pacing = (f"closed loop, {args.users} users (each sends its next request when its last has finished)"
              if args.users else f"replayed at {args.speed:g}×")
    print(f"trace: {trace.source}: {len(trace):,} requests over {trace.duration_s:,.0f} s, {pacing}")
    if rate < 1.0:
        print(f"sample: the routing keys at rate {rate:g} ({len(trace):,} of {whole:,} requests) on "
              f"{results[0].config.instances:,} instances; figures in the whole trace's units, each with its 95 % band")
    elif sample_plan.reason:
        print(f"sample: {sample_plan.note()}")
    print(f"fleet: {lab_args.describe_fleet(config)}")
    for line in lab_args.settings_lines(args, config, strategies, trace):
        print(line)
    if tenants["count"] > 1:
        print(f"tenants: {tenants['count']:,} ({tenant_origin(args, trace)})")
    for warning in warnings:
        print(f"warning: {warning}")
    print(f"PREFIX_AWARE: PrefixLength {config.prefix_length} bytes = {config.key_blocks} blocks, ConcurrencyThreshold {config.concurrency_threshold}".replace(" 1 blocks,", " 1 block,"))
    print()
    print(table(results))
    for r in results:
        for warning in result_warnings(r):
            print(f"warning: {warning}")
    if tenants["count"] > 1 or limits is not None:
        for r in results:
            print()
            print(tenant_table(r.strategy, r.tenants))
    if tenants["dominant"]:
        print(f"\nwarning: {tenants['dominant']['text']}")
    if isolation is not None:
        from prefix_routing.lab.isolation_price import isolation_table

        print(f"\ntrust domains (PREFIX_AWARE): one shared component against {args.domains}, each with its own "
              "copies and caches")
        print(isolation_table(isolation))
    if plots:
        print("\nplots: " + ", ".join(plots), file=sys.stderr)
    return 0


def tenant_origin(args, trace) -> str:
    """Where the trace's tenants come from."""
    if args.workload and trace.tenants and args.tenants is None:
        return f"the {args.workload} workload's"
    if args.tenants is not None:
        return f"--tenants {args.tenants}: by conversation"
    return "the request log's"


def result_warnings(r) -> list[str]:
    """A strategy's timeouts, its overload and what it did not model."""
    from prefix_routing.lab.overload import overload_text

    timeout = r.config.timeout_s
    out = list(r.notes)
    if r.timeouts:
        out.append(f"{r.strategy}: {r.timeouts:,} requests got no first token within {timeout:g} s (counted at "
                   f"{timeout:g} s in the TTFT percentiles)")
    overloaded = overload_text(r.waited_share, r.timeouts, r.requests, timeout)
    if overloaded:
        out.append(f"{r.strategy}: {overloaded}")
    return out


def fleet_dict(config, speed: float) -> dict:
    cap = config.capacity_tokens
    return {
        "instances": config.instances,
        "copies": config.copies,
        "preset": config.preset.name,
        "prefix_length": config.prefix_length,
        "key_blocks": config.key_blocks,
        "concurrency_threshold": config.concurrency_threshold,
        "cache_tokens": "infinite" if math.isinf(cap) else cap,
        "bytes_per_token": config.bytes_per_token,
        "key_offset_bytes": config.key_offset_bytes,
        "block_tokens": config.block_tokens,
        "speed": speed,
        "seed": config.seed,
    }


def _miss_share(name: str):
    """A table cell: the uncached tokens of one cause (lab/misses.py) as a share of prompt tokens."""
    return lambda r: f"{r.misses.get(name, 0.0) / (sum(r.instance_prompt_tokens) or 1):.1%}"


def _banded_ms(q: int):
    """A TTFT percentile in ms, with its band from a sample (low–high) when the run was sampled."""
    def cell(r) -> str:
        seconds, sample = getattr(r, f"ttft_p{q}_s"), r.extra.get("sample")
        return ms_text(seconds, sample["bands"][f"ttft_p{q}_s"]) if sample else f"{seconds * 1000:,.0f}"
    return cell


def table(results) -> str:
    rows = [
        ("hit rate (tokens)", lambda r: share_text(r.hit_rate, r.extra["sample"]["hit_rate_band"])
         if "sample" in r.extra else f"{r.hit_rate:.1%}"),
        ("TTFT P50 (ms)", _banded_ms(50)),
        ("TTFT P90 (ms)", _banded_ms(90)),
        ("TTFT P99 (ms)", _banded_ms(99)),
        ("output tokens/s", lambda r: f"{r.throughput_tok_s:,.0f}"),
        ("max/mean requests", lambda r: f"{r.max_mean_requests:.2f}"),
        ("max/mean tokens", lambda r: f"{r.max_mean_tokens:.2f}"),
        *[(f"miss: {label}", _miss_share(name)) for name, label in
          (("last_block", "last block"), ("first_touch", "first touch"), ("rekeyed", "re-keyed"),
           ("routed_away", "routed away"), ("evicted", "evicted"))],
        ("spills", lambda r: f"{r.spills:,}"),
        ("timeouts", lambda r: f"{r.timeouts:,}"),
        (f"waited > {WAIT_S:g} s", lambda r: f"{r.waited_share:.1%}"),
        *([("copy-hours", lambda r: f"{r.copy_hours:,.2f}")] if any(r.autoscaling for r in results) else []),
    ]
    sampled = any("sample" in r.extra for r in results)
    if sampled:  # a figure without a band is not printed from a sample
        rows = [(label, cell if label.startswith(("hit rate", "TTFT")) else (lambda r: "—")) for label, cell in rows]
    names = [r.strategy if len(r.strategy) <= 14 else {"LEAST_OUTSTANDING_REQUESTS": "LEAST_OUTSTAND."}.get(r.strategy, r.strategy[:14]) for r in results]
    cells = [(label, [cell(r) for r in results]) for label, cell in rows]
    width = max(14, *(len(n) for n in names), *(len(c) for _, row in cells for c in row)) + 2
    lines = [f"{'':<20}" + "".join(f"{n:>{width}}" for n in names)]
    for label, row in cells:
        lines.append(f"{label:<20}" + "".join(f"{c:>{width}}" for c in row))
    if sampled:
        lines.append("—: not estimated from a sample (shares of the load, counts and throughput need every copy: "
                     "leave --sample out)")
    n_inst = len(results[0].instance_requests) if results else 0
    if n_inst <= 16 and not sampled:
        lines.append("request share per instance:")
        for r, name in zip(results, names):
            total = sum(r.instance_requests) or 1
            lines.append(f"  {name:<16}" + " ".join(f"{q / total:5.1%}" for q in r.instance_requests))
    return "\n".join(lines)
