"""Errors of the rules: a rejected body (:class:`NormalizationError`), bad settings (:class:`SettingsError`), and
:class:`UserError`, which the command line turns into one line and exit status 2."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from prefix_routing.rules.constants import NO_VALUE


def describe_value(value: Any, limit: int = 40) -> str:
    """A short, one-line description of a value for error messages (strings truncated)."""
    if isinstance(value, str):
        text = json.dumps(value[:limit], ensure_ascii=True)
        if len(value) > limit:
            text = text[:-1] + '..."'
        return f"string {text}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        text = repr(value)
        return f"number {text[:limit]}{'...' if len(text) > limit else ''}"
    if isinstance(value, Mapping):
        return f"an object with {len(value)} key{'s' if len(value) != 1 else ''}"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} bytes"
    return f"a {type(value).__name__}"


class NormalizationError(ValueError):
    """The body cannot be normalized: it is malformed or of a shape the normalizer does not accept.

    ``field`` is a JSON path (``"body"``, ``"messages[2].content"``), ``reason`` says what is wrong,
    ``allowed`` what would be accepted, ``code`` is a stable machine-readable kind (for logs and
    HTTP status mapping): ``empty``, ``too_large``, ``invalid_utf8``, ``invalid_json``,
    ``not_object``, ``too_deep``, ``duplicate_key``, ``non_finite_number``, ``invalid_unicode``,
    ``missing_field``, ``invalid_field``, ``ambiguous_kind``. The message is always one line.
    """

    def __init__(
        self,
        field: str,
        reason: str,
        *,
        value: Any = NO_VALUE,
        allowed: str | None = None,
        code: str = "invalid_field",
    ) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        self.allowed = allowed
        self.code = code
        message = f"{field}: {reason}"
        if value is not NO_VALUE:
            message += f" (got {describe_value(value)})"
        if allowed:
            message += f"; allowed: {allowed}"
        super().__init__(message.replace("\r", " ").replace("\n", " "))

    def __reduce__(self):  # keep pickling (multiprocessing) working with keyword-only arguments
        return (_rebuild_error, (self.field, self.reason, self.value, self.allowed, self.code))


def _rebuild_error(field, reason, value, allowed, code):  # pragma: no cover - pickling helper
    return NormalizationError(field, reason, value=value, allowed=allowed, code=code)


class SettingsError(ValueError):
    """Bad normalizer settings; the message names the source, the field, the value and what is allowed."""

    def __init__(self, source: str, field: str, reason: str, *, value: Any = NO_VALUE, allowed: str = "") -> None:
        self.source = source
        self.field = field
        message = f"{source}: {field}: {reason}"
        if value is not NO_VALUE:
            message += f" (got {describe_value(value, 60)})"
        if allowed:
            message += f"; allowed: {allowed}"
        super().__init__(message.replace("\r", " ").replace("\n", " "))


class UserError(Exception):
    """Bad input from the user: a file, a flag, a line of a trace.

    The message must name what is wrong (field, value) and what is allowed. The command line
    prints it as one line without a traceback and exits with status 2.
    """
