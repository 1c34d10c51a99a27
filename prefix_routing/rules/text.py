"""Text rules on prompt text: Unicode NFC, LF line endings, no spaces before a line end, no whitespace at the end of a system prompt."""

from __future__ import annotations

from prefix_routing.rules.constants import LINEWISE_MIN, to_nfc
from prefix_routing.rules.notes import Notes


def normalize_text(text: str, *, system: bool = False) -> str:
    """The text rules applied to prompt text (``system=True`` also strips the end of a system prompt)."""
    return text_rules(text, system, None, "")


def text_rules(text: str, system: bool, notes: Notes | None, path: str) -> str:
    # CR first: "\r" and "\n" are starters that compose with nothing, so the order with NFC is free,
    # and "\n" is a safe boundary for NFC: normalizing line by line equals normalizing the whole.
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        if notes is not None:
            notes.add_text("cr", path)
    if len(text) < LINEWISE_MIN:
        if not text.isascii():
            normal = to_nfc(text)
            if normal != text:
                text = normal
                if notes is not None:
                    notes.add_text("nfc", path)
        # NFC never creates nor removes a space or tab before a line feed.
        if " \n" in text or "\t\n" in text:
            text = _strip_line_ends(text.split("\n"))
            if notes is not None:
                notes.add_text("trailing", path)
    else:
        # Long text, line by line: a few decomposed lines do not cost a normalization of the whole
        # text (unicodedata returns a line that passes its quick check as the same object), and
        # rstrip looks at line ends only instead of searching the whole text twice.
        lines = text.split("\n")
        normal = lines if text.isascii() else list(map(to_nfc, lines))
        stripped = [line.rstrip(" \t") for line in normal]
        stripped[-1] = normal[-1]  # the end of the text is not a line end
        if stripped != lines:
            text = "\n".join(stripped)
            if notes is not None:
                if normal != lines:
                    notes.add_text("nfc", path)
                if stripped != normal:
                    notes.add_text("trailing", path)
    if system and text[-1:] in (" ", "\t", "\n"):
        text = text.rstrip(" \t\n")
        if notes is not None:
            notes.add_text("system_end", path)
    return text


def _strip_line_ends(lines: list[str]) -> str:
    """Join lines with "\n", removing spaces and tabs at the end of every line but the last."""
    last = lines.pop()
    lines = [line.rstrip(" \t") for line in lines]
    lines.append(last)
    return "\n".join(lines)
