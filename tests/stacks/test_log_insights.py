import json

from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LogField


def test_saved_queries_use_the_telemetry_fields(default_templates):
    queries = {
        q["Properties"]["Name"]: q["Properties"]["QueryString"]
        for q in default_templates["observability"].find_resources("AWS::Logs::QueryDefinition").values()
    }
    reuse = next(v for k, v in queries.items() if k.endswith("prefix-reuse-share"))
    top = next(v for k, v in queries.items() if k.endswith("top-prefixes"))
    for query in (reuse, top):
        assert f"{LogField.MESSAGE} = '{REQUEST_LOG_MESSAGE}'" in query
        assert LogField.PREFIX_FINGERPRINT in query
    assert "(sum(requests) - count(*)) * 100 / sum(requests) as reuse_percent" in reuse
    assert reuse.count("| stats ") == 2 and "display" not in reuse
    assert "sort requests desc" in top


def test_contributor_insights_rank_fingerprints_and_tenants(default_templates):
    rules = default_templates["observability"].find_resources("AWS::CloudWatch::InsightRule")
    keys = set()
    for rule in rules.values():
        body = rule["Properties"]["RuleBody"]
        # The log group name is a cross-stack import: the body is a Fn::Join around it.
        text = "".join(part if isinstance(part, str) else "<group>" for part in body["Fn::Join"][1])
        parsed = json.loads(text)
        assert parsed["LogFormat"] == "JSON" and parsed["AggregateOn"] == "Count"
        assert parsed["Contribution"]["Filters"] == [{"Match": f"$.{LogField.MESSAGE}", "In": [REQUEST_LOG_MESSAGE]}]
        keys.update(parsed["Contribution"]["Keys"])
    assert keys == {f"$.{LogField.PREFIX_FINGERPRINT}", f"$.{LogField.TENANT}"}
