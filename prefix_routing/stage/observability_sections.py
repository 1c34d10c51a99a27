"""The sections of a stage that watch and change a running endpoint: its metrics ([metrics]),
alarms ([alarms]) and their fixed names, how updates reach the copies ([deployment]), and the
routing advisor function ([advisor]); with the rules that join them to the other sections.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from prefix_routing.rules.sampling import MIN_RATE
from prefix_routing.stage.domain_checks import ComponentPlan
from prefix_routing.stage.section import Section, allowed
from prefix_routing.stage.value_checks import LOG_RETENTION_DAYS

PUBLISH_FREQUENCIES = (10, 30, 60, 120, 180, 240, 300)


class MetricsSettings(Section):
    """The [metrics] section: the endpoint config's MetricsConfig (enhanced metrics are always on)."""

    publish_frequency_s: int = Field(
        10, description="seconds between the endpoint's metric publications (with detailed observability, also "
        "between scrapes of the container's metrics)",
        json_schema_extra=allowed(", ".join(map(str, PUBLISH_FREQUENCIES))),
    )
    # Billed per GB ingested, and AWS turns it on for new endpoint configs: the template always says which.
    detailed_observability: bool | None = Field(
        None,
        description="the endpoint's detailed observability: the engine's own metrics (vLLM's prefix-cache queries "
        "and hits, the server-side hit rate), per-GPU, host and placement metrics, as OpenTelemetry metrics in "
        "CloudWatch (queried with PromQL; billed per GB ingested); unset: on for `vllm` stages, off otherwise",
        json_schema_extra=allowed("`true`, `false`", doc_default="on for `vllm`, off for `djl-lmi`"),
    )

    def detailed_observability_for(self, framework: str) -> bool:
        """Whether the endpoint config turns detailed observability on for a stage of ``framework``."""
        if self.detailed_observability is None:
            return framework == "vllm"
        return self.detailed_observability

    @field_validator("publish_frequency_s")
    @classmethod
    def _frequency(cls, value: int) -> int:
        if value not in PUBLISH_FREQUENCIES:
            raise ValueError(f"allowed: one of {', '.join(map(str, PUBLISH_FREQUENCIES))}")
        return value


class AlarmSettings(Section):
    """The [alarms] section: thresholds of the stage's alarms (notifications go to its SNS topic)."""

    ttft_p50_ms: float = Field(
        2000.0, gt=0, le=900_000,
        description="alarm when P50 time to first token exceeds this (ms); a first token later than the front "
        "door's longest timeout (900 s) never comes",
    )
    hotspot_factor: float = Field(
        2.0, gt=1, le=100, description="an instance above this multiple of its fair share (the scaling target)"
    )
    minimum_hit_rate: float = Field(0.3, ge=0, le=1, description="alarm when cached ÷ prompt tokens fall below this")
    error_rate_percent: float = Field(1.0, gt=0, le=100, description="5XX errors as % of invocations")
    evaluation_periods: int = Field(5, ge=1, le=60, description="minutes a condition must hold")
    emails: list[Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")]] = Field(
        default_factory=list, description="e-mail subscriptions of the alarm topic"
    )


#: Alarms whose names the stacks fix (``<component>-<suffix>``), because something outside the
#: observability stack names them: each component's DeploymentConfig (the endpoint stack) its rollback
#: alarms, and ``verify`` the engine-metrics alarm. The other alarms are named by CloudFormation.
ERROR_RATE_ALARM = "error-rate"
TTFT_P50_ALARM = "ttft-p50"
ENGINE_HIT_RATE_ALARM = "engine-hit-rate"
ENGINE_METRICS_ALARM = "engine-metrics-missing"
ROLLBACK_ALARMS = (ERROR_RATE_ALARM, TTFT_P50_ALARM)
#: SageMaker's documented bounds on a rolling update's batch: 5 to 50 % of the component's copies.
BATCH_PERCENT_MIN, BATCH_PERCENT_MAX = 5, 50


def alarm_name(component: str, alarm: str) -> str:
    """The fixed name of one of a component's alarms (``ROLLBACK_ALARMS``, the engine alarms)."""
    return f"{component}-{alarm}"


