"""The text rules (prefix_routing.rules.text): NFC, line endings, trailing spaces, the end of system prompts."""

from __future__ import annotations

import re
import unicodedata

import pytest

from prefix_routing.rules.text import normalize_text
from tests.prefix_routing.rules.conftest import chat, norm, parsed, user


def reference_text_rules(text: str, system: bool) -> str:
    """The documented rules, written the obvious (slow) way."""
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[ \t]+(?=\n)", "", text)
    return text.rstrip(" \t\n") if system else text


@pytest.mark.parametrize(
    "text, system, expected",
    [
        ("e\u0301", False, "\u00e9"),  # NFC
        ("\u212b", False, "\u00c5"),  # Angstrom sign -> A with ring (canonical singleton)
        ("a\r\nb\rc\n", False, "a\nb\nc\n"),  # CRLF and CR to LF
        ("a  \nb\t\n\nc  ", False, "a\nb\n\nc  "),  # line ends stripped; the end of a user text is kept
        ("  indented\n\ttab inside\tkept", False, "  indented\n\ttab inside\tkept"),
        ("nbsp\u00a0\nideographic\u3000\n", False, "nbsp\u00a0\nideographic\u3000\n"),  # only space and tab
        ("You are helpful.  \n\n \t", True, "You are helpful."),  # end of a system prompt
        ("\n\nlead kept", True, "\n\nlead kept"),
        ("", True, ""),
        ("x \r\n", False, "x\n"),  # CRLF first, then the space before it
        ("\r\u0301 \n\u1100\u1161", False, "\n\u0301\n\uac00"),  # combining mark after a line break
    ],
)
def test_text_rules(text, system, expected):
    assert normalize_text(text, system=system) == expected == reference_text_rules(text, system)
    long = (text + "\n") * 300  # long texts take the line-by-line path: same result
    assert len(long) >= 512 or not text
    assert normalize_text(long, system=system) == reference_text_rules(long, system)


def test_text_rules_apply_to_prompt_text_only():
    body = {
        "messages": [
            {"role": "system", "content": "sys  \r\n"},
            {"role": "developer", "content": [{"type": "text", "text": "dev\t\n"}]},
            {"role": "user", "content": [{"type": "text", "text": "u\r\n"}, {"type": "image_url", "image_url": {"url": "a \r\n"}}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"arguments": "{\"a\": \"x \\r\\n\"}"}}]},
            {"role": "tool", "content": "t \r\n", "tool_call_id": "1", "name": "n \r\n"},
        ],
        "stop": ["\r\n", " \n"],
        "user": "Cafe\u0301",
    }
    out = parsed(norm(body))
    messages = out["messages"]
    assert messages[0]["content"] == "sys"
    assert messages[1]["content"] == [{"type": "text", "text": "dev"}]  # developer = system prompt
    assert messages[2]["content"][0]["text"] == "u\n"
    assert messages[2]["content"][1]["image_url"]["url"] == "a \r\n"
    assert messages[3] == body["messages"][3]
    assert messages[4]["content"] == "t\n" and messages[4]["name"] == "n \r\n"
    assert out["stop"] == ["\r\n", " \n"]
    assert out["user"] == "Cafe\u0301"


def test_completion_and_lmi_prompts_keep_their_end():
    # The end of a completion prompt is where the model continues: a trailing space there matters.
    assert parsed(norm({"prompt": "Answer: "}))["prompt"] == "Answer: "
    assert parsed(norm({"prompt": ["a \r\nb ", "c"]}))["prompt"] == ["a\nb ", "c"]
    assert parsed(norm({"inputs": "x\t\r\ny "}))["inputs"] == "x\ny "


def test_long_text_with_a_few_decomposed_lines():
    lines = [f"line {i} caf\u00e9 \u65e5\u672c" for i in range(500)]
    lines[7] = unicodedata.normalize("NFD", lines[7]) + "  "
    lines[300] = lines[300] + "\t"
    text = "\r\n".join(lines)
    expected = "\n".join(f"line {i} caf\u00e9 \u65e5\u672c" for i in range(500))
    result = norm(chat(user(text)))
    assert parsed(result)["messages"][0]["content"] == expected
    notes = "\n".join(result.changes)
    assert "NFC" in notes and "CRLF" in notes and "spaces/tabs" in notes
