"""``python -m prefix_routing demo``: RANDOM vs PREFIX_AWARE, careless vs normalized clients, locally."""

from __future__ import annotations

import sys
import time

from prefix_routing.rules.errors import UserError

HELP = "replay the conversation trace and the long-context workload through the emulator and compare"


def add_arguments(parser) -> None:
    parser.add_argument("--conversation-requests", type=int, default=1000, help="requests of the trace slice")
    parser.add_argument("--long-context-requests", type=int, default=360, help="requests of the long-context run")
    parser.add_argument("--speed", type=float, default=20.0, help="model time runs this many times faster")
    parser.add_argument("--concurrency", type=int, default=32, help="client threads per run")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the workloads and the routing")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    parser.add_argument("--engines", type=int, metavar="N",
                        help="run the comparison on N real engines instead of the fleet model "
                             "(engines build first; about 3 minutes with 2; default: the fleet model)")
    parser.add_argument("--engine-kind", choices=("llama.cpp", "vllm"), default="llama.cpp",
                        help="--engines: llama.cpp (default; fresh engines per case) or vllm (the same engines, "
                             "their prefix caches reset between cases)")
    parser.add_argument("--requests", type=int, default=120, help="--engines: requests per case (default 120)")


def run(args) -> int:
    from prefix_routing.cli.demo_run import as_json, render_table, run_demo

    for flag, value in (("--conversation-requests", args.conversation_requests),
                        ("--long-context-requests", args.long_context_requests), ("--concurrency", args.concurrency)):
        if not 1 <= value <= 100_000:
            raise UserError(f"{flag} {value}: allowed 1 to 100000")
    if not 0 < args.speed <= 1000:
        raise UserError(f"--speed {args.speed}: allowed more than 0 to 1000")
    started = time.monotonic()

    def progress(result) -> None:
        print(f"  {result.workload:18} {result.strategy:13} {result.client:10} done "
              f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)

    if args.engine_kind != "llama.cpp" and args.engines is None:
        raise UserError(f"--engine-kind {args.engine_kind}: give --engines N (the fleet model has no engine kind)")
    if args.engines is not None:
        from prefix_routing.cli.demo_engines import EngineDemoSpec, run_engine_demo

        if not 1 <= args.engines <= 16:
            raise UserError(f"--engines {args.engines}: allowed 1 to 16")
        if not 1 <= args.requests <= 10_000:
            raise UserError(f"--requests {args.requests}: allowed 1 to 10000")
        spec = EngineDemoSpec(engines=args.engines, kind=args.engine_kind, requests=args.requests, seed=args.seed,
                              concurrency=min(args.concurrency, 4 * args.engines))
        results = run_engine_demo(spec, progress=progress, say=lambda text: print(text, file=sys.stderr))
    else:
        results = run_demo(
            conversation_requests=args.conversation_requests, long_context_requests=args.long_context_requests,
            speed=args.speed, concurrency=args.concurrency, seed=args.seed, progress=progress,
            say=lambda text: print(text, file=sys.stderr),
        )
    print(as_json(results) if args.json else render_table(results))
    print(f"demo took {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0
