"""Saved Logs Insights queries and Contributor Insights rules over the normalizer's request log.

Field names come from ``prefix_routing.rules.telemetry.LogField``: the Lambda writes exactly these.
Prefix fingerprints and tenants are unbounded, so they are ranked here, never used as metric
dimensions.
"""

from __future__ import annotations

import json

from aws_cdk import aws_cloudwatch as cloudwatch, aws_logs as logs
from constructs import Construct

from prefix_routing.rules.telemetry import LIMIT_NAMES, REQUEST_LOG_MESSAGE, LimitLogField, LogField as F

ONLY_REQUEST_LINES = f"{F.MESSAGE} = '{REQUEST_LOG_MESSAGE}'"


def prefix_reuse_query() -> logs.QueryString:
    """Share of requests whose prefix fingerprint another request also had (the rule of thumb: > 50 %)."""
    return logs.QueryString(
        filter_statements=[ONLY_REQUEST_LINES, f"ispresent({F.PREFIX_FINGERPRINT})"],
        # Second stats over the first's rows: every request beyond a fingerprint's first reuses it.
        # Only arithmetic over aggregates, which Logs Insights documents for a second stats.
        stats_statements=[
            f"count(*) as requests by {F.PREFIX_FINGERPRINT}",
            "sum(requests) as total, count(*) as prefixes, (sum(requests) - count(*)) * 100 / sum(requests) "
            "as reuse_percent",
        ],
    )


def top_prefixes_query(limit: int = 20) -> logs.QueryString:
    return logs.QueryString(
        filter_statements=[ONLY_REQUEST_LINES],
        stats_statements=[
            f"count(*) as requests, avg({F.TTFT_MS}) as ttft_ms, sum({F.CACHED_TOKENS}) / sum({F.PROMPT_TOKENS}) "
            f"as hit_rate by {F.PREFIX_FINGERPRINT}"
        ],
        sort="requests desc",
        limit=limit,
    )


def tenant_usage_query(limit: int = 20) -> logs.QueryString:
    """Tenants by the prompt tokens they sent: requests, prompt, cached and completion tokens, the
    cached share (the same fields and sums as ``python -m prefix_routing usage``)."""
    return logs.QueryString(
        filter_statements=[ONLY_REQUEST_LINES],
        stats_statements=[
            f"count(*) as requests, sum({F.PROMPT_TOKENS}) as prompt_tokens, sum({F.CACHED_TOKENS}) as cached_tokens, "
            f"sum({F.OUTPUT_TOKENS}) as completion_tokens, sum({F.CACHED_TOKENS}) / sum({F.PROMPT_TOKENS}) "
            f"as cached_share by {F.TENANT}"
        ],
        sort="prompt_tokens desc",
        limit=limit,
    )


def contributor_rule_body(log_group_name: str, key_field: str, extra_filters: list[dict] | None = None) -> str:
    return json.dumps(
        {
            "Schema": {"Name": "CloudWatchLogRule", "Version": 1},
            "LogGroupNames": [log_group_name],
            "LogFormat": "JSON",
            "Contribution": {
                "Keys": [f"$.{key_field}"],
                "Filters": [{"Match": f"$.{F.MESSAGE}", "In": [REQUEST_LOG_MESSAGE]}, *(extra_filters or [])],
            },
            "AggregateOn": "Count",
        },
        separators=(",", ":"),
    )


class RequestLogInsights(Construct):
    """Attributes: ``reuse_query``, ``top_prefixes_query``, ``tenant_usage_query`` (``logs.QueryDefinition``),
    ``cfn_top_prefixes_rule``, ``cfn_top_tenants_rule``, ``cfn_top_throttled_tenants_rule`` (``CfnInsightRule``;
    None without limits)."""

    def __init__(self, scope: Construct, construct_id: str, *, log_group: logs.ILogGroup, name_prefix: str,
                 limits_enabled: bool = False) -> None:
        super().__init__(scope, construct_id)
        self.reuse_query = logs.QueryDefinition(
            self,
            "PrefixReuse",
            query_definition_name=f"{name_prefix}/prefix-reuse-share",
            query_string=prefix_reuse_query(),
            log_groups=[log_group],
        )
        self.top_prefixes_query = logs.QueryDefinition(
            self,
            "TopPrefixes",
            query_definition_name=f"{name_prefix}/top-prefixes",
            query_string=top_prefixes_query(),
            log_groups=[log_group],
        )
        self.tenant_usage_query = logs.QueryDefinition(
            self,
            "TenantUsage",
            query_definition_name=f"{name_prefix}/tenant-usage",
            query_string=tenant_usage_query(),
            log_groups=[log_group],
        )
        self.cfn_top_prefixes_rule = cloudwatch.CfnInsightRule(
            self,
            "TopPrefixesRule",
            rule_name=f"{name_prefix}-top-prefixes",
            rule_state="ENABLED",
            rule_body=contributor_rule_body(log_group.log_group_name, F.PREFIX_FINGERPRINT),
        )
        self.cfn_top_tenants_rule = cloudwatch.CfnInsightRule(
            self,
            "TopTenantsRule",
            rule_name=f"{name_prefix}-top-tenants",
            rule_state="ENABLED",
            rule_body=contributor_rule_body(log_group.log_group_name, F.TENANT),
        )
        # Tenants ranked by the requests their limits refused (never a metric dimension: unbounded).
        self.cfn_top_throttled_tenants_rule = None
        if limits_enabled:
            self.cfn_top_throttled_tenants_rule = cloudwatch.CfnInsightRule(
                self,
                "TopThrottledTenantsRule",
                rule_name=f"{name_prefix}-top-throttled-tenants",
                rule_state="ENABLED",
                rule_body=contributor_rule_body(log_group.log_group_name, F.TENANT, [
                    {"Match": f"$.{LimitLogField.THROTTLED_BY}", "In": list(LIMIT_NAMES)}]),
            )
