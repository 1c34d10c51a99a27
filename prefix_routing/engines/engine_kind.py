"""What every kind of local engine offers (llama.cpp's ``llama-server``, vLLM for CPUs), and the options
a caller sets, so that the command line, the emulator, calibration and the tests see one interface.

A kind installs or builds itself once per pin into the engine cache (``build``), makes its tiny model
(``model``) and describes how to start one engine (``launch``: the program, its arguments for a port,
its environment, how long it may take to answer ``GET /health``). Starting, watching and stopping the
processes is :mod:`prefix_routing.engines.process`'s, the same for every kind.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from prefix_routing.rules.errors import UserError

LLAMA_CPP = "llama.cpp"
VLLM = "vllm"
KIND_NAMES = (LLAMA_CPP, VLLM)  # the values of --kind and --engine-kind (scripts rely on them)

SLOTS_RANGE = (1, 64)
CONTEXT_RANGE = (256, 1_048_576)  # tokens
CACHE_RAM_MIB_RANGE = (0, 1_048_576)
CACHE_TOKENS_RANGE = (256, 16_777_216)
BLOCK_SIZE_RANGE = (16, 1024)
THREADS_RANGE = (1, 64)


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """How each engine is started. ``None``: the kind's default. The flags named in errors are the
    command line's (``engines start``; ``emulate`` spells them ``--engine-…``)."""

    slots: int = 1  # sequences run at once: llama.cpp's -np, vLLM's --max-num-seqs
    context: int = 8192  # llama.cpp: -c, shared by the slots; vLLM: --max-model-len, per sequence
    cache_ram_mib: int | None = None  # llama.cpp only: --cache-ram, MiB of saved slot states
    cache_tokens: int | None = None  # vLLM only: KV-cache tokens (whole blocks; default 1 GiB of them)
    block_size: int | None = None  # vLLM only: tokens per KV block (a multiple of 32 on CPUs; default 128)
    threads: int = 1

    def __post_init__(self) -> None:
        for name, value, (low, high) in (("slots", self.slots, SLOTS_RANGE), ("context", self.context, CONTEXT_RANGE),
                                         ("threads", self.threads, THREADS_RANGE),
                                         ("cache_ram_mib", self.cache_ram_mib, CACHE_RAM_MIB_RANGE),
                                         ("cache_tokens", self.cache_tokens, CACHE_TOKENS_RANGE),
                                         ("block_size", self.block_size, BLOCK_SIZE_RANGE)):
            if value is None and name in ("cache_ram_mib", "cache_tokens", "block_size"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise UserError(f"engine {name} {value!r}: allowed an integer from {low} to {high}")


@dataclass(frozen=True)
class Launch:
    """How to start one engine of a kind: ``command(port)``, run with ``environment`` added to ours."""

    kind: str
    program: str  # argv[0] (or argv[1] for an interpreted stand-in): what a running engine's pid shows
    command: Callable[[int], list[str]]
    environment: dict[str, str] = field(default_factory=dict)
    wait_s: float = 60.0  # for GET /health to answer 200
    #: per engine (its index among those started together): extra environment, e.g. a core to bind to
    per_engine: Callable[[int], dict[str, str]] = lambda index: {}

    def env(self, index: int) -> dict[str, str]:
        return {**os.environ, **self.environment, **self.per_engine(index)}


class EngineKind(Protocol):
    """One kind of engine: its cache, its build, its model, its command line and what it reports."""

    name: str
    #: the Prometheus counter of prompt tokens served from the engine's cache (``engines status``)
    cached_counter: str

    def cache_root(self) -> Path: ...

    def built(self) -> bool:
        """Whether this pin is installed or built in the engine cache."""

    def build(self, *, force: bool = False, say: Callable[[str], None] = print) -> Path:
        """Install or build this pin (once; ``force``: again), then make the model; returns the program."""

    def model(self, *, say: Callable[[str], None] = print) -> Path:
        """The tiny model, made if this pin has none yet."""

    def launch(self, options: EngineOptions, *, say: Callable[[str], None] = print) -> Launch:
        """How to start engines with ``options`` (UserError if the kind does not take one of them)."""

    def reset_cache(self, url: str) -> bool:
        """Empty the prefix cache of the engine at ``url`` (True), or False where the kind cannot (then a
        cold cache is a new engine)."""


def refuse(kind: str, options: EngineOptions, *names: str) -> None:
    """UserError for options the kind ignores, so that a caller never believes one took effect."""
    given = [name for name in names if getattr(options, name) is not None]
    if given:
        flags = ", ".join(f"{name} (--{FLAGS[name]}, emulate's --engine-{FLAGS[name]})" for name in given)
        raise UserError(f"{flags}: not an option of {kind} engines")


#: The command line's flag of each option (``engines start --X``, ``emulate --engine-X``).
FLAGS = {"slots": "slots", "context": "context", "cache_ram_mib": "cache-ram", "cache_tokens": "cache-tokens",
         "block_size": "block-size", "threads": "threads"}
