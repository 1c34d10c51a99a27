"""The advisor function's configuration, copy reading, state and one run, with plain fakes for the AWS
clients (prefix_routing/advisor/function.py): which variable sets what, each variable's bounds, the
fleet the window is modelled on, what is published, kept and notified."""

from __future__ import annotations

import json

import pytest

from prefix_routing.advisor.function import (
    AdvisorConfig,
    Clients,
    ConfigurationError,
    _load_state,
    current_copies,
    run_once,
)
from prefix_routing.lab import advisor, traces
from prefix_routing.lab.advisor import NotifySettings
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.stage_fleet import preset_for
from prefix_routing.lab.traces import Trace
from prefix_routing.rules import telemetry
from prefix_routing.rules.errors import UserError

REQUIRED = {"REQUEST_LOG_GROUP": "/aws/lambda/normalizer", "INFERENCE_COMPONENT_NAME": "ic-1", "STAGE": "prod",
            "INSTANCE_TYPE": "ml.p5.48xlarge", "MODEL": "meta-llama/Llama-3.1-70B-Instruct"}
FULL = {**REQUIRED, "TENSOR_PARALLEL_DEGREE": "4", "COPIES_PER_INSTANCE": "2", "COPIES_MAX": "6",
        "PREFIX_LENGTH": "2048", "CONCURRENCY_THRESHOLD": "12", "SCALING_TARGET": "3.5",
        "ALARM_TOPIC_ARN": "arn:aws:sns:us-east-1:111122223333:alarms", "STATE_PARAMETER": "/advisor/state",
        "METRIC_NAMESPACE": "Custom", "WINDOW_S": "900", "MAX_EVENTS": "5000", "NOTIFY_GAIN_POINTS": "7.5",
        "NOTIFY_TTFT_GAIN": "0.3", "NOTIFY_AFTER_RUNS": "4"}


# ----------------------------------------------------------------------------- the configuration


def test_every_variable_sets_its_field():
    cfg = AdvisorConfig.from_env(FULL)
    assert cfg == AdvisorConfig(
        log_group="/aws/lambda/normalizer", component_name="ic-1", stage="prod", instance_type="ml.p5.48xlarge",
        model="meta-llama/Llama-3.1-70B-Instruct", tensor_parallel_degree=4, copies_per_instance=2, copies_max=6,
        prefix_length=2048, concurrency_threshold=12, scaling_target=3.5,
        topic_arn="arn:aws:sns:us-east-1:111122223333:alarms", state_parameter="/advisor/state", namespace="Custom",
        window_s=900.0, max_events=5000, notify=NotifySettings(gain_points=7.5, ttft_gain=0.3, after_runs=4))
    ints = (cfg.tensor_parallel_degree, cfg.copies_per_instance, cfg.copies_max, cfg.prefix_length,
            cfg.concurrency_threshold, cfg.max_events, cfg.notify.after_runs)
    assert all(type(v) is int for v in ints)
    assert all(type(v) is float for v in (cfg.scaling_target, cfg.window_s, cfg.notify.gain_points))


def test_unset_variables_take_their_defaults():
    cfg = AdvisorConfig.from_env(REQUIRED)
    assert (cfg.tensor_parallel_degree, cfg.copies_per_instance, cfg.copies_max) == (1, 1, 1)
    assert (cfg.prefix_length, cfg.concurrency_threshold, cfg.scaling_target) == (4096, 1024, 1.0)
    assert (cfg.topic_arn, cfg.state_parameter, cfg.namespace) == (None, None, telemetry.NAMESPACE)
    assert (cfg.window_s, cfg.max_events) == (3600.0, 100_000)
    assert cfg.notify == NotifySettings(gain_points=5.0, ttft_gain=0.20, after_runs=3)


def test_empty_optional_names_are_unset():
    cfg = AdvisorConfig.from_env({**REQUIRED, "ALARM_TOPIC_ARN": "", "STATE_PARAMETER": "", "METRIC_NAMESPACE": ""})
    assert (cfg.topic_arn, cfg.state_parameter, cfg.namespace) == (None, None, telemetry.NAMESPACE)


@pytest.mark.parametrize("name", sorted(REQUIRED))
@pytest.mark.parametrize("value", [None, ""])
def test_a_required_variable_missing_or_empty_is_named(name, value):
    env = {**REQUIRED}
    if value is None:
        del env[name]
    else:
        env[name] = value
    with pytest.raises(ConfigurationError, match=f"^{name}: missing; the stack sets it$"):
        AdvisorConfig.from_env(env)


