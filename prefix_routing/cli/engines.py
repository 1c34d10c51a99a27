"""``python -m prefix_routing engines build|start|stop|status [--kind llama.cpp|vllm]``: real engines on 127.0.0.1."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HELP = ("build, start, stop or show real engines on 127.0.0.1: llama.cpp (llama-server) or vLLM for CPUs, "
        "with prefix caching")


def add_arguments(parser) -> None:
    from prefix_routing.engines.engine_kind import KIND_NAMES

    parser.add_argument("action", choices=("build", "start", "stop", "status"))
    parser.add_argument("--kind", choices=KIND_NAMES,
                        help="which engine: llama.cpp (the default for build and start) or vllm (vLLM for CPUs, in a "
                             "virtualenv of its own, about 3.5 GB); stop/status: every kind unless given")
    parser.add_argument("--count", type=int, default=2, help="start: how many engines (default 2)")
    parser.add_argument("--slots", type=int, default=1,
                        help="start: sequences each engine runs at once (llama.cpp -np, vLLM --max-num-seqs; default 1)")
    parser.add_argument("--context", type=int, default=8192,
                        help="start: context tokens per engine (llama.cpp: shared by the slots; vLLM: the longest "
                             "sequence; default 8192)")
    parser.add_argument("--cache-ram", type=int, metavar="MIB",
                        help="start, llama.cpp: MiB of saved slot states per engine (--cache-ram; default its 8192)")
    parser.add_argument("--cache-tokens", type=int, metavar="T",
                        help="start, vllm: KV-cache tokens per engine, in whole blocks (default 1 GiB: 262,144 tokens "
                             "of the tiny model); small values show eviction")
    parser.add_argument("--block-size", type=int, metavar="B",
                        help="start, vllm: tokens per KV block, a multiple of 32 (default 128, vLLM's on CPUs)")
    parser.add_argument("--force", action="store_true", help="build: build or install again even if this pin is cached")
    parser.add_argument("--state", help="where the started engines are recorded (default: in the engine cache)")
    parser.add_argument("--json", action="store_true", help="start/status: print JSON")


def run(args) -> int:
    from dataclasses import asdict

    from prefix_routing.engines import process
    from prefix_routing.engines.engine_kind import EngineOptions
    from prefix_routing.engines.registry import KINDS, engine_kind

    say = (lambda text: print(text, file=sys.stderr, flush=True)) if args.json else \
        (lambda text: print(text, flush=True))
    kinds = [engine_kind(args.kind)] if args.kind else list(KINDS.values())
    states = [Path(args.state)] if args.state else [k.cache_root() / "run" / "engines.json" for k in kinds]
    kind, state = kinds[0], states[0]
    if args.action == "build":
        kind.build(force=args.force, say=say)
        return 0
    if args.action == "start":
        options = EngineOptions(slots=args.slots, context=args.context, cache_ram_mib=args.cache_ram,
                                cache_tokens=args.cache_tokens, block_size=args.block_size)
        launch = kind.launch(options, say=say)
        if kind.name != "llama.cpp":
            say(f"starting {args.count} {kind.name} engine(s) (about 1.5 minutes each on 2 cores) ...")
        engines = process.start(args.count, launch, state, log_dir=state.parent / "logs")
        if args.json:
            print(json.dumps({"engines": [{k: v for k, v in asdict(e).items() if k not in ("binary", "workers")}
                                          for e in engines]}))
        else:
            for engine in engines:
                print(f"{engine.url}  {engine.kind}  pid {engine.pid}  log {engine.log}")
        return 0
    if args.action == "stop":
        stopped = [engine for path in dict.fromkeys(states) for engine in process.stop(path)]
        print(f"stopped {len(stopped)} engine(s)" + (": " + ", ".join(str(e.pid) for e in stopped) if stopped else ""))
        return 0
    counters = {name: k.cached_counter for name, k in KINDS.items()}
    rows = [row for path in dict.fromkeys(states) for row in process.status(path, counters)]
    if args.json:
        print(json.dumps({"engines": rows}))
        return 0
    for row in rows:
        slots = f"  slots {row['slots']}" if row["slots"] is not None else ""
        print(f"{row['url']}  {row['kind']}  pid {row['pid']}{slots}  cached prompt tokens "
              f"{row['prompt_tokens_cached_total']}")
    if not rows:
        print("no engines running")
    return 0
