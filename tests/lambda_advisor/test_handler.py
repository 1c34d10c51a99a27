"""The advisor Lambda's handler: configuration from the environment, one run, one summary line."""

from __future__ import annotations

import importlib.util
import json

import pytest

from prefix_routing.advisor.function import ConfigurationError
from tests.prefix_routing.advisor.test_function import ENV

HANDLER = __import__("pathlib").Path(__file__).resolve().parents[2] / "lambda" / "advisor" / "handler.py"


@pytest.fixture
def handler_module(monkeypatch):
    # Loaded under its own name: the normalizer's handler is also a module called "handler".
    spec = importlib.util.spec_from_file_location("advisor_handler", HANDLER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "_make_clients", lambda: "clients")
    return module


def test_a_run_logs_and_returns_its_summary_without_the_whole_advice(handler_module, monkeypatch, capsys):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    seen = {}

    def fake_run(config, clients, now_ms):
        seen.update(config=config, clients=clients, now_ms=now_ms)
        advice = {"current": {"prefix_length": 1024}, "best": {"prefix_length": 8192}, "gain_points": 20.0,
                  "measured_hit_rate": 0.1, "points": list(range(1000))}
        return {"advised": True, "requests": 300, "better": True, "notified": False, "notes": [], "advice": advice}

    monkeypatch.setattr(handler_module, "run_once", fake_run)
    summary = handler_module.handler({"source": "aws.events"}, None)
    assert seen["config"].log_group == ENV["REQUEST_LOG_GROUP"] and seen["clients"] == "clients"
    assert seen["now_ms"] > 1_700_000_000_000
    assert summary == {"advised": True, "requests": 300, "better": True, "notified": False, "notes": [],
                       "current": {"prefix_length": 1024}, "best": {"prefix_length": 8192}, "gain_points": 20.0,
                       "measured_hit_rate": 0.1}
    line = json.loads(capsys.readouterr().out.strip())
    assert line["message"] == "prefix_routing.advisor" and "advice" not in line


def test_a_missing_variable_fails_the_run_with_its_name(handler_module, monkeypatch):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("REQUEST_LOG_GROUP")
    with pytest.raises(ConfigurationError, match="REQUEST_LOG_GROUP: missing"):
        handler_module.handler({}, None)
