"""The freeze rules (prefix_routing.rules.freeze): placeholders in the shared part, their values after it."""

from __future__ import annotations

import json
import os

from prefix_routing.rules.body import normalize_body
from prefix_routing.rules.constants import FREEZE_HEADER
from prefix_routing.rules.identity import prefix_fingerprint
from prefix_routing.rules.settings import FreezeRule, NormalizerSettings
from tests.prefix_routing.rules.conftest import DATE, USER, chat, norm, parsed, system, user


def frozen(*rules, placement="system_message"):
    return NormalizerSettings(freeze_rules=rules, freeze_placement=placement)


def test_freeze_moves_values_to_a_message_after_the_system_prompt():
    settings = frozen(DATE, USER)
    body = chat(system("Today is 2026-11-30. User: Alice. Deadline 2026-12-24, again 2026-11-30."), user("Hi"))
    result = norm(body, settings)
    messages = parsed(result)["messages"]
    assert messages[0] == system("Today is ⟦date:1⟧. User: ⟦user:1⟧. Deadline ⟦date:2⟧, again ⟦date:1⟧.")
    assert messages[1] == system(
        FREEZE_HEADER + '\n⟦date:1⟧ = "2026-11-30"\n⟦date:2⟧ = "2026-12-24"\n⟦user:1⟧ = "Alice"'
    )
    assert messages[2] == user("Hi")
    assert any(change.startswith("freeze: date ×3, user ×1") for change in result.changes)
    assert "Alice" not in "".join(result.changes) and "2026" not in "".join(result.changes)


def test_freeze_gives_a_shared_prefix_to_requests_of_different_days():
    settings = frozen(DATE)
    shared = "You are the assistant of ACME. " * 60
    a = norm(chat(system(f"Today is 2026-11-30. {shared}"), user("question one")), settings)
    b = norm(chat(system(f"Today is 2026-12-01. {shared}"), user("question two")), settings)
    assert a.body[:1024] == b.body[:1024]
    assert prefix_fingerprint(a.body, 1024) == prefix_fingerprint(b.body, 1024)
    common = len(os.path.commonprefix([a.body, b.body]))
    assert common > len(shared)  # the whole system prompt is shared
    assert parsed(a)["messages"][1]["content"].endswith('= "2026-11-30"')  # values kept, never deleted
    assert parsed(b)["messages"][1]["content"].endswith('= "2026-12-01"')
    unfrozen = norm(chat(system(f"Today is 2026-11-30. {shared}"), user("q")))
    other = norm(chat(system(f"Today is 2026-12-01. {shared}"), user("q")))
    assert unfrozen.body[:1024] != other.body[:1024]


def test_freeze_is_idempotent_and_extends_the_values_when_the_prompt_changes():
    settings = frozen(DATE)
    first = norm(chat(system("On 2026-11-30."), user("x")), settings)
    assert normalize_body(first.body, settings).body == first.body
    edited = parsed(first)
    edited["messages"][0]["content"] += " And on 2027-01-01 or 2026-11-30."
    second = parsed(normalize_body(json.dumps(edited), settings))
    assert second["messages"][0]["content"] == "On ⟦date:1⟧. And on ⟦date:2⟧ or ⟦date:1⟧."
    assert second["messages"][1]["content"] == FREEZE_HEADER + '\n⟦date:1⟧ = "2026-11-30"\n⟦date:2⟧ = "2027-01-01"'
    assert len(second["messages"]) == 3


def test_freeze_touches_only_the_leading_system_messages():
    settings = frozen(DATE)
    body = chat(user("2026-11-30"), system("2026-11-30"))
    assert norm(body, settings).body == norm(body).body
    body = chat(system("a 2026-01-01"), {"role": "developer", "content": [{"type": "text", "text": "b 2026-01-02"}]},
                user("c 2026-01-03"))
    messages = parsed(norm(body, settings))["messages"]
    assert messages[0]["content"] == "a ⟦date:1⟧"
    assert messages[1]["content"] == [{"type": "text", "text": "b ⟦date:2⟧"}]
    assert messages[2]["role"] == "developer"  # same role as the last system-prompt message
    assert messages[3] == user("c 2026-01-03")


def test_freeze_placement_first_user_message():
    settings = frozen(DATE, placement="first_user_message")
    result = norm(chat(system("Today 2026-11-30"), user("Hi")), settings)
    messages = parsed(result)["messages"]
    assert messages == [system("Today ⟦date:1⟧"), user(FREEZE_HEADER + '\n⟦date:1⟧ = "2026-11-30"\n\nHi')]
    assert normalize_body(result.body, settings).body == result.body
    parts = norm(chat(system("Today 2026-11-30"), {"role": "user", "content": [{"type": "text", "text": "Hi"}]}), settings)
    assert parsed(parts)["messages"][1]["content"][0] == {"type": "text", "text": FREEZE_HEADER + '\n⟦date:1⟧ = "2026-11-30"'}
    assert normalize_body(parts.body, settings).body == parts.body
    # no user message right after the system prompt: a system message carries the values
    alone = parsed(norm(chat(system("Today 2026-11-30")), settings))["messages"]
    assert alone[1]["role"] == "system" and alone[1]["content"].startswith(FREEZE_HEADER)


def test_freeze_in_a_completion_prompt_keeps_the_last_paragraph_last():
    settings = frozen(DATE)
    result = norm({"prompt": "Instructions of 2026-11-30.\n\nMore 2026-11-30.\n\nQ: what day?\nA:"}, settings)
    assert parsed(result)["prompt"] == (
        "Instructions of ⟦date:1⟧.\n\nMore ⟦date:1⟧.\n\n" + FREEZE_HEADER + '\n⟦date:1⟧ = "2026-11-30"\n\nQ: what day?\nA:'
    )
    assert normalize_body(result.body, settings).body == result.body
    lmi = norm({"inputs": ["Day 2026-11-30\n\nQ?", "no blank line 2026-11-30"]}, settings)
    assert parsed(lmi)["inputs"] == ["Day ⟦date:1⟧\n\n" + FREEZE_HEADER + '\n⟦date:1⟧ = "2026-11-30"\n\nQ?',
                                     "no blank line 2026-11-30"]
    assert normalize_body(lmi.body, settings).body == lmi.body


def test_freeze_values_are_json_strings_so_multiline_values_survive():
    settings = frozen(FreezeRule("block", r"BEGIN[\s\S]*?END"))
    result = norm(chat(system('x BEGIN a\n"b"\\ END y'), user("q")), settings)
    messages = parsed(result)["messages"]
    line = messages[1]["content"].split("\n")[1]
    assert json.loads(line.split(" = ", 1)[1]) == 'BEGIN a\n"b"\\ END'
    assert normalize_body(result.body, settings).body == result.body


def test_freeze_never_rewrites_inside_a_placeholder():
    settings = frozen(DATE, FreezeRule("num", r"\d+"))
    result = norm(chat(system("2026-11-30 and 42"), user("q")), settings)
    messages = parsed(result)["messages"]
    assert messages[0]["content"] == "⟦date:1⟧ and ⟦num:1⟧"
    assert normalize_body(result.body, settings).body == result.body
