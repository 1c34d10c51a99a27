"""Who used what, and what the cache saved them: the request log added up per tenant, for chargeback.

Each line of the front door's request log (``telemetry.LogField``) counts for its ``tenant``:

- a served request (status below 400): its prompt, cached and completion tokens, and the prefill
  time its cached tokens saved, by the lab's engine model for the stage's instance
  (:class:`.latency.LatencyModel`): the prefill of the whole prompt minus that of its uncached part
  after the cached one;
- a refusal by a limit (429 with ``throttled_by``): counted by that limit;
- any other failure (4xx, 5xx): counted as an error.

Lines that are not request lines are ignored and counted; a request line that cannot be read
(not JSON, a count that is not a whole number, a count above the lab's bounds) is skipped and
counted with its reason, never an error. A line without a tenant counts for ``(none)``.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Final, Iterable

from prefix_routing.lab import input_bounds
from prefix_routing.lab.latency import LatencyModel
from prefix_routing.lab.trace_data import Skipped, is_int
from prefix_routing.lab.traces import LINE_TOO_LONG, open_lines
from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LimitLogField, LogField

NO_TENANT: Final = "(none)"
#: The CSV's columns, in order (``--csv``; a chargeback sheet reads them by name).
CSV_COLUMNS: Final = ("tenant", "requests", "served", "prompt_tokens", "cached_tokens", "completion_tokens",
                      "cached_share", "prefill_saved_s", "refused_requests_per_minute", "refused_tokens_per_minute",
                      "refused_concurrent_streams", "errors")
LIMITS: Final = ("requests_per_minute", "tokens_per_minute", "concurrent_streams")
#: Tenants kept apart at most; the rest are added up in one row (a log names who called).
MAX_TENANTS: Final = 100_000
OTHER_TENANTS: Final = "(other tenants)"


@dataclass
class TenantUsage:
    """One tenant's sums over a log."""

    requests: int = 0
    served: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    prefill_saved_s: float = 0.0
    refused: Counter = field(default_factory=Counter)  # by limit
    errors: int = 0

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def prefill_saved_s(latency: LatencyModel, prompt: int, cached: int) -> float:
    """The prefill time ``cached`` tokens of a ``prompt`` saved: all of it cold, minus the rest after them."""
    cached = min(cached, prompt)
    if cached <= 0:
        return 0.0
    return max(0.0, latency.prefill_s(prompt, 0) - latency.prefill_s(prompt - cached, cached))


@dataclass
class UsageReport:
    """Per-tenant usage of a log, what it skipped and ignored."""

    tenants: dict[str, TenantUsage] = field(default_factory=dict)
    skipped: Skipped = field(default_factory=Skipped)
    lines: int = 0

    def tenant(self, name: str) -> TenantUsage:
        found = self.tenants.get(name)
        if found is None:
            if len(self.tenants) >= MAX_TENANTS:
                name = OTHER_TENANTS
                found = self.tenants.get(name)
            if found is None:
                found = self.tenants[name] = TenantUsage()
        return found

    def total(self) -> TenantUsage:
        total = TenantUsage()
        for usage in self.tenants.values():
            total.requests += usage.requests
            total.served += usage.served
            total.prompt_tokens += usage.prompt_tokens
            total.cached_tokens += usage.cached_tokens
            total.completion_tokens += usage.completion_tokens
            total.prefill_saved_s += usage.prefill_saved_s
            total.refused.update(usage.refused)
            total.errors += usage.errors
        return total


def _count(obj: dict, name: str, high: int) -> tuple[int | None, str | None]:
    """(a token count of a line: absent or null is 0, None when it is bad, why)."""
    value = obj.get(name)
    if value is None:
        return 0, None
    if not is_int(value) or value < 0:
        return None, f"bad {name!r}"
    problem = input_bounds.count_problem(name, value, high)
    return (None, problem) if problem else (value, None)


def add_line(report: UsageReport, where: str, text: str | None, latency: LatencyModel | None) -> None:
    """One log line into ``report`` (None: a line the reader found too long and did not hold)."""
    report.lines += 1
    if text is None or len(text) > input_bounds.MAX_LINE_BYTES:
        report.skipped.add(where, LINE_TOO_LONG)
        return
    try:
        obj = json.loads(text)
    except ValueError:
        if REQUEST_LOG_MESSAGE in text:
            report.skipped.add(where, "broken request log line")
        else:
            report.skipped.ignored["lines that are not JSON (runtime lines)"] += 1
        return
    if not isinstance(obj, dict) or obj.get(LogField.MESSAGE) != REQUEST_LOG_MESSAGE:
        report.skipped.ignored[f"lines whose message is not {REQUEST_LOG_MESSAGE!r}"] += 1
        return
    status = obj.get(LogField.STATUS)
    if not is_int(status) or not 100 <= status <= 599:
        report.skipped.add(where, f"missing or bad {LogField.STATUS!r}", repr(status)[:40])
        return
    counts = {}
    for name, high in ((LogField.PROMPT_TOKENS, input_bounds.MAX_PROMPT_TOKENS),
                       (LogField.CACHED_TOKENS, input_bounds.MAX_PROMPT_TOKENS),
                       (LogField.OUTPUT_TOKENS, input_bounds.MAX_OUTPUT_TOKENS)):
        counts[name], problem = _count(obj, name, high)
        if problem:
            report.skipped.add(where, problem, repr(obj.get(name))[:40])
            return
    tenant = obj.get(LogField.TENANT)
    usage = report.tenant(tenant if isinstance(tenant, str) and tenant else NO_TENANT)
    usage.requests += 1
    if status == 429 and obj.get(LimitLogField.THROTTLED_BY) in LIMITS:
        usage.refused[obj[LimitLogField.THROTTLED_BY]] += 1
        return
    if status >= 400:
        usage.errors += 1
        return
    prompt, cached = counts[LogField.PROMPT_TOKENS], min(counts[LogField.CACHED_TOKENS], counts[LogField.PROMPT_TOKENS])
    usage.served += 1
    usage.prompt_tokens += prompt
    usage.cached_tokens += cached
    usage.completion_tokens += counts[LogField.OUTPUT_TOKENS]
    if latency is not None:
        usage.prefill_saved_s += prefill_saved_s(latency, prompt, cached)


