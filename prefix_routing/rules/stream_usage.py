"""Whether a streamed OpenAI-style body asks for usage, and the body with it asked.

vLLM and llama.cpp report usage (and so cached tokens) at the end of a stream only when the body
says ``stream_options.include_usage``. The front door adds it to bodies that do not say (its
``stream_usage`` setting), and so does the load tester's ``openai`` target: this is the one rule
both follow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def usage_request(data: Any) -> tuple[bool, bool]:
    """(the body streams and asks for usage, the body streams and does not say either way)."""
    if not isinstance(data, Mapping) or data.get("stream") is not True:
        return False, False
    options = data.get("stream_options")
    if options is None:
        return False, True
    if isinstance(options, Mapping):
        if options.get("include_usage") is True:
            return True, False
        return False, "include_usage" not in options
    return False, False  # an odd stream_options is the caller's to keep


def with_include_usage(data: Mapping[str, Any]) -> dict[str, Any]:
    """The body with ``stream_options.include_usage`` set, its other stream options kept."""
    options = data.get("stream_options")
    return {**data, "stream_options": {**(options or {}), "include_usage": True}}
