"""Sampling the request log at the source (prefix_routing.rules.sampling).

The filter pattern is checked two ways, neither of them our code: it must equal what aws-cdk-lib's
``FilterPattern`` builder writes for the same conditions, and a small evaluator of CloudWatch Logs'
JSON filter grammar (written here from AWS's documentation: ``$.field`` selectors, ``=`` on strings,
``<`` on numbers, ``IS TRUE`` on booleans, ``&&``, ``||`` and parentheses; a comparison on a missing
field, or on a value of another type, does not match) must agree with ``in_sample`` on every line.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from prefix_routing.rules import sampling
from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LogField as F

# --------------------------------------------------------------------------- an independent evaluator

_TOKEN = re.compile(r'\s*(\{|\}|\(|\)|&&|\|\||\$\.[A-Za-z_]+|"[^"]*"|-?\d+(?:\.\d+)?|<=|>=|!=|=|<|>|IS|TRUE|FALSE)')


def _tokens(pattern: str) -> list[str]:
    out, at = [], 0
    while at < len(pattern.rstrip()):
        m = _TOKEN.match(pattern, at)
        assert m, f"cannot read the pattern at {pattern[at:]!r}"
        out.append(m.group(1))
        at = m.end()
    return out


def matches(pattern: str, event: dict) -> bool:
    """CloudWatch's JSON filter pattern semantics, for the constructs above."""
    tokens = _tokens(pattern)
    assert tokens[0] == "{" and tokens[-1] == "}", pattern
    tokens, pos = tokens[1:-1], [0]

    def peek():
        return tokens[pos[0]] if pos[0] < len(tokens) else None

    def take():
        pos[0] += 1
        return tokens[pos[0] - 1]

    def condition() -> bool:
        if peek() == "(":
            take()
            value = disjunction()
            assert take() == ")"
            return value
        field, op = take()[2:], take()
        if op == "IS":
            return event.get(field) is (take() == "TRUE")
        literal = take()
        value = event.get(field)
        if literal.startswith('"'):
            return op == "=" and isinstance(value, str) and value == literal[1:-1]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        return {"<": value < float(literal), ">": value > float(literal), "=": value == float(literal)}[op]

    def conjunction() -> bool:
        value = condition()
        while peek() == "&&":
            take()
            value = condition() and value
        return value

    def disjunction() -> bool:
        value = conjunction()
        while peek() == "||":
            take()
            value = conjunction() or value
        return value

    result = disjunction()
    assert pos[0] == len(tokens), pattern
    return result


# --------------------------------------------------------------------------- the bucket


def test_the_bucket_is_blake2b_of_the_id_and_the_fingerprint_mod_10000():
    # The rule as the module's docstring states it, computed here without the module.
    digest = hashlib.blake2b(b"pa-tenant\x00ead51ec387ceab95", digest_size=8).digest()
    expected = int.from_bytes(digest, "little") % 10_000
    assert sampling.sample_bucket("pa-tenant", "ead51ec387ceab95") == expected
    assert sampling.sample_bucket("pa-tenant", "ead51ec387ceab95") == expected  # stable
    assert sampling.sample_bucket("pa-other", "ead51ec387ceab95") != expected  # the id is part of the key


def test_buckets_spread_evenly():
    buckets = [sampling.sample_bucket("pa-t", f"{i:016x}") for i in range(20_000)]
    assert all(0 <= b < 10_000 for b in buckets)
    inside = sum(b < 1000 for b in buckets)  # rate 0.1: 2,000 expected, sd about 42
    assert 1800 < inside < 2200


@pytest.mark.parametrize(("rate", "limit"), [(1.0, 10_000), (0.1, 1000), (0.0138, 138), (0.0001, 1), (0.25, 2500)])
def test_a_rate_keeps_the_buckets_below_rate_times_10000(rate, limit):
    assert sampling.bucket_limit(rate) == limit


@pytest.mark.parametrize("rate", [0.0, 0.00009, 1.01, -1.0])
def test_a_rate_out_of_range_is_refused_by_name(rate):
    with pytest.raises(ValueError, match="sample rate.*allowed: from 0.0001 to 1"):
        sampling.bucket_limit(rate)


@pytest.mark.parametrize(("requests", "budget", "rate"), [
    (3_600_000, 50_000, 0.0138),  # floor(10,000 × 50,000 / 3,600,000) = floor(138.9) = 138 buckets
    (100_000, 50_000, 0.5),
    (50_000, 50_000, 1.0),  # fits: every key
    (0, 50_000, 1.0),
    (10**12, 1, 0.0001),  # at least one bucket
])
def test_the_rate_for_a_volume_keeps_about_the_budget(requests, budget, rate):
    assert sampling.rate_for_volume(requests, budget) == rate


# --------------------------------------------------------------------------- the filter pattern


def _cdk_pattern(limit: int | None) -> str:
    from aws_cdk import aws_logs as logs

    message = logs.FilterPattern.string_value(f"$.{F.MESSAGE}", "=", REQUEST_LOG_MESSAGE)
    if limit is None:
        return message.log_pattern_string
    sampled = logs.FilterPattern.any(logs.FilterPattern.number_value(f"$.{F.SAMPLE_BUCKET}", "<", limit),
                                     logs.FilterPattern.boolean_value(f"$.{F.SAMPLE_HOT}", True))
    return logs.FilterPattern.all(message, sampled).log_pattern_string


@pytest.mark.parametrize(("rate", "limit"), [(0.1, 1000), (0.0001, 1), (0.0138, 138), (1.0, None)])
def test_the_pattern_is_what_aws_cdk_writes_for_the_same_conditions(rate, limit):
    assert sampling.filter_pattern(rate) == _cdk_pattern(limit)


def _line(**fields) -> dict:
    return {F.MESSAGE: REQUEST_LOG_MESSAGE, F.SAMPLE_HOT: False, **fields}


LINES = [
    _line(**{F.SAMPLE_BUCKET: 0}),
    _line(**{F.SAMPLE_BUCKET: 999}),
    _line(**{F.SAMPLE_BUCKET: 1000}),  # the first bucket outside a 10 % sample
    _line(**{F.SAMPLE_BUCKET: 9999}),
    _line(**{F.SAMPLE_BUCKET: 9999, F.SAMPLE_HOT: True}),  # hot: in every sample
    _line(**{F.SAMPLE_BUCKET: None, F.SAMPLE_HOT: True}),
    _line(**{F.SAMPLE_BUCKET: 5000, F.SAMPLE_HOT: "true"}),  # a string is not a boolean
    _line(**{F.SAMPLE_BUCKET: None}),  # a request rejected before its fingerprint
    _line(),  # written before the front door logged buckets
    _line(**{F.SAMPLE_BUCKET: "5"}),  # a string is not a number
    {F.MESSAGE: "something else", F.SAMPLE_BUCKET: 3, F.SAMPLE_HOT: True},
]


@pytest.mark.parametrize("rate", [0.1, 0.0001, 0.5, 1.0])
def test_in_sample_is_the_pattern_read_by_cloudwatch_s_rules(rate):
    pattern = sampling.filter_pattern(rate)
    assert [sampling.in_sample(line, rate) for line in LINES] == [matches(pattern, line) for line in LINES]


def test_at_10_percent_the_sample_is_the_low_buckets_and_the_hot_lines():
    # By hand from the lines above: buckets 0 and 999, and the two hot ones.
    assert [sampling.in_sample(line, 0.1) for line in LINES] == [
        True, True, False, False, True, True, False, False, False, False, False]
    assert [matches(sampling.filter_pattern(0.1), json.loads(json.dumps(line))) for line in LINES].count(True) == 4