class DeploymentSettings(Section):
    """The [deployment] section: how a new image, model or container setting reaches the copies (each
    inference component's DeploymentConfig). A rolling update replaces a batch of copies at a time and
    rolls back when the component's error-rate or TTFT alarm fires; each new copy starts with an empty
    KV cache."""

    rolling_update: bool = Field(
        True,
        description="replace copies a batch at a time, each batch baking on live traffic before the next; false: "
        "SageMaker's default update of the component, without rollback alarms",
    )
    batch_type: Literal["COPY_COUNT", "CAPACITY_PERCENT"] = Field(
        "COPY_COUNT", description="what `batch_size` counts: copies, or percent of the component's copies"
    )
    batch_size: int = Field(
        1, ge=1, le=1000,
        description="copies (or percent of them) replaced per step (`RollingUpdatePolicy.MaximumBatchSize`); small "
        "batches keep most KV caches warm during an update. SageMaker documents 5-50 % of the copy count",
        json_schema_extra=allowed(f"with `CAPACITY_PERCENT` from {BATCH_PERCENT_MIN} to {BATCH_PERCENT_MAX}"),
    )
    wait_interval_s: int = Field(
        600, ge=0, le=3600,
        description="seconds each batch bakes on live traffic while the rollback alarms watch it "
        "(`WaitIntervalInSeconds`); with `auto_rollback`, at least `alarms.evaluation_periods` minutes, the time "
        "an alarm needs to fire",
    )
    timeout_s: int = Field(
        28800, ge=600, le=28800,
        description="the longest the whole update may take (`MaximumExecutionTimeoutInSeconds`)",
    )
    auto_rollback: bool = Field(
        True,
        description="roll the update back when the component's 5XX error-rate alarm or its TTFT P50 alarm (the "
        "front door's) fires during it",
    )

    @model_validator(mode="after")
    def _percent(self) -> "DeploymentSettings":
        if self.batch_type == "CAPACITY_PERCENT" and not BATCH_PERCENT_MIN <= self.batch_size <= BATCH_PERCENT_MAX:
            raise ValueError(
                f"batch_size ({self.batch_size}) with batch_type CAPACITY_PERCENT; allowed: {BATCH_PERCENT_MIN} to "
                f"{BATCH_PERCENT_MAX} (SageMaker's batch is 5-50 % of the copy count)"
            )
        return self


_SAMPLE_ALLOWED = f"allowed: `auto`, or a rate from {MIN_RATE:g} to 1"  # the lowest rate: one log bucket


def _sample_rate(value: Any) -> float | str:
    """``advisor.sample``: ``auto`` or a rate (one message for both, not one per kind)."""
    if value == "auto":
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and MIN_RATE <= value <= 1.0:
        return float(value)
    raise ValueError(_SAMPLE_ALLOWED)


class CanarySettings(Section):
    """The [canary] section: the isolation canary (prefix_routing.canary), a scheduled function that
    proves, per trust domain, that the cache still works and that tenants stay apart in it."""

    enabled: bool = Field(
        False,
        description="every `every_minutes`, per trust domain, a synthetic tenant's prompt is sent twice and a second "
        "synthetic tenant's identical prompt once, with the routing ids and salts the front door would give them; "
        "the repeat must be cached (`CanaryCacheCold` otherwise) and the other tenant's must not be beyond the chat "
        "template's first tokens (`CanaryIsolationBreach` otherwise), each with its alarm",
    )
    every_minutes: int = Field(60, ge=5, le=1440, description="minutes between runs")
    prompt_tokens: int = Field(
        1024, ge=256, le=8192,
        description="about how many tokens the canary's prompt has (3 requests of it per domain per run, 1 output "
        "token each)",
    )


