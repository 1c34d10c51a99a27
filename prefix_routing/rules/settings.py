"""The normalizer's settings and freeze rules, validated once when they are made."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from os import PathLike
from typing import Any, Final

from prefix_routing.rules.constants import (
    RULE_NAME_RE,
    BLOCK_BYTES_MAX,
    BLOCK_BYTES_MIN,
    FREEZE_PLACEMENTS,
    MAX_BODY_BYTES_LIMIT,
    MAX_DEPTH_MAX,
    MAX_DEPTH_MIN,
    PREFIX_LENGTH_MAX,
    PREFIX_LENGTH_MIN,
)
from prefix_routing.rules.errors import SettingsError


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
        if not isinstance(self.name, str) or not RULE_NAME_RE.fullmatch(self.name):
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


DEFAULT_SETTINGS: Final = NormalizerSettings()
