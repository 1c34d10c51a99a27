"""Replica steering in the stacks: with replication and its steering on, the front door's table exists
(the limits' table: one table for both), the function may get, put and update its items, and its
environment names it; without steering (or replication), nothing of it. cdk-nag runs in synth."""

import json

import pytest

from prefix_routing.frontdoor.config import InvokeConfig
from tests.stacks.conftest import nag_report, stage_with, synth
from tests.stacks.test_limits_table import LIMITS, _function

REPLICATION = {"replication": {"enabled": True}}  # steering: true by default


@pytest.fixture(scope="module")
def steering():
    return synth(stage_with(normalizer=REPLICATION))


@pytest.fixture(scope="module")
def steering_and_limits():
    return synth(stage_with(normalizer=REPLICATION, limits=LIMITS))[1]


def _dynamodb_statements(template):
    return [s for p in template.find_resources("AWS::IAM::Policy").values()
            for s in p["Properties"]["PolicyDocument"]["Statement"]
            if any(a.startswith("dynamodb:") for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]]))]


def test_steering_gets_the_table_its_item_actions_and_its_name(steering):
    stacks, templates = steering
    template = templates["normalizer"]
    (table_id, table), = template.find_resources("AWS::DynamoDB::Table").items()
    assert table["Properties"]["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    (statement,) = _dynamodb_statements(template)
    assert sorted(statement["Action"]) == ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"]
    assert statement["Resource"] == {"Fn::GetAtt": [table_id, "Arn"]}
    variables = _function(template)["Environment"]["Variables"]
    assert variables["STEERING_TABLE"] == {"Ref": table_id} and "LIMITS_TABLE" not in variables
    config = InvokeConfig.from_env({k: v if isinstance(v, str) else "table" for k, v in variables.items()})
    assert (config.replication.enabled, config.replication.steering, config.steering_table) == (True, True, "table")
    assert not config.limits.enabled
    assert nag_report(stacks)["violations"] == []


def test_with_limits_too_it_is_one_table_and_one_statement(steering_and_limits):
    template = steering_and_limits["normalizer"]
    (table_id,) = template.find_resources("AWS::DynamoDB::Table")
    (statement,) = _dynamodb_statements(template)
    assert statement["Resource"] == {"Fn::GetAtt": [table_id, "Arn"]}
    variables = _function(template)["Environment"]["Variables"]
    assert variables["STEERING_TABLE"] == variables["LIMITS_TABLE"] == {"Ref": table_id}


@pytest.mark.parametrize("replication", [{"enabled": True, "steering": False}, {"enabled": False, "steering": True}])
def test_without_steering_there_is_no_table(replication):
    template = synth(stage_with(normalizer={"replication": replication}))[1]["normalizer"]
    assert not template.find_resources("AWS::DynamoDB::Table") and not _dynamodb_statements(template)
    assert "STEERING_TABLE" not in _function(template)["Environment"]["Variables"]


def test_the_replication_widget_shows_collisions_and_fallbacks(steering):
    dashboard = json.dumps(steering[1]["observability"].find_resources("AWS::CloudWatch::Dashboard"))
    assert "ReplicaCollisions" in dashboard and "SteeringFallbacks" in dashboard
