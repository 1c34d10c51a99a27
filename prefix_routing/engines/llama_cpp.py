"""llama.cpp as a kind of local engine: ``llama-server`` built from the pinned source (:mod:`.build`),
the tiny GGUF model (:mod:`.model`), one thread, prompt caching and metrics on.

What it caches: per slot, the common prefix of the one sequence a slot last ran, plus the saved
states of ``--cache-ram`` (``prefix_routing.lab.slot_cache``). It ignores ``cache_salt``: tenants who
share a llama.cpp copy share its cache.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prefix_routing.engines import build
from prefix_routing.engines.engine_kind import LLAMA_CPP, EngineOptions, Launch, refuse
from prefix_routing.rules.errors import UserError


def server_command(binary: Path, model: Path, port: int, *, slots: int = 1, context: int = 8192,
                   threads: int = 1, cache_ram_mib: int | None = None) -> list[str]:
    """One engine: 127.0.0.1 only, ``threads`` threads, ``slots`` slots sharing ``context`` tokens,
    prompt caching on (the server's default; said explicitly), metrics on. ``cache_ram_mib``: the
    host-memory LRU of saved slot states (llama.cpp's ``--cache-ram``; None: its default, 8,192 MiB,
    which holds about two million tokens of the tiny model: an engine that forgets nothing)."""
    command = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
               "-tb", str(threads), "-np", str(slots), "-c", str(context), "--cache-prompt", "--metrics",
               "--no-webui"]
    if cache_ram_mib is not None:
        command += ["--cache-ram", str(cache_ram_mib)]
    return command


class LlamaCpp:
    """The llama.cpp kind (:class:`prefix_routing.engines.engine_kind.EngineKind`)."""

    name = LLAMA_CPP
    cached_counter = "llamacpp:prompt_tokens_cached_total"

    def cache_root(self) -> Path:
        return build.cache_root()

    def built(self) -> bool:
        return build.binary_path().is_file()

    def build(self, *, force: bool = False, say: Callable[[str], None] = print) -> Path:
        binary = build.build(force=force, say=say)
        build.ensure_model(say=say)
        return binary

    def model(self, *, say: Callable[[str], None] = print) -> Path:
        return build.ensure_model(say=say)

    def reset_cache(self, url: str) -> bool:
        """llama.cpp's saved states (--cache-ram) cannot be emptied from outside: a cold cache is a new engine."""
        return False

    def launch(self, options: EngineOptions, *, say: Callable[[str], None] = print,
               binary: Path | None = None, model: Path | None = None) -> Launch:
        """``binary`` and ``model``: others than this pin's (tests, stand-ins)."""
        refuse(self.name, options, "cache_tokens", "block_size")
        binary = binary or build.binary_path()
        if not binary.is_file():
            raise UserError(f"no llama-server at {binary}: run `python -m prefix_routing engines build` (or make engines)")
        model = model or self.model(say=say)
        return Launch(self.name, str(binary), lambda port: server_command(
            binary, model, port, slots=options.slots, context=options.context, threads=options.threads,
            cache_ram_mib=options.cache_ram_mib))
