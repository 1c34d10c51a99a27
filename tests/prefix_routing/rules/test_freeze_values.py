"""Re-normalizing a body whose values block (after the system prompt) has lines that are not values:
they are skipped, and the values after them are still learned, so a value already given keeps its
placeholder (prefix_routing.rules.freeze._FreezeState.learn_block)."""

from __future__ import annotations

import pytest

from prefix_routing.rules.constants import FREEZE_HEADER
from tests.prefix_routing.rules.conftest import DATE, chat, norm, parsed, system, user
from prefix_routing.rules.settings import FreezeRule, NormalizerSettings


@pytest.mark.parametrize("odd_line", [
    "a line that is no value",
    '⟦date:1⟧ = "\\q"',  # the shape of a value, but not JSON
])
def test_a_value_after_an_odd_line_keeps_its_placeholder(odd_line):
    settings = NormalizerSettings(freeze_rules=(DATE,))
    values = system(f'{FREEZE_HEADER}\n{odd_line}\n⟦date:2⟧ = "2026-11-30"')
    result = norm(chat(system("On ⟦date:2⟧. And on 2026-11-30."), values, user("x")), settings)
    messages = parsed(result)["messages"]
    assert messages[0]["content"] == "On ⟦date:2⟧. And on ⟦date:2⟧."  # not a new ⟦date:3⟧


def test_a_new_value_is_numbered_after_the_highest_placeholder_already_used():
    # the text uses ⟦date:5⟧ then ⟦date:2⟧: the next date is ⟦date:6⟧, whatever the order they appear in
    settings = NormalizerSettings(freeze_rules=(DATE,))
    values = system(f'{FREEZE_HEADER}\n⟦date:5⟧ = "2026-01-05"\n⟦date:2⟧ = "2026-01-02"')
    result = norm(chat(system("From ⟦date:5⟧ to ⟦date:2⟧, then 2027-07-07."), values, user("x")), settings)
    messages = parsed(result)["messages"]
    assert messages[0]["content"] == "From ⟦date:5⟧ to ⟦date:2⟧, then ⟦date:6⟧."
    assert messages[1]["content"].endswith('\n⟦date:6⟧ = "2027-07-07"')


def test_values_are_written_as_they_are_not_as_ascii_escapes():
    settings = NormalizerSettings(freeze_rules=(FreezeRule("user", r"(?<=User: )\w+"),))
    result = norm(chat(system("User: Zoë."), user("x")), settings)
    messages = parsed(result)["messages"]
    assert messages[0]["content"] == "User: ⟦user:1⟧."
    assert messages[1]["content"] == f'{FREEZE_HEADER}\n⟦user:1⟧ = "Zoë"'


def test_an_empty_match_in_context_is_left_alone():
    # the pattern cannot match an empty text on its own (so the settings take it), but after "User: " it
    # can: an empty value gets no placeholder
    settings = NormalizerSettings(freeze_rules=(FreezeRule("user", r"(?<=User: )\w*"),))
    result = norm(chat(system("User: . User: Ann."), user("x")), settings)
    messages = parsed(result)["messages"]
    assert messages[0]["content"] == "User: . User: ⟦user:1⟧."
    assert messages[1]["content"] == f'{FREEZE_HEADER}\n⟦user:1⟧ = "Ann"'
