"""What a request is charged up front under ``tokens_per_minute``: its prompt estimate plus the most
output it asks for. Expected values are hand computations from rules/limits.py's docstring and the
fields' meanings in OpenAI's and vLLM's request models (``max_completion_tokens or max_tokens``; ``n``
and ``best_of`` answers each up to it) and LMI/TGI's ``parameters.max_new_tokens``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefix_routing.rules.limits import (
    MAX_LIMIT,
    admission_charge,
    renewal_interval_s,
    requested_output_tokens,
)


@pytest.mark.parametrize(("body", "expected"), [
    ({"messages": [], "max_tokens": 300}, 300),
    ({"prompt": "x", "max_completion_tokens": 200, "max_tokens": 900}, 200),  # vLLM: max_completion_tokens first
    ({"prompt": "x", "max_completion_tokens": None, "max_tokens": 900}, 900),  # null: not set
    ({"inputs": "x", "parameters": {"max_new_tokens": 64}}, 64),
    ({"prompt": "x", "max_tokens": 100, "n": 3}, 300),  # three answers, each up to 100
    ({"prompt": "x", "max_tokens": 100, "n": 2, "best_of": 5}, 500),  # best_of generates 5
    ({"prompt": "x", "max_tokens": 100, "n": 0}, 100),  # not a count of answers: one
    ({"prompt": "x", "max_tokens": 100, "n": True}, 100),
    ({"prompt": "x", "max_tokens": 50.0}, 50),  # a whole float, as the engines' lax models take it
    ({"prompt": "x", "max_tokens": 50.5}, None),  # refused by the engine: the stage's default is charged
    ({"prompt": "x", "max_tokens": "50"}, None),
    ({"prompt": "x", "max_tokens": 0}, None),
    ({"prompt": "x", "max_tokens": -5}, None),
    ({"prompt": "x", "max_tokens": True}, None),
    ({"prompt": "x", "max_completion_tokens": "many", "max_tokens": 70}, 70),  # the first count of the three
    ({"prompt": "x", "parameters": [1]}, None),
    ({"prompt": "x"}, None),
    ([1, 2], None),
    ("max_tokens", None),
])
def test_the_output_a_body_asks_for(body, expected):
    assert requested_output_tokens(body) == expected


def test_an_enormous_ask_is_bounded_and_can_never_fit_a_minute():
    assert requested_output_tokens({"max_tokens": 10**30}) == MAX_LIMIT + 1
    assert requested_output_tokens({"max_tokens": 10**6, "n": 10**6}) == MAX_LIMIT + 1
    assert requested_output_tokens({"max_tokens": float("inf")}) is None


@given(st.integers(1, 10**12), st.integers(1, 10**12))
def test_the_ask_is_never_more_than_one_past_the_largest_limit(tokens, answers):
    asked = requested_output_tokens({"max_tokens": tokens, "n": answers})
    assert asked == min(tokens * answers, MAX_LIMIT + 1)


def test_the_charge_is_the_prompt_estimate_plus_the_output_or_the_default():
    assert admission_charge(2003, 200, 1024) == 500 + 200  # 2,003 bytes ÷ 4 = 500
    assert admission_charge(2003, None, 1024) == 500 + 1024
    assert admission_charge(0, None, 7) == 1 + 7  # the prompt estimate is at least 1
    assert admission_charge(8, 0, 7) == 2  # an explicit 0 is not the default


def test_a_lease_is_renewed_every_third_of_it():
    assert renewal_interval_s(30) == 10.0 and renewal_interval_s(60) == 20.0 and renewal_interval_s(10) == 10 / 3


def test_the_rules_below_the_default_output_are_named_with_their_limits():
    from prefix_routing.rules.limits import LimitSettings, TenantLimits

    settings = LimitSettings(default=TenantLimits(tokens_per_minute=5000), default_max_tokens=2000, tenants=(
        ("batch-*", TenantLimits(tokens_per_minute=1500)),  # below 2,000
        ("big-*", TenantLimits(tokens_per_minute=2000)),  # exactly the default output: admitted when the prompt is small
        ("streams-*", TenantLimits(concurrent_streams=2)),  # inherits the default's 5,000
    ))
    assert settings.below_default_output() == [("batch-*", 1500)]
    assert LimitSettings(default=TenantLimits(tokens_per_minute=1999), default_max_tokens=2000).below_default_output() \
        == [("default", 1999)]
    assert LimitSettings(default=TenantLimits(requests_per_minute=1), default_max_tokens=2000).below_default_output() == []
