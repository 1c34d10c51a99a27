"""The command line's values and their bounds, one parser at a time (prefix_routing/cli): ages,
ranged integers, positive numbers, cache sizes, similarity, cache-ram, times, load steps, headers,
and autoscaling and replication settings from the flags and the stage."""

from __future__ import annotations

import argparse
import calendar
import json
import math
from argparse import ArgumentTypeError

import pytest

from prefix_routing.cli import advise, emulate, flag_values, lab_args
from prefix_routing.cli import loadtest as loadtest_cli
from prefix_routing.lab.autoscaling import AutoscalingSettings
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.replication import ReplicationSettings
from prefix_routing.stage.config import DEFAULT_STAGE_DATA, parse_stage


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("1h", 3600), ("2d", 172_800),
                                           (" 1.5 h ", 5400), ("0.5m", 30)])
def test_an_age_is_a_number_and_a_unit(text, seconds):
    assert advise.parse_age(text) == seconds


@pytest.mark.parametrize("text", ["0m", "0.0h", "1w", "h", "", None, "-1h", "1 hour"])
def test_an_age_that_is_not_positive_or_has_no_unit_is_refused(text):
    with pytest.raises(UserError, match=r"^--since .*: expected a positive age such as 30m, 1h or 2d$"):
        advise.parse_age(text)


def test_a_ranged_integer_takes_its_bounds_and_names_them():
    parse = flag_values.ranged_int("--copies", 1, 10)
    assert (parse("1"), parse("10")) == (1, 10)
    for text, message in (("0", "0: must be from 1 to 10"), ("11", "11: must be from 1 to 10"),
                          ("2.5", "'2.5' is not an integer (allowed: 1 to 10)")):
        with pytest.raises(ArgumentTypeError, match=f"^{re_escape(message)}$"):
            parse(text)


def test_a_positive_number_is_finite_and_above_zero():
    parse = flag_values.positive_float("--rate")
    assert parse("0.25") == 0.25 and parse("1e3") == 1000.0
    for text, message in (("0", "0: must be a number > 0"), ("-2", "-2: must be a number > 0"),
                          ("inf", "inf: must be a number > 0"), ("nan", "nan: must be a number > 0"),
                          ("fast", "'fast' is not a number")):
        with pytest.raises(ArgumentTypeError, match=f"^{re_escape(message)}$"):
            parse(text)


@pytest.mark.parametrize("text, tokens", [("infinite", math.inf), (" INF ", math.inf), ("unbounded", math.inf),
                                          ("500000", 500_000), ("500k", 500_000), ("1.4M", 1_400_000),
                                          ("2m", 2_000_000), ("0", 0)])
def test_a_cache_size_is_a_token_count_with_k_or_m_or_infinite(text, tokens):
    assert flag_values.parse_cache_tokens(text) == tokens


@pytest.mark.parametrize("text, message", [("-1", "'-1': must be >= 0"), ("nan", "'nan': must be >= 0"),
                                           ("lots", "'lots': takes a token count (e.g. 500k) or 'infinite'"),
                                           ("k", "'k': takes a token count")])
def test_a_cache_size_that_is_no_count_is_refused(text, message):
    with pytest.raises(ArgumentTypeError, match=f"^{re_escape(message)}"):
        flag_values.parse_cache_tokens(text)


def test_slot_similarity_is_a_fraction_from_zero_to_one():
    assert [flag_values.similarity(t) for t in ("0", "0.1", "1")] == [0.0, 0.1, 1.0]
    for text, message in (("1.01", "1.01: must be from 0 to 1 (0 = off)"), ("-0.1", "-0.1: must be from 0 to 1"),
                          ("half", "'half' is not a number (allowed: 0 to 1)")):
        with pytest.raises(ArgumentTypeError, match=f"^{re_escape(message)}"):
            flag_values.similarity(text)


def test_cache_ram_is_mib_or_zero_or_minus_one():
    assert [flag_values.cache_ram(t) for t in ("-1", "0", "64", "0.5")] == [-1.0, 0.0, 64.0, 0.5]
    for text, message in (("-2", "-2: must be MiB >= 0 (0 = off) or -1 (no limit)"), ("-0.5", "-0.5: must be"),
                          ("inf", "inf: must be"), ("lots", "'lots' is not a number of MiB (0 = off, -1 = no limit)")):
        with pytest.raises(ArgumentTypeError, match=f"^{re_escape(message)}"):
            flag_values.cache_ram(text)


