#!/usr/bin/env python3
"""The CDK app. ``cdk synth -c stage=NAME`` picks ``config/NAME.toml``; no stage: the embedded default."""

from __future__ import annotations

import sys

from aws_cdk import App

from prefix_routing.stage.config import DEFAULT_STAGE, ConfigError, load_stage
from stacks.app_builder import add_security_checks, build_stage


def main() -> int:
    app = App()
    stage = app.node.try_get_context("stage") or DEFAULT_STAGE
    try:
        config = load_stage(str(stage))  # validated once, before any construct exists
    except ConfigError as error:
        print(f"configuration error (stage {stage!r}):\n{error}", file=sys.stderr)
        return 2
    for warning in config.warnings:
        print(f"warning: stage {config.name!r}: {warning}", file=sys.stderr)
    build_stage(app, config)
    add_security_checks(app)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
