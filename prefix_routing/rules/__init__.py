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

Standard library only: this package runs in AWS Lambda, in client applications, in the lab and in the
emulator. It is deterministic across processes (no ``hash()``, no set iteration) and idempotent.

The modules: :mod:`.constants` (limits, field orders), :mod:`.errors`, :mod:`.settings`
(:class:`NormalizerSettings`, :class:`FreezeRule`), :mod:`.identity` (routing identity, fingerprints,
block hashes), :mod:`.text`, :mod:`.parse`, :mod:`.freeze`, :mod:`.body` (:func:`normalize_body`),
:mod:`.openai_path` (how the OpenAI-compatible path routes; :func:`prepare_openai_request`),
and :mod:`.telemetry` (the metric and log-field contract). Nothing here imports anything of ours
outside this package, nor anything outside the standard library.
"""

from prefix_routing.rules.body import Normalized, normalize_body
from prefix_routing.rules.constants import (
    BLOCK_BYTES_MIN,
    KNOWN_FIELD_ORDER,
    MAX_BODY_BYTES_LIMIT,
    PREFIX_LENGTH_MAX,
    PREFIX_LENGTH_MIN,
)
from prefix_routing.rules.errors import NormalizationError, SettingsError, UserError
from prefix_routing.rules.identity import RoutingIdentity, block_hashes, prefix_fingerprint, routing_identity
from prefix_routing.rules.openai_path import prepare_openai_request
from prefix_routing.rules.settings import FreezeRule, NormalizerSettings
from prefix_routing.rules.text import normalize_text

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
    "UserError",
    "block_hashes",
    "normalize_body",
    "normalize_text",
    "prefix_fingerprint",
    "prepare_openai_request",
    "routing_identity",
]
