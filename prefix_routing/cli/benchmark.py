"""``python -m prefix_routing benchmark --stage NAME --workload long-context|shared-prefix|FILE``: a
SageMaker AI benchmark job against the deployed stage, beside the lab's prediction for it.

The workload (the lab's generator, or a Mooncake trace FILE) is simulated first on the stage's fleet,
as ``simulate --stage NAME --strategy <the stage's>`` does (the job calls the endpoint directly, so
without the front door's replication or limits); then uploaded as a Mooncake trace, replayed by
AIPerf on AWS's side, and its results read back from S3 (prefix_routing/benchmark/).
"""

from __future__ import annotations

import math
import sys

from prefix_routing.cli import flag_values, lab_args, trace_args
from prefix_routing.rules.errors import UserError

HELP = ("after cdk deploy: run a SageMaker AI benchmark job (AIPerf on AWS's fleet; billed) against the stage's "
        "endpoint and print it beside the lab's prediction")

#: The lab's workloads this command takes by name; anything else is a Mooncake trace file.
WORKLOAD_NAMES = ("long-context", "shared-prefix")
TIMEOUT_RANGE_S = (60, 7 * 86400)
POLL_RANGE_S = (5, 600)
DEFAULT_POLL_S = 30
#: With no --timeout: the workload's own duration and this much more (the job's start-up and tail).
DEFAULT_TIMEOUT_MARGIN_S = 3600


def add_arguments(parser) -> None:
    parser.add_argument("--stage", required=True, metavar="NAME",
                        help="the deployed stage (config/NAME.toml, or default); its [benchmark] s3_uri must be set")
    parser.add_argument("--workload", required=True, metavar="long-context|shared-prefix|FILE",
                        help="the lab's long-context or shared-prefix workload, or a Mooncake-format trace file")
    parser.add_argument("--limit", type=flag_values.ranged_int("--limit", 1, 10**7), metavar="N",
                        help="send only the workload's first N requests (a shorter, cheaper job)")
    parser.add_argument("--seed", type=int, default=0, help="seed of a generated workload and of the lab (default 0)")
    parser.add_argument("--timeout", type=flag_values.ranged_int("--timeout", *TIMEOUT_RANGE_S), metavar="SECONDS",
                        help="stop the job and give up after this long (default: the workload's duration plus "
                        f"{DEFAULT_TIMEOUT_MARGIN_S // 60} minutes)")
    parser.add_argument("--poll", type=flag_values.ranged_int("--poll", *POLL_RANGE_S), default=DEFAULT_POLL_S,
                        metavar="SECONDS", help=f"seconds between status checks (default {DEFAULT_POLL_S})")
    parser.add_argument("--region", help="AWS region (default: the stage's, else your AWS configuration's)")
    parser.add_argument("--profile", help="AWS profile to use")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def simulate_args(args, stage):
    """``simulate``'s arguments for the same workload on the stage's fleet, at the stage's strategy."""
    import argparse
    import os

    from prefix_routing.cli import simulate

    if args.workload.startswith("cloudwatch:"):
        raise UserError(f"--workload {args.workload}: a benchmark replays a Mooncake trace file or a lab workload "
                        f"({', '.join(WORKLOAD_NAMES)}), not a CloudWatch log")
    if args.workload not in WORKLOAD_NAMES and not os.path.isfile(args.workload):
        raise UserError(f"--workload {args.workload}: no such file; allowed: {', '.join(WORKLOAD_NAMES)}, or a "
                        "Mooncake-format trace file")
    parser = argparse.ArgumentParser(add_help=False)
    simulate.add_arguments(parser)
    argv = ["--stage", stage.name, "--strategy", stage.routing.strategy, "--replication", "off", "--limits", "off",
            "--no-plots", "--seed", str(args.seed), *(["--limit", str(args.limit)] if args.limit else [])]
    argv += ["--workload", args.workload] if args.workload in WORKLOAD_NAMES else ["--format", "mooncake", "--",
                                                                                   args.workload]
    return parser.parse_args(argv)


def predict(args, stage):
    """(trace, predicted figures, what the lab modelled): the lab's simulation of the workload."""
    from prefix_routing import lab
    from prefix_routing.benchmark import predicted_figures
    from prefix_routing.lab.routing import Strategy

    sim = simulate_args(args, stage)
    trace, spec = trace_args.load_from_args(sim)
    strategy = Strategy.parse(stage.routing.strategy)
    config = lab_args.settle_autoscaling(sim, lab_args.fleet_config_from_args(sim, trace, spec), [strategy])
    (result,) = lab.simulate_many(trace, config, [strategy], progress=False)
    modelled = {"strategy": strategy.value, "fleet": lab_args.describe_fleet(config),
                "autoscaling": None if config.autoscaling is None else
                f"copies {config.autoscaling.min_copies} to {config.autoscaling.max_copies}",
                "replication": "off: the job calls the endpoint directly, not through the front door",
                "notes": list(result.notes)}
    return trace, predicted_figures(result), modelled


def _now():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def run(args) -> int:
    import time

    from prefix_routing.benchmark import check_stage, render_text, run_benchmark
    from prefix_routing.cli.stages import load_stage_arg

    stage = load_stage_arg(args.stage)
    check_stage(stage)
    trace, predicted, modelled = predict(args, stage)
    timeout = args.timeout if args.timeout is not None else math.ceil(trace.duration_s) + DEFAULT_TIMEOUT_MARGIN_S
    if trace.duration_s >= timeout:
        raise UserError(f"the workload lasts {trace.duration_s:,.0f} s and --timeout {timeout:g} would stop the job "
                        "before it has sent it: give a longer --timeout (the duration and some minutes of start-up), "
                        "or fewer requests (--limit)")
    clients = _clients(args, stage)

    def report(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    label = args.workload if args.workload in WORKLOAD_NAMES else "trace"
    try:
        result = run_benchmark(stage, trace, label, predicted, modelled, clients, now=_now(),
                               timeout_s=timeout, poll_s=args.poll, clock=time.monotonic, sleep=time.sleep,
                               report=report)
    except KeyboardInterrupt:
        report("interrupted: a job already created keeps running; its stop command is above")
        return 130
    if args.json:
        lab_args.print_json(result)
    else:
        print(render_text(result))
    return 0


def _clients(args, stage):
    from prefix_routing.benchmark import clients_for

    return clients_for(profile=args.profile, region=args.region or stage.region)
