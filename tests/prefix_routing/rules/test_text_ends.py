"""The text rules strip spaces and tabs at line ends (and, for a system prompt, spaces, tabs and line
feeds at its end) and nothing else: a letter before them, or other whitespace, stays. Short texts and
long ones (normalized line by line) alike (prefix_routing.rules.text)."""

from __future__ import annotations

from prefix_routing.rules.constants import LINEWISE_MIN
from prefix_routing.rules.text import normalize_text


def test_only_spaces_and_tabs_go_at_a_line_end():
    assert normalize_text("BOX \t\nXX") == "BOX\nXX"
    long = "BOX \t\n" + "a" * LINEWISE_MIN
    assert normalize_text(long) == "BOX\n" + "a" * LINEWISE_MIN


def test_a_system_prompt_loses_only_spaces_tabs_and_line_feeds_at_its_end():
    assert normalize_text("BOX \t\n", system=True) == "BOX"
    assert normalize_text("no\u00a0break\u00a0 \n", system=True) == "no\u00a0break\u00a0"  # NBSP is not stripped
    assert normalize_text("page\f \n", system=True) == "page\f"