class AdvisorSettings(Section):
    """The [advisor] section: the routing advisor function (prefix_routing.advisor), run on a schedule
    over the last window of the normalizer's request log."""

    enabled: bool = Field(
        True,
        description="the routing advisor function: every `schedule_minutes` it replays that window of the request "
        "log through the lab, publishes `PredictedHitRate`, `BestPredictedHitRate`, `HitRateBound`, "
        "`MeasuredHitRate`, `PrefixReuseShare` and the recommended settings, and notifies the alarm topic when "
        "they would pay",
    )
    schedule_minutes: int = Field(60, ge=5, le=1440, description="minutes between runs; each run reads the window since the last")
    notify_gain_points: float = Field(
        5.0, gt=0, le=100, description="hit-rate points the recommended settings must gain over the current ones to count"
    )
    notify_ttft_gain: float = Field(0.2, gt=0, lt=1, description="or the share of P50 TTFT they must cut")
    notify_after_runs: int = Field(
        3, ge=1, le=1000,
        description="consecutive runs with the same recommendation before one notification (then none until it changes)",
    )
    max_events: int = Field(
        100_000, ge=1000, le=1_000_000,
        description="request-log lines read per run at most; a run that hits the bound logs where it cut the window",
    )
    sample: Annotated[float | str, BeforeValidator(_sample_rate)] = Field(
        "auto",
        description="the share of routing keys a run reads (the front door logs each request's key bucket and "
        "CloudWatch Logs filters by it): `auto` reads about half of `max_events` from the window's `Requests` "
        "count (every key while they fit), or a rate; hot prefixes are read in every sample",
        json_schema_extra=allowed(_SAMPLE_ALLOWED.removeprefix("allowed: ")),
    )
    memory_mb: int = Field(1024, ge=256, le=10240, description="the function's memory (MB)")
    timeout_s: int = Field(300, ge=60, le=900, description="the function's timeout (s)")
    log_retention_days: LOG_RETENTION_DAYS = Field(
        30, description="retention of the function's log group (a CloudWatch Logs value)"
    )


def check_bake(deployment: DeploymentSettings, alarms: AlarmSettings) -> None:
    """Raise ValueError when a rolling update's batch bakes for less time than a rollback alarm needs
    to fire."""
    periods = alarms.evaluation_periods
    if deployment.rolling_update and deployment.auto_rollback and deployment.wait_interval_s < periods * 60:
        raise ValueError(
            f"deployment.wait_interval_s ({deployment.wait_interval_s}) is shorter than the {periods} minutes "
            f"(alarms.evaluation_periods) a rollback alarm needs to fire: a bad batch would pass its bake; "
            f"allowed: at least {periods * 60}, or deployment.auto_rollback = false"
        )


def rollback_alarm_names(deployment: DeploymentSettings, component: str) -> list[str]:
    """The alarms a component's rolling update rolls back on (none without auto-rollback)."""
    if not (deployment.rolling_update and deployment.auto_rollback):
        return []
    return [alarm_name(component, alarm) for alarm in ROLLBACK_ALARMS]


def batch_warnings(deployment: DeploymentSettings, plans: Iterable[ComponentPlan]) -> list[str]:
    """The components a rolling batch does not fit: one that never has two copies gets no rolling
    policy at all (a batch of its one copy is all of it), and the copy counts a ``COPY_COUNT`` batch
    is not 5-50 % of."""
    if not deployment.rolling_update:
        return []
    size, found = deployment.batch_size, []
    # 5-50 % of the copy count: the batch fits counts from 2 x size to 20 x size.
    fits = (2 * size, 20 * size)
    for plan in plans:
        if not rolls(plan):
            found.append(f"{plan.name} has at most {plan.copies_max} copy: it gets no rolling update (SageMaker "
                         "documents batches of 5-50 % of the copy count, and one copy is all of it); an update "
                         "replaces its copy at once")
            continue
        if deployment.batch_type != "COPY_COUNT":
            continue
        low, high = max(1, plan.copies_min), plan.copies_max
        if low < fits[0] or high > fits[1]:
            found.append(
                f"deployment.batch_size {size} (COPY_COUNT) is 5-50 % of {fits[0]} to {fits[1]} copies, but "
                f"{plan.name} may have {low} to {high}: SageMaker documents batches of 5-50 % of the copy count, "
                "so an update at another count may be refused (CAPACITY_PERCENT follows the count)"
            )
    return found


def rolls(plan: ComponentPlan) -> bool:
    """Whether a component can have a rolling update: only with two copies or more."""
    return plan.copies_max >= 2
