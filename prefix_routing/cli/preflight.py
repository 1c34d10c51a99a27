"""``python -m prefix_routing preflight``: before the first ``cdk deploy``, settle what only the account can tell."""

from __future__ import annotations

from pathlib import Path

HELP = "before cdk deploy: check the account's quotas, bootstrap, model access, layer and AMI for a stage (read-only)"


def add_arguments(parser) -> None:
    parser.add_argument("--stage", default="default", metavar="NAME", help="the stage to check (config/NAME.toml)")
    parser.add_argument("--region", help="AWS region (default: the stage's, else your AWS configuration's)")
    parser.add_argument("--profile", help="AWS profile to use (default: boto3's usual credential chain)")
    parser.add_argument("--cdk-out", default="cdk.out", type=Path,
                        help="the synthesized app, for the bootstrap version its stacks need (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON (default: one line each)")


def run(args) -> int:
    from prefix_routing.cli.stages import load_stage_arg
    from prefix_routing.verify import exit_status, render_json, render_text
    from prefix_routing.verify.preflight import run_preflight

    config = load_stage_arg(args.stage)
    checks = run_preflight(config, profile=args.profile, region=args.region, manifest=args.cdk_out / "manifest.json")
    print(render_json(checks) if args.json else render_text(checks))
    return exit_status(checks)
