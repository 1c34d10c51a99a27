"""Which tenant key applies, and which keys never can (rules/tenant_match.py): a pattern that an
earlier pattern covers, checked soundly against fnmatch itself."""

from __future__ import annotations

import copy
import fnmatch
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefix_routing.rules.tenant_match import covers, first_match, shadowed


@pytest.mark.parametrize("general, specific, covered", [
    ("*", "acme-*", True), ("*", "*", True), ("acme", "acme", True), ("acme", "acme-1", False),
    ("acme*", "acme-*", True), ("acme-*", "acme*", False), ("*a*", "a*", True), ("a*", "*a*", False),
    ("a?c", "abc", True), ("a?c", "a*c", False), ("a*c", "a?c", True), ("??", "?", False),
    ("[ab]*", "a*", True), ("[ab]*", "[a-b]x", True), ("[ab]*", "[a-c]*", False), ("[!a]*", "b*", True),
    ("[!a]*", "a*", False), ("[!a]*", "[!ab]*", True), ("a[", "a[", True), ("a[", "ab", False),
    ("arn:aws:iam::*:role/*", "arn:aws:iam::111122223333:role/acme-*", True),
    ("arn:aws:iam::*:role/team-*", "arn:aws:iam::111122223333:role/team-?x", True),
    ("arn:aws:iam::111122223333:role/*", "arn:aws:iam::*:role/acme", False),
    ("?*", "*?", False),  # true, but its proof reorders a star: the check says no (it never refuses wrongly)
])
def test_covers_by_hand(general, specific, covered):
    assert covers(general, specific) is covered


def test_a_later_pattern_is_shadowed_by_the_first_earlier_one_that_covers_it_and_ids_never_are():
    keys = ["acme", "team-*", "*", "team-a*", "acme", "x?", "zed"]
    assert shadowed(keys) == [("team-a*", "team-*"), ("x?", "*")]
    assert first_match("zed", keys) == 6  # an id after "*" still applies to its tenant: ids first
    assert shadowed(["a*", "b*", "c"]) == [] and shadowed([]) == []


ALPHABET = "ab-"
PATTERN = st.text(alphabet=ALPHABET + "*?", max_size=5) | st.builds(
    lambda a, b, neg: f"{a}[{'!' if neg else ''}{b}]", st.text(alphabet=ALPHABET + "*", max_size=2),
    st.text(alphabet="ab", min_size=1, max_size=2), st.booleans())
STRINGS = ["".join(p) for n in range(6) for p in itertools.product(ALPHABET + "c", repeat=n)]


@settings(max_examples=300, deadline=None)
@given(general=PATTERN, specific=PATTERN)
def test_covers_is_sound_against_fnmatch(general, specific):
    """Whenever covers says yes, every string the specific pattern matches, the general one matches too."""
    if covers(general, specific):
        assert all(fnmatch.fnmatchcase(t, general) for t in STRINGS if fnmatch.fnmatchcase(t, specific))


def test_the_stage_refuses_a_limits_override_an_earlier_pattern_hides():
    from prefix_routing.stage.config import DEFAULT_STAGE_DATA, ConfigError, parse_stage

    data = copy.deepcopy(DEFAULT_STAGE_DATA)
    data["limits"] = {"concurrent_streams": 8, "tenants": {"*": {"concurrent_streams": 4},
                                                           "arn:aws:iam::*:role/Batch*": {"concurrent_streams": 2}}}
    with pytest.raises(ConfigError) as raised:
        parse_stage(data, source="stage.toml")
    [line] = raised.value.problems
    assert "limits.tenants" in line and line.endswith(
        "'arn:aws:iam::*:role/Batch*' never applies: the earlier pattern '*' takes every tenant it matches; allowed: "
        "a pattern before the more general ones that would take its tenants, or none")
    data["limits"]["tenants"] = dict(reversed(list(data["limits"]["tenants"].items())))
    assert parse_stage(data, source="stage.toml").limits.to_rules().for_tenant(
        "arn:aws:iam::1:role/Batch-7")[0] == "arn:aws:iam::*:role/Batch*"
