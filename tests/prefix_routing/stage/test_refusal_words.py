"""Every refused stage value says what is allowed, type errors included, in the configuration
reference's own words (prefix_routing/stage/reference_text.py), and in the same words for a limit's
default and its per-tenant override."""

from __future__ import annotations

import copy

import pytest
from pydantic import BaseModel

from prefix_routing.stage.config import DEFAULT_STAGE_DATA, ConfigError, StageConfig, parse_stage
from prefix_routing.stage.reference_text import strip_annotated, without_none


def leaves(model: type[BaseModel], prefix: tuple = ()):
    for name, field in model.model_fields.items():
        base, _ = strip_annotated(without_none(field.annotation)[0])
        if isinstance(base, type) and issubclass(base, BaseModel):
            yield from leaves(base, prefix + (name,))
        else:
            yield prefix + (name,)


LEAVES = [loc for loc in leaves(StageConfig) if loc[0] not in ("name", "domains")]
WRONG = ("x", 1.5, True, [1], {"a": 1})  # a value of every other kind: each field refuses at least one


def refusals(loc: tuple, value) -> list[str]:
    data = copy.deepcopy(DEFAULT_STAGE_DATA)
    node = data
    for part in loc[:-1]:
        node = node.setdefault(part, {})
    node[loc[-1]] = value
    try:
        parse_stage(data, source="stage.toml")
    except ConfigError as error:
        return error.problems
    return []


@pytest.mark.parametrize("loc", LEAVES, ids=".".join)
def test_every_refusal_of_every_field_names_what_is_allowed(loc):
    found = [problem for value in WRONG for problem in refusals(loc, value)]
    assert found, f"{'.'.join(loc)} took every value"
    assert all("allowed" in problem for problem in found), found


def test_a_type_error_says_the_fields_kind_and_its_rule():
    assert refusals(("routing", "prefix_length"), "4096") == [
        "stage.toml: routing.prefix_length = '4096': allowed: an integer; from 1024 to 65536"]
    assert refusals(("limits", "on_store_error"), 1) == [
        "stage.toml: limits.on_store_error = 1: allowed: one of `open`, `closed`"]
    assert refusals(("tenancy", "require_isolation"), "yes") == [
        "stage.toml: tenancy.require_isolation = 'yes': allowed: `true` or `false`"]
    assert refusals(("model", "environment"), ["A=1"])[0].startswith(
        "stage.toml: model.environment = ['A=1']: allowed: a table of strings; at most 96 entries")


@pytest.mark.parametrize("value", ["x", 0, 1.5])
def test_a_limit_and_its_override_are_refused_in_the_same_words(value):
    (default,) = refusals(("limits", "concurrent_streams"), value)
    (override,) = refusals(("limits", "tenants"), {"acme-*": {"concurrent_streams": value}})
    assert default.split(": ", 2)[2] == override.split(": ", 2)[2]
    assert "limits.tenants.acme-*.concurrent_streams" in override
