"""The isolation canary ([canary]): its function and schedule in the normalizer stack, its role's exact
statements, its asset, and its two alarms per inference component in the observability stack; nothing
of it when the canary is off.

Expected values are the literals of the stage below or hand computations from them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prefix_routing.frontdoor.config import InvokeConfig
from prefix_routing.stage.config import load_stage, parse_stage
from prefix_routing.stage.loading import CONFIG_DIR
from stacks.constructs.isolation_canary import canary_environment
from tests.stacks.conftest import findings, nag_report, stage_with, synth
from tests.test_architecture import module_name, subpackage_of

ACME = "arn:aws:iam::111122223333:role/acme"
DOMAINS = {"shared": {"copies_min": 1, "copies_max": 2}, "acme": {"tenants": [ACME], "copies_min": 1, "copies_max": 1}}
SHARED, ACME_IC = "default-shared-ic", "default-acme-ic"  # "<stage>-<domain>-ic"
STACK = "PrefixRouting-default"


@pytest.fixture(scope="module")
def synthesized():
    # The default stage (vLLM: salts keep tenants apart) with two domains, per-tenant limits and a
    # canary every 30 minutes with 2,048-token prompts.
    return synth(stage_with(domains=DOMAINS, tenancy={"default_domain": "shared"},
                            limits={"requests_per_minute": 600},
                            canary={"enabled": True, "every_minutes": 30, "prompt_tokens": 2048}))


def _canary(template, kind: str, prefix: str = "Canary") -> dict:
    (found,) = [r["Properties"] for name, r in template.find_resources(kind).items() if name.startswith(prefix)]
    return found


def _plain(value):
    """A template value with ``Fn::Join`` of the partition, region and account written out."""
    if isinstance(value, dict) and set(value) == {"Fn::Join"}:
        return "".join(p if isinstance(p, str) else "${" + p["Ref"] + "}" for p in value["Fn::Join"][1])
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def test_the_function_runs_on_arm64_once_at_a_time_with_the_front_doors_settings(synthesized):
    normalizer = synthesized[1]["normalizer"]
    function = _canary(normalizer, "AWS::Lambda::Function")
    assert (function["Runtime"], function["Architectures"], function["Handler"], function["MemorySize"],
            function["Timeout"], function["ReservedConcurrentExecutions"]) == (
        "python3.14", ["arm64"], "handler.handler", 256, 300, 1)
    env = function["Environment"]["Variables"]
    (secret_id,) = normalizer.find_resources("AWS::SecretsManager::Secret")
    assert env["TENANT_KEY_SECRET_ARN"] == {"Ref": secret_id}  # the front door's key: where it is, never the key
    assert (env["CANARY_PROMPT_TOKENS"], env["CANARY_SALTED"]) == ("2048", "true")  # vLLM honours cache_salt
    assert "LIMITS" not in env and "LIMITS_TABLE" not in env and env["REPLICATION_STEERING"] == "false"
    config = InvokeConfig.from_env({k: v if isinstance(v, str) else "token" for k, v in env.items()})
    assert (config.endpoint_name, config.component_name) == ("default-prefix-llm", SHARED)
    assert list(config.domains.components) == [("shared", SHARED), ("acme", ACME_IC)]
    front_door = [f["Properties"]["Environment"]["Variables"] for f in
                  normalizer.find_resources("AWS::Lambda::Function").values() if f["Properties"]["Handler"] == "run.sh"]
    (front,) = front_door
    for name in ("PREFIX_LENGTH", "BLOCK_BYTES", "TENANCY", "DOMAINS", "ROUTING_STRATEGY"):
        assert env[name] == front[name], name  # the same normalization and components as the front door
    assert "LIMITS" in front  # the front door has the stage's limits; the canary's tenants have none


def test_the_schedule_runs_it_every_30_minutes_without_retries(synthesized):
    rule = _canary(synthesized[1]["normalizer"], "AWS::Events::Rule")
    assert rule["ScheduleExpression"] == "rate(30 minutes)"
    (target,) = rule["Targets"]
    assert target["RetryPolicy"] == {"MaximumRetryAttempts": 0}
    (function_id,) = [n for n in synthesized[1]["normalizer"].find_resources("AWS::Lambda::Function")
                      if n.startswith("CanaryFunction")]
    assert target["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]}


def test_the_role_may_write_its_log_invoke_the_endpoint_and_its_components_and_read_the_key_only(synthesized):
    normalizer = synthesized[1]["normalizer"]
    (log_id,) = [n for n in normalizer.find_resources("AWS::Logs::LogGroup") if n.startswith("CanaryLogs")]
    (secret_id,) = normalizer.find_resources("AWS::SecretsManager::Secret")
    statements = _canary(normalizer, "AWS::IAM::Policy", "CanaryRoleDefaultPolicy")["PolicyDocument"]["Statement"]
    arn = "arn:${AWS::Partition}:sagemaker:${AWS::Region}:${AWS::AccountId}:"
    assert [{**s, "Resource": _plain(s["Resource"])} for s in statements] == [
        {"Action": ["logs:CreateLogStream", "logs:PutLogEvents"], "Effect": "Allow",
         "Resource": {"Fn::GetAtt": [log_id, "Arn"]}},
        {"Action": "sagemaker:InvokeEndpoint", "Effect": "Allow",  # (CDK sorts a statement's resources)
         "Resource": [f"{arn}endpoint/default-prefix-llm", f"{arn}inference-component/{ACME_IC}",
                      f"{arn}inference-component/{SHARED}"]},
        {"Action": "secretsmanager:GetSecretValue", "Effect": "Allow", "Resource": {"Ref": secret_id}},
    ]
    (role,) = [r["Properties"] for n, r in normalizer.find_resources("AWS::IAM::Role").items() if n.startswith("CanaryRole")]
    assert "ManagedPolicyArns" not in role and "Policies" not in role  # no managed policy, no inline extras
    assert _canary(normalizer, "AWS::Lambda::Function")["LoggingConfig"] == {"LogGroup": {"Ref": log_id}}
    assert _canary(normalizer, "AWS::Logs::LogGroup")["RetentionInDays"] == 30  # normalizer.log_retention_days


def test_two_alarms_per_component_on_the_canary_metrics_to_the_alarm_topic(synthesized):
    observability = synthesized[1]["observability"]
    (topic_id,) = observability.find_resources("AWS::SNS::Topic")
    alarms = {a["Properties"]["AlarmName"]: a["Properties"]
              for a in observability.find_resources("AWS::CloudWatch::Alarm").values()
              if "canary" in str(a["Properties"].get("AlarmName", ""))}
    expected = {}
    for component in (SHARED, ACME_IC):
        expected[f"{component}-canary-isolation-breach"] = ("CanaryIsolationBreach", component, 1)
        expected[f"{component}-canary-cache-cold"] = ("CanaryCacheCold", component, 2)
    assert set(alarms) == set(expected)
    for name, (metric, component, runs) in expected.items():
        alarm = alarms[name]
        assert (alarm["MetricName"], alarm["Namespace"], alarm["Dimensions"]) == (
            metric, "PrefixRouting", [{"Name": "InferenceComponent", "Value": component}]), name
        assert (alarm["Statistic"], alarm["Period"], alarm["Threshold"], alarm["ComparisonOperator"]) == (
            "Maximum", 1800, 1, "GreaterThanOrEqualToThreshold"), name  # one period per run (30 minutes)
        assert (alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"], alarm["TreatMissingData"]) == (
            runs, runs, "notBreaching"), name
        assert alarm["AlarmActions"] == alarm["OKActions"] == [{"Ref": topic_id}], name
        assert component in alarm["AlarmDescription"] and "every 30 minutes" in alarm["AlarmDescription"]


def test_each_dashboard_shows_its_components_canary_alarms(synthesized):
    observability = synthesized[1]["observability"]
    alarm_ids = {a["Properties"].get("AlarmName"): name for name, a in
                 observability.find_resources("AWS::CloudWatch::Alarm").items()}
    dashboards = {d["Properties"]["DashboardName"]: json.dumps(d["Properties"]["DashboardBody"])
                  for d in observability.find_resources("AWS::CloudWatch::Dashboard").values()}
    for dashboard, component, other in (("default-prefix-llm-routing", SHARED, ACME_IC),
                                        ("default-prefix-llm-routing-acme", ACME_IC, SHARED)):
        for kind in ("isolation-breach", "cache-cold"):
            assert f'"{alarm_ids[f"{component}-canary-{kind}"]}"' in dashboards[dashboard], (dashboard, kind)
            assert f'"{alarm_ids[f"{other}-canary-{kind}"]}"' not in dashboards[dashboard], (dashboard, kind)


def test_cdk_nag_is_clean_without_acknowledgements(synthesized):
    stacks, _ = synthesized
    report = nag_report(stacks)
    assert report["conclusion"] == "success" and report["violations"] == [], findings(report["violations"])
    # The canary needs no acknowledgement (no wildcard); the stage's others each carry a reason.
    suppressed = report["suppressedViolations"]
    assert not [f for f in findings(suppressed) if "/Canary" in f[1]], findings(suppressed)
    assert all(entry["reason"].strip() for entry in suppressed)


def test_canary_off_means_no_function_no_rule_no_alarms(default_templates):
    normalizer, observability = default_templates["normalizer"], default_templates["observability"]
    assert not [n for n in normalizer.to_json()["Resources"] if n.startswith("Canary")]
    assert not normalizer.find_resources("AWS::Events::Rule")
    names = [a["Properties"].get("AlarmName", "") for a in observability.find_resources("AWS::CloudWatch::Alarm").values()]
    assert not [n for n in names if "canary" in str(n)]


def test_a_vllm_stage_counts_on_salts_and_an_lmi_stage_cannot_run_the_canary():
    import tomllib

    from prefix_routing.stage.config import ConfigError

    env = canary_environment(load_stage("multi-tenant"), "arn:aws:secretsmanager:us-east-1:111122223333:secret:k")
    assert (env["CANARY_SALTED"], env["CANARY_PROMPT_TOKENS"]) == ("true", "1024")  # vLLM keeps salted blocks apart
    data = tomllib.loads((CONFIG_DIR / "trust-domains.toml").read_text())
    with pytest.raises(ConfigError, match="reports no cached tokens"):  # LMI: the canary could not see the cache
        parse_stage({**data, "canary": {"enabled": True}}, source="test")


def test_the_shipped_multi_tenant_stage_runs_the_canary_hourly():
    stage = load_stage("multi-tenant")
    assert (stage.canary.enabled, stage.canary.every_minutes, stage.model.framework) == (True, 60, "vllm")
    env = canary_environment(stage, "arn")
    assert "LIMITS" not in env and stage.limits.enabled  # the stage's limits are the front door's only
    assert InvokeConfig.from_env(env).limits.enabled is False


def _asset(stacks) -> Path:
    (asset,) = [p for p in Path(stacks.normalizer.node.root.outdir).glob("asset.*")
                if (p / "prefix_routing" / "canary").is_dir()]
    return asset


def test_the_asset_holds_the_rules_the_front_door_and_the_canary_only(synthesized):
    asset = _asset(synthesized[0])
    contents = {p.relative_to(asset).as_posix() for p in asset.rglob("*.py")}
    assert "handler.py" in contents and "prefix_routing/canary/probe.py" in contents
    assert "prefix_routing/frontdoor/config.py" in contents and "prefix_routing/rules/identity.py" in contents
    library = {c for c in contents if c.startswith("prefix_routing/")}
    assert {subpackage_of(module_name(Path(c))) for c in library} == {"rules", "frontdoor", "canary", "package"}
    for subpackage in ("lab", "emulator", "stage", "loadtest", "cli", "advisor", "verify"):
        assert not any(c.startswith(f"prefix_routing/{subpackage}/") for c in contents), subpackage
    assert not (asset / "aws_lambda_powertools").exists() and not (asset / "run.sh").exists()
    assert not list(asset.rglob("*.pyc"))  # no bytecode of this machine's Python


_ISOLATED = """
import json, sys
sys.path.insert(0, sys.argv[1])
for name in ("pydantic", "numpy", "aws_lambda_powertools"): sys.modules[name] = None
import botocore, handler
from botocore.session import get_session
members = sorted(get_session().get_service_model("sagemaker-runtime").operation_model("InvokeEndpoint").input_shape.members)
print(json.dumps({"botocore": botocore.__file__, "handler": handler.__file__, "members": members}))
"""


def test_the_asset_imports_alone_with_an_sdk_that_knows_prefix_aware_id(synthesized):
    asset = _asset(synthesized[0])
    # -I -S: no PYTHONPATH, no site-packages; only the asset and the standard library answer an import.
    done = subprocess.run([sys.executable, "-I", "-S", "-B", "-c", _ISOLATED, str(asset)], capture_output=True,
                          text=True, timeout=120, cwd=asset, env={"AWS_DEFAULT_REGION": "us-east-1"})
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert all(Path(found[m]).resolve().is_relative_to(asset.resolve()) for m in ("botocore", "handler"))
    assert {"PrefixAwareId", "InferenceComponentName"} <= set(found["members"])
