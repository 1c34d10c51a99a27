"""The per-tenant limit rule (prefix_routing.rules.limits): which limits apply, the minute's
arithmetic, the estimate, which limit refuses, and the settings' round trip. Hand-computed values."""

from __future__ import annotations

import pytest

from prefix_routing.rules.limits import (
    LimitSettings,
    TenantLimits,
    admission_refusal,
    token_estimate,
    window_admits,
    window_of,
    window_reset_s,
)

BATCH = "arn:aws:iam::111122223333:role/Batch*"


def settings() -> LimitSettings:
    return LimitSettings(
        default=TenantLimits(requests_per_minute=600, concurrent_streams=4),
        tenants=((BATCH, TenantLimits(concurrent_streams=1)),
                 ("arn:aws:iam::111122223333:role/BatchPriority", TenantLimits(concurrent_streams=8)),
                 ("*", TenantLimits(tokens_per_minute=100_000))),
    )


def test_a_tenants_own_id_wins_then_the_first_matching_pattern_then_the_defaults():
    rules = settings()
    # exact id first, although the pattern before it matches too
    assert rules.for_tenant("arn:aws:iam::111122223333:role/BatchPriority") == (
        "arn:aws:iam::111122223333:role/BatchPriority", TenantLimits(600, None, 8))
    # the first pattern in file order; unset fields are the defaults'
    assert rules.for_tenant("arn:aws:iam::111122223333:role/BatchJobs") == (BATCH, TenantLimits(600, None, 1))
    assert rules.for_tenant("anyone") == ("*", TenantLimits(600, 100_000, 4))
    plain = LimitSettings(default=TenantLimits(requests_per_minute=5))
    assert plain.for_tenant("anyone") == ("default", TenantLimits(requests_per_minute=5))
    assert not LimitSettings().enabled and plain.enabled


def test_the_minute_and_its_reset():
    assert window_of(119.9) == 1 and window_of(120.0) == 2
    assert window_reset_s(120.0) == 60 and window_reset_s(179.2) == 1 and window_reset_s(179.99) == 1


def test_the_estimate_is_a_quarter_of_the_bytes_at_least_one():
    assert token_estimate(2000) == 500 and token_estimate(3) == 1 and token_estimate(0) == 1


def test_which_limit_refuses():
    limits = TenantLimits(requests_per_minute=10, tokens_per_minute=1000, concurrent_streams=2)
    assert admission_refusal(limits, 1, 9, 500, 500) is None  # 10th request, exactly 1000 tokens, 2nd stream
    assert admission_refusal(limits, 1, 10, 0, 1) == "requests_per_minute"
    assert admission_refusal(limits, 1, 0, 501, 500) == "tokens_per_minute"
    assert admission_refusal(limits, 2, 0, 0, 1) == "concurrent_streams"
    # over a minute's limit and the streams at once: the minute's is named (its Retry-After is the longer)
    assert admission_refusal(limits, 2, 10, 0, 1) == "requests_per_minute"
    assert window_admits(TenantLimits(concurrent_streams=1), 10**6, 10**9, 10**9) is None  # no minute limits


def test_settings_travel_as_json_and_come_back_equal():
    rules = settings()
    assert LimitSettings.from_mapping(__import__("json").loads(rules.to_json())) == rules


@pytest.mark.parametrize(("build", "message"), [
    (lambda: TenantLimits(requests_per_minute=0), "limits.requests_per_minute: got number 0; allowed: a whole number from 1 to 1000000000"),
    (lambda: TenantLimits(concurrent_streams=True), "limits.concurrent_streams"),
    (lambda: LimitSettings(on_store_error="ignore"), 'limits.on_store_error: got string "ignore"; allowed: open or closed'),
    (lambda: LimitSettings(store_timeout_ms=1), "limits.store_timeout_ms"),
    (lambda: LimitSettings(lease_s=5), "limits.lease_s"),
    (lambda: LimitSettings(tenants=(("a b", TenantLimits()),) * 33), "limits.tenants: 33 overrides"),
    (lambda: LimitSettings.from_mapping({"default": {"rpm": 1}}), "allowed: an object of requests_per_minute"),
])
def test_bad_settings_name_the_field_and_what_is_allowed(build, message):
    with pytest.raises(ValueError) as refused:
        build()
    assert message in str(refused.value)