BOUNDS = [  # (variable, field, lowest, highest, below, above, the allowed text)
    ("TENSOR_PARALLEL_DEGREE", "tensor_parallel_degree", "1", "8", "0", "9", "from 1 to 8"),
    ("COPIES_PER_INSTANCE", "copies_per_instance", "1", "1024", "0", "1025", "from 1 to 1024"),
    ("COPIES_MAX", "copies_max", "1", "100000", "0", "100001", "from 1 to 100000"),
    ("PREFIX_LENGTH", "prefix_length", "1024", "65536", "1023", "65537", "from 1024 to 65536"),
    ("CONCURRENCY_THRESHOLD", "concurrency_threshold", "1", "1024", "0", "1025", "from 1 to 1024"),
    ("SCALING_TARGET", "scaling_target", "0", "1024", "-0.5", "1024.5", "from 0 to 1024"),
    ("WINDOW_S", "window_s", "60", "86400", "59.9", "86401", "from 60 to 86400"),
    ("MAX_EVENTS", "max_events", "1", "10000000", "0", "10000001", "from 1 to 1e+07"),
]


@pytest.mark.parametrize("name, attribute, low, high, below, above, allowed", BOUNDS)
def test_each_number_is_bounded_inclusively(name, attribute, low, high, below, above, allowed):
    assert getattr(AdvisorConfig.from_env({**REQUIRED, name: low}), attribute) == float(low)
    assert getattr(AdvisorConfig.from_env({**REQUIRED, name: high}), attribute) == float(high)
    for raw in (below, above):
        with pytest.raises(ConfigurationError, match=f"^{name}: '{raw}'; allowed: {allowed}$".replace("+", r"\+")):
            AdvisorConfig.from_env({**REQUIRED, name: raw})


@pytest.mark.parametrize("name, raw, message", [
    ("COPIES_MAX", "4.0", "COPIES_MAX: '4.0' is not an integer"),
    ("TENSOR_PARALLEL_DEGREE", "eight", "TENSOR_PARALLEL_DEGREE: 'eight' is not an integer"),
    ("WINDOW_S", "an hour", "WINDOW_S: 'an hour' is not a number"),
    ("SCALING_TARGET", "", "SCALING_TARGET: '' is not a number"),
])
def test_a_value_that_is_no_number_is_named(name, raw, message):
    with pytest.raises(ConfigurationError, match=f"^{message}$"):
        AdvisorConfig.from_env({**REQUIRED, name: raw})


@pytest.mark.parametrize("name, raw, message", [
    ("NOTIFY_AFTER_RUNS", "1001", "NOTIFY_AFTER_RUNS: '1001'; allowed: from 1 to 1000"),
    ("NOTIFY_AFTER_RUNS", "0", "NOTIFY_AFTER_RUNS: '0'; allowed: from 1 to 1000"),
    ("NOTIFY_GAIN_POINTS", "-1", "NOTIFY_GAIN_POINTS: '-1'; allowed: from 0 to inf"),
    ("NOTIFY_GAIN_POINTS", "0", "advisor.notify_gain_points=0.0: allowed"),
    ("NOTIFY_TTFT_GAIN", "1", "advisor.notify_ttft_gain=1.0: allowed"),
])
def test_the_notification_settings_are_checked_as_configuration_errors(name, raw, message):
    with pytest.raises(ConfigurationError, match=message):
        AdvisorConfig.from_env({**REQUIRED, name: raw})
    assert AdvisorConfig.from_env({**REQUIRED, "NOTIFY_AFTER_RUNS": "1000"}).notify.after_runs == 1000


# ----------------------------------------------------------------------------- the copies serving now


class SageMaker:
    def __init__(self, runtime=None, error=None):
        self.runtime, self.error, self.asked = runtime, error, []

    def describe_inference_component(self, **kwargs):
        self.asked.append(kwargs)
        if self.error:
            raise self.error
        return {"InferenceComponentName": kwargs["InferenceComponentName"], "RuntimeConfig": self.runtime}


@pytest.mark.parametrize("runtime, copies", [
    ({"CurrentCopyCount": 1, "DesiredCopyCount": 3}, 1),
    ({"CurrentCopyCount": 5}, 5),
    ({"CurrentCopyCount": 6}, 6),
    ({"CurrentCopyCount": 9}, 6),  # more than the stage allows: its maximum
    ({"CurrentCopyCount": 0}, 6),  # scaled to zero: the advice holds at the stage's size
    ({"DesiredCopyCount": 2}, 6),
    ({"CurrentCopyCount": None}, 6),
])
def test_the_copies_serving_now_within_the_stages_maximum(runtime, copies):
    cfg = AdvisorConfig.from_env(FULL)
    sagemaker = SageMaker(runtime)
    assert current_copies(cfg, sagemaker) == copies
    assert sagemaker.asked == [{"InferenceComponentName": "ic-1"}]


