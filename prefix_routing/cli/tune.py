"""``python -m prefix_routing tune TRACE``: sweep PrefixLength × ConcurrencyThreshold and recommend."""

from __future__ import annotations

import sys

from prefix_routing import lab
from prefix_routing.cli import flag_values, lab_args, tenant_args, trace_args
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.sample_bands import ms_text, share_text
from prefix_routing.lab.simulate import check_autoscaling
from prefix_routing.rules.errors import UserError

HELP = "tune PrefixLength and ConcurrencyThreshold on a trace: frontier, recommendation, config snippet"


def add_arguments(parser) -> None:
    trace_args.add_trace_arguments(parser)
    lab_args.add_fleet_arguments(parser, grid=True)
    tenant_args.add_tenant_arguments(parser)
    parser.add_argument(
        "--max-imbalance", type=flag_values.positive_float("--max-imbalance"), default=1.2, metavar="X",
        help="largest acceptable max/mean requests per instance (default 1.2)",
    )
    trace_args.add_sample_argument(parser)


def run(args) -> int:
    if args.preset == "list":
        print(lab_args.presets_table())
        return 0
    lab_args.fleet_config_from_args(args, None, None)  # bad flags fail before a long read
    limits = tenant_args.limits_from_args(args)
    trace, spec = trace_args.load_from_args(args)
    config = lab_args.fleet_config_from_args(args, trace, spec)
    strategies = list(dict.fromkeys(args.strategy or (Strategy.RANDOM, Strategy.LEAST_OUTSTANDING_REQUESTS, Strategy.PREFIX_AWARE)))
    baselines = [s for s in strategies if s is not Strategy.PREFIX_AWARE]
    config = lab_args.settle_autoscaling(args, config, [Strategy.PREFIX_AWARE])
    check_autoscaling(config, [Strategy.PREFIX_AWARE])  # the grid is PREFIX_AWARE's
    replications = replication_sweep(args)
    if getattr(args, "sample", None) is not None and any(replications):
        raise UserError("--sample: a sampled run does not model hot-prefix replication (its shares count requests, "
                        "which a sample thins); leave --sample out")
    # Sampled by the keys of the fleet's own PrefixLength (the first given, or the default). The grid
    # runs on PREFIX_AWARE's miniature (whole copies); the baselines, which spread a key over every
    # copy, on theirs (every copy, each cache × R, the clock × 1/R): lab/sampling.py.
    trace, sample_plan, whole = trace_args.sampled(args, trace, config, strategies=[Strategy.PREFIX_AWARE, *baselines],
                                                   limits=limits)
    rate, speed, baseline_fleet, fleet = sample_plan.rate, getattr(args, "speed", 1.0), None, config
    if rate < 1.0:
        from prefix_routing.lab.sampling import grid_miniatures

        fleet, speed, baseline_fleet = grid_miniatures(config, rate, speed)
    result = lab.tune(
        trace,
        fleet,
        prefix_lengths=args.prefix_length or lab.CANDIDATE_PREFIX_LENGTHS,
        thresholds=args.concurrency_threshold or lab.CANDIDATE_THRESHOLDS,
        baselines=baselines,
        max_imbalance=args.max_imbalance,
        speed=speed,
        progress=args.progress,
        replications=replications,
        limits=limits,
        baseline_fleet=baseline_fleet,
        sample_rate=rate,
    )
    if rate < 1.0:
        result["sample"] = {"rate": rate, "requests": len(trace), "of_requests": whole,
                            "keyed_on_prefix_length": config.prefix_length, "instances": fleet.instances}
    elif sample_plan.reason:
        result["sample"] = {"rate": 1.0, "asked": sample_plan.asked, "note": sample_plan.note()}
    out = lab_args.plot_dir(args, "tune")
    result["plots"] = [str(p) for p in lab.plot_tune(result, out)] if out else []
    result["fleet"] = lab_args.settings_dict(args, config)
    result["warnings"] = lab_args.trace_warnings(fleet, trace) + recommendation_warnings(result, fleet)
    if args.json:
        lab_args.print_json(result)
        return 0
    print(render(result, config, lab_args.settings_lines(args, config, [Strategy.PREFIX_AWARE, *baselines], trace)))
    if result["plots"]:
        print("\nplots: " + ", ".join(result["plots"]), file=sys.stderr)
    return 0


def _hit(point: dict) -> str:
    """A point's hit rate, with its band when it was simulated on a sample."""
    bands = point.get("bands")
    return share_text(point["hit_rate"], bands["hit_rate"]) if bands else f"{point['hit_rate']:.1%}"


