"""Synthesizes stages in-process with the app's own context (cdk.json) and security checks."""

import json
from pathlib import Path

import pytest
from aws_cdk import App
from aws_cdk.assertions import Template

from prefix_routing.stage.config import DEFAULT_STAGE_DATA, load_stage, parse_stage
from stacks.app_builder import add_security_checks, build_stage

ROOT = Path(__file__).resolve().parents[2]
CDK_CONTEXT = json.loads((ROOT / "cdk.json").read_text())["context"]


def synth(config):
    """(stacks, {name: Template}) for a stage config; cdk-nag runs, as in app.py."""
    app = App(context=CDK_CONTEXT)
    stacks = build_stage(app, config)
    add_security_checks(app)
    app.synth()
    return stacks, {
        "endpoint": Template.from_stack(stacks.endpoint),
        "normalizer": Template.from_stack(stacks.normalizer),
        "observability": Template.from_stack(stacks.observability),
    }


def validation_report(app_or_stacks):
    """The validation report the checks wrote to the cloud assembly (``validation-report.json``).

    Takes the App, or ``synth``'s stacks; also readable after a synth that failed the checks.
    """
    root = getattr(app_or_stacks, "endpoint", app_or_stacks).node.root
    return json.loads((Path(root.outdir) / "validation-report.json").read_text())


def nag_report(app_or_stacks):
    """The AwsSolutions plugin's part of the validation report (exactly one)."""
    reports = [r for r in validation_report(app_or_stacks)["pluginReports"] if r["pluginName"] == "AwsSolutions"]
    assert len(reports) == 1, reports
    return reports[0]


def findings(entries):
    """{(rule, construct path)} of a report's ``violations`` or ``suppressedViolations``."""
    return {(entry["ruleName"], c["constructPath"]) for entry in entries for c in entry["violatingConstructs"]}


def stage_with(**sections):
    """The default stage with some sections' fields replaced."""
    data = json.loads(json.dumps(DEFAULT_STAGE_DATA))
    for section, fields in sections.items():
        if isinstance(fields, dict):
            data.setdefault(section, {}).update(fields)
        else:
            data[section] = fields
    return parse_stage(data, source="test")


@pytest.fixture(scope="session")
def default_stage():
    return synth(load_stage())


@pytest.fixture(scope="session")
def default_templates(default_stage):
    return default_stage[1]
