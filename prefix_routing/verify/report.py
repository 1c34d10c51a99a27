"""One line per check: ✔ (as configured), ✘ (wrong, with what to do) or ? (cannot tell yet, and why)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Final

OK: Final = "ok"
FAIL: Final = "fail"
UNKNOWN: Final = "unknown"
SYMBOLS: Final = {OK: "✔", FAIL: "✘", UNKNOWN: "?"}


@dataclass(frozen=True, slots=True)
class Check:
    """``fix`` is what to do about a ✘ (and, for a ?, how to settle it); empty for ✔."""

    status: str
    title: str
    detail: str = ""
    fix: str = ""

    def line(self) -> str:
        text = f"{SYMBOLS[self.status]} {self.title}" + (f": {self.detail}" if self.detail else "")
        return text + (f"\n    fix: {self.fix}" if self.fix and self.status == FAIL else
                       f"\n    to settle: {self.fix}" if self.fix else "")


def ok(title: str, detail: str = "") -> Check:
    return Check(OK, title, detail)


def fail(title: str, detail: str, fix: str) -> Check:
    return Check(FAIL, title, detail, fix)


def unknown(title: str, detail: str, fix: str = "") -> Check:
    return Check(UNKNOWN, title, detail, fix)


def render_text(checks: list[Check]) -> str:
    counts = {status: sum(c.status == status for c in checks) for status in SYMBOLS}
    summary = f"{counts[OK]} ✔, {counts[FAIL]} ✘, {counts[UNKNOWN]} ?"
    return "\n".join([c.line() for c in checks] + [summary])


def render_json(checks: list[Check]) -> str:
    return json.dumps({"checks": [asdict(c) for c in checks], "failed": sum(c.status == FAIL for c in checks)},
                      indent=2, ensure_ascii=False)


def exit_status(checks: list[Check]) -> int:
    """1 when anything is wrong; a ? alone does not fail (it needs traffic, or a permission)."""
    return 1 if any(c.status == FAIL for c in checks) else 0
