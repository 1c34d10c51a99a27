"""The per-tenant limits' settings at their edges (prefix_routing.rules.limits): each bound on both
sides, the error that names the field, the compact JSON the stack puts in ``LIMITS`` and what
:meth:`LimitSettings.from_mapping` takes back. Expected values are hand-written from the module's
docstrings."""

from __future__ import annotations

import json

import pytest

from prefix_routing.rules.limits import (
    LimitSettings,
    TenantLimits,
    admission_refusal,
    token_estimate,
    window_admits,
    window_reset_s,
)


@pytest.mark.parametrize("name", ["requests_per_minute", "tokens_per_minute", "concurrent_streams"])
def test_each_limit_is_a_whole_number_from_one_to_a_billion(name):
    assert getattr(TenantLimits(**{name: 1}), name) == 1
    assert getattr(TenantLimits(**{name: 10**9}), name) == 10**9
    for bad, shown in ((0, "number 0"), (10**9 + 1, "number 1000000001"), (2.0, "number 2.0"), ("3", 'string "3"'),
                       (False, "false")):
        with pytest.raises(ValueError) as refused:
            TenantLimits(**{name: bad})
        assert str(refused.value) == f"limits.{name}: got {shown}; allowed: a whole number from 1 to 1000000000"


def test_over_takes_each_unset_limit_from_the_defaults():
    defaults = TenantLimits(requests_per_minute=10, tokens_per_minute=20, concurrent_streams=30)
    assert TenantLimits().over(defaults) == defaults
    assert TenantLimits(tokens_per_minute=5).over(defaults) == TenantLimits(10, 5, 30)
    assert TenantLimits(1, 2, 3).over(defaults) == TenantLimits(1, 2, 3)
    assert TenantLimits(concurrent_streams=7).over(TenantLimits()) == TenantLimits(concurrent_streams=7)


def test_as_dict_leaves_out_what_is_unset():
    assert TenantLimits().as_dict() == {}
    assert TenantLimits(tokens_per_minute=5, concurrent_streams=2).as_dict() == {"tokens_per_minute": 5,
                                                                                 "concurrent_streams": 2}


def test_the_settings_defaults():
    settings = LimitSettings()
    assert (settings.default, settings.tenants, settings.on_store_error, settings.store_timeout_ms,
            settings.lease_s, settings.default_max_tokens) == (TenantLimits(), (), "open", 50, 30, 1024)
    assert LimitSettings.from_mapping({}) == settings
    assert LimitSettings.from_mapping({"default": None, "tenants": None}) == settings


@pytest.mark.parametrize(("field", "low", "high"), [("store_timeout_ms", 5, 5000), ("lease_s", 10, 60)])
def test_timeouts_and_leases_are_bounded_on_both_sides(field, low, high):
    assert getattr(LimitSettings(**{field: low}), field) == low
    assert getattr(LimitSettings(**{field: high}), field) == high
    allowed = f"allowed: {low} to {high}"
    for bad, shown in ((low - 1, f"number {low - 1}"), (high + 1, f"number {high + 1}"), (float(low), f"number {low}.0")):
        with pytest.raises(ValueError) as refused:
            LimitSettings(**{field: bad})
        assert str(refused.value) == f"limits.{field}: got {shown}; {allowed}"


def test_both_store_error_modes_are_allowed():
    assert LimitSettings(on_store_error="closed").on_store_error == "closed"
    assert LimitSettings(on_store_error="open").on_store_error == "open"


def test_at_most_32_overrides():
    assert len(LimitSettings(tenants=tuple((f"t{i}", TenantLimits()) for i in range(32))).tenants) == 32
    with pytest.raises(ValueError) as refused:
        LimitSettings(tenants=tuple((f"t{i}", TenantLimits()) for i in range(33)))
    assert str(refused.value) == "limits.tenants: 33 overrides; allowed: at most 32"


def test_an_override_key_is_1_to_256_printable_characters():
    assert LimitSettings(tenants=(("x", TenantLimits()), ("y" * 256, TenantLimits()))).tenants[1][0] == "y" * 256
    for bad, shown in (("", 'string ""'), ("y" * 257, None), ("a\nb", 'string "a\\nb"'), (7, "number 7")):
        with pytest.raises(ValueError) as refused:
            LimitSettings(tenants=(("ok", TenantLimits()), (bad, TenantLimits())))
        message = str(refused.value)
        assert message.startswith("limits.tenants: key ")
        assert message.endswith("; allowed: a tenant id or pattern of 1-256 printable characters")
        if shown is not None:
            assert message == f"limits.tenants: key {shown}; allowed: a tenant id or pattern of 1-256 printable characters"


def test_enabled_when_the_defaults_or_any_override_limits():
    assert not LimitSettings(tenants=(("a", TenantLimits()),)).enabled
    assert LimitSettings(tenants=(("a", TenantLimits()), ("b", TenantLimits(concurrent_streams=1)))).enabled
    assert LimitSettings(default=TenantLimits(tokens_per_minute=1)).enabled


