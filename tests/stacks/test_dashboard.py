import json

from prefix_routing.rules import telemetry
from prefix_routing.stage.config import load_stage


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


def test_per_instance_widgets_read_only_per_instance_series(default_templates):
    body = _body(default_templates["observability"])
    component = load_stage().component_name
    where = f"WHERE InferenceComponentName = '{component}' GROUP BY InstanceId"
    schema = 'FROM SCHEMA(\\"AWS/SageMaker\\", InferenceComponentName, InstanceId)'  # JSON-escaped in the body
    assert f"SELECT SUM(Invocations) {schema} {where} ORDER BY SUM() DESC" in body
    assert f"SELECT MAX(ConcurrentRequestsPerCopy) {schema} {where} ORDER BY MAX() DESC" in body


def test_no_widget_reads_a_metric_no_aws_source_lists(default_templates):
    body = _body(default_templates["observability"])
    for name in ("DesiredCopyCount", "CurrentCopyCount"):  # DescribeInferenceComponent fields, not metrics
        assert name not in body


def test_copy_counts_are_the_normalizers_published_metrics(default_templates):
    body = _body(default_templates["observability"])
    for spec in (telemetry.DESIRED_COPIES, telemetry.CURRENT_COPIES):
        assert f'"{telemetry.NAMESPACE}","{spec.name}","{telemetry.DIMENSION_COMPONENT}"' in body


def test_hot_prefix_replication_widget_sits_with_the_hotspot_widgets(default_templates):
    (dashboard,) = default_templates["observability"].find_resources("AWS::CloudWatch::Dashboard").values()
    parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    widgets = json.loads("".join(p if isinstance(p, str) else "token" for p in parts))["widgets"]
    titles = [w["properties"].get("title", "") for w in widgets]
    (index,) = [i for i, t in enumerate(titles) if t.startswith("Hot-prefix replication")]
    assert titles[index - 1].startswith("Concurrent requests per copy, per instance")  # right beside it
    widget = widgets[index]
    assert widget["y"] == widgets[index - 1]["y"]  # on the same row
    metrics = widget["properties"]["metrics"]
    replicated = [m for m in metrics if telemetry.REPLICATED_REQUESTS.name in m]
    hot = [m for m in metrics if telemetry.HOT_PREFIXES.name in m]
    assert len(replicated) == 1 and len(hot) == 1
    component = load_stage().component_name
    for metric, statistic, axis in ((replicated[0], "Sum", "left"), (hot[0], "Maximum", "right")):
        assert metric[:4] == [telemetry.NAMESPACE, metric[1], telemetry.DIMENSION_COMPONENT, component]
        assert metric[-1]["stat"] == statistic and metric[-1].get("yAxis", "left") == axis


def test_rekeyed_requests_have_their_widget_with_their_share(default_templates):
    (dashboard,) = default_templates["observability"].find_resources("AWS::CloudWatch::Dashboard").values()
    parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    widgets = json.loads("".join(p if isinstance(p, str) else "token" for p in parts))["widgets"]
    (widget,) = [w for w in widgets if w["properties"].get("title", "").startswith("Re-keyed requests")]
    metrics = widget["properties"]["metrics"]
    (rekeyed,) = [m for m in metrics if telemetry.REKEYED_REQUESTS.name in m]
    assert rekeyed[:4] == [telemetry.NAMESPACE, telemetry.REKEYED_REQUESTS.name, telemetry.DIMENSION_COMPONENT,
                           load_stage().component_name]
    (share,) = [m for m in metrics if isinstance(m[0], dict) and "expression" in m[0]]
    assert share[0]["expression"] == "100 * rekeyed / requests" and share[0].get("yAxis") == "right"


def _widgets(template):
    (dashboard,) = template.find_resources("AWS::CloudWatch::Dashboard").values()
    parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    return json.loads("".join(p if isinstance(p, str) else "token" for p in parts))["widgets"]


def test_the_engines_hit_rate_sits_beside_the_front_doors(default_templates):
    widgets = _widgets(default_templates["observability"])
    titles = [w["properties"].get("title") or w["properties"].get("markdown", "")[:40] for w in widgets]
    (front_door,) = [i for i, t in enumerate(titles) if t.startswith("KV-cache hit rate")]
    status, text = widgets[front_door + 1], widgets[front_door + 2]
    assert status["type"] == "alarm" and status["properties"]["title"] == "Engine prefix-cache hit rate: alarms"
    assert len(status["properties"]["alarms"]) == 2  # the hit rate and whether its metrics are published
    assert text["type"] == "text" and text["properties"]["markdown"].startswith("**Engine prefix-cache hit rate**")
    component = load_stage().component_name
    label = f'"aws.sagemaker.inference_component.name"="{component}"'
    # either spelling of each counter: vLLM exposes the _total suffix, CloudWatch may or may not keep it
    query = (f'sum(rate({{__name__=~"vllm:prefix_cache_hits(_total)?", {label}}}[5m])) / '
             f'sum(rate({{__name__=~"vllm:prefix_cache_queries(_total)?", {label}}}[5m]))')
    assert f"`{query}`" in text["properties"]["markdown"]
    row = widgets[front_door]["y"]
    assert status["y"] == row and text["y"] == row + status["height"]  # one column, on the hit rate's row
    assert status["x"] == text["x"] == widgets[front_door]["x"] + widgets[front_door]["width"]
    assert status["height"] + text["height"] == widgets[front_door]["height"]


def test_the_advisors_row_names_where_the_hits_went_and_the_log_ranks_tenants_by_usage(default_templates):
    widgets = _widgets(default_templates["observability"])
    (hits,) = [w for w in widgets if w["properties"].get("title", "").startswith("Hit rate: measured vs")]
    expressions = {m[0]["expression"]: m[0] for m in hits["properties"]["metrics"]
                   if isinstance(m[0], dict) and "expression" in m[0]}
    assert set(expressions) == {"bound - predicted", "predicted - measured"}
    assert expressions["bound - predicted"]["label"].startswith("lost to routing and capacity")
    assert expressions["predicted - measured"]["label"].startswith("lost in the engine")
    assert all(e.get("yAxis") == "right" for e in expressions.values())
    (usage,) = [w for w in widgets if w["properties"].get("title", "").startswith("Top tenants by prompt tokens")]
    assert usage["type"] == "log" and "by tenant" in usage["properties"]["query"]
    assert "sort prompt_tokens desc" in usage["properties"]["query"]
