"""``python -m prefix_routing usage``: requests, tokens, refusals and the cache's savings per tenant."""

from __future__ import annotations

import sys
import time

from prefix_routing.cli.flag_values import ranged_int

HELP = "who used what: per tenant, requests, prompt/cached/completion tokens, refusals and prefill time saved"


def add_arguments(parser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--log-file", metavar="FILE", help="a saved request log (JSON lines, .gz ok)")
    source.add_argument("--log-group", metavar="NAME", help="the front door's CloudWatch log group, read with your "
                        "AWS credentials")
    parser.add_argument("--since", default="1h", metavar="AGE", help="--log-group: the window, e.g. 30m, 1h, 2d")
    parser.add_argument("--region", help="--log-group: AWS region (default: the stage's, or your AWS configuration's)")
    parser.add_argument("--stage", default="default", help="the stage whose instance and model price the prefill "
                        "time saved (the lab's engine model)")
    parser.add_argument("--csv", action="store_true", help="one CSV row per tenant (for chargeback) instead of a table")
    parser.add_argument("--top", type=ranged_int("--top", 1, 100_000), default=20,
                        help="tenants shown in the table (the rest summed in one row)")


def run(args) -> int:
    from prefix_routing.cli.advise import parse_age
    from prefix_routing.cli.stages import load_stage_arg
    from prefix_routing.lab import usage
    from prefix_routing.lab.latency import LatencyModel
    from prefix_routing.lab.stage_fleet import preset_for_stage
    from prefix_routing.rules.errors import UserError

    stage = load_stage_arg(args.stage)
    latency = LatencyModel.from_preset(preset_for_stage(stage))
    cut: list = []
    if args.log_file:
        try:
            report = usage.read_usage(usage.file_lines(args.log_file), latency)
        except OSError as error:
            raise UserError(f"--log-file {args.log_file}: {error.strerror or error}") from None
        except UserError as error:  # missing, a directory, unreadable: said by the lab's reader
            raise UserError(f"--log-file {args.log_file}: {error}") from None
    else:
        end = int(time.time() * 1000)
        start = end - int(parse_age(args.since) * 1000)
        report = usage.read_usage_from_cloudwatch(args.log_group, start, end, latency,
                                                  region=args.region or stage.region, cut=cut)
    print(usage.render_csv(report) if args.csv else usage.render_text(report, top=args.top), end="" if args.csv else "\n")
    if cut:
        print(f"read the first {usage.MAX_EVENTS:,} events only: the window was cut at epoch ms {cut[0]}", file=sys.stderr)
    return 0
