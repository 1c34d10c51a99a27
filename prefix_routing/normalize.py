"""Canonical request bodies for prefix-aware routing: equivalent requests, identical leading bytes.

SageMaker's ``PREFIX_AWARE`` routing keys on the first ``PrefixLength`` *bytes* of the request body
(``InvokeEndpoint`` / ``InvokeEndpointWithResponseStream``). Two clients that send the same prompt
with a different key order, different JSON whitespace, ``\\r\\n`` line endings, another Unicode form or
the sampling parameters before the prompt land on different instances and miss the warm KV cache.
:func:`normalize_body` rewrites a body into one canonical byte string; the rules are documented in
``docs/normalizer.md`` and summarised here:

* accepted bodies: OpenAI-style chat (``messages``), completions (``prompt``), LMI/TGI (``inputs``);
* canonical JSON: ``cache_salt`` (when present), the prompt-bearing field, the known fields in
  :data:`KNOWN_FIELD_ORDER`, then unknown fields sorted by code point; message keys ``role``,
  ``content``, then the rest sorted; content parts ``type`` first, then the rest sorted; LMI
  ``parameters`` sorted; every deeper object is kept in the order it was sent; compact separators;
  UTF-8 without ``\\u`` escapes for non-ASCII text;
* text rules on prompt text only: Unicode NFC; CRLF and CR to LF; spaces and tabs before a line
  feed removed; spaces, tabs and line feeds at the end of system (and developer) prompts removed;
* freeze rules (optional): volatile segments of the shared leading content are replaced by stable
  placeholders ``⟦name:n⟧`` and their values given right after the shared part, never deleted;
* tenancy: :func:`routing_identity` derives a ``PrefixAwareId`` and vLLM's ``cache_salt`` with
  HMAC-SHA256; the salt is the first key of chat and completion bodies.

Standard library only: this module runs in AWS Lambda, in client applications, in the lab and in the
emulator. It is deterministic across processes (no ``hash()``, no set iteration) and idempotent.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import math
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from os import PathLike
from typing import Any, Final

__all__ = [
    "BLOCK_BYTES_MIN",
    "KNOWN_FIELD_ORDER",
    "MAX_BODY_BYTES_LIMIT",
    "PREFIX_LENGTH_MAX",
    "PREFIX_LENGTH_MIN",
    "FreezeRule",
    "Normalized",
    "NormalizationError",
    "NormalizerSettings",
    "RoutingIdentity",
    "SettingsError",
    "block_hashes",
    "normalize_body",
    "normalize_text",
    "prefix_fingerprint",
    "routing_identity",
]

# --------------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------------

PREFIX_LENGTH_MIN: Final = 1024  # SageMaker's PrefixAwareRoutingConfig.PrefixLength range
PREFIX_LENGTH_MAX: Final = 65536
BLOCK_BYTES_MIN: Final = 64
BLOCK_BYTES_MAX: Final = 1024 * 1024
MAX_BODY_BYTES_LIMIT: Final = 6 * 1024 * 1024  # InvokeEndpoint(WithResponseStream) Body max: 6 MiB
MAX_DEPTH_MIN: Final = 8
MAX_DEPTH_MAX: Final = 256
FINGERPRINT_HEX_DIGITS: Final = 16

#: Roles whose messages are system prompts (the end-of-system-prompt rule and freeze rules).
SYSTEM_ROLES: Final = ("system", "developer")

#: Top-level fields after the prompt-bearing one, in this order (chat and completion bodies).
#: Roughly: what is constant per application first (model, tools), then sampling, then streaming and
#: per-user fields, so that when a short prompt leaves room in the prefix window the bytes that
#: follow it are the ones most likely shared. Fields not listed follow, sorted by code point.
KNOWN_FIELD_ORDER: Final = (
    "model",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "response_format",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "n",
    "best_of",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "echo",
    "suffix",
    "stream",
    "stream_options",
    "user",
    "metadata",
)
#: LMI / TGI bodies: ``inputs``, then these, then the rest sorted.
KNOWN_LMI_FIELD_ORDER: Final = ("parameters", "stream")

PROMPT_FIELDS: Final = {"messages": "chat", "prompt": "completion", "inputs": "lmi"}

#: First line of the block that carries the values of frozen segments.
FREEZE_HEADER: Final = "Values of the placeholders ⟦…⟧ used above:"
FREEZE_PLACEMENTS: Final = ("system_message", "first_user_message")

_PLACEHOLDER_RE: Final = re.compile(r"(⟦[A-Za-z][A-Za-z0-9_-]{0,39}:[1-9][0-9]{0,8}⟧)")
_PLACEHOLDER_PARTS_RE: Final = re.compile(r"⟦([A-Za-z][A-Za-z0-9_-]{0,39}):([1-9][0-9]{0,8})⟧")
_FREEZE_LINE_RE: Final = re.compile(r"(⟦[A-Za-z][A-Za-z0-9_-]{0,39}:[1-9][0-9]{0,8}⟧) = (\".*\")")
_RULE_NAME_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")
_IDENTIFIER_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ROUTING_ID_RE: Final = re.compile(r"[!-~]{1,64}")  # printable ASCII, no space: botocore's pattern holds
_SALT_RE: Final = re.compile(r"[!-~]{1,256}")

_BOM: Final = b"\xef\xbb\xbf"
_LINEWISE_MIN: Final = 512  # texts of at least this many characters get the text rules line by line
_NFC: Final = functools.partial(unicodedata.normalize, "NFC")

_NO_VALUE: Final = object()


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------


def _describe(value: Any, limit: int = 40) -> str:
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
        value: Any = _NO_VALUE,
        allowed: str | None = None,
        code: str = "invalid_field",
    ) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        self.allowed = allowed
        self.code = code
        message = f"{field}: {reason}"
        if value is not _NO_VALUE:
            message += f" (got {_describe(value)})"
        if allowed:
            message += f"; allowed: {allowed}"
        super().__init__(message.replace("\r", " ").replace("\n", " "))

    def __reduce__(self):  # keep pickling (multiprocessing) working with keyword-only arguments
        return (_rebuild_error, (self.field, self.reason, self.value, self.allowed, self.code))


def _rebuild_error(field, reason, value, allowed, code):  # pragma: no cover - pickling helper
    return NormalizationError(field, reason, value=value, allowed=allowed, code=code)


class SettingsError(ValueError):
    """Bad normalizer settings; the message names the source, the field, the value and what is allowed."""

    def __init__(self, source: str, field: str, reason: str, *, value: Any = _NO_VALUE, allowed: str = "") -> None:
        self.source = source
        self.field = field
        message = f"{source}: {field}: {reason}"
        if value is not _NO_VALUE:
            message += f" (got {_describe(value, 60)})"
        if allowed:
            message += f"; allowed: {allowed}"
        super().__init__(message.replace("\r", " ").replace("\n", " "))


# --------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------


def _check_int(source: str, name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SettingsError(source, name, "out of range or not an integer", value=value,
                            allowed=f"an integer {low}..{high}")


@dataclass(frozen=True)
class FreezeRule:
    """A named regular expression for a volatile segment (a date, a request id, a user name).

    Matches in the shared leading content are replaced by ``⟦name:n⟧`` and their values are given
    after the shared part. The pattern must not match the empty string.
    """

    name: str
    pattern: str
    _regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._validate("settings", "freeze_rules[]")

    def _validate(self, source: str, where: str) -> None:
        if not isinstance(self.name, str) or not _RULE_NAME_RE.fullmatch(self.name):
            raise SettingsError(
                source, f"{where}.name", "not a valid rule name", value=self.name,
                allowed="1-40 characters: a letter, then letters, digits, '_' or '-'",
            )
        if not isinstance(self.pattern, str) or not self.pattern or len(self.pattern) > 2000:
            raise SettingsError(source, f"{where}.pattern", "not a pattern", value=self.pattern,
                                allowed="a non-empty regular expression (Python re syntax), at most 2000 characters")
        try:
            regex = re.compile(self.pattern)
        except re.error as error:
            raise SettingsError(source, f"{where}.pattern", f"invalid regular expression ({error})",
                                value=self.pattern, allowed="a Python re regular expression") from None
        if regex.fullmatch("") is not None:
            raise SettingsError(source, f"{where}.pattern", "matches the empty string", value=self.pattern,
                                allowed="a regular expression that only matches non-empty text")
        object.__setattr__(self, "_regex", regex)


_SETTINGS_KEYS: Final = (
    "prefix_length", "block_bytes", "freeze_rules", "max_body_bytes", "max_depth", "freeze_placement",
)


@dataclass(frozen=True)
class NormalizerSettings:
    """What the normalizer needs to know; validated on construction (raises :class:`SettingsError`)."""

    prefix_length: int = 4096  # the endpoint's PrefixLength, 1024..65536
    block_bytes: int = 2048  # size of the blocks whose chained hashes are logged
    freeze_rules: tuple[FreezeRule, ...] = ()
    max_body_bytes: int = MAX_BODY_BYTES_LIMIT
    max_depth: int = 64  # JSON nesting limit (the top-level object is depth 1)
    #: where the values of frozen segments of a chat body go: a message right after the leading
    #: system messages ("system_message"), or the start of the first user message after them
    #: ("first_user_message", for chat templates that accept only one system message).
    freeze_placement: str = "system_message"

    def __post_init__(self) -> None:
        self._validate("settings")

    def _validate(self, source: str) -> None:
        _check_int(source, "prefix_length", self.prefix_length, PREFIX_LENGTH_MIN, PREFIX_LENGTH_MAX)
        _check_int(source, "block_bytes", self.block_bytes, BLOCK_BYTES_MIN, BLOCK_BYTES_MAX)
        _check_int(source, "max_body_bytes", self.max_body_bytes, 2, MAX_BODY_BYTES_LIMIT)
        _check_int(source, "max_depth", self.max_depth, MAX_DEPTH_MIN, MAX_DEPTH_MAX)
        if self.freeze_placement not in FREEZE_PLACEMENTS:
            raise SettingsError(source, "freeze_placement", "unknown placement", value=self.freeze_placement,
                                allowed=" or ".join(FREEZE_PLACEMENTS))
        rules = self.freeze_rules
        if isinstance(rules, list):
            rules = tuple(rules)
            object.__setattr__(self, "freeze_rules", rules)
        if not isinstance(rules, tuple) or not all(isinstance(r, FreezeRule) for r in rules):
            raise SettingsError(source, "freeze_rules", "not a sequence of FreezeRule", value=rules,
                                allowed="a tuple of FreezeRule(name, pattern)")
        seen: set[str] = set()
        for index, rule in enumerate(rules):
            if rule.name in seen:
                raise SettingsError(source, f"freeze_rules[{index}].name", "duplicate rule name", value=rule.name,
                                    allowed="names unique within freeze_rules")
            seen.add(rule.name)

    @classmethod
    def from_mapping(cls, data: Mapping, *, source: str = "settings") -> NormalizerSettings:
        """Build settings from a JSON-like mapping; unknown keys and bad values raise :class:`SettingsError`.

        ``freeze_rules`` is a list of ``{"name": ..., "pattern": ...}`` objects.
        """
        if not isinstance(data, Mapping):
            raise SettingsError(source, "(top level)", "not an object", value=data,
                                allowed=f"an object with keys among {', '.join(_SETTINGS_KEYS)}")
        for key in data:
            if key not in _SETTINGS_KEYS:
                raise SettingsError(source, str(key), "unknown setting", allowed=", ".join(_SETTINGS_KEYS))
        kwargs: dict[str, Any] = {k: data[k] for k in _SETTINGS_KEYS if k in data and k != "freeze_rules"}
        raw_rules = data.get("freeze_rules", [])
        if not isinstance(raw_rules, (list, tuple)):
            raise SettingsError(source, "freeze_rules", "not a list", value=raw_rules,
                                allowed='a list of {"name": ..., "pattern": ...} objects')
        rules = []
        for index, raw in enumerate(raw_rules):
            where = f"freeze_rules[{index}]"
            if isinstance(raw, FreezeRule):
                rules.append(raw)
                continue
            if not isinstance(raw, Mapping) or set(raw) != {"name", "pattern"}:
                raise SettingsError(source, where, "not a rule object", value=raw,
                                    allowed='an object with exactly the keys "name" and "pattern"')
            rule = object.__new__(FreezeRule)
            object.__setattr__(rule, "name", raw["name"])
            object.__setattr__(rule, "pattern", raw["pattern"])
            rule._validate(source, where)
            rules.append(rule)
        settings = object.__new__(cls)
        for name in _SETTINGS_KEYS:
            object.__setattr__(settings, name, kwargs.get(name, cls.__dataclass_fields__[name].default))
        object.__setattr__(settings, "freeze_rules", tuple(rules))
        settings._validate(source)
        return settings

    @classmethod
    def load(cls, path: str | PathLike) -> NormalizerSettings:
        """Read settings from a JSON file (``--config FILE``). Any problem raises :class:`SettingsError`."""
        source = str(path)
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except OSError as error:
            raise SettingsError(source, "(file)", f"cannot read: {error.strerror or error}") from None
        try:
            data = json.loads(raw.decode("utf-8-sig"), object_pairs_hook=_settings_pairs)
        except UnicodeDecodeError as error:
            raise SettingsError(source, "(file)", f"not UTF-8 (byte {error.start})") from None
        except ValueError as error:
            raise SettingsError(source, "(file)", f"not valid JSON ({error})") from None
        return cls.from_mapping(data, source=source)


def _settings_pairs(pairs):
    result = dict(pairs)
    if len(result) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {json.dumps(key)}")
            seen.add(key)
    return result


_DEFAULT_SETTINGS: Final = NormalizerSettings()


# --------------------------------------------------------------------------------------------------
# Tenancy
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoutingIdentity:
    """Per tenant and application: the ``PrefixAwareId`` routing hint and vLLM's ``cache_salt``."""

    prefix_aware_id: str
    cache_salt: str

    def __post_init__(self) -> None:
        if not isinstance(self.prefix_aware_id, str) or not _ROUTING_ID_RE.fullmatch(self.prefix_aware_id):
            raise ValueError(
                f"prefix_aware_id: not a valid PrefixAwareId (got {_describe(self.prefix_aware_id)}); "
                "allowed: 1-64 printable ASCII characters without spaces"
            )
        if not isinstance(self.cache_salt, str) or not _SALT_RE.fullmatch(self.cache_salt):
            raise ValueError(
                f"cache_salt: not a valid salt (got {_describe(self.cache_salt)}); "
                "allowed: 1-256 printable ASCII characters without spaces"
            )