def test_a_time_is_epoch_milliseconds_or_iso_8601_in_utc_unless_it_says_otherwise():
    ten = calendar.timegm((2026, 11, 30, 10, 0, 0)) * 1000
    assert flag_values.time_ms(None, 42) == 42
    assert flag_values.time_ms("1796032800000", 0) == 1_796_032_800_000
    assert flag_values.time_ms("2026-11-30T10:00:00Z", 0) == ten
    assert flag_values.time_ms("2026-11-30T10:00:00", 0) == ten  # no zone: UTC
    assert flag_values.time_ms("2026-11-30T11:00:00+01:00", 0) == ten
    assert flag_values.time_ms("2026-11-30T10:00:00.250Z", 0) == ten + 250
    with pytest.raises(UserError, match=r"^time 'yesterday': use ISO 8601 \(2026-11-30T10:00:00Z\) or epoch"):
        flag_values.time_ms("yesterday", 0)


def test_a_load_step_is_seconds_and_a_factor():
    assert flag_values.load_step("1800:3") == (1800.0, 3.0)
    assert flag_values.load_step("0:0.5") == (0.0, 0.5)
    for text, message in (("1800", "expected SECONDS:FACTOR, e.g. 1800:3"), ("a:3", "expected SECONDS:FACTOR"),
                          ("-1:3", "needs SECONDS >= 0 and FACTOR > 0"), ("60:0", "needs SECONDS >= 0 and FACTOR > 0")):
        with pytest.raises(UserError, match=f"^--load-step '{re_escape(text)}': {re_escape(message)}"):
            flag_values.load_step(text)


def test_a_load_tester_number_has_its_kind_and_its_floor():
    at_least = loadtest_cli._number(int, "--concurrency", low=1)
    assert at_least("1") == 1 and isinstance(at_least("7"), int)
    above = loadtest_cli._number(float, "--rate", low=0, strict_low=True)
    assert above("0.5") == 0.5
    free = loadtest_cli._number(float, "--offset")
    assert free("-3") == -3.0
    for parse, text, message in (
            (at_least, "0", "--concurrency '0': must be >= 1"), (above, "0", "--rate '0': must be > 0"),
            (at_least, "1.5", "--concurrency '1.5': not an integer"), (above, "x", "--rate 'x': not a number"),
            (above, "inf", "--rate 'inf': not a finite number"), (free, "nan", "--offset 'nan': not a finite number"),
            (free, "-inf", "--offset '-inf': not a finite number")):
        with pytest.raises(ArgumentTypeError, match=f"^{re_escape(message)}$"):
            parse(text)


def test_headers_are_name_colon_value():
    assert loadtest_cli._headers(["X-Tenant: a", "x-trace:b:c ", "Empty:"]) == {
        "X-Tenant": "a", "x-trace": "b:c", "Empty": ""}
    assert loadtest_cli._headers([]) == {}
    for value, message in (("no colon", "expected 'NAME: VALUE'"), (": v", "expected 'NAME: VALUE'"),
                           ("Bad Name: v", "expected 'NAME: VALUE'"), ("X: a\r\nY: b", "line breaks are not allowed"),
                           ("X: a\nb", "line breaks are not allowed")):
        with pytest.raises(UserError, match=re_escape(message)):
            loadtest_cli._headers([value])


def test_an_emulator_number_is_above_zero():
    assert emulate._number("--speed", "2.5") == 2.5
    with pytest.raises(UserError, match=r"^--speed '0': must be > 0$"):
        emulate._number("--speed", "0")
    with pytest.raises(UserError, match=r"^--speed 'nan': must be > 0$"):
        emulate._number("--speed", "nan")
    with pytest.raises(UserError, match=r"^--speed 'fast': not a number$"):
        emulate._number("--speed", "fast")


# ----------------------------------------------------------------------------- autoscaling and replication


def args(**values) -> argparse.Namespace:
    return argparse.Namespace(**values)


def stage(**sections):
    data = json.loads(json.dumps(DEFAULT_STAGE_DATA))
    for section, fields in sections.items():
        data.setdefault(section, {}).update(fields)
    return parse_stage(data, source="test")


def with_stage(config, **values) -> argparse.Namespace:
    namespace = args(stage=config.name, **values)
    namespace._stage_config = config  # what stage_from_args keeps once it has loaded the stage
    return namespace


def test_autoscaling_is_off_unless_asked():
    assert lab_args.autoscaling_from_args(args(), 8) is None
    assert lab_args.autoscaling_from_args(args(autoscaling="off"), 8) is None


def test_autoscaling_on_scales_up_to_the_fleet_with_the_flags_settings():
    assert lab_args.autoscaling_from_args(args(autoscaling="on"), 6) == AutoscalingSettings(max_copies=6)
    got = lab_args.autoscaling_from_args(args(autoscaling="on", autoscaling_target=2.5, autoscaling_min=2,
                                              copy_startup_s=90.0), 6)
    assert got == AutoscalingSettings(target_per_copy=2.5, min_copies=2, max_copies=6, startup_s=90.0)
    assert lab_args.autoscaling_from_args(args(autoscaling="on", autoscaling_min=9), 4).min_copies == 4


