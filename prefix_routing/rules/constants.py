"""The limits, field orders and patterns the normalization rules share (SageMaker's and vLLM's where they come from)."""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Final

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

PLACEHOLDER_RE: Final = re.compile(r"(⟦[A-Za-z][A-Za-z0-9_-]{0,39}:[1-9][0-9]{0,8}⟧)")
PLACEHOLDER_PARTS_RE: Final = re.compile(r"⟦([A-Za-z][A-Za-z0-9_-]{0,39}):([1-9][0-9]{0,8})⟧")
FREEZE_LINE_RE: Final = re.compile(r"(⟦[A-Za-z][A-Za-z0-9_-]{0,39}:[1-9][0-9]{0,8}⟧) = (\".*\")")
RULE_NAME_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")
IDENTIFIER_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ROUTING_ID_RE: Final = re.compile(r"[!-~]{1,64}")  # printable ASCII, no space: botocore's pattern holds
SALT_RE: Final = re.compile(r"[!-~]{1,256}")

UTF8_BOM: Final = b"\xef\xbb\xbf"
LINEWISE_MIN: Final = 512  # texts of at least this many characters get the text rules line by line
to_nfc: Final = functools.partial(unicodedata.normalize, "NFC")

NO_VALUE: Final = object()
