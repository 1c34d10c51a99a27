"""Parsing and validation of a request body: UTF-8, strict JSON (no duplicate keys, no NaN), size and depth limits."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from prefix_routing.rules.constants import UTF8_BOM
from prefix_routing.rules.errors import NormalizationError
from prefix_routing.rules.notes import Notes, json_path
from prefix_routing.rules.settings import NormalizerSettings


class _DuplicateKeys(dict):
    __slots__ = ("duplicate",)


class _NonFinite:
    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


def find_path(root: Any, predicate) -> tuple | None:
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


def too_deep_error(field_path: str, max_depth: int) -> NormalizationError:
    return NormalizationError(field_path, f"JSON nested deeper than {max_depth} levels",
                              allowed=f"at most {max_depth} levels of objects and lists", code="too_deep")


def _parse_bytes(body: bytes, settings: NormalizerSettings, notes: Notes) -> dict:
    if len(body) > settings.max_body_bytes:
        raise NormalizationError("body", f"too large: {len(body)} bytes",
                                 allowed=f"at most {settings.max_body_bytes} bytes", code="too_large")
    if body.startswith(UTF8_BOM):
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
        raise too_deep_error("body", settings.max_depth) from None
    except json.JSONDecodeError as error:
        raise NormalizationError("body", f"invalid JSON: {error.msg} (line {error.lineno}, column {error.colno})",
                                 allowed="a JSON object (RFC 8259)", code="invalid_json") from None
    except ValueError as error:  # e.g. an integer with more digits than int() accepts
        raise NormalizationError("body", f"invalid JSON number: {str(error)[:80]}",
                                 allowed="numbers with at most 4300 digits", code="invalid_json") from None
    if flags:
        if "duplicate" in flags:
            path = find_path(data, lambda n: isinstance(n, _DuplicateKeys))
            node = data
            for part in path:
                node = node[part]
            raise NormalizationError(json_path(path), f"duplicate key {json.dumps(node.duplicate[:40])}",
                                     allowed="each key at most once per object", code="duplicate_key")
        path = find_path(data, lambda n: isinstance(n, _NonFinite))
        node = data
        for part in path:
            node = node[part]
        raise NormalizationError(json_path(path), f"non-finite number {node.literal[:40]}",
                                 allowed="finite JSON numbers (no NaN, Infinity or overflowing exponents)",
                                 code="non_finite_number")
    if not isinstance(data, dict):
        raise NormalizationError("body", "not a JSON object", value=data, allowed="a JSON object", code="not_object")
    if brackets is None:
        brackets = text.count("{") + text.count("[")
    if brackets > settings.max_depth:  # depth <= number of opening brackets: no walk needed
        path = _too_deep_path(data, settings.max_depth)
        if path is not None:
            raise too_deep_error(json_path(path), settings.max_depth)
    return data


def _from_python(value: Any, depth: int, max_depth: int, path: tuple) -> Any:
    """Copy a Python object into plain JSON types, validating as the parser would."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if value.bit_length() > 14000:  # str(int) refuses more than 4300 digits
            raise NormalizationError(json_path(path), "integer too large", allowed="integers of at most 4200 digits")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NormalizationError(json_path(path), "non-finite number", value=value,
                                     allowed="finite numbers", code="non_finite_number")
        return float(value)
    if isinstance(value, (Mapping, list, tuple)):
        if depth > max_depth:
            raise too_deep_error(json_path(path), max_depth)
        if isinstance(value, Mapping):
            result = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise NormalizationError(json_path(path), "object key is not a string", value=key,
                                             allowed="string keys")
                result[key] = _from_python(item, depth + 1, max_depth, path + (key,))
            return result
        return [_from_python(item, depth + 1, max_depth, path + (i,)) for i, item in enumerate(value)]
    raise NormalizationError(json_path(path), "not a JSON value", value=value,
                             allowed="dict, list, str, int, float, bool or None")


def load_body(body: Any, settings: NormalizerSettings, notes: Notes) -> dict:
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
