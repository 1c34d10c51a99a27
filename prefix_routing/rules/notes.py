"""JSON paths for error messages, and the notes that say what normalization changed (never prompt text)."""

from __future__ import annotations

import json
from typing import Final

from prefix_routing.rules.constants import IDENTIFIER_RE


def json_path(parts: tuple) -> str:
    """A JSON path such as ``messages[2].content``; very deep paths keep their first and last 8 steps."""
    out = []
    for part in parts:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif IDENTIFIER_RE.fullmatch(part):
            out.append(f".{part}" if out else part)
        else:
            out.append(f"[{json.dumps(part[:40], ensure_ascii=True)}]")
    if len(out) > 16:
        out = [*out[:8], "…", *out[-8:]]
    return "".join(out) or "body"


_TEXT_RULES: Final = (
    ("nfc", "Unicode NFC"),
    ("cr", "CRLF/CR line endings to LF"),
    ("trailing", "spaces/tabs before line ends removed"),
    ("system_end", "whitespace at the end of the system prompt removed"),
)


class Notes:
    __slots__ = ("text", "other")

    def __init__(self) -> None:
        self.text: dict[str, list[str]] = {}
        self.other: list[str] = []

    def add_text(self, rule: str, path: str) -> None:
        self.text.setdefault(rule, []).append(path)

    def render(self) -> tuple[str, ...]:
        lines = []
        for rule, label in _TEXT_RULES:
            paths = self.text.get(rule)
            if paths:
                shown = ", ".join(paths[:4]) + (f", … ({len(paths) - 4} more)" if len(paths) > 4 else "")
                lines.append(f"text: {label} in {len(paths)} text{'s' if len(paths) != 1 else ''}: {shown}")
        return tuple(lines + self.other)
