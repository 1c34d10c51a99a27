"""The canonical body: chat, completion and LMI shapes, field order, compact JSON; :func:`normalize_body` is the entry point."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from prefix_routing.rules.constants import (
    NO_VALUE,
    KNOWN_FIELD_ORDER,
    KNOWN_LMI_FIELD_ORDER,
    PROMPT_FIELDS,
    SYSTEM_ROLES,
)
from prefix_routing.rules.errors import NormalizationError
from prefix_routing.rules.freeze import freeze_chat, freeze_prompt
from prefix_routing.rules.identity import RoutingIdentity, block_hashes, prefix_fingerprint
from prefix_routing.rules.notes import Notes, json_path
from prefix_routing.rules.parse import find_path, load_body, too_deep_error
from prefix_routing.rules.settings import DEFAULT_SETTINGS, NormalizerSettings
from prefix_routing.rules.text import text_rules


@dataclass(frozen=True)
class Normalized:
    body: bytes  # canonical JSON bytes
    kind: str  # "chat" | "completion" | "lmi"
    prefix_fingerprint: str  # prefix_fingerprint(body, settings.prefix_length)
    block_hashes: tuple[str, ...]  # block_hashes(body, settings.block_bytes)
    changes: tuple[str, ...]  # what was changed, for --explain; never prompt text


# --------------------------------------------------------------------------------------------------
# Body shapes
# --------------------------------------------------------------------------------------------------

_CONTENT_ALLOWED: Final = "a string, a list of content parts, or null/absent (assistant messages only)"


def _chat_messages(messages: Any, settings: NormalizerSettings, notes: Notes) -> list[dict]:
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
                content = text_rules(content, system, notes, f"{path}.content")
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
        freeze_chat(out, settings, notes)
    return out


def _content_parts(parts: list, system: bool, notes: Notes, path: str) -> list:
    out = []
    for index, part in enumerate(parts):
        part_path = f"{path}[{index}]"
        if not isinstance(part, dict):
            raise NormalizationError(part_path, "not an object", value=part,
                                     allowed='a content part object with a string "type"')
        kind = part.get("type")
        if not isinstance(kind, str):
            raise NormalizationError(f"{part_path}.type", "missing or not a string",
                                     value=kind if "type" in part else NO_VALUE,
                                     allowed='a string such as "text" or "image_url"',
                                     code="invalid_field" if "type" in part else "missing_field")
        new = {"type": kind}
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise NormalizationError(f"{part_path}.text", "missing or not a string",
                                         value=text if "text" in part else NO_VALUE,
                                         allowed="a string (the text of a text part)",
                                         code="invalid_field" if "text" in part else "missing_field")
        for key in sorted(k for k in part if k != "type"):
            value = part[key]
            if kind == "text" and key == "text":
                value = text_rules(value, system, notes, f"{part_path}.text")
            new[key] = value
        out.append(new)
    return out


_PROMPT_ALLOWED: Final = ("a string, a non-empty list of strings, a non-empty list of token ids (integers), "
                          "or a non-empty list of non-empty lists of token ids")


def _is_token_ids(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(t, int) and not isinstance(t, bool) for t in value))


def _prompt(prompt: Any, settings: NormalizerSettings, notes: Notes, name: str) -> Any:
    if isinstance(prompt, str):
        text = text_rules(prompt, False, notes, name)
        return freeze_prompt(text, settings, notes, name) if settings.freeze_rules else text
    if isinstance(prompt, list) and prompt:
        if all(isinstance(item, str) for item in prompt):
            out = []
            for index, item in enumerate(prompt):
                text = text_rules(item, False, notes, f"{name}[{index}]")
                if settings.freeze_rules:
                    text = freeze_prompt(text, settings, notes, f"{name}[{index}]")
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
    settings: NormalizerSettings = DEFAULT_SETTINGS,
    *,
    identity: RoutingIdentity | None = None,
) -> Normalized:
    """Rewrite a request body into its canonical bytes; raise :class:`NormalizationError` if it is malformed.

    ``body`` is the raw request (bytes or str) or an already parsed mapping. With ``identity``,
    chat and completion bodies get ``cache_salt`` as their first key (replacing a client's value);
    LMI bodies get no salt, and a client's ``cache_salt`` (top level or in ``parameters``) is removed
    (isolation there is through ``PrefixAwareId`` only).
    """
    if not isinstance(settings, NormalizerSettings):
        raise TypeError("settings must be a NormalizerSettings")
    if identity is not None and not isinstance(identity, RoutingIdentity):
        raise TypeError("identity must be a RoutingIdentity or None")
    try:
        return _normalize(body, settings, identity)
    except RecursionError:  # a deep Mapping given by a caller that is itself deep in the stack
        raise too_deep_error("body", settings.max_depth) from None


def _normalize(body: Any, settings: NormalizerSettings, identity: RoutingIdentity | None) -> Normalized:
    notes = Notes()
    data = load_body(body, settings, notes)

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
            out["parameters"] = {key: parameters[key] for key in sorted(parameters)
                                 if identity is None or key != "cache_salt"}
            if len(out["parameters"]) != len(parameters):
                notes.other.append("parameters.cache_salt: the client's value removed (LMI bodies carry no salt)")
        # LMI/TGI bodies carry no cache_salt of ours (the container does not take one): tenants are
        # kept apart by PrefixAwareId only. A client's own salt is removed wherever it stands, so that
        # no client can choose (or guess) another tenant's.
        if identity is not None and "cache_salt" in data:
            data = {key: value for key, value in data.items() if key != "cache_salt"}
            notes.other.append("cache_salt: the client's value removed (LMI bodies carry no salt)")
        _order_fields(data, KNOWN_LMI_FIELD_ORDER, out)
    else:
        salt = data.get("cache_salt", NO_VALUE)
        if salt is not NO_VALUE and (not isinstance(salt, str) or not salt):
            raise NormalizationError("cache_salt", "not a non-empty string", value=salt, allowed="a non-empty string")
        if identity is not None:
            if salt is NO_VALUE:
                notes.other.append("cache_salt: added from the routing identity (first key)")
            elif salt != identity.cache_salt:
                notes.other.append("cache_salt: the client's value replaced by the routing identity's (first key)")
            salt = identity.cache_salt
        if salt is not NO_VALUE:
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
        path = find_path(data, _has_surrogate) or ()
        raise NormalizationError(json_path(path), "text contains an unpaired surrogate (e.g. \\ud800)",
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
