"""Engines for the length of a ``with`` block: what ``emulate --engines``, ``demo --engines``, the
real-engine tests and the benchmarks start, each with its own state file, so that one never stops
another's engines. The block's end stops them however it ends (an exception, or the ``BaseException``
that ``emulate`` raises on SIGTERM/SIGINT): by the ids in the state file and by the ids it handed out."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator

from prefix_routing.engines import process
from prefix_routing.engines.engine_kind import LLAMA_CPP, EngineOptions
from prefix_routing.engines.process import Engine
from prefix_routing.engines.registry import engine_kind


def built(kind: str = LLAMA_CPP) -> bool:
    """Whether this pin of the kind is in the engine cache (``engines build --kind KIND`` has run)."""
    return engine_kind(kind).built()


@contextlib.contextmanager
def local_engines(count: int, *, kind: str = LLAMA_CPP, slots: int = 1, context: int = 8192,
                  cache_ram_mib: int | None = None, cache_tokens: int | None = None, block_size: int | None = None,
                  say: Callable[[str], None] = print) -> Iterator[list[Engine]]:
    """``count`` engines of ``kind`` on 127.0.0.1, stopped (by their process ids) when the block ends."""
    engines_kind = engine_kind(kind)
    options = EngineOptions(slots=slots, context=context, cache_ram_mib=cache_ram_mib, cache_tokens=cache_tokens,
                            block_size=block_size)
    launch = engines_kind.launch(options, say=say)
    root = engines_kind.cache_root()
    state = root / "run" / f"session-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
    engines = process.start(count, launch, state, log_dir=root / "run" / "logs")
    try:
        yield engines
    finally:
        process.stop(state)
        process.terminate(engines)  # by the ids in hand too, should the state file have gone
