"""The metric factory (stacks/metrics.py): names, statistics and queries as CloudWatch defines them."""

import json
import re

import pytest

from stacks.metrics import SageMakerMetrics

COMPONENT_LEVEL = {"InferenceComponentName"}  # the series every WHERE InferenceComponentName = ... matches


def _schema_dimensions(query: str) -> set[str] | None:
    """The exact dimension set a query's SCHEMA(...) reads, or None for a plain namespace."""
    match = re.search(r'FROM SCHEMA\("AWS/SageMaker"((?:, \w+)*)\)', query)
    return {d.strip() for d in match.group(1).split(",") if d.strip()} if match else None


def test_concurrency_statistics_are_the_documented_ones():
    metrics = SageMakerMetrics(endpoint_name="ep", component_name="ic")
    for statistic in ("Minimum", "Maximum"):
        assert metrics.concurrent_requests_per_copy(statistic).statistic == statistic
    for statistic in ("Average", "p50", "Sum"):
        with pytest.raises(ValueError, match=f"statistic '{statistic}': AWS documents only Minimum and Maximum"):
            metrics.concurrent_requests_per_copy(statistic)


def test_per_instance_query_never_matches_component_level_series():
    query = SageMakerMetrics(endpoint_name="ep", component_name="ic").per_instance_query("MAX", "X")
    assert query == ('SELECT MAX(X) FROM SCHEMA("AWS/SageMaker", InferenceComponentName, InstanceId) '
                     "WHERE InferenceComponentName = 'ic' GROUP BY InstanceId ORDER BY MAX() DESC")
    assert _schema_dimensions(query) == {"InferenceComponentName", "InstanceId"} != COMPONENT_LEVEL


def _expressions(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "Expression" and isinstance(value, str):
                yield value
            yield from _expressions(value)
    elif isinstance(node, list):
        for value in node:
            yield from _expressions(value)


def test_every_sagemaker_query_of_every_template_reads_an_exact_dimension_set(default_templates):
    """No AVG( anywhere; every Metrics Insights query over AWS/SageMaker uses SCHEMA without the component-level set."""
    queries, in_alarms = [], 0
    for template in default_templates.values():
        text = json.dumps(template.to_json())
        assert "AVG(" not in text
        alarm_queries = [q for q in _expressions(template.to_json()) if q.lstrip().upper().startswith("SELECT")]
        in_alarms += len(alarm_queries)
        queries += alarm_queries
        bodies = [r["Properties"]["DashboardBody"] for r in template.find_resources("AWS::CloudWatch::Dashboard").values()]
        for body in bodies:
            joined = "".join(p if isinstance(p, str) else "" for p in body["Fn::Join"][1]) if isinstance(body, dict) else body
            queries += [q.replace('\\"', '"') for q in re.findall(r'"expression":"(SELECT[^"\\]*(?:\\.[^"\\]*)*)"', joined)]
    assert in_alarms >= 2 and len(queries) - in_alarms >= 2  # hotspot and pinned alarms; two dashboard widgets
    for query in queries:
        if "AWS/SageMaker" in query:
            dimensions = _schema_dimensions(query)
            assert dimensions is not None, query
            assert dimensions != COMPONENT_LEVEL and "InstanceId" in dimensions, query

