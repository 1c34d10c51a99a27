"""SageMaker's OpenAI-compatible path: how it routes, and a request prepared for it.

On ``/endpoints/<name>/openai/v1/chat/completions`` (bearer token) ``PrefixAwareRoutingConfig``
works on the *text content of the ``messages`` array*, not on body bytes: ``PrefixLength`` counts
its characters, and the routing id is the body field ``prompt_cache_key`` instead of the
``X-Amzn-SageMaker-Prefix-Aware-Id`` header (botocore's ``PrefixAwareRoutingConfig``
documentation). So JSON layout and key order cannot scatter requests there, but the text can: the
text rules and freeze rules still matter, and tenants still need their own ``prompt_cache_key``
and ``cache_salt``.

"Text content" is read here as every message's text in order, joined without separators: a
string ``content`` as it is, a list of content parts as the ``text`` of its text parts. Roles, tool
calls and images are not text. (What SageMaker does with non-text parts is not documented.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from prefix_routing.rules.body import normalize_body
from prefix_routing.rules.errors import NormalizationError
from prefix_routing.rules.identity import RoutingIdentity
from prefix_routing.rules.settings import NormalizerSettings

#: The body field that is the routing id on the OpenAI-compatible path.
PROMPT_CACHE_KEY = "prompt_cache_key"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part["text"] for part in content
                       if isinstance(part, Mapping) and part.get("type", "text") == "text"
                       and isinstance(part.get("text"), str))
    return ""


def messages_text(messages: Any) -> str:
    """The text content of a ``messages`` array, in order (what ``PrefixLength`` counts there)."""
    if not isinstance(messages, list):
        return ""
    return "".join(_text_of(m.get("content")) for m in messages if isinstance(m, Mapping))


def routing_prefix(body: Mapping[str, Any], prefix_length: int) -> str:
    """The first ``prefix_length`` characters of the messages' text: the path's routing key."""
    return messages_text(body.get("messages"))[:prefix_length]


def routing_id(body: Mapping[str, Any]) -> str | None:
    """The path's routing id: ``prompt_cache_key`` when it is a non-empty string."""
    value = body.get(PROMPT_CACHE_KEY)
    return value if isinstance(value, str) and value else None


def prepare_openai_request(body: Mapping[str, Any] | str | bytes, settings: NormalizerSettings | None = None,
                           identity: RoutingIdentity | None = None) -> dict[str, Any]:
    """A chat request ready for the OpenAI-compatible path (or the ``openai`` SDK pointed at it).

    The text rules and freeze rules apply to the message text as on the invoke path (the key is
    text there); with ``identity``, ``prompt_cache_key`` is the tenant's ``PrefixAwareId`` (routing
    apart) and ``cache_salt`` its salt (engine cache apart). Returns the body as a dict: its JSON
    layout is irrelevant on this path. Raises :class:`NormalizationError` as ``normalize_body`` does,
    and for a body that is not a chat (``messages``).
    """
    normalized = normalize_body(body, settings or NormalizerSettings(), identity=identity)
    if normalized.kind != "chat":
        raise NormalizationError("body", f"a {normalized.kind} body: the OpenAI-compatible path takes chat bodies",
                                 allowed="a JSON object with 'messages'", code="not_chat")
    prepared = json.loads(normalized.body)
    if identity is not None:
        prepared[PROMPT_CACHE_KEY] = identity.prefix_aware_id
    return prepared
