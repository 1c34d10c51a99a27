"""The routing advisor function in the observability stack: schedule, IAM, environment, asset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prefix_routing.advisor import AdvisorConfig
from prefix_routing.rules import telemetry
from prefix_routing.stage.config import load_stage
from tests.stacks.conftest import nag_report, stage_with, synth


def _advisor_function(template) -> dict:
    (function,) = [r for r in template.find_resources("AWS::Lambda::Function").values()
                   if r["Properties"]["Handler"] == "handler.handler"]
    return function


def _statements(template) -> list[dict]:
    policies = template.find_resources("AWS::IAM::Policy")
    (policy,) = [p for name, p in policies.items() if name.startswith("AdvisorRoleDefaultPolicy")]
    return policy["Properties"]["PolicyDocument"]["Statement"]


def test_the_function_runs_hourly_on_arm64_with_its_own_log_group(default_templates):
    template = default_templates["observability"]
    function = _advisor_function(template)["Properties"]
    assert (function["Runtime"], function["Architectures"], function["MemorySize"], function["Timeout"]) == \
        ("python3.14", ["arm64"], 1024, 300)
    assert function["ReservedConcurrentExecutions"] == 1
    (rule,) = template.find_resources("AWS::Events::Rule").values()
    assert rule["Properties"]["ScheduleExpression"] == "rate(1 hour)"  # advisor.schedule_minutes = 60
    groups = template.find_resources("AWS::Logs::LogGroup")
    (own,) = [g for name, g in groups.items() if name.startswith("AdvisorLogs")]
    assert own["Properties"]["RetentionInDays"] == 30


def test_iam_is_scoped_to_the_stages_own_resources(default_templates):
    statements = {tuple(s["Action"]) if isinstance(s["Action"], list) else (s["Action"],): s
                  for s in _statements(default_templates["observability"])}
    filter_logs = statements[("logs:FilterLogEvents",)]
    assert "Fn::ImportValue" in json.dumps(filter_logs["Resource"])  # the normalizer stack's log group, nothing else
    metrics = statements[("cloudwatch:PutMetricData",)]
    assert metrics["Resource"] == "*"
    assert metrics["Condition"] == {"StringEquals": {"cloudwatch:namespace": telemetry.NAMESPACE}}
    describe = statements[("sagemaker:DescribeInferenceComponent",)]
    assert f"inference-component/{load_stage().component_name}" in json.dumps(describe["Resource"])
    assert ("sns:Publish",) in statements
    # Reading the window's Requests count (which sets the log's sample rate): no resource type either.
    volume = statements[("cloudwatch:GetMetricStatistics",)]
    for actions, statement in statements.items():
        if statement not in (metrics, volume):  # the only wildcard resources: actions without a resource type
            assert statement["Resource"] != "*", actions
        # The only wildcard action: KMS data keys for the encrypted topic (acknowledged, with its reason).
        assert all("*" not in a or a == "kms:GenerateDataKey*" for a in actions), actions


def test_the_wildcards_are_acknowledged_with_their_reasons(default_stage):
    stacks, _ = default_stage
    report = nag_report(stacks)
    suppressed = [s for s in report.get("suppressedViolations", []) if "Advisor" in json.dumps(s)]
    reasons = json.dumps(suppressed)
    assert "cloudwatch:namespace" in reasons and "alarm topic" in reasons and "GetMetricStatistics" in reasons


def test_the_environment_is_what_the_function_reads(default_templates):
    env = _advisor_function(default_templates["observability"])["Properties"]["Environment"]["Variables"]
    plain = {k: ("token" if isinstance(v, dict) else v) for k, v in env.items()}
    config = AdvisorConfig.from_env(plain)
    stage = load_stage()
    assert (config.component_name, config.instance_type, config.prefix_length, config.concurrency_threshold,
            config.window_s, config.notify.after_runs) == (
        stage.component_name, stage.endpoint.instance_type, stage.routing.prefix_length,
        stage.routing.concurrency_threshold, 3600.0, 3)
    assert (env["SAMPLE"], config.sample) == ("auto", "auto")  # the default: the rate from the window's volume


def test_a_stage_s_sample_rate_reaches_the_function():
    _, templates = synth(stage_with(advisor={"sample": 0.05}))
    env = _advisor_function(templates["observability"])["Properties"]["Environment"]["Variables"]
    assert env["SAMPLE"] == "0.05"
    assert AdvisorConfig.from_env({k: ("token" if isinstance(v, dict) else v) for k, v in env.items()}).sample == 0.05


def test_advisor_off_means_no_function_no_rule():
    _, templates = synth(stage_with(advisor={"enabled": False}))
    template = templates["observability"]
    assert not template.find_resources("AWS::Events::Rule")
    assert not [r for r in template.find_resources("AWS::Lambda::Function").values()
                if r["Properties"].get("Handler") == "handler.handler"]


def test_the_asset_imports_without_numpy_matplotlib_or_pydantic(default_stage):
    stacks, _ = default_stage
    (asset,) = [p for p in Path(stacks.observability.node.root.outdir).glob("asset.*")
                if (p / "prefix_routing" / "advisor").is_dir()]
    assert (asset / "handler.py").is_file() and not (asset / "prefix_routing" / "frontdoor").exists()
    assert not (asset / "prefix_routing" / "stage" / "config.py").exists()
    check = ("import sys\nfor m in ('numpy', 'matplotlib', 'pydantic', 'tqdm'): sys.modules[m] = None\n"
             "import handler\nfrom prefix_routing.lab import advisor\nprint('ok')\n")
    done = subprocess.run([sys.executable, "-B", "-c", check], cwd=asset, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(asset), "AWS_DEFAULT_REGION": "us-east-1"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def _widgets(template) -> list[dict]:
    (dashboard,) = template.find_resources("AWS::CloudWatch::Dashboard").values()
    parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    return json.loads("".join(p if isinstance(p, str) else "token" for p in parts))["widgets"]


def test_the_dashboard_row_compares_measured_with_predicted_best_and_bound(default_templates):
    widgets = _widgets(default_templates["observability"])
    (chart,) = [w for w in widgets if w["properties"].get("title", "").startswith("Hit rate: measured vs")]
    rates = [m for m in chart["properties"]["metrics"] if not isinstance(m[0], dict)]  # the losses' math aside
    names = [m[1] for m in rates if m[-1].get("visible", True)]
    assert names == ["MeasuredHitRate", "PredictedHitRate", "BestPredictedHitRate", "HitRateBound"]
    assert all(m[-1]["period"] == 3600 and m[-1]["stat"] == "Maximum" for m in rates)
    (reuse,) = [w for w in widgets if w["properties"].get("title", "").startswith("Prefix reuse share")]
    assert reuse["properties"]["annotations"]["horizontal"][0]["value"] == 0.5
    assert reuse["properties"]["metrics"][0][1] == "PrefixReuseShare"
    (text,) = [w for w in widgets if w["type"] == "text" and "Routing advisor" in w["properties"]["markdown"]]
    assert chart["y"] == reuse["y"] == text["y"]  # one row
    _, templates = synth(stage_with(advisor={"enabled": False}))
    assert not [w for w in _widgets(templates["observability"]) if "advisor" in json.dumps(w).lower()]