@pytest.mark.parametrize("flag, attribute", [("--autoscaling-target", "autoscaling_target"),
                                             ("--autoscaling-min", "autoscaling_min"),
                                             ("--copy-startup-s", "copy_startup_s")])
def test_an_autoscaling_flag_without_autoscaling_is_an_error(flag, attribute):
    with pytest.raises(UserError, match=f"^{flag} needs --autoscaling on$"):
        lab_args.autoscaling_from_args(args(**{attribute: 3}), 8)


def test_a_stage_with_room_to_scale_brings_its_own_autoscaling():
    # The default stage: copies 2 to 3, target 4, cooldowns 60/300 s, hotspot factor 2.
    config = stage()
    got = lab_args.autoscaling_from_args(with_stage(config), 8)
    assert got == AutoscalingSettings(target_per_copy=4.0, min_copies=2, max_copies=3, scale_out_cooldown_s=60,
                                      scale_in_cooldown_s=300, hotspot_factor=2.0)
    assert lab_args.autoscaling_from_args(with_stage(config), 2).max_copies == 2  # the fleet is smaller
    assert lab_args.autoscaling_from_args(with_stage(config, autoscaling="off"), 8) is None


def test_a_stage_with_fixed_copies_refuses_autoscaling_flags_and_says_why():
    config = stage(endpoint={"copies_min": 3, "copies_max": 3})
    assert lab_args.autoscaling_from_args(with_stage(config), 8) is None
    with pytest.raises(UserError, match=r"^--autoscaling-min needs --autoscaling on \(stage default has fixed copies\)$"):
        lab_args.autoscaling_from_args(with_stage(config, autoscaling_min=1), 8)


def test_the_stages_autoscaling_is_not_modelled_with_llama_cpp_slots():
    namespace = with_stage(stage(), cache_policy="llamacpp-slots")
    assert lab_args.autoscaling_from_args(namespace, 8) is None
    assert namespace._autoscaling_note.startswith("the stage's copy autoscaling is not modelled with llamacpp-slots")
    assert lab_args.autoscaling_from_args(with_stage(stage(), cache_policy="vllm-blocks"), 8) is not None
    flagged = with_stage(stage(), cache_policy="llamacpp-slots", autoscaling_target=2.0)
    assert lab_args.autoscaling_from_args(flagged, 8).target_per_copy == 2.0  # asked for: modelled


def test_replication_is_off_unless_asked_or_the_stage_has_it():
    assert lab_args.replication_from_args(args()) is None
    assert lab_args.replication_from_args(args(replication="on")) == ReplicationSettings(enabled=True)
    got = lab_args.replication_from_args(args(replication="on", replication_target_share=0.5,
                                              replication_max_replicas=4))
    assert got == ReplicationSettings(enabled=True, target_share_factor=0.5, max_replicas=4)


@pytest.mark.parametrize("attribute, flag", [("replication_target_share", "--replication-target-share"),
                                             ("replication_max_replicas", "--replication-max-replicas")])
def test_a_replication_flag_without_replication_is_an_error(attribute, flag):
    with pytest.raises(UserError, match=f"^{flag} needs --replication on$"):
        lab_args.replication_from_args(args(**{attribute: 2}))
    with pytest.raises(UserError, match=f"^{flag} needs --replication on \\(stage default has it off\\)$"):
        lab_args.replication_from_args(with_stage(stage(), **{attribute: 2}))


def test_the_stages_replication_and_a_bad_value_from_the_flags():
    config = stage(normalizer={"replication": {"enabled": True, "max_replicas": 8, "target_share_factor": 2.0}})
    got = lab_args.replication_from_args(with_stage(config))
    assert (got.enabled, got.max_replicas, got.target_share_factor) == (True, 8, 2.0)
    assert lab_args.replication_from_args(with_stage(config, replication="off")) is None
    with pytest.raises(UserError, match="replication.max_replicas: got number 100"):
        lab_args.replication_from_args(args(replication="on", replication_max_replicas=100))


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_the_mooncake_trace_absent_its_slice_is_read_and_said(tmp_path, capsys):
    from prefix_routing.cli.trace_args import CONVERSATION_SLICE, trace_or_slice

    missing = str(tmp_path / "traces" / "conversation_trace.jsonl")
    assert trace_or_slice(missing) == str(CONVERSATION_SLICE)
    assert "is absent (the Mooncake conversation trace" in capsys.readouterr().err
    present = tmp_path / "conversation_trace.jsonl"
    present.write_text("{}\n")
    assert trace_or_slice(str(present)) == str(present)  # there: read as it is
    assert trace_or_slice(str(tmp_path / "other.jsonl")) == str(tmp_path / "other.jsonl")  # another name: its error
    assert capsys.readouterr().err == ""
