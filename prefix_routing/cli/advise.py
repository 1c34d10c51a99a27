"""``python -m prefix_routing advise --stage NAME``: the routing advisor on a window of the request log.

What the advisor function does every hour, with the caller's credentials (``--log-group``) or on a
saved request log (``--log-file``): replay the window through the stage's fleet at its current
routing settings and over the tune grid, compare, and print the settings to change to.
"""

from __future__ import annotations

import re
import time
from functools import partial

from prefix_routing.cli import flag_values, lab_args, trace_args
from prefix_routing.rules.errors import UserError

HELP = "the routing advisor: replay a window of the request log, compare the settings, print the snippet"


def add_arguments(parser) -> None:
    parser.add_argument("--stage", required=True, metavar="NAME", help="the deployed stage (config/NAME.toml, or default)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--log-file", metavar="FILE", help="a saved request log (JSON lines, .gz ok): offline")
    source.add_argument("--log-group", metavar="NAME", help="the normalizer's CloudWatch log group (default: the "
                        "RequestLogGroupName output of the stage's Normalizer stack)")
    parser.add_argument("--since", default="1h", metavar="AGE", help="--log-group: the window, e.g. 30m, 1h, 6h (default 1h)")
    parser.add_argument("--region", help="--log-group: AWS region (default: the stage's, or the usual chain)")
    parser.add_argument("--copies", type=flag_values.ranged_int("--copies", 1, 1024), metavar="N",
                        help="copies now (default: the stage's copies_max, the endpoint at its size)")
    trace_args.add_sample_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def parse_age(text: str) -> float:
    """Seconds of ``30m``, ``1h``, ``2d``, ``90s``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text or "")
    if not match or float(match.group(1)) <= 0:
        raise UserError(f"--since {text!r}: expected a positive age such as 30m, 1h or 2d")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


def run(args) -> int:
    from prefix_routing.cli.stages import load_stage_arg
    from prefix_routing.lab import advisor, traces
    from prefix_routing.lab.fleet_config import FleetConfig
    from prefix_routing.lab.stage_fleet import stage_fleet_values

    stage = load_stage_arg(args.stage)
    values = stage_fleet_values(stage)
    if args.copies is not None:  # copies now: fewer instances of the same packing
        per = values["copies"]
        values["instances"] = max(1, -(-args.copies // per))
    presampled = False
    if args.log_file:
        window = traces.read_request_log(args.log_file)
    else:
        from prefix_routing.advisor.function import request_log_group

        region = args.region or stage.region
        group = args.log_group or request_log_group(f"{stage.stack_prefix}-Normalizer", region=region)
        end = int(time.time() * 1000)
        read = partial(traces.read_cloudwatch, group, end - int(parse_age(args.since) * 1000), end, region=region)
        if isinstance(args.sample, float) and args.sample < 1.0:
            # A set rate: only the sample's lines cross the wire (the front door's buckets); a log
            # written before it logged them has none in the sample, and is read whole.
            try:
                window, presampled = read(sample_rate=args.sample), True
            except UserError:
                window = read()
        else:
            window = read()
    trace_args.report_skipped(window)
    config = FleetConfig(**values, block_tokens=window.block_tokens, block_bytes=window.block_bytes)
    rate = args.sample
    if rate == "auto":
        from prefix_routing.lab.sampling import auto_rate

        rate = auto_rate(len(window))
    advice = advisor.advise(window, config, min_threshold=stage.scaling.target_concurrent_requests_per_copy,
                            sample=1.0 if rate is None else rate, presampled=presampled)
    if args.json:
        lab_args.print_json(advice)
    else:
        print(advisor.render(advice))
    return 0
