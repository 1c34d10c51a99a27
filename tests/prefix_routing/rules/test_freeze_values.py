"""Re-normalizing a body whose values block (after the system prompt) has lines that are not values:
they are skipped, and the values after them are still learned, so a value already given keeps its
placeholder (prefix_routing.rules.freeze._FreezeState.learn_block)."""

from __future__ import annotations

import pytest

from prefix_routing.rules.constants import FREEZE_HEADER
from tests.prefix_routing.rules.conftest import DATE, chat, norm, parsed, system, user
from prefix_routing.rules.settings import NormalizerSettings


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