def _ms(point: dict, q: int) -> str:
    """A point's TTFT percentile in ms, with its band (low–high) when it was simulated on a sample."""
    seconds, bands = point[f"ttft_p{q}_s"], point.get("bands")
    return ms_text(seconds, bands[f"ttft_p{q}_s"]) if bands else f"{seconds * 1000:,.0f}"


SWEPT_SHARE_FACTORS = (0.1, 0.25, 0.5, 1.0, 2.0)


def replication_sweep(args) -> list:
    """Replication on (--replication on, or the stage's): off and a few target share factors (or
    the one given), on the other settings given; else off only."""
    from dataclasses import replace

    settings = lab_args.replication_from_args(args)  # the flags' own checks
    if settings is None:
        return [None]
    factors = [settings.target_share_factor] if args.replication_target_share else SWEPT_SHARE_FACTORS
    return [None] + [replace(settings, target_share_factor=f) for f in factors]


def recommendation_warnings(result: dict, config) -> list[str]:
    """The recommended setting's overload, if the modelled fleet does not keep up even there."""
    from prefix_routing.lab.overload import overload_text

    rec = result["recommendation"]
    text = overload_text(rec["waited_share"], rec["timeouts"], result["requests"], config.timeout_s)
    return [f"at the recommended setting, {text}"] if text else []


def render(result: dict, config, settings: list[str] = ()) -> str:
    sample = result.get("sample") or {}
    sampled = sample.get("rate", 1.0) < 1.0
    if sampled:
        sample_line = [f"sample: the routing keys of PrefixLength {sample['keyed_on_prefix_length']} at rate "
                       f"{sample['rate']:g} ({sample['requests']:,} of {sample['of_requests']:,} requests) on "
                       f"{sample['instances']:,} instances; each figure with its 95 % band; settings keyed on fewer "
                       "bytes read somewhat high"]
    else:
        sample_line = [f"sample: {sample['note']}"] if sample.get("note") else []
    lines = [
        f"trace: {result['source']}: {result['requests']:,} requests",
        *sample_line,
        f"fleet: {lab_args.describe_fleet(config)}",
        *settings,
        *(f"warning: {w}" for w in result.get("warnings", [])),
        "",
    ]
    widths = (10, 9, 9) if not sampled else (15, 17, 17)
    lines.append(f"{'strategy':<28}{'PrefixLength':>13}{'threshold':>10}{'replicas':>9}{'hit rate':>{widths[0]}}"
                 f"{'P50 ms':>{widths[1]}}{'P90 ms':>{widths[2]}}{'max/mean':>9}{'spills':>8}")

    def row(p):
        pl = f"{p['prefix_length']:,}" if p["prefix_length"] else "-"
        th = str(p["concurrency_threshold"]) if p["concurrency_threshold"] else "-"
        rep = f"×{p['replication']:g}" if p.get("replication") else "off"  # the target share factor
        imbalance, spills = ("—", "—") if sampled else (f"{p['max_mean_requests']:.2f}", f"{p['spills']:,}")
        return (
            f"{p['strategy']:<28}{pl:>13}{th:>10}{rep:>9}{_hit(p):>{widths[0]}}{_ms(p, 50):>{widths[1]}}"
            f"{_ms(p, 90):>{widths[2]}}{imbalance:>9}{spills:>8}"
        )

    for p in result["baselines"]:
        lines.append(row(p))
    lines.append("frontier (hit rate and P50 TTFT against imbalance; PREFIX_AWARE):")
    for p in result["frontier"]:
        lines.append(row(p))
    rec = result["recommendation"]
    lines += [
        "",
        f"recommended: PrefixLength {rec['prefix_length']} (≈ {rec['key_blocks']} blocks), ConcurrencyThreshold "
        f"{rec['concurrency_threshold']}, replication "
        f"{'off' if rec['replication'] is None else 'above ' + format(rec['replication'], 'g') + ' fair shares'}: "
        f"hit rate {_hit(rec)}, P50 TTFT {_ms(rec, 50)} ms"
        + (f" (best hit rate found {result['best_hit_rate']:.1%}), max/mean {rec['max_mean_requests']:.2f} (bound "
           f"{result['max_imbalance']})" if not sampled else ""),
    ]
    if sampled:
        lines.append("—: not estimated from a sample (the load's shares and counts need every copy: leave --sample out)")
    if result["note"]:
        lines.append(f"note: {result['note']}")
    dominant = (result.get("tenants") or {}).get("dominant")
    if dominant:
        lines.append(f"warning: {dominant['text']}")
    verdict = result.get("verdict")
    if verdict:
        lines += ["", f"verdict: {verdict['text']}", f"  ({verdict['criterion']})"]
    lines += ["", "for the stage file (config/<stage>.toml):", result["snippet"].rstrip()]
    return "\n".join(lines)
