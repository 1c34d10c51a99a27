"""Engines for the length of a ``with`` block: what ``emulate --engines``, ``demo --engines``, the
real-engine tests and the fidelity benchmark start, each with its own state file, so that one never
stops another's engines. The block's end stops them however it ends (an exception, or the
``BaseException`` that ``emulate`` raises on SIGTERM/SIGINT): by the ids in the state file and by the
ids it handed out."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator

from prefix_routing.engines import build, process
from prefix_routing.engines.process import Engine
from prefix_routing.rules.errors import UserError


def built() -> bool:
    """Whether this pin's ``llama-server`` is in the cache (``engines build`` has run)."""
    return build.binary_path().is_file()


@contextlib.contextmanager
def local_engines(count: int, *, slots: int = 1, context: int = 8192, cache_ram_mib: int | None = None,
                  say: Callable[[str], None] = print) -> Iterator[list[Engine]]:
    """``count`` engines on 127.0.0.1, stopped (by their process ids) when the block ends."""
    root = build.cache_root()
    binary = build.binary_path(root)
    if not binary.is_file():
        raise UserError(f"no llama-server at {binary}: run `python -m prefix_routing engines build` (or make engines)")
    model = build.ensure_model(say=say)
    state = root / "run" / f"session-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
    engines = process.start(count, binary, model, state, log_dir=root / "run" / "logs", slots=slots,
                            context=context, cache_ram_mib=cache_ram_mib)
    try:
        yield engines
    finally:
        process.stop(state)
        process.terminate(engines)  # by the ids in hand too, should the state file have gone
