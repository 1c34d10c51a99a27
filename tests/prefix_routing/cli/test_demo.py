"""A small demo run: the direction of the published result, and normalization's share in it."""

import tomllib

import pytest

from prefix_routing.cli.demo_run import _toml, demo_stage, long_context_workload_for_demo, render_table, run_case
from prefix_routing.stage.config import parse_stage


def test_stage_round_trips_through_toml():
    stage = demo_stage("ml.p5.48xlarge", 7, strategy="PREFIX_AWARE", prefix_length=4096, threshold=10)
    assert parse_stage(tomllib.loads(_toml(stage.model_dump(mode="json", exclude_unset=True))), source="t") == stage


@pytest.fixture(scope="module")
def long_context_results():
    results = {}
    for strategy in ("RANDOM", "PREFIX_AWARE"):
        workload = long_context_workload_for_demo(150, 20.0, strategy, seed=0)
        for client in ("varied", "normalized") + (("front door",) if strategy == "PREFIX_AWARE" else ()):
            results[strategy, client] = run_case(workload, client, concurrency=16, seed=0)
    return results


def test_every_request_is_served(long_context_results):
    # The front door's case too: 16 clients under a limit of 16 streams per tenant are never refused.
    for result in long_context_results.values():
        assert result.sent == result.succeeded == 150


def test_prefix_aware_with_normalization_beats_random(long_context_results):
    prefix = long_context_results["PREFIX_AWARE", "normalized"]
    random = long_context_results["RANDOM", "normalized"]
    assert prefix.hit_rate > random.hit_rate + 0.2
    assert prefix.ttft_p50_ms < 0.6 * random.ttft_p50_ms


def test_normalization_recovers_what_client_variation_destroys(long_context_results):
    varied = long_context_results["PREFIX_AWARE", "varied"]
    normalized = long_context_results["PREFIX_AWARE", "normalized"]
    assert normalized.hit_rate > varied.hit_rate + 0.2
    table = render_table(list(long_context_results.values()))
    assert table.count("\n") == 2 + 5 and "PREFIX_AWARE | normalized | 150 / 150" in table


def test_the_front_door_normalizes_for_careless_clients(long_context_results):
    varied = long_context_results["PREFIX_AWARE", "varied"]
    through_front_door = long_context_results["PREFIX_AWARE", "front door"]
    assert through_front_door.hit_rate > varied.hit_rate + 0.2


def test_without_the_shared_trace_the_demo_replays_the_slice_in_tests_data_and_says_so(monkeypatch, tmp_path):
    from prefix_routing.cli import demo_run

    said = []
    monkeypatch.setattr(demo_run, "CONVERSATION_TRACE", tmp_path / "absent.jsonl")
    assert demo_run.conversation_trace(said.append) == demo_run.CONVERSATION_SLICE
    assert demo_run.CONVERSATION_SLICE.is_file() and len(said) == 1 and str(demo_run.CONVERSATION_SLICE) in said[0]
    workload = demo_run.conversation_workload(5, 20.0, "PREFIX_AWARE", demo_run.CONVERSATION_SLICE)
    assert len(workload.items) == 5


def test_every_option_of_demo_and_emulate_shows_its_default():
    import argparse

    from prefix_routing.cli import demo, emulate, main

    for module in (demo, emulate):
        parser = main._Parser(prog="x", formatter_class=main._DefaultsFormatter)
        module.add_arguments(parser)
        formatter = parser._get_formatter()
        for action in parser._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                assert action.help and "default" in formatter._get_help_string(action), action.option_strings