_ID_CONTEXT: Final = b"prefix_routing/prefix-aware-id/v1\x00"
_SALT_CONTEXT: Final = b"prefix_routing/cache-salt/v1\x00"


def _identity_message(tenant: str, application: str | None) -> bytes:
    # Length-prefixed so that ("ab", "c") and ("a", "bc") and ("abc", None) never collide.
    encoded = tenant.encode("utf-8")
    parts = [len(encoded).to_bytes(4, "big"), encoded]
    if application is None:
        parts.append(b"\x00")
    else:
        app = application.encode("utf-8")
        parts += [b"\x01", len(app).to_bytes(4, "big"), app]
    return b"".join(parts)


def routing_identity(tenant: str, application: str | None, key: bytes) -> RoutingIdentity:
    """Derive the routing id and the cache salt of a tenant (and application) with HMAC-SHA256.

    ``key`` is a secret of at least 16 bytes. Neither the key nor the tenant appears in the result:
    ``prefix_aware_id`` is ``"pa-"`` + 40 hex digits (160 bits) of one HMAC, ``cache_salt`` 32 hex
    digits (128 bits) of another (separate domain strings), so one cannot be computed from the other.
    Raises :class:`ValueError` for an empty tenant or application, a non-string, or a short key.
    """
    if not isinstance(tenant, str) or not tenant:
        raise ValueError(f"tenant: must be a non-empty string (got {_describe(tenant)})")
    if application is not None and (not isinstance(application, str) or not application):
        raise ValueError(f"application: must be None or a non-empty string (got {_describe(application)})")
    if not isinstance(key, (bytes, bytearray, memoryview)) or len(key) < 16:
        raise ValueError("key: must be at least 16 bytes of secret key material")
    try:
        message = _identity_message(tenant, application)
    except UnicodeEncodeError:
        raise ValueError("tenant/application: must be valid Unicode (no unpaired surrogates)") from None
    key = bytes(key)
    routing = hmac.new(key, _ID_CONTEXT + message, hashlib.sha256).hexdigest()[:40]
    salt = hmac.new(key, _SALT_CONTEXT + message, hashlib.sha256).hexdigest()[:32]
    return RoutingIdentity(prefix_aware_id=f"pa-{routing}", cache_salt=salt)