def read_usage(lines: Iterable[tuple[str, str | None]], latency: LatencyModel | None) -> UsageReport:
    """Per-tenant usage of ``(where, line)`` pairs (a file's numbered lines, CloudWatch's events)."""
    report = UsageReport()
    for where, text in lines:
        if text is None or text.strip():
            add_line(report, where, text, latency)
    return report


def _rows(report: UsageReport) -> list[tuple[str, TenantUsage]]:
    """Tenants by their prompt tokens, most first (then by name)."""
    return sorted(report.tenants.items(), key=lambda item: (-item[1].prompt_tokens, -item[1].requests, item[0]))


def render_csv(report: UsageReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for name, usage in _rows(report):
        writer.writerow([name, usage.requests, usage.served, usage.prompt_tokens, usage.cached_tokens,
                         usage.completion_tokens, f"{usage.cached_share:.4f}", f"{usage.prefill_saved_s:.3f}",
                         *(usage.refused[limit] for limit in LIMITS), usage.errors])
    return out.getvalue()


def render_text(report: UsageReport, *, top: int = 20) -> str:
    header = (f"{'tenant':<40} {'requests':>9} {'prompt':>12} {'cached':>12} {'cached %':>8} {'completion':>11} "
              f"{'saved s':>9} {'refused':>8} {'errors':>7}")
    lines = [header]
    rows = _rows(report)

    def line(name: str, usage: TenantUsage) -> str:
        shown = name if len(name) <= 40 else name[:19] + "…" + name[-20:]
        return (f"{shown:<40} {usage.requests:>9,} {usage.prompt_tokens:>12,} {usage.cached_tokens:>12,} "
                f"{100 * usage.cached_share:>7.1f}% {usage.completion_tokens:>11,} {usage.prefill_saved_s:>9.1f} "
                f"{sum(usage.refused.values()):>8,} {usage.errors:>7,}")

    lines += [line(name, usage) for name, usage in rows[:top]]
    if len(rows) > top:
        rest = UsageReport(tenants=dict(rows[top:])).total()
        lines.append(line(f"({len(rows) - top:,} more tenants)", rest))
    total = report.total()
    lines.append(line("all tenants", total))
    if any(total.refused.values()):
        lines.append("refused by limit: " + ", ".join(f"{limit} {total.refused[limit]:,}" for limit in LIMITS
                                                      if total.refused[limit]))
    summary = report.skipped.summary(report.lines)
    if summary:
        lines.append(summary)
    return "\n".join(lines)


#: Events read from CloudWatch Logs at most (a window beyond it is cut, and the output says so).
MAX_EVENTS: Final = 2_000_000


def file_lines(path: str) -> Iterable[tuple[str, str | None]]:
    """A saved log's numbered lines, read as the lab reads every trace (``traces.open_lines``: ``.gz``
    allowed, a line beyond the bound never held whole, a missing file a ``UserError``)."""
    for number, text in open_lines(path):
        yield f"{path}:{number}", text


def cloudwatch_lines(client, log_group: str, start_ms: int, end_ms: int, *,
                     max_events: int = MAX_EVENTS, cut: list | None = None) -> Iterable[tuple[str, str]]:
    """The request lines of a log group's window (``FilterLogEvents`` on the request message); past
    ``max_events`` the window is cut and the first cut event's time appended to ``cut``."""
    paginator = client.get_paginator("filter_log_events")
    read = 0
    for page in paginator.paginate(logGroupName=log_group, startTime=int(start_ms), endTime=int(end_ms),
                                   filterPattern=f'"{REQUEST_LOG_MESSAGE}"'):
        for event in page.get("events", []):
            if read >= max_events:
                if cut is not None:
                    cut.append(event.get("timestamp"))
                return
            read += 1
            yield f"{log_group} event {event.get('eventId', '?')}", event.get("message", "")


def read_usage_from_cloudwatch(log_group: str, start_ms: int, end_ms: int, latency: LatencyModel | None, *,
                               region: str | None = None, client=None, cut: list | None = None) -> UsageReport:
    """:func:`read_usage` over a log group's window, with the caller's credentials; an AWS error is a
    ``UserError`` naming the log group."""
    import boto3  # imported here, as the lab's other reader of CloudWatch does
    from botocore.exceptions import BotoCoreError, ClientError

    from prefix_routing.rules.errors import UserError

    try:
        client = client or boto3.client("logs", region_name=region)
        return read_usage(cloudwatch_lines(client, log_group, start_ms, end_ms, cut=cut), latency)
    except ClientError as error:
        info = error.response.get("Error", {})
        raise UserError(f"--log-group {log_group}: {info.get('Code', 'error')}: {info.get('Message', '')}") from None
    except BotoCoreError as error:
        raise UserError(f"--log-group {log_group}: {error}") from None