def test_a_failed_reading_of_the_copies_is_the_stages_maximum():
    assert current_copies(AdvisorConfig.from_env(FULL), SageMaker(error=RuntimeError("denied"))) == 6


# ----------------------------------------------------------------------------- the rule's state


class SSM:
    class exceptions:  # noqa: N801 - boto3's shape
        class ParameterNotFound(Exception):
            pass

    def __init__(self, value=None):
        self.value, self.got, self.put = value, [], []

    def get_parameter(self, *, Name):
        self.got.append(Name)
        if self.value is None:
            raise self.exceptions.ParameterNotFound(Name)
        return {"Parameter": {"Name": Name, "Value": self.value}}

    def put_parameter(self, **kwargs):
        self.put.append(kwargs)


@pytest.mark.parametrize("value, state", [
    ('{"recommendation": [8192, 16], "runs": 2, "notified": null}',
     {"recommendation": [8192, 16], "runs": 2, "notified": None}),
    ("placeholder", None),  # the stack's placeholder: not JSON
    ("[1, 2]", None),  # JSON, not ours
    (None, None),  # no such parameter yet
])
def test_the_state_is_the_parameters_json_object_else_none(value, state):
    ssm = SSM(value)
    assert _load_state(AdvisorConfig.from_env(FULL), ssm) == state
    assert ssm.got == ["/advisor/state"]


def test_without_a_parameter_or_a_client_there_is_no_state():
    ssm = SSM('{"runs": 1}')
    assert _load_state(AdvisorConfig.from_env(REQUIRED), ssm) is None and ssm.got == []
    assert _load_state(AdvisorConfig.from_env(FULL), None) is None


# ----------------------------------------------------------------------------- one run


class Recorder:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda **kwargs: self.calls.append((name, kwargs)) or {}


ADVICE = {
    "window": {"source": "cloudwatch:g", "requests": 3, "duration_s": 2.0},
    "hit_rate_bound": 0.6, "prefix_reuse_share": 0.5, "measured_hit_rate": 0.4, "measured_above_bound": None,
    "current": {"prefix_length": 2048, "concurrency_threshold": 12, "predicted_hit_rate": 0.3, "ttft_p50_s": 1.0,
                "waited_share": 0.0, "timeouts": 0},
    "best": {"prefix_length": 8192, "concurrency_threshold": 16, "predicted_hit_rate": 0.5, "ttft_p50_s": 0.5,
             "waited_share": 0.0, "timeouts": 0},
    "kept_current": False, "gain_points": 20.0, "ttft_gain": 0.5, "better": True, "overloaded": None,
    "verdict": None, "snippet": "[routing]\nprefix_length = 8192\nconcurrency_threshold = 16\n",
}


def window() -> Trace:
    trace = Trace([0.0, 1.0, 2.0], [1024] * 3, [10] * 3, [[1], [1, 2], [3]], block_tokens=256, block_bytes=1024.0,
                  source="cloudwatch:g")
    trace.notes.append("read 3 events")
    return trace


@pytest.fixture
def run(monkeypatch):
    """run(env, state, copies, advice) -> (result, calls): one run_once with every call recorded."""
    def go(env=FULL, *, state=None, copies=5, advice=ADVICE, now_ms=1_800_000_000_000, read=None):
        calls = {"read": [], "advise": []}
        trace = window()

        def read_cloudwatch(group, start_ms, end_ms, **kwargs):
            calls["read"].append((group, start_ms, end_ms, kwargs))
            if read is not None:
                raise read
            return trace

        def advise(w, fleet, **kwargs):
            calls["advise"].append((w, fleet, kwargs))
            return advice

        monkeypatch.setattr(traces, "read_cloudwatch", read_cloudwatch)
        monkeypatch.setattr(advisor, "advise", advise)
        clients = Clients(logs=object(), cloudwatch=Recorder(), sagemaker=SageMaker({"CurrentCopyCount": copies}),
                          sns=Recorder(), ssm=SSM(None if state is None else json.dumps(state)))
        calls["clients"], calls["trace"] = clients, trace
        return run_once(AdvisorConfig.from_env(env), clients, now_ms), calls
    return go


