"""Per-tenant limits in the stacks: the table, the function's access to it (only its own table, only the
actions the limiter makes), the settings in its environment, the alarm, the widget and the ranking of
throttled tenants. Without limits, none of it."""

import json

import pytest

from prefix_routing.frontdoor.config import InvokeConfig
from tests.stacks.conftest import stage_with, synth

LIMITS = {"concurrent_streams": 4, "requests_per_minute": 600,
          "tenants": {"arn:aws:iam::111122223333:role/Batch*": {"concurrent_streams": 1}}}


@pytest.fixture(scope="module")
def limited():
    return synth(stage_with(limits=LIMITS))[1]


def _joined(value) -> str:
    """A template string, with the tokens in an Fn::Join (the log group's name) as a placeholder."""
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(p if isinstance(p, str) else "TOKEN" for p in parts)
    return value


def _function(template):
    (function,) = [f["Properties"] for f in template.find_resources("AWS::Lambda::Function").values()
                   if f["Properties"]["Handler"] == "run.sh"]
    return function


def test_the_table_is_on_demand_with_ttl_encrypted_and_its_counts_not_backed_up(limited):
    (table_id, table), = limited["normalizer"].find_resources("AWS::DynamoDB::Table").items()
    props = table["Properties"]
    assert props["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert props["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert props["SSESpecification"] == {"SSEEnabled": True}
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": False}
    assert table["DeletionPolicy"] == "Delete"


def test_the_function_may_get_put_and_update_items_of_that_table_only(limited):
    template = limited["normalizer"]
    (table_id,) = template.find_resources("AWS::DynamoDB::Table")
    statements = [s for p in template.find_resources("AWS::IAM::Policy").values()
                  for s in p["Properties"]["PolicyDocument"]["Statement"]
                  if any(a.startswith("dynamodb:") for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]]))]
    assert len(statements) == 1
    assert sorted(statements[0]["Action"]) == ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"]
    assert statements[0]["Resource"] == {"Fn::GetAtt": [table_id, "Arn"]}


def test_the_function_reads_the_stages_limits_and_table(limited):
    variables = _function(limited["normalizer"])["Environment"]["Variables"]
    (table_id,) = limited["normalizer"].find_resources("AWS::DynamoDB::Table")
    assert variables["LIMITS_TABLE"] == {"Ref": table_id}
    config = InvokeConfig.from_env({k: v if isinstance(v, str) else "table" for k, v in variables.items()})
    assert config.limits.default.concurrent_streams == 4 and config.limits.default.requests_per_minute == 600
    rule, batch = config.limits.for_tenant("arn:aws:iam::111122223333:role/BatchJobs")
    assert (rule, batch.concurrent_streams, batch.requests_per_minute) == ("arn:aws:iam::111122223333:role/Batch*", 1, 600)
    assert config.limits.lease_s == 30  # not the function's timeout: renewed while streaming, a dead one frees in 30 s
    assert config.limits.default_max_tokens == 1024
    assert len(json.dumps(variables)) < 4096  # Lambda's limit on the environment


def test_an_alarm_a_widget_and_a_ranking_of_throttled_tenants(limited):
    template = limited["observability"]
    alarms = [a["Properties"] for a in template.find_resources("AWS::CloudWatch::Alarm").values()]
    names = [m["MetricStat"]["Metric"]["MetricName"] for a in alarms for m in a.get("Metrics", []) if "MetricStat" in m]
    assert "LimiterStoreErrors" in names
    dashboard = json.dumps(template.find_resources("AWS::CloudWatch::Dashboard"))
    assert "ThrottledRequests" in dashboard and "LimiterTime" in dashboard
    bodies = [_joined(r["Properties"]["RuleBody"]) for r in template.find_resources("AWS::CloudWatch::InsightRule").values()]
    rules = [json.loads(body) for body in bodies if "throttled_by" in body]
    (rule,) = rules
    assert rule["Contribution"]["Keys"] == ["$.tenant"]
    assert {"Match": "$.throttled_by", "In": ["requests_per_minute", "tokens_per_minute", "concurrent_streams"]} in \
        rule["Contribution"]["Filters"]


def test_without_limits_there_is_no_table_and_no_limits_setting(default_templates):
    assert not default_templates["normalizer"].find_resources("AWS::DynamoDB::Table")
    variables = _function(default_templates["normalizer"])["Environment"]["Variables"]
    assert "LIMITS" not in variables and "LIMITS_TABLE" not in variables
    assert "LimiterStoreErrors" not in json.dumps(default_templates["observability"].to_json())
