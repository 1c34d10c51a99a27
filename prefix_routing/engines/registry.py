"""The kinds of local engine by name (``--kind``, ``--engine-kind``): llama.cpp and vLLM."""

from __future__ import annotations

from prefix_routing.engines.engine_kind import KIND_NAMES, LLAMA_CPP, VLLM, EngineKind
from prefix_routing.engines.llama_cpp import LlamaCpp
from prefix_routing.engines.vllm import Vllm
from prefix_routing.rules.errors import UserError

KINDS: dict[str, EngineKind] = {LLAMA_CPP: LlamaCpp(), VLLM: Vllm()}
DEFAULT_KIND = LLAMA_CPP
assert tuple(KINDS) == KIND_NAMES


def engine_kind(name: str) -> EngineKind:
    """The kind called ``name``; UserError naming the allowed ones otherwise."""
    try:
        return KINDS[name]
    except (KeyError, TypeError):
        raise UserError(f"engine kind {name!r}: allowed {', '.join(KIND_NAMES)}") from None
