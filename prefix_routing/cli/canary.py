"""``python -m prefix_routing canary``: the isolation canary's check, run locally against the emulator."""

from __future__ import annotations

import json

HELP = "check, per trust domain, that the cache works and tenants stay apart in it (locally, on real engines)"


def add_arguments(parser) -> None:
    parser.add_argument("--stage", default="default", help="the stage whose domains, salts and normalization are used")
    parser.add_argument("--runtime-url", metavar="URL",
                        help="an emulated runtime already serving the stage (python -m prefix_routing emulate); "
                        "default: start engines and the emulator for this run, one engine per domain, and stop them")
    parser.add_argument("--engine-kind", choices=("llama.cpp", "vllm"), default="llama.cpp",
                        help="without --runtime-url: the engines to start")
    parser.add_argument("--prompt-tokens", type=int, default=None,
                        help="about how many tokens the prompt has (default: the stage's canary.prompt_tokens)")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON (default: one line per domain)")


def run(args) -> int:
    from prefix_routing.cli.stages import load_stage_arg
    from prefix_routing.rules.errors import UserError

    config = load_stage_arg(args.stage)
    prompt_tokens = args.prompt_tokens if args.prompt_tokens is not None else config.canary.prompt_tokens
    if not 64 <= prompt_tokens <= 8192:
        raise UserError(f"--prompt-tokens: got {prompt_tokens}; allowed: 64 to 8192")
    if args.runtime_url:
        verdicts = check_runtime(config, args.runtime_url, prompt_tokens)
    else:
        from prefix_routing.emulator.engine_backend import start_engine_emulator
        from prefix_routing.engines import session

        with session.local_engines(len(config.components()), kind=args.engine_kind, slots=1,
                                   say=lambda text: None) as engines:
            server = start_engine_emulator(config, [engine.url for engine in engines])
            try:
                verdicts = check_runtime(config, server.url, prompt_tokens)
            finally:
                server.stop()
    if args.json:
        print(json.dumps([v.as_dict() for v in verdicts], indent=2))
    else:
        print("\n".join(v.line() for v in verdicts))
    return 1 if any(v.isolation_breach or v.cache_cold for v in verdicts) else 0


def check_runtime(config, runtime_url: str, prompt_tokens: int):
    """The canary's run against an emulated runtime on 127.0.0.1, as the stage's front door would send it."""
    from prefix_routing.canary.run import check_local_runtime
    from prefix_routing.stage.front_door_env import front_door_environment

    return check_local_runtime(runtime_url, front_door_environment(config), prompt_tokens=prompt_tokens,
                               salted=config.model.isolates_by_salt,
                               endpoint_name=config.endpoint_name)