# --------------------------------------------------------------------------------------------------
# Fingerprints
# --------------------------------------------------------------------------------------------------


def prefix_fingerprint(data: bytes, prefix_length: int) -> str:
    """``sha256(data[:prefix_length])``, first 16 hex digits: equal routing keys, equal fingerprints."""
    if isinstance(prefix_length, bool) or not isinstance(prefix_length, int) or prefix_length < 1:
        raise ValueError(f"prefix_length: must be a positive integer (got {prefix_length!r})")
    return hashlib.sha256(memoryview(data)[:prefix_length]).hexdigest()[:FINGERPRINT_HEX_DIGITS]


def block_hashes(data: bytes, block_bytes: int) -> tuple[str, ...]:
    """Chained hashes of the full ``block_bytes``-sized blocks of ``data`` (a partial last block is not hashed).

    ``h0 = sha256(block0)``, ``hi = sha256(h(i-1) || block i)`` on the 32-byte digests; each hash
    therefore covers everything before its block's end (like a KV-cache block hash). Returned as the
    first 16 hex digits of each digest.
    """
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < 1:
        raise ValueError(f"block_bytes: must be a positive integer (got {block_bytes!r})")
    view = memoryview(data)
    sha256 = hashlib.sha256
    previous = b""
    digests = []
    for start in range(0, len(view) - block_bytes + 1, block_bytes):
        digest = sha256(previous)
        digest.update(view[start:start + block_bytes])
        previous = digest.digest()
        digests.append(previous)
    hashes = [d[: FINGERPRINT_HEX_DIGITS // 2].hex() for d in digests]
    return tuple(hashes)


# --------------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Normalized:
    body: bytes  # canonical JSON bytes
    kind: str  # "chat" | "completion" | "lmi"
    prefix_fingerprint: str  # prefix_fingerprint(body, settings.prefix_length)
    block_hashes: tuple[str, ...]  # block_hashes(body, settings.block_bytes)
    changes: tuple[str, ...]  # what was changed, for --explain; never prompt text


# --------------------------------------------------------------------------------------------------
# Paths and notes
# --------------------------------------------------------------------------------------------------


def _path(parts: tuple) -> str:
    """A JSON path such as ``messages[2].content``; very deep paths keep their first and last 8 steps."""
    out = []
    for part in parts:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif _IDENTIFIER_RE.fullmatch(part):
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


class _Notes:
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


# --------------------------------------------------------------------------------------------------
# Text rules
# --------------------------------------------------------------------------------------------------


def normalize_text(text: str, *, system: bool = False) -> str:
    """The text rules applied to prompt text (``system=True`` also strips the end of a system prompt)."""
    return _text_rules(text, system, None, "")


def _text_rules(text: str, system: bool, notes: _Notes | None, path: str) -> str:
    # CR first: "\r" and "\n" are starters that compose with nothing, so the order with NFC is free,
    # and "\n" is a safe boundary for NFC: normalizing line by line equals normalizing the whole.
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        if notes is not None:
            notes.add_text("cr", path)
    if len(text) < _LINEWISE_MIN:
        if not text.isascii():
            normal = _NFC(text)
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
        normal = lines if text.isascii() else list(map(_NFC, lines))
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


# --------------------------------------------------------------------------------------------------
# Parsing and validation
# --------------------------------------------------------------------------------------------------


class _DuplicateKeys(dict):
    __slots__ = ("duplicate",)


class _NonFinite:
    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _find(root: Any, predicate) -> tuple | None:
    """Depth-first, document order: the path of the first node for which predicate is true."""
    stack: list[tuple[Any, tuple]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if predicate(node):
            return path
        if isinstance(node, dict):
            stack.extend((v, path + (k,)) for k, v in reversed(list(node.items())))
        elif isinstance(node, list):
            stack.extend((v, path + (i,)) for i, v in reversed(list(enumerate(node))))
    return None


def _too_deep_path(root: Any, max_depth: int) -> tuple | None:
    stack: list[tuple[Any, int, tuple]] = [(root, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if depth > max_depth:
            return path
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, (dict, list)):
                    stack.append((value, depth + 1, path + (key,)))
        else:
            for index, value in enumerate(node):
                if isinstance(value, (dict, list)):
                    stack.append((value, depth + 1, path + (index,)))
    return None


def _too_deep(field_path: str, max_depth: int) -> NormalizationError:
    return NormalizationError(field_path, f"JSON nested deeper than {max_depth} levels",
                              allowed=f"at most {max_depth} levels of objects and lists", code="too_deep")


def _parse_bytes(body: bytes, settings: NormalizerSettings, notes: _Notes) -> dict:
    if len(body) > settings.max_body_bytes:
        raise NormalizationError("body", f"too large: {len(body)} bytes",
                                 allowed=f"at most {settings.max_body_bytes} bytes", code="too_large")
    if body.startswith(_BOM):
        body = body[3:]
        notes.other.append("removed a UTF-8 byte order mark")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise NormalizationError("body", f"not valid UTF-8 at byte {error.start}",
                                 allowed="UTF-8 encoded JSON", code="invalid_utf8") from None
    return _parse_text(text, settings, body.count(b"{") + body.count(b"["))


def _parse_text(text: str, settings: NormalizerSettings, brackets: int | None = None) -> dict:
    if not text or text.isspace():
        raise NormalizationError("body", "empty", allowed="a JSON object", code="empty")
    flags = []

    def pairs_hook(pairs):
        result = dict(pairs)
        if len(result) != len(pairs):
            seen = set()
            for key, _ in pairs:
                if key in seen:
                    break
                seen.add(key)
            result = _DuplicateKeys(result)
            result.duplicate = key
            flags.append("duplicate")
        return result

    def constant(literal):
        flags.append("constant")
        return _NonFinite(literal)

    def parse_float(literal):
        number = float(literal)
        if math.isinf(number):
            flags.append("constant")
            return _NonFinite(literal)
        return number

    try:
        data = json.JSONDecoder(object_pairs_hook=pairs_hook, parse_constant=constant,
                                parse_float=parse_float).decode(text)
    except RecursionError:
        raise _too_deep("body", settings.max_depth) from None
    except json.JSONDecodeError as error:
        raise NormalizationError("body", f"invalid JSON: {error.msg} (line {error.lineno}, column {error.colno})",
                                 allowed="a JSON object (RFC 8259)", code="invalid_json") from None
    except ValueError as error:  # e.g. an integer with more digits than int() accepts
        raise NormalizationError("body", f"invalid JSON number: {str(error)[:80]}",
                                 allowed="numbers with at most 4300 digits", code="invalid_json") from None
    if flags:
        if "duplicate" in flags:
            path = _find(data, lambda n: isinstance(n, _DuplicateKeys))
            node = data
            for part in path:
                node = node[part]
            raise NormalizationError(_path(path), f"duplicate key {json.dumps(node.duplicate[:40])}",
                                     allowed="each key at most once per object", code="duplicate_key")
        path = _find(data, lambda n: isinstance(n, _NonFinite))
        node = data
        for part in path:
            node = node[part]
        raise NormalizationError(_path(path), f"non-finite number {node.literal[:40]}",
                                 allowed="finite JSON numbers (no NaN, Infinity or overflowing exponents)",
                                 code="non_finite_number")
    if not isinstance(data, dict):
        raise NormalizationError("body", "not a JSON object", value=data, allowed="a JSON object", code="not_object")
    if brackets is None:
        brackets = text.count("{") + text.count("[")
    if brackets > settings.max_depth:  # depth <= number of opening brackets: no walk needed
        path = _too_deep_path(data, settings.max_depth)
        if path is not None:
            raise _too_deep(_path(path), settings.max_depth)
    return data


def _from_python(value: Any, depth: int, max_depth: int, path: tuple) -> Any:
    """Copy a Python object into plain JSON types, validating as the parser would."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if value.bit_length() > 14000:  # str(int) refuses more than 4300 digits
            raise NormalizationError(_path(path), "integer too large", allowed="integers of at most 4200 digits")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NormalizationError(_path(path), "non-finite number", value=value,
                                     allowed="finite numbers", code="non_finite_number")
        return float(value)
    if isinstance(value, (Mapping, list, tuple)):
        if depth > max_depth:
            raise _too_deep(_path(path), max_depth)
        if isinstance(value, Mapping):
            result = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise NormalizationError(_path(path), "object key is not a string", value=key,
                                             allowed="string keys")
                result[key] = _from_python(item, depth + 1, max_depth, path + (key,))
            return result
        return [_from_python(item, depth + 1, max_depth, path + (i,)) for i, item in enumerate(value)]
    raise NormalizationError(_path(path), "not a JSON value", value=value,
                             allowed="dict, list, str, int, float, bool or None")


def _load(body: Any, settings: NormalizerSettings, notes: _Notes) -> dict:
    if isinstance(body, (bytes, bytearray, memoryview)):
        return _parse_bytes(bytes(body), settings, notes)
    if isinstance(body, str):
        size = len(body.encode("utf-8", "surrogatepass"))
        if size > settings.max_body_bytes:
            raise NormalizationError("body", f"too large: {size} bytes",
                                     allowed=f"at most {settings.max_body_bytes} bytes", code="too_large")
        if body.startswith("\ufeff"):
            body = body[1:]
            notes.other.append("removed a byte order mark")
        return _parse_text(body, settings)
    if isinstance(body, Mapping):
        return _from_python(body, 1, settings.max_depth, ())
    raise NormalizationError("body", "unsupported body type", value=body,
                             allowed="bytes, str or a mapping", code="not_object")


# --------------------------------------------------------------------------------------------------
# Freeze rules
# --------------------------------------------------------------------------------------------------


class _FreezeState:
    """Placeholder assignments of one body (or one completion prompt string)."""

    __slots__ = ("by_value", "next_index", "new_lines", "counts")

    def __init__(self) -> None:
        self.by_value: dict[tuple[str, str], str] = {}
        self.next_index: dict[str, int] = {}
        self.new_lines: list[str] = []
        self.counts: dict[str, int] = {}

    def learn_text(self, text: str) -> None:
        """Existing placeholders (from an earlier normalization) reserve their numbers."""
        if "⟦" in text:
            for name, number in _PLACEHOLDER_PARTS_RE.findall(text):
                self.next_index[name] = max(self.next_index.get(name, 1), int(number) + 1)

    def learn_block(self, block: str) -> None:
        for line in block.split("\n")[1:]:
            match = _FREEZE_LINE_RE.fullmatch(line)
            if not match:
                continue
            try:
                value = json.loads(match.group(2))
            except ValueError:
                continue
            if isinstance(value, str):
                name, _, _ = match.group(1)[1:-1].partition(":")
                self.by_value.setdefault((name, value), match.group(1))
        self.learn_text(block)

    def placeholder(self, name: str, value: str) -> str:
        self.counts[name] = self.counts.get(name, 0) + 1
        key = (name, value)
        found = self.by_value.get(key)
        if found is None:
            number = self.next_index.get(name, 1)
            self.next_index[name] = number + 1
            found = f"⟦{name}:{number}⟧"
            self.by_value[key] = found
            self.new_lines.append(f"{found} = {json.dumps(value, ensure_ascii=False)}")
        return found


def _freeze_text(text: str, rules: tuple[FreezeRule, ...], state: _FreezeState, system: bool) -> str:
    """Replace the rules' matches by placeholders (never inside an existing placeholder), to a fixpoint."""
    for _ in range(64):
        before = text
        for rule in rules:
            pieces = _PLACEHOLDER_RE.split(text)
            changed = False
            for index in range(0, len(pieces), 2):  # even indexes: plain text between placeholders
                piece = pieces[index]
                if not piece:
                    continue

                def substitute(match, name=rule.name):
                    value = match.group(0)
                    return state.placeholder(name, value) if value else value

                replaced = rule._regex.sub(substitute, piece)
                if replaced != piece:
                    pieces[index] = replaced
                    changed = True
            if changed:
                text = "".join(pieces)
        if text == before:
            return text
        text = _text_rules(text, system, None, "")
    return text


def _render_block(lines: list[str]) -> str:
    return "\n".join([FREEZE_HEADER, *lines])


def _freeze_note(state: _FreezeState, where: str, target: str) -> str:
    counts = ", ".join(f"{name} ×{count}" for name, count in sorted(state.counts.items()))
    return f"freeze: {counts} in {where} replaced by placeholders; values in {target}"


def _is_values_message(message: dict) -> bool:
    """A system message that an earlier normalization added to carry the values of frozen segments."""
    content = message.get("content")
    return message["role"] in SYSTEM_ROLES and isinstance(content, str) and content.startswith(FREEZE_HEADER)


def _freeze_chat(messages: list[dict], settings: NormalizerSettings, notes: _Notes) -> None:
    block_end = 0
    while block_end < len(messages) and messages[block_end]["role"] in SYSTEM_ROLES and not _is_values_message(
        messages[block_end]
    ):
        block_end += 1
    if block_end == 0:
        return
    rules = settings.freeze_rules
    state = _FreezeState()
    # Where an earlier normalization put the values, if it did.
    existing_message = block_end < len(messages) and _is_values_message(messages[block_end])
    user = messages[block_end] if block_end < len(messages) and messages[block_end]["role"] == "user" else None
    existing_user_part = False
    if existing_message:
        state.learn_block(messages[block_end]["content"])
    elif user is not None:
        content = user.get("content")
        if isinstance(content, str) and content.startswith(FREEZE_HEADER):
            state.learn_block(content.split("\n\n", 1)[0])
            existing_user_part = True
        elif (isinstance(content, list) and content and content[0].get("type") == "text"
              and isinstance(content[0].get("text"), str) and content[0]["text"].startswith(FREEZE_HEADER)):
            state.learn_block(content[0]["text"])
            existing_user_part = True
    for message in messages[:block_end]:
        content = message.get("content")
        if isinstance(content, str):
            state.learn_text(content)
        elif isinstance(content, list):
            for part in content:
                if part.get("type") == "text":
                    state.learn_text(part["text"])
    where = []
    for index, message in enumerate(messages[:block_end]):
        content = message.get("content")
        if isinstance(content, str):
            frozen = _freeze_text(content, rules, state, True)
            if frozen != content:
                message["content"] = frozen
                where.append(f"messages[{index}].content")
        elif isinstance(content, list):
            for part_index, part in enumerate(content):
                if part.get("type") == "text":
                    frozen = _freeze_text(part["text"], rules, state, True)
                    if frozen != part["text"]:
                        part["text"] = frozen
                        where.append(f"messages[{index}].content[{part_index}].text")
    if not state.new_lines:
        return
    where_text = ", ".join(where)
    if existing_message:
        target = messages[block_end]
        target["content"] = _text_rules(target["content"] + "\n" + "\n".join(state.new_lines), True, None, "")
        notes.other.append(_freeze_note(state, where_text, f"messages[{block_end}] (appended)"))
        return
    if settings.freeze_placement == "first_user_message" and user is not None and (
        isinstance(user.get("content"), (str, list))
    ):
        content = user["content"]
        if isinstance(content, str):
            if existing_user_part:
                head, sep, rest = content.partition("\n\n")
                content = head + "\n" + "\n".join(state.new_lines) + sep + rest
            else:
                content = _render_block(state.new_lines) + ("\n\n" + content if content else "")
            user["content"] = _text_rules(content, False, None, "")
        elif existing_user_part:
            content[0]["text"] = _text_rules(content[0]["text"] + "\n" + "\n".join(state.new_lines), False, None, "")
        else:
            content.insert(0, {"type": "text", "text": _text_rules(_render_block(state.new_lines), False, None, "")})
        notes.other.append(_freeze_note(state, where_text, f"the start of messages[{block_end}] (first user message)"))
        return
    role = messages[block_end - 1]["role"]
    messages.insert(block_end, {"role": role, "content": _text_rules(_render_block(state.new_lines), True, None, "")})
    notes.other.append(_freeze_note(state, where_text, f"a new {role} message messages[{block_end}]"))


def _freeze_prompt(text: str, settings: NormalizerSettings, notes: _Notes, path: str) -> str:
    """Completion / LMI prompt: the shared head is everything before the last blank line."""
    state = _FreezeState()
    marker = text.find("\n\n" + FREEZE_HEADER)
    if marker >= 0:
        head, rest = text[:marker], text[marker + 2:]
        block, sep, tail = rest.partition("\n\n")
        state.learn_block(block)
    else:
        cut = text.rfind("\n\n")
        if cut <= 0:  # no blank line: no head to share, nothing is frozen (documented)
            return text
        head, block, sep, tail = text[:cut], "", "\n\n", text[cut + 2:]
    state.learn_text(head)
    frozen = _freeze_text(head, settings.freeze_rules, state, False)
    if not state.new_lines:
        return text
    block = block + "\n" + "\n".join(state.new_lines) if block else _render_block(state.new_lines)
    notes.other.append(_freeze_note(state, path + " (before its last blank line)", f"{path} before its last paragraph"))
    return _text_rules(frozen + "\n\n" + block + (sep or "\n\n") + tail, False, None, "")


# --------------------------------------------------------------------------------------------------
# Body shapes
# --------------------------------------------------------------------------------------------------

_CONTENT_ALLOWED: Final = "a string, a list of content parts, or null/absent (assistant messages only)"


def _chat_messages(messages: Any, settings: NormalizerSettings, notes: _Notes) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise NormalizationError("messages", "not a non-empty list", value=messages,
                                 allowed="a non-empty list of message objects")
    out = []
    reordered = 0
    for index, message in enumerate(messages):
        path = f"messages[{index}]"
        if not isinstance(message, dict):
            raise NormalizationError(path, "not an object", value=message,
                                     allowed='an object with a string "role" and a "content"')
        role = message.get("role")
        if not isinstance(role, str) or not role:
            if "role" not in message:
                raise NormalizationError(f"{path}.role", "missing", allowed='a non-empty string such as "user"',
                                         code="missing_field")
            raise NormalizationError(f"{path}.role", "not a non-empty string", value=role,
                                     allowed='a non-empty string such as "system", "user", "assistant", "tool"')
        system = role in SYSTEM_ROLES
        new = {"role": role}
        if "content" in message:
            content = message["content"]
            if isinstance(content, str):
                content = _text_rules(content, system, notes, f"{path}.content")
            elif isinstance(content, list):
                content = _content_parts(content, system, notes, f"{path}.content")
            elif content is None:
                if role != "assistant":
                    raise NormalizationError(f"{path}.content", "null", allowed=_CONTENT_ALLOWED)
            else:
                raise NormalizationError(f"{path}.content", "wrong type", value=content, allowed=_CONTENT_ALLOWED)
            new["content"] = content
        elif role != "assistant":
            raise NormalizationError(f"{path}.content", "missing", allowed=_CONTENT_ALLOWED, code="missing_field")
        keys = list(message)
        if len(keys) > len(new):
            for key in sorted(k for k in keys if k != "role" and k != "content"):
                new[key] = message[key]
        if list(new) != keys:
            reordered += 1
        out.append(new)
    if reordered:
        plural = "s" if reordered != 1 else ""
        notes.other.append(f"keys reordered (role, content, then sorted) in {reordered} message{plural}")
    if settings.freeze_rules:
        _freeze_chat(out, settings, notes)
    return out


def _content_parts(parts: list, system: bool, notes: _Notes, path: str) -> list:
    out = []
    for index, part in enumerate(parts):
        part_path = f"{path}[{index}]"
        if not isinstance(part, dict):
            raise NormalizationError(part_path, "not an object", value=part,
                                     allowed='a content part object with a string "type"')
        kind = part.get("type")
        if not isinstance(kind, str):
            raise NormalizationError(f"{part_path}.type", "missing or not a string",
                                     value=kind if "type" in part else _NO_VALUE,
                                     allowed='a string such as "text" or "image_url"',
                                     code="invalid_field" if "type" in part else "missing_field")
        new = {"type": kind}
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise NormalizationError(f"{part_path}.text", "missing or not a string",
                                         value=text if "text" in part else _NO_VALUE,
                                         allowed="a string (the text of a text part)",
                                         code="invalid_field" if "text" in part else "missing_field")
        for key in sorted(k for k in part if k != "type"):
            value = part[key]
            if kind == "text" and key == "text":
                value = _text_rules(value, system, notes, f"{part_path}.text")
            new[key] = value
        out.append(new)
    return out


_PROMPT_ALLOWED: Final = ("a string, a non-empty list of strings, a non-empty list of token ids (integers), "
                          "or a non-empty list of non-empty lists of token ids")


def _is_token_ids(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(t, int) and not isinstance(t, bool) for t in value))


def _prompt(prompt: Any, settings: NormalizerSettings, notes: _Notes, name: str) -> Any:
    if isinstance(prompt, str):
        text = _text_rules(prompt, False, notes, name)
        return _freeze_prompt(text, settings, notes, name) if settings.freeze_rules else text
    if isinstance(prompt, list) and prompt:
        if all(isinstance(item, str) for item in prompt):
            out = []
            for index, item in enumerate(prompt):
                text = _text_rules(item, False, notes, f"{name}[{index}]")
                if settings.freeze_rules:
                    text = _freeze_prompt(text, settings, notes, f"{name}[{index}]")
                out.append(text)
            return out
        if name == "prompt" and (_is_token_ids(prompt) or all(_is_token_ids(item) for item in prompt)):
            return prompt
    allowed = _PROMPT_ALLOWED if name == "prompt" else "a string or a non-empty list of strings"
    raise NormalizationError(name, "wrong type", value=prompt, allowed=allowed)


def _order_fields(data: dict, known: tuple[str, ...], out: dict) -> None:
    """Append to ``out`` the known fields of ``data`` in order, then the others sorted by code point."""
    for key in known:
        if key in data and key not in out:
            out[key] = data[key]
    for key in sorted(k for k in data if k not in out):
        out[key] = data[key]


# --------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------


def normalize_body(
    body: bytes | str | Mapping,
    settings: NormalizerSettings = _DEFAULT_SETTINGS,
    *,
    identity: RoutingIdentity | None = None,
) -> Normalized:
    """Rewrite a request body into its canonical bytes; raise :class:`NormalizationError` if it is malformed.

    ``body`` is the raw request (bytes or str) or an already parsed mapping. With ``identity``,
    chat and completion bodies get ``cache_salt`` as their first key (replacing a client's value);
    LMI bodies get no salt (isolation there is through ``PrefixAwareId`` only).
    """
    if not isinstance(settings, NormalizerSettings):
        raise TypeError("settings must be a NormalizerSettings")
    if identity is not None and not isinstance(identity, RoutingIdentity):
        raise TypeError("identity must be a RoutingIdentity or None")
    try:
        return _normalize(body, settings, identity)
    except RecursionError:  # a deep Mapping given by a caller that is itself deep in the stack
        raise _too_deep("body", settings.max_depth) from None


def _normalize(body: Any, settings: NormalizerSettings, identity: RoutingIdentity | None) -> Normalized:
    notes = _Notes()
    data = _load(body, settings, notes)

    present = [name for name in PROMPT_FIELDS if name in data]
    if len(present) != 1:
        raise NormalizationError(
            "body", "no prompt field" if not present else f"several prompt fields ({', '.join(present)})",
            allowed='exactly one of "messages" (chat), "prompt" (completion) or "inputs" (LMI/TGI)',
            code="missing_field" if not present else "ambiguous_kind",
        )
    first = present[0]
    kind = PROMPT_FIELDS[first]
    out: dict[str, Any] = {}
    if kind == "lmi":
        out["inputs"] = _prompt(data["inputs"], settings, notes, "inputs")
        parameters = data.get("parameters")
        if "parameters" in data:
            if not isinstance(parameters, dict):
                raise NormalizationError("parameters", "not an object", value=parameters,
                                         allowed="an object of generation parameters")
            if list(parameters) != sorted(parameters):
                notes.other.append("parameters: keys sorted")
            out["parameters"] = {key: parameters[key] for key in sorted(parameters)}
        # No cache_salt for LMI/TGI bodies (the container does not take it), identity or not:
        # tenants are kept apart by PrefixAwareId only. Nothing changes, so nothing is noted.
        _order_fields(data, KNOWN_LMI_FIELD_ORDER, out)
    else:
        salt = data.get("cache_salt", _NO_VALUE)
        if salt is not _NO_VALUE and (not isinstance(salt, str) or not salt):
            raise NormalizationError("cache_salt", "not a non-empty string", value=salt, allowed="a non-empty string")
        if identity is not None:
            if salt is _NO_VALUE:
                notes.other.append("cache_salt: added from the routing identity (first key)")
            elif salt != identity.cache_salt:
                notes.other.append("cache_salt: the client's value replaced by the routing identity's (first key)")
            salt = identity.cache_salt
        if salt is not _NO_VALUE:
            out["cache_salt"] = salt
        if kind == "chat":
            out["messages"] = _chat_messages(data["messages"], settings, notes)
        else:
            out["prompt"] = _prompt(data["prompt"], settings, notes, "prompt")
        _order_fields(data, KNOWN_FIELD_ORDER, out)

    input_order = [k for k in data if k != "cache_salt" or kind == "lmi"]
    output_order = [k for k in out if k != "cache_salt" or kind == "lmi"]
    if input_order != output_order:
        notes.other.append(f"top-level fields reordered: {first} first, then the canonical order")

    try:
        raw = _ENCODER.encode(out).encode("utf-8")
    except UnicodeEncodeError:
        path = _find(data, _has_surrogate) or ()
        raise NormalizationError(_path(path), "text contains an unpaired surrogate (e.g. \\ud800)",
                                 allowed="valid Unicode text", code="invalid_unicode") from None
    if len(raw) > settings.max_body_bytes:
        raise NormalizationError("body", f"too large after normalization: {len(raw)} bytes",
                                 allowed=f"at most {settings.max_body_bytes} bytes", code="too_large")
    if isinstance(body, (bytes, bytearray)) and raw != body:
        notes.other.append("JSON re-serialized: compact separators, UTF-8 without \\u escapes")
    return Normalized(
        body=raw,
        kind=kind,
        prefix_fingerprint=prefix_fingerprint(raw, settings.prefix_length),
        block_hashes=block_hashes(raw, settings.block_bytes),
        changes=notes.render(),
    )


def _has_surrogate(node: Any) -> bool:
    candidates = [node] if isinstance(node, str) else list(node) if isinstance(node, dict) else []
    for text in candidates:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return True
    return False


_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False)
