"""What a stage field allows, in words: the configuration reference's "type" and "allowed" columns,
and the words every refused value is told (a type error included), so that the two never differ.

Read from the fields themselves: their annotation (integer, number, string, boolean, a choice, a list
or table), their bounds, lengths and pattern, and the ``allowed`` text of fields whose rule is a
validator (:func:`prefix_routing.stage.section.allowed`).
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

from pydantic import BaseModel


def range_text(metadata: Any) -> str | None:
    """'from 1024 to 65536', 'more than 0, less than 1'... from a field's Ge/Gt/Le/Lt bounds, or None."""
    bounds = {
        type(m).__name__: getattr(m, type(m).__name__.lower())
        for m in (metadata or ())
        if type(m).__name__ in ("Ge", "Gt", "Le", "Lt")
    }
    low = bounds.get("Ge", bounds.get("Gt"))
    high = bounds.get("Le", bounds.get("Lt"))
    if low is None and high is None:
        return None
    low_word = "more than" if "Gt" in bounds else "from"
    high_word = "less than" if "Lt" in bounds else "to"  # "to 1" would wrongly allow 1
    if high is None:
        return f"{low_word} {low}"
    if low is None:
        return f"at most {high}" if high_word == "to" else f"less than {high}"
    return f"{low_word} {low} to {high}" if high_word == "to" else f"{low_word} {low}, {high_word} {high}"


def code_span(value: Any) -> str:
    return f"`{value}`"


def without_none(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            return args[0], True
    return annotation, False


def strip_annotated(annotation: Any) -> tuple[Any, list[Any]]:
    if typing.get_origin(annotation) is typing.Annotated:
        base, *metadata = typing.get_args(annotation)
        flattened = []
        for m in metadata:  # Field(...) inside Annotated carries its constraints in .metadata
            flattened.extend(getattr(m, "metadata", None) or [m])
        return base, flattened
    return annotation, []


def type_text(annotation: Any) -> str:
    base, optional = without_none(annotation)
    base, _ = strip_annotated(base)
    origin = typing.get_origin(base)
    if origin is Literal:
        values = typing.get_args(base)
        text = "integer" if all(isinstance(v, int) for v in values) else "string"
    elif origin is list:
        (item,) = typing.get_args(base)
        text = f"list of {type_text(item)}s"
    elif origin is dict:
        _, value = typing.get_args(base)
        inner = (("limits" if value.__name__ == "TenantLimitSettings" else "sections (below)")
                 if isinstance(value, type) and issubclass(value, BaseModel) else f"{type_text(value)}s")
        text = f"table of {inner}"
    elif origin in (typing.Union, types.UnionType):  # e.g. a rate or `auto`
        text = " or ".join(type_text(arg) for arg in typing.get_args(base))
    else:
        text = {str: "string", int: "integer", float: "number", bool: "boolean"}[base]
    return f"{text} or unset" if optional else text


def _constraint_parts(metadata: list[Any]) -> list[str]:
    parts = []
    bounds = range_text(metadata)
    if bounds:
        parts.append(bounds)
    lengths = {type(m).__name__: getattr(m, "min_length", None) or getattr(m, "max_length", None)
               for m in metadata if type(m).__name__ in ("MinLen", "MaxLen")}
    if "MinLen" in lengths and "MaxLen" in lengths:
        parts.append(f"{lengths['MinLen']} to {lengths['MaxLen']} characters")
    elif "MaxLen" in lengths:
        parts.append(f"at most {lengths['MaxLen']} characters")
    elif "MinLen" in lengths:
        parts.append(f"at least {lengths['MinLen']} characters")
    for m in metadata:
        pattern = getattr(m, "pattern", None)
        if pattern:
            parts.append(f"matches {code_span(pattern)}")
    return parts


def allowed_text(field: Any) -> str:
    base, _ = without_none(field.annotation)
    base, inner = strip_annotated(base)
    parts: list[str] = []
    origin = typing.get_origin(base)
    if origin is Literal:
        parts.append(", ".join(code_span(v) for v in typing.get_args(base)))
    if origin in (list, dict):
        limit = next((m.max_length for m in field.metadata if type(m).__name__ == "MaxLen"), None)
        if limit is not None:
            parts.append(f"at most {limit} entries")
        if origin is list:
            _, item_metadata = strip_annotated(typing.get_args(base)[0])
            item_parts = _constraint_parts(item_metadata)
            if item_parts:
                parts.append("each " + ", ".join(item_parts))
    else:
        parts.extend(_constraint_parts(list(field.metadata) + inner))
    extra = (field.json_schema_extra or {}).get("allowed")
    if extra:
        parts.append(extra)
    if not parts:
        return "`true`, `false`" if base is bool else "any"
    return "; ".join(parts)


_ARTICLES = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "`true` or `false`"}


def allowed_words(field: Any) -> str:
    """``allowed: …`` for a refused value of ``field``: its kind and what the reference allows, e.g.
    "allowed: an integer; from 1024 to 65536" or "allowed: `open`, `closed`"."""
    kind = type_text(field.annotation).removesuffix(" or unset")
    rules = allowed_text(field)
    if typing.get_origin(strip_annotated(without_none(field.annotation)[0])[0]) is Literal:
        return f"allowed: one of {rules}"
    if kind == "boolean":
        return "allowed: `true` or `false`"
    what = _ARTICLES.get(kind, f"a {kind}")
    return f"allowed: {what}" + ("" if rules in ("any", "") else f"; {rules}")
