import json

from prefix_routing.rules import telemetry


def _body(template):
    (dashboard,) = template.find_resources("AWS::CloudWatch::Dashboard").values()
    body = dashboard["Properties"]["DashboardBody"]
    return "".join(p if isinstance(p, str) else json.dumps(p) for p in body["Fn::Join"][1]) if isinstance(body, dict) else body


def test_dashboard_shows_ttft_hit_rate_imbalance_capacity_and_errors(default_templates):
    body = _body(default_templates["observability"])
    for title in ("Time to first token", "KV-cache hit rate", "Requests per instance", "Copies: desired vs current",
                  "GPU utilization", "Model latency", "Errors"):
        assert title in body, title
    assert telemetry.TTFT.name in body and '"p90"' in body
    assert "GROUP BY InstanceId" in body
