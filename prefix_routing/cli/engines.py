"""``python -m prefix_routing engines build|start|stop|status``: real llama.cpp engines on 127.0.0.1."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prefix_routing.rules.errors import UserError

HELP = "build, start, stop or show real llama.cpp engines (llama-server with prefix caching) on 127.0.0.1"


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=("build", "start", "stop", "status"))
    parser.add_argument("--count", type=int, default=2, help="start: how many engines (default 2)")
    parser.add_argument("--slots", type=int, default=1, help="start: slots per engine (default 1)")
    parser.add_argument("--context", type=int, default=8192, help="start: context tokens per engine (default 8192)")
    parser.add_argument("--cache-ram", type=int, metavar="MIB",
                        help="start: MiB of saved slot states per engine (llama.cpp's --cache-ram; default its 8192)")
    parser.add_argument("--force", action="store_true", help="build: rebuild even if this pin is cached")
    parser.add_argument("--state", help="where the started engines are recorded (default: in the engine cache)")
    parser.add_argument("--json", action="store_true", help="start/status: print JSON")


def run(args) -> int:
    from dataclasses import asdict

    from prefix_routing.engines import build, process

    say = (lambda text: print(text, file=sys.stderr)) if args.json else print
    root = build.cache_root()
    state = Path(args.state) if args.state else root / "run" / "engines.json"
    if args.action == "build":
        build.build(force=args.force, say=say)
        build.ensure_model(say=say)
        return 0
    if args.action == "start":
        binary = build.binary_path(root)
        if not binary.is_file():
            raise UserError(f"no llama-server at {binary}: run `python -m prefix_routing engines build` (or make engines)")
        model = build.ensure_model(say=say)
        engines = process.start(args.count, binary, model, state, log_dir=state.parent / "logs",
                                slots=args.slots, context=args.context,
                                cache_ram_mib=args.cache_ram)
        if args.json:
            print(json.dumps({"engines": [{k: v for k, v in asdict(e).items() if k != "binary"} for e in engines]}))
        else:
            for engine in engines:
                print(f"{engine.url}  pid {engine.pid}  log {engine.log}")
        return 0
    if args.action == "stop":
        stopped = process.stop(state)
        print(f"stopped {len(stopped)} engine(s)" + (": " + ", ".join(str(e.pid) for e in stopped) if stopped else ""))
        return 0
    rows = process.status(state)
    if args.json:
        print(json.dumps({"engines": rows}))
        return 0
    for row in rows:
        print(f"{row['url']}  pid {row['pid']}  slots {row['slots']}  cached prompt tokens "
              f"{row['prompt_tokens_cached_total']}")
    if not rows:
        print("no engines running")
    return 0
