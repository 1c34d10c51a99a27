"""The lab commands' trace flags: where the requests come from (a file, CloudWatch, a generated
workload), how they are read and keyed, and ``--sample``."""

from __future__ import annotations

import sys
from pathlib import Path

from prefix_routing.cli.flag_values import load_step, positive_float, ranged_int, sample_rate, time_ms
from prefix_routing.lab.trace_data import Trace
from prefix_routing.lab.workloads import WORKLOADS, LongContextSpec
from prefix_routing.rules.errors import UserError


def add_trace_arguments(parser) -> None:
    parser.add_argument(
        "trace", nargs="?", metavar="TRACE",
        help="a trace file (Mooncake JSONL, the normalizer's request log, or raw request bodies; .gz ok), "
        "or cloudwatch:LOG_GROUP to read the normalizer's log from CloudWatch Logs",
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), help="generate a workload instead of reading TRACE")
    parser.add_argument("--format", default="auto", choices=("auto", "mooncake", "log", "bodies"), help="trace format (default: from the first line)")
    parser.add_argument("--strict", action="store_true", help="fail on the first broken line instead of skipping it")
    parser.add_argument("--limit", type=ranged_int("--limit", 1, 10**9), help="use only the first N requests")
    parser.add_argument("--start", help="cloudwatch: start time (ISO 8601 or epoch ms; default: 1 hour before --end)")
    parser.add_argument("--end", help="cloudwatch: end time (ISO 8601 or epoch ms; default: now)")
    parser.add_argument("--region", help="cloudwatch: AWS region")
    parser.add_argument("--body-rate", type=positive_float("--body-rate"), default=1.0, help="raw bodies: arrivals per second (bodies carry no times; default 1)")
    parser.add_argument("--body-block-bytes", type=ranged_int("--body-block-bytes", 16, 65536), help="raw bodies: bytes per hashed block (default: the normalizer's)")
    parser.add_argument("--bytes-per-token", type=positive_float("--bytes-per-token"), default=4.0, metavar="R", help="bytes of body per prompt token (default 4)")
    parser.add_argument("--key-offset-bytes", type=ranged_int("--key-offset-bytes", 0, 65536), default=0, metavar="B", help="JSON bytes before the prompt in the normalized body (default 0; invoke path only)")
    parser.add_argument("--api", choices=("invoke", "openai"), default="invoke",
                        help="the path the clients call: invoke (PrefixLength counts body bytes, JSON included) or "
                        "openai (it counts characters of the messages' text; --bytes-per-token then means characters)")
    parser.add_argument("--load-step", metavar="T:F", help="--workload long-context: the arrival rate × F from T seconds on (e.g. 1800:3)")
    parser.add_argument("--zipf", type=float, metavar="S", help="--workload long-context: prefix popularity ∝ 1/rank^S (default 0: uniform)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (routing, generated workloads; default 0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def load_from_args(args) -> tuple[Trace, "LongContextSpec | None"]:
    """The trace the command works on: read (any format, or CloudWatch) or generated."""
    import time

    from prefix_routing.lab import traces

    spec = None
    tenants = getattr(args, "tenants", None)
    if args.workload:
        if args.trace:
            raise UserError("give either TRACE or --workload, not both")
        spec_cls, generate = WORKLOADS[args.workload]
        options = {} if args.zipf is None else {"zipf": args.zipf}
        if args.load_step:
            options["load_step"] = load_step(args.load_step)
        if options and spec_cls is not LongContextSpec:
            raise UserError(f"{'--zipf' if args.zipf is not None else '--load-step'} shapes the long-context workload, "
                            f"not {args.workload}")
        if tenants is not None and "tenants" in spec_cls.__dataclass_fields__:
            options["tenants"], tenants = tenants, None  # the workload's own tenants
        spec = spec_cls(**options)
        trace = generate(spec, seed=args.seed)
    elif args.zipf is not None or args.load_step:
        raise UserError(f"{'--zipf' if args.zipf is not None else '--load-step'} shapes a generated workload: "
                        "give it with --workload long-context")
    elif not args.trace:
        raise UserError("no trace: give a TRACE file (or cloudwatch:LOG_GROUP), or --workload long-context")
    elif args.trace.startswith("cloudwatch:"):
        group = args.trace.split(":", 1)[1]
        if not group:
            raise UserError("cloudwatch: needs a log group name, e.g. cloudwatch:/aws/lambda/normalizer")
        end = time_ms(args.end, int(time.time() * 1000))
        start = time_ms(args.start, end - 3600_000)
        if start >= end:
            raise UserError(f"--start must be before --end ({start} >= {end})")
        trace = traces.read_cloudwatch(group, start, end, region=args.region, strict=args.strict, bytes_per_token=args.bytes_per_token)
    else:
        args.trace = trace_or_slice(args.trace)
        body_options = {"rate": args.body_rate, "block_bytes": args.body_block_bytes}
        if getattr(args, "prefix_length", None) and isinstance(args.prefix_length, int):
            body_options["prefix_length"] = args.prefix_length
        trace = traces.load_trace(args.trace, args.format, strict=args.strict, bytes_per_token=args.bytes_per_token, **body_options)
    if args.limit:
        trace = trace.head(args.limit)
    if tenants is not None:
        from prefix_routing.lab.tenants import with_tenants

        trace = with_tenants(trace, tenants)
    report_skipped(trace)
    return trace, spec


#: The Mooncake conversation trace's name, and its first 1,000 requests kept in the clone (tests/data/README.md).
CONVERSATION_TRACE_NAME = "conversation_trace.jsonl"
CONVERSATION_SLICE = Path(__file__).resolve().parents[2] / "tests" / "data" / "mooncake_slice.jsonl"


def trace_or_slice(path: str) -> str:
    """``path``, or, where it names the Mooncake conversation trace and no file is there, the slice of it
    kept in the clone (said on stderr): the commands the documentation shows run without the trace."""
    if Path(path).name != CONVERSATION_TRACE_NAME or Path(path).exists() or not CONVERSATION_SLICE.is_file():
        return path
    print(f"{path} is absent (the Mooncake conversation trace, Apache-2.0: github.com/kvcache-ai/Mooncake, "
          f"FAST25-release/traces/): reading its first 1,000 requests, {CONVERSATION_SLICE}, instead", file=sys.stderr)
    return str(CONVERSATION_SLICE)


def report_skipped(trace: Trace) -> None:
    """Broken lines (with their line numbers) and the summary, on stderr."""
    skipped = trace.skipped
    for example in skipped.examples:
        print(f"warning: {example}", file=sys.stderr)
    if skipped.count > len(skipped.examples):
        print(f"warning: ... and {skipped.count - len(skipped.examples):,} more", file=sys.stderr)
    summary = skipped.summary(trace.lines)
    if summary:
        print(f"{trace.source}: {summary}", file=sys.stderr)
    for note in trace.notes:
        print(f"{trace.source}: {note}", file=sys.stderr)


def key_offset_bytes(args) -> int:
    """Bytes of the routing key that are not prompt text: the JSON before the prompt on the invoke
    path; none on the OpenAI-compatible path, whose PrefixLength counts message text only."""
    if getattr(args, "api", "invoke") == "openai":
        if args.key_offset_bytes:
            raise UserError(f"--key-offset-bytes {args.key_offset_bytes}: the OpenAI-compatible path counts the "
                            "messages' text only; leave it out with --api openai")
        return 0
    return args.key_offset_bytes


def add_sample_argument(parser) -> None:
    parser.add_argument("--sample", type=sample_rate, metavar="R|auto",
                        help="simulate a sample of the routing keys (PrefixAwareId and first PrefixLength bytes) at rate R "
                        "(0.0001-1, or 10%%) on R of the instances (a miniature simulation); auto: about 200,000 requests; "
                        "each figure comes with its 95%% band, and a sample whose error is not bounded (too few "
                        "instances or keys) runs the whole trace and says why")


def sampled(args, trace, config, *, strategies=None, users=None, limits=None, domains=None):
    """(the trace to simulate, its ``lab.sampling.SamplePlan``, the whole trace's requests) for
    ``--sample`` with ``strategies``: the sample of the routing keys, or the whole trace where the
    plan runs it."""
    from prefix_routing.lab import sampling

    requested = getattr(args, "sample", None)
    if requested is None:
        return trace, sampling.SamplePlan(1.0, 1.0), len(trace)
    rate = sampling.auto_rate(len(trace)) if requested == "auto" else requested
    if rate >= 1.0:
        return trace, sampling.SamplePlan(rate, 1.0), len(trace)
    sampling.check_sampling(config, users=users, limits=limits, domains=domains)
    chosen = sampling.plan(trace, config, rate, strategies)
    if chosen.rate >= 1.0:
        return trace, chosen, len(trace)
    return sampling.sample(trace, rate, config.key_blocks), chosen, len(trace)


