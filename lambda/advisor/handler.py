"""The routing advisor Lambda's entry point: thin, the logic is in ``prefix_routing.advisor``.

Run by an EventBridge schedule (``advisor.schedule_minutes``); the event itself carries nothing the
run needs. The configuration comes from the environment the stack sets (``AdvisorConfig.from_env``),
the clients are made once per execution environment, and each run's summary is one JSON log line.
"""

from __future__ import annotations

import json
import os
import time

import boto3

from prefix_routing.advisor import AdvisorConfig, Clients, run_once

_clients: Clients | None = None


def _make_clients() -> Clients:
    return Clients(logs=boto3.client("logs"), cloudwatch=boto3.client("cloudwatch"),
                   sagemaker=boto3.client("sagemaker"), sns=boto3.client("sns"), ssm=boto3.client("ssm"))


def handler(event, context) -> dict:
    global _clients
    config = AdvisorConfig.from_env(os.environ)  # a missing variable fails the run with its name
    if _clients is None:
        _clients = _make_clients()
    result = run_once(config, _clients, int(time.time() * 1000))
    summary = {key: value for key, value in result.items() if key != "advice"}
    if result.get("advised"):
        advice = result["advice"]
        summary.update(current=advice["current"], best=advice["best"], gain_points=advice["gain_points"],
                       measured_hit_rate=advice["measured_hit_rate"])
    print(json.dumps({"message": "prefix_routing.advisor", **summary}, default=str))
    return summary
