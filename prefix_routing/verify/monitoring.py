"""The stage's alarms and every metric its alarms and dashboard read, as CloudWatch holds them.

What is checked is what was deployed: the alarm names come from the observability stack's
resources, their metrics (and Metrics Insights queries) from ``DescribeAlarms``, the widgets' from
the dashboard body. Each metric is looked up with ``ListMetrics`` and must exist with the exact
dimension set its reader uses, which settles the one fact no document gives: which dimension sets
SageMaker's enhanced metrics publish.

The engine's own prefix-cache counters (detailed observability) are OpenTelemetry metrics, read
with PromQL, which ``ListMetrics`` and the SDK's CloudWatch client do not query: their names are
settled by the PromQL alarm on their absence, ``<component>-engine-metrics-missing``, whose state
verify reads (OK: the metric is seen).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from prefix_routing.stage.config import ENGINE_METRICS_ALARM, StageConfig, alarm_name
from prefix_routing.verify.deployment import error_code
from prefix_routing.verify.report import Check, fail, ok, unknown

_SCHEMA_RE = re.compile(r'SELECT\s+\w+\((?P<metric>\w+)\)\s+FROM\s+SCHEMA\("(?P<ns>[^"]+)"(?P<dims>(?:\s*,\s*\w+)*)\)'
                        r"(?P<rest>.*)", re.IGNORECASE | re.DOTALL)
_WHERE_RE = re.compile(r"(\w+)\s*=\s*'([^']*)'")
_NOT_YET = ("no series yet: SageMaker publishes invocation metrics only once requests arrive, and the normalizer "
            "its EMF metrics after its first request")


@dataclass(frozen=True, slots=True)
class MetricNeed:
    """A series an alarm or widget reads: namespace, name, the exact dimension names, the known values."""

    namespace: str
    name: str
    dimensions: frozenset[str]
    values: tuple[tuple[str, str], ...]
    schema: bool  # from a Metrics Insights SCHEMA(...) query (values are a filter, not all dimensions)

    def label(self) -> str:
        return f"{self.namespace} {self.name} {{{', '.join(sorted(self.dimensions))}}}"


def _from_stat(metric: dict) -> MetricNeed:
    dims = tuple((d["Name"], d["Value"]) for d in metric.get("Dimensions", []))
    return MetricNeed(metric["Namespace"], metric["MetricName"], frozenset(n for n, _ in dims), dims, False)


def _from_query(query: str) -> MetricNeed | None:
    match = _SCHEMA_RE.search(query)
    if not match:
        return None
    dims = frozenset(d.strip() for d in match["dims"].split(",") if d.strip())
    values = tuple(pair for pair in _WHERE_RE.findall(match["rest"]) if pair[0] in dims)
    return MetricNeed(match["ns"], match["metric"], dims, values, True)


def alarm_needs(alarm: dict) -> list[MetricNeed]:
    if alarm.get("MetricName"):
        return [_from_stat(alarm)]
    needs = []
    for query in alarm.get("Metrics", []):
        if "MetricStat" in query:
            needs.append(_from_stat(query["MetricStat"]["Metric"]))
        elif query.get("Expression"):
            needs += [n for n in [_from_query(query["Expression"])] if n]
    return needs


def dashboard_needs(body: str) -> list[MetricNeed]:
    needs = []
    for widget in json.loads(body).get("widgets", []):
        for series in (widget.get("properties") or {}).get("metrics", []):
            if series and isinstance(series[-1], dict) and "expression" in series[-1]:
                needs += [n for n in [_from_query(series[-1]["expression"])] if n]
                continue
            names = [v for v in series if isinstance(v, str)]
            if len(names) >= 2:
                dims = tuple(zip(names[2::2], names[3::2]))
                needs.append(MetricNeed(names[0], names[1], frozenset(n for n, _ in dims), dims, False))
    return needs


def stack_resources(cloudformation: Any, stack: str, resource_type: str) -> list[str]:
    """Physical ids of one type in a stack (paginated)."""
    ids, token = [], None
    while True:
        page = cloudformation.list_stack_resources(StackName=stack, **({"NextToken": token} if token else {}))
        ids += [r["PhysicalResourceId"] for r in page["StackResourceSummaries"] if r["ResourceType"] == resource_type]
        token = page.get("NextToken")
        if not token:
            return ids


def check_metric(cloudwatch: Any, need: MetricNeed) -> Check:
    title = f"metric {need.label()}"
    filters = [{"Name": n, "Value": v} for n, v in need.values]
    try:
        found = cloudwatch.list_metrics(Namespace=need.namespace, MetricName=need.name, Dimensions=filters)["Metrics"]
    except Exception as error:  # noqa: BLE001
        return unknown(title, f"cannot list metrics ({error_code(error)})", "grant cloudwatch:ListMetrics")
    sets = {frozenset(d["Name"] for d in m.get("Dimensions", [])) for m in found}
    if need.dimensions in sets:
        return ok(title, f"{sum(frozenset(d['Name'] for d in m.get('Dimensions', [])) == need.dimensions for m in found)} series")
    if not sets:
        return unknown(title, _NOT_YET, "send traffic (verify --invoke sends two requests) and run verify again")
    published = "; ".join("{" + ", ".join(sorted(s)) + "}" for s in sorted(sets, key=sorted))
    fix = ("set SageMakerMetrics.PER_INSTANCE_DIMENSIONS (stacks/metrics.py) to the per-instance set published "
           "and redeploy the observability stack") if need.schema else \
        "the reader's dimensions do not match what is published: fix the metric factory (stacks/metrics.py)"
    return fail(title, f"published only with {published}", fix)


def check_monitoring(cloudformation: Any, cloudwatch: Any, config: StageConfig) -> list[Check]:
    stack = f"{config.stack_prefix}-Observability"
    try:
        names = stack_resources(cloudformation, stack, "AWS::CloudWatch::Alarm")
    except Exception as error:  # noqa: BLE001
        return [fail(f"stack {stack}", f"cannot list its resources ({error_code(error)})",
                     f"deploy it: npx cdk deploy --all -c stage={config.name}")]
    alarms = {a["AlarmName"]: a for a in cloudwatch.describe_alarms(AlarmNames=names)["MetricAlarms"]} if names else {}
    needs: dict[MetricNeed, None] = {}
    for alarm in alarms.values():
        needs.update(dict.fromkeys(alarm_needs(alarm)))
    try:
        body = cloudwatch.get_dashboard(DashboardName=config.dashboard_name)["DashboardBody"]
        needs.update(dict.fromkeys(dashboard_needs(body)))
        checks = [ok(f"dashboard {config.dashboard_name}")]
    except Exception as error:  # noqa: BLE001
        checks = [fail(f"dashboard {config.dashboard_name}", f"not found ({error_code(error)})",
                       f"deploy the observability stack: npx cdk deploy {stack} -c stage={config.name}")]
    metric_checks = {need: check_metric(cloudwatch, need) for need in needs}
    checks += list(metric_checks.values())
    engine_alarms = {alarm_name(plan.name, ENGINE_METRICS_ALARM): plan.name for plan in config.components()}
    if config.engine_hit_rate_published:
        checks += [check_engine_metrics(name, component, name in names, alarms.get(name), config)
                   for name, component in engine_alarms.items()]
    traffic = any(c.status == "ok" for need, c in metric_checks.items() if need.name in ("Invocations", "Requests"))
    for name in names:
        if config.engine_hit_rate_published and name in engine_alarms:
            continue  # its own line above
        alarm = alarms.get(name)
        if alarm is None:
            checks.append(fail(f"alarm {name}", "in the stack but not in CloudWatch",
                               f"redeploy the observability stack: npx cdk deploy {stack} -c stage={config.name}"))
            continue
        state, reason = alarm.get("StateValue"), alarm.get("StateReason", "")
        reads = [metric_checks[n] for n in alarm_needs(alarm)]
        if state == "OK":
            checks.append(ok(f"alarm {name}", "OK"))
        elif state == "ALARM":
            checks.append(unknown(f"alarm {name}", f"ALARM: {reason}", "the deployment is wired; the system is not "
                                  "healthy: read the alarm's description and the dashboard"))
        elif traffic and reads and (any(c.status == "fail" for c in reads) or all(c.status == "ok" for c in reads)):
            checks.append(fail(f"alarm {name}", f"INSUFFICIENT_DATA after traffic: {reason}",
                               "its metrics are not published as it reads them: see the metric lines above"))
        else:
            checks.append(unknown(f"alarm {name}", f"INSUFFICIENT_DATA: {_NOT_YET}", "send traffic and run verify again"))
    return checks


def check_engine_metrics(name: str, component: str, in_stack: bool, alarm: dict | None, config: StageConfig) -> Check:
    """Whether the engine's prefix-cache counters reach CloudWatch for ``component``, from the state of
    the PromQL alarm ``name`` on their absence: OK ✔ (seen), ALARM or no state yet ? (not seen: the
    metric names are settled on first deploy), missing ✘."""
    title = f"engine prefix-cache metrics {component}"
    stack = f"{config.stack_prefix}-Observability"
    if not in_stack or alarm is None:
        where = "CloudWatch" if in_stack else f"the stack {stack}"
        return fail(title, f"alarm {name} is not in {where}: nothing watches the engine's hit rate",
                    f"redeploy the observability stack: npx cdk deploy {stack} -c stage={config.name}")
    state = alarm.get("StateValue")
    if state == "OK":
        return ok(title, "published (the engine hit-rate widget's query and alarm have data)")
    settle = ("settle on first deploy: in CloudWatch Query Studio (PromQL), look for the vLLM prefix-cache series "
              f"(vllm:prefix_cache_queries, with or without _total: the alarm selects both) labelled "
              f"aws.sagemaker.inference_component.name = {component}; if they have other names or labels, "
              "set them in EngineMetrics (stacks/metrics.py) and redeploy the observability stack; if there are none, "
              "check that detailed observability is on (the line above) and that the copies are InService")
    if state == "ALARM":
        return unknown(title, f"not seen ({alarm.get('StateReason', 'absent')})", settle)
    return unknown(title, f"not evaluated yet ({state})", "run verify again in a few minutes; if it stays, " + settle)