def test_a_run_models_the_window_on_the_copies_serving_now(run):
    result, calls = run(copies=5)
    ((group, start, end, kwargs),) = calls["read"]
    assert (group, start, end) == ("/aws/lambda/normalizer", 1_800_000_000_000 - 900_000, 1_800_000_000_000)
    assert kwargs == {"client": calls["clients"].logs, "max_events": 5000}
    ((w, fleet, kwargs),) = calls["advise"]
    assert w is calls["trace"]
    # 5 copies, 2 per instance: 3 instances (the last one half full).
    assert fleet == FleetConfig(instances=3, copies=2, preset=preset_for("ml.p5.48xlarge", "70B", 4),
                                prefix_length=2048, concurrency_threshold=12, block_tokens=256, block_bytes=1024.0)
    assert kwargs == {"settings": NotifySettings(7.5, 0.3, 4), "min_threshold": 3.5}
    # (the stub has no Requests figure: the volume is unknown, so the window is read whole)
    assert result == {"advised": True, "requests": 3, "sample_rate": 1.0, "copies": 5, "better": True,
                      "lost_tenants": [], "notified": False,
                      "notes": ["read 3 events",
                                "the window's Requests count was not available: read whole, up to 5,000 lines"],
                      "skipped": calls["trace"].skipped.as_dict(), "advice": ADVICE}


def test_a_run_publishes_each_figure_once_with_the_component_and_the_time(run):
    _, calls = run()
    (volume, (name, kwargs)) = calls["clients"].cloudwatch.calls  # the window's volume first, then the figures
    assert volume[0] == "get_metric_statistics"
    assert name == "put_metric_data" and kwargs["Namespace"] == "Custom"
    assert kwargs["MetricData"] == [
        {"MetricName": spec.name, "Dimensions": [{"Name": telemetry.DIMENSION_COMPONENT, "Value": "ic-1"}],
         "Value": float(value), "Unit": spec.unit, "Timestamp": 1_800_000_000.0}
        for spec, value in advisor.metric_values(ADVICE)]
    assert [m["MetricName"] for m in kwargs["MetricData"]][-1] == telemetry.MEASURED_HIT_RATE.name


def test_the_runth_run_in_a_row_notifies_once_and_keeps_the_state(run):
    # NOTIFY_AFTER_RUNS 4: the state says 3 runs of the same advice; this is the fourth.
    result, calls = run(state={"recommendation": [8192, 16], "runs": 3, "notified": None})
    assert result["notified"] is True
    state = {"recommendation": [8192, 16], "runs": 4, "notified": [8192, 16]}
    assert calls["clients"].ssm.put == [{"Name": "/advisor/state", "Value": json.dumps(state), "Type": "String",
                                         "Overwrite": True}]
    ((name, kwargs),) = calls["clients"].sns.calls
    assert name == "publish"
    assert kwargs == {"TopicArn": "arn:aws:sns:us-east-1:111122223333:alarms",
                      "Subject": "prod: routing advisor: PrefixLength 8192, ConcurrencyThreshold 16 would pay",
                      "Message": advisor.render(ADVICE)}


def test_a_run_before_the_runth_keeps_the_count_and_notifies_nobody(run):
    result, calls = run(state={"recommendation": [8192, 16], "runs": 1, "notified": None})
    assert result["notified"] is False and calls["clients"].sns.calls == []
    assert json.loads(calls["clients"].ssm.put[0]["Value"]) == {"recommendation": [8192, 16], "runs": 2,
                                                                "notified": None}


def test_the_subject_is_cut_at_sns_s_100_characters(run):
    stage = "s" * 90
    result, calls = run({**FULL, "STAGE": stage, "NOTIFY_AFTER_RUNS": "1"})
    ((_, kwargs),) = calls["clients"].sns.calls
    assert kwargs["Subject"] == (stage + ": routing advisor: PrefixLength")[:100] and len(kwargs["Subject"]) == 100


def test_without_a_topic_or_a_state_parameter_nothing_is_sent_or_kept(run):
    env = {k: v for k, v in FULL.items() if k not in ("ALARM_TOPIC_ARN", "STATE_PARAMETER")}
    result, calls = run({**env, "NOTIFY_AFTER_RUNS": "1"})
    assert result["notified"] is True  # due, with nowhere to say it
    assert calls["clients"].sns.calls == [] and calls["clients"].ssm.put == [] and calls["clients"].ssm.got == []


def test_a_window_without_requests_advises_nothing_and_calls_nothing_else(run):
    result, calls = run(read=UserError("cloudwatch:g: no requests found"))
    assert result == {"advised": False, "reason": "cloudwatch:g: no requests found"}
    assert calls["advise"] == [] and calls["clients"].sagemaker.asked == []
    # the window's volume was asked for; nothing published
    assert [name for name, _ in calls["clients"].cloudwatch.calls] == ["get_metric_statistics"]
