"""``python -m prefix_routing verify``: check a live deployment of a stage against its stage file."""

from __future__ import annotations

HELP = "after cdk deploy: check the live endpoint, alarms, metrics and normalizer of a stage (read-only)"


def add_arguments(parser) -> None:
    parser.add_argument("--stage", default="default", help="the stage file under config/ (default: the embedded default)")
    parser.add_argument("--region", help="AWS region (default: the stage's, else your AWS configuration's)")
    parser.add_argument("--profile", help="AWS profile to use")
    parser.add_argument("--invoke", action="store_true",
                        help="also send two signed requests through the Function URL (the only calls that are not reads)")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")


def run(args) -> int:
    from prefix_routing.cli.stages import load_stage_arg
    from prefix_routing.verify import exit_status, render_json, render_text, run_verify

    config = load_stage_arg(args.stage)
    checks = run_verify(config, profile=args.profile, region=args.region, invoke=args.invoke)
    print(render_json(checks) if args.json else render_text(checks))
    return exit_status(checks)
