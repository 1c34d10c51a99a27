"""One run of the routing advisor, with the AWS calls it needs (clients passed in: tests stub them)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Mapping

from prefix_routing.lab import advisor, traces
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.sampling import parse_rate
from prefix_routing.lab.stage_fleet import preset_for
from prefix_routing.rules import sampling, telemetry
from prefix_routing.rules.errors import UserError


class ConfigurationError(ValueError):
    """An environment variable is missing or malformed (names the variable, the value, what is allowed)."""


@dataclass(frozen=True)
class AdvisorConfig:
    """What the stack puts in the function's environment (``from_env``)."""

    log_group: str
    component_name: str
    stage: str
    instance_type: str
    model: str  # the model id or S3 URI (its size, e.g. 70B, picks the preset)
    tensor_parallel_degree: int
    copies_per_instance: int
    copies_max: int
    prefix_length: int
    concurrency_threshold: int
    scaling_target: float = 1.0  # scaling.target_concurrent_requests_per_copy: the lowest threshold to advise
    topic_arn: str | None = None
    state_parameter: str | None = None
    namespace: str = telemetry.NAMESPACE
    window_s: float = 3600.0
    max_events: int = 100_000
    # "auto": the rate that reads about half of max_events, from the window's Requests metric; or a rate
    sample: float | str = "auto"
    notify: advisor.NotifySettings = field(default_factory=advisor.NotifySettings)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "AdvisorConfig":
        def text(name: str, default: str | None = None) -> str:
            value = env.get(name, default)
            if not value:
                raise ConfigurationError(f"{name}: missing; the stack sets it")
            return value

        def number(name: str, default, kind=float, low=0.0, high=math.inf):
            raw = env.get(name)
            if raw is None:
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise ConfigurationError(f"{name}: {raw!r} is not a{'n integer' if kind is int else ' number'}") from None
            if not low <= value <= high:
                raise ConfigurationError(f"{name}: {raw!r}; allowed: from {low:g} to {high:g}")
            return value

        try:
            notify = advisor.NotifySettings(
                gain_points=number("NOTIFY_GAIN_POINTS", 5.0), ttft_gain=number("NOTIFY_TTFT_GAIN", 0.20),
                after_runs=number("NOTIFY_AFTER_RUNS", 3, int, 1, 1000))
        except UserError as error:
            raise ConfigurationError(str(error)) from None
        return cls(
            log_group=text("REQUEST_LOG_GROUP"),
            component_name=text("INFERENCE_COMPONENT_NAME"),
            stage=text("STAGE"),
            instance_type=text("INSTANCE_TYPE"),
            model=text("MODEL"),
            tensor_parallel_degree=number("TENSOR_PARALLEL_DEGREE", 1, int, 1, 8),
            copies_per_instance=number("COPIES_PER_INSTANCE", 1, int, 1, 1024),
            copies_max=number("COPIES_MAX", 1, int, 1, 100_000),
            prefix_length=number("PREFIX_LENGTH", 4096, int, 1024, 65536),
            concurrency_threshold=number("CONCURRENCY_THRESHOLD", 1024, int, 1, 1024),
            scaling_target=number("SCALING_TARGET", 1.0, float, 0.0, 1024.0),
            topic_arn=env.get("ALARM_TOPIC_ARN") or None,
            state_parameter=env.get("STATE_PARAMETER") or None,
            namespace=env.get("METRIC_NAMESPACE") or telemetry.NAMESPACE,
            window_s=number("WINDOW_S", 3600.0, float, 60.0, 86_400.0),
            max_events=number("MAX_EVENTS", 100_000, int, 1, 10_000_000),
            sample=_sample_setting(env.get("SAMPLE")),
            notify=notify,
        )


def _sample_setting(raw: str | None) -> float | str:
    try:
        return "auto" if raw is None else parse_rate(raw)
    except UserError:
        raise ConfigurationError(f"SAMPLE: {raw!r}; allowed: auto, or a rate from {sampling.MIN_RATE} to 1") from None