def test_patterns_are_shell_patterns_and_case_sensitive():
    settings = LimitSettings(tenants=(("team-?", TenantLimits(concurrent_streams=1)),
                                      ("[xy]*", TenantLimits(concurrent_streams=2)),
                                      ("Batch", TenantLimits(concurrent_streams=3)),
                                      ("[mn]?*", TenantLimits(concurrent_streams=4))))
    assert settings.for_tenant("team-7") == ("team-?", TenantLimits(concurrent_streams=1))
    assert settings.for_tenant("team-77") == ("default", TenantLimits())
    assert settings.for_tenant("yak") == ("[xy]*", TenantLimits(concurrent_streams=2))
    assert settings.for_tenant("batch") == ("default", TenantLimits())  # "Batch" is an id, and case counts
    assert settings.for_tenant("Batch") == ("Batch", TenantLimits(concurrent_streams=3))
    assert settings.for_tenant("m1xyz") == ("[mn]?*", TenantLimits(concurrent_streams=4))  # all three wildcards


def test_the_environment_form_is_compact_sorted_json():
    settings = LimitSettings(default=TenantLimits(requests_per_minute=600, concurrent_streams=4),
                             tenants=(("b*", TenantLimits(concurrent_streams=1)), ("a", TenantLimits())),
                             on_store_error="closed", store_timeout_ms=80, lease_s=15, default_max_tokens=64)
    assert settings.to_json() == (
        '{"default":{"concurrent_streams":4,"requests_per_minute":600},"default_max_tokens":64,"lease_s":15,'
        '"on_store_error":"closed","store_timeout_ms":80,"tenants":[["b*",{"concurrent_streams":1}],["a",{}]]}')
    assert LimitSettings().to_json() == ('{"default":{},"default_max_tokens":1024,"lease_s":30,"on_store_error":"open",'
                                         '"store_timeout_ms":50}')
    assert LimitSettings.from_mapping(json.loads(settings.to_json())) == settings


@pytest.mark.parametrize(("data", "message"), [
    ([], "limits: not an object"),
    ({"default": {}, "lease": 1, "x": 2}, "limits: unknown keys ['lease', 'x']"),
    ({"tenants": {"a": {}}}, "limits.tenants: not a list of [pattern, limits]"),
    ({"tenants": [["a", {}, {}]]}, "limits.tenants: not a list of [pattern, limits]"),
    ({"tenants": [["a", {}], ("b", {})]}, "limits.tenants: not a list of [pattern, limits]"),
    ({"default": [1]}, "limits: a list of 1 item; allowed: an object of requests_per_minute, tokens_per_minute, "
                       "concurrent_streams"),
    ({"tenants": [["a", {"streams": 1}]]}, "limits: an object with 1 key; allowed: an object of "
                                           "requests_per_minute, tokens_per_minute, concurrent_streams"),
])
def test_from_mapping_names_what_is_wrong(data, message):
    with pytest.raises(ValueError) as refused:
        LimitSettings.from_mapping(data)
    assert str(refused.value) == message


def test_from_mapping_reads_every_field():
    settings = LimitSettings.from_mapping({"default": {"tokens_per_minute": 9}, "tenants": [["a*", {"concurrent_streams": 2}]],
                                           "on_store_error": "closed", "store_timeout_ms": 70, "lease_s": 40,
                                           "default_max_tokens": 5})
    assert settings == LimitSettings(default=TenantLimits(tokens_per_minute=9),
                                     tenants=(("a*", TenantLimits(concurrent_streams=2)),),
                                     on_store_error="closed", store_timeout_ms=70, lease_s=40, default_max_tokens=5)


def test_the_minute_and_the_estimate_at_their_edges():
    assert window_reset_s(0.0) == 60 and window_reset_s(59.0) == 1 and window_reset_s(30.5) == 30
    assert token_estimate(4) == 1 and token_estimate(7) == 1 and token_estimate(8) == 2


def test_each_limit_refuses_exactly_at_its_bound():
    assert window_admits(TenantLimits(requests_per_minute=3), 2, 0, 1) is None
    assert window_admits(TenantLimits(requests_per_minute=3), 3, 0, 1) == "requests_per_minute"
    assert window_admits(TenantLimits(tokens_per_minute=100), 0, 60, 40) is None
    assert window_admits(TenantLimits(tokens_per_minute=100), 0, 61, 40) == "tokens_per_minute"
    assert window_admits(TenantLimits(tokens_per_minute=100), 0, 60, 41) == "tokens_per_minute"
    streams = TenantLimits(concurrent_streams=2)
    assert admission_refusal(streams, 1, 10**6, 10**9, 10**9) is None
    assert admission_refusal(streams, 2, 0, 0, 1) == "concurrent_streams"
    assert admission_refusal(TenantLimits(), 10**6, 10**6, 10**9, 10**9) is None
    # the minute's tokens refuse before the streams
    assert admission_refusal(TenantLimits(tokens_per_minute=10, concurrent_streams=1), 1, 0, 10, 1) == "tokens_per_minute"