@dataclass(frozen=True)
class Clients:
    """boto3 clients: logs, cloudwatch, sagemaker, sns and ssm."""

    logs: Any
    cloudwatch: Any
    sagemaker: Any
    sns: Any = None
    ssm: Any = None


def current_copies(cfg: AdvisorConfig, sagemaker: Any) -> int:
    """The copies serving now (``DescribeInferenceComponent``), else the stage's maximum."""
    try:
        runtime = sagemaker.describe_inference_component(InferenceComponentName=cfg.component_name)["RuntimeConfig"]
        copies = int(runtime.get("CurrentCopyCount") or 0)
    except Exception:  # noqa: BLE001 - the advice still holds at the stage's size; the run says so
        return cfg.copies_max
    return max(1, min(copies, cfg.copies_max)) if copies else cfg.copies_max


def window_requests(cfg: AdvisorConfig, cloudwatch: Any, start_ms: int, end_ms: int) -> float | None:
    """The requests the front door sent in the window (its ``Requests`` metric, summed), or None when
    CloudWatch has no figure (no data yet, or the call failed)."""
    try:
        points = cloudwatch.get_metric_statistics(
            Namespace=cfg.namespace, MetricName=telemetry.REQUESTS.name,
            Dimensions=[{"Name": telemetry.DIMENSION_COMPONENT, "Value": cfg.component_name}],
            StartTime=start_ms / 1000.0, EndTime=end_ms / 1000.0,
            Period=max(60, -(-(end_ms - start_ms) // 60_000) * 60), Statistics=["Sum"],  # one datapoint
        )["Datapoints"]
        total = math.fsum(float(p["Sum"]) for p in points)
    except Exception:  # noqa: BLE001 - without the volume the run reads unsampled, bounded by max_events
        return None
    return total if points and math.isfinite(total) else None


def sample_rate(cfg: AdvisorConfig, volume: float | None) -> float:
    """The rate the run reads at: the configured one, or (auto) the one that keeps about half of
    ``max_events`` of the window's volume (the rest is room for hot prefixes, which every sample
    reads, and for a busier window than the metric said); 1 when the volume is unknown."""
    if cfg.sample != "auto":
        return float(cfg.sample)
    return 1.0 if volume is None else sampling.rate_for_volume(volume, max(1, cfg.max_events // 2))


def read_window(cfg: AdvisorConfig, clients: Clients, start_ms: int, end_ms: int) -> tuple[traces.Trace, float, float | None]:
    """(the window, the rate it was read at, the window's volume): a sample at the source when the
    volume calls for it; a window with no line in the sample (a log written before the front door
    logged buckets) is read again whole."""
    volume = window_requests(cfg, clients.cloudwatch, start_ms, end_ms) if cfg.sample == "auto" else None
    rate = sample_rate(cfg, volume)
    unknown = cfg.sample == "auto" and volume is None
    read = partial(traces.read_cloudwatch, cfg.log_group, start_ms, end_ms, client=clients.logs,
                   max_events=cfg.max_events)
    if rate < 1.0:
        try:
            return read(sample_rate=rate), rate, volume
        except UserError:
            window = read()
            window.notes.append(f"no line matched the sample at rate {rate:g} (lines without "
                                f"{telemetry.LogField.SAMPLE_BUCKET!r}: written before the front door sampled): read whole")
            return window, 1.0, volume
    window = read()
    if unknown:
        window.notes.append(f"the window's {telemetry.REQUESTS.name} count was not available: read whole, up to "
                            f"{cfg.max_events:,} lines")
    return window, 1.0, volume


def run_once(cfg: AdvisorConfig, clients: Clients, now_ms: int) -> dict:
    """Advise on the window ending at ``now_ms``; publish, keep the rule's state, notify."""
    start_ms = now_ms - int(cfg.window_s * 1000)
    try:
        window, rate, volume = read_window(cfg, clients, start_ms, now_ms)
    except UserError as error:  # no requests in the window (or the log group is gone): nothing to advise on
        return {"advised": False, "reason": str(error)}
    copies = current_copies(cfg, clients.sagemaker)
    per = cfg.copies_per_instance
    fleet = FleetConfig(
        instances=max(1, -(-copies // per)), copies=per,
        preset=preset_for(cfg.instance_type, cfg.model, cfg.tensor_parallel_degree, stage=cfg.stage),
        prefix_length=cfg.prefix_length, concurrency_threshold=cfg.concurrency_threshold,
        block_tokens=window.block_tokens, block_bytes=window.block_bytes,
    )
    sampled = {"sample": rate, "presampled": True} if rate < 1.0 else {}
    advice = advisor.advise(window, fleet, settings=cfg.notify, min_threshold=cfg.scaling_target, **sampled)
    if volume is not None:
        advice["window"]["volume"] = volume  # the Requests metric's count, of which the window is a sample
    dimensions = [{"Name": telemetry.DIMENSION_COMPONENT, "Value": cfg.component_name}]
    clients.cloudwatch.put_metric_data(Namespace=cfg.namespace, MetricData=[
        {"MetricName": spec.name, "Dimensions": dimensions, "Value": float(value), "Unit": spec.unit,
         "Timestamp": now_ms / 1000.0}
        for spec, value in advisor.metric_values(advice)
    ])
    state = _load_state(cfg, clients.ssm)
    due, state = advisor.notify(advice, state, cfg.notify.after_runs)
    if cfg.state_parameter and clients.ssm is not None:
        clients.ssm.put_parameter(Name=cfg.state_parameter, Value=json.dumps(state), Type="String", Overwrite=True)
    if due and cfg.topic_arn and clients.sns is not None:
        best = advice["best"]
        clients.sns.publish(
            TopicArn=cfg.topic_arn,
            Subject=f"{cfg.stage}: routing advisor: PrefixLength {best['prefix_length']}, "
                    f"ConcurrencyThreshold {best['concurrency_threshold']} would pay"[:100],
            Message=advisor.render(advice),
        )
    return {"advised": True, "requests": len(window), "sample_rate": rate, "copies": copies, "better": advice["better"],
            "lost_tenants": advice.get("lost_tenants", []), "notified": due, "notes": list(window.notes), "skipped": window.skipped.as_dict(), "advice": advice}


def _load_state(cfg: AdvisorConfig, ssm: Any) -> dict | None:
    if not cfg.state_parameter or ssm is None:
        return None
    try:
        value = ssm.get_parameter(Name=cfg.state_parameter)["Parameter"]["Value"]
    except ssm.exceptions.ParameterNotFound:
        return None
    try:
        state = json.loads(value)
    except ValueError:
        return None  # not ours (the stack's placeholder, or edited by hand): start afresh
    return state if isinstance(state, dict) else None


def request_log_group(stack: str, *, region: str | None = None, cloudformation: Any = None) -> str:
    """The deployed stage's request log group: its Normalizer ``stack``'s ``RequestLogGroupName``
    output (``advise --stage`` without ``--log-group``)."""
    from botocore.exceptions import BotoCoreError, ClientError

    if cloudformation is None:
        import boto3

        cloudformation = boto3.client("cloudformation", region_name=region)
    try:
        (described,) = cloudformation.describe_stacks(StackName=stack)["Stacks"]
    except (ClientError, BotoCoreError) as error:
        raise UserError(f"stack {stack}: {error}; deploy it, or give --log-group or --log-file") from None
    outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
    if "RequestLogGroupName" not in outputs:
        raise UserError(f"stack {stack} has no RequestLogGroupName output (deployed before it existed): "
                        "give --log-group")
    return outputs["RequestLogGroupName"]
