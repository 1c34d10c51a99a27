"""``python -m prefix_routing emulate``: the stage's endpoint, emulated on 127.0.0.1."""

from __future__ import annotations

import math
import sys
import time

from prefix_routing.rules.errors import UserError

HELP = "serve the SageMaker runtime API on 127.0.0.1 with the stage's routing over the lab's fleet model"


def add_arguments(parser) -> None:
    parser.add_argument("--port", type=int, default=8080, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--stage", default="default", help="stage whose routing settings to emulate")
    parser.add_argument("--speed", type=float, default=1.0, help="model time runs this many times faster")
    parser.add_argument("--preset", help="lab preset instead of the one matching the stage's instance and model")
    parser.add_argument("--cache-tokens", help="KV-cache tokens per copy, or 'infinite' (default: the preset's)")
    parser.add_argument("--faults", default="", help="e.g. throttle_rate=0.05,stream_error_rate=0.01,seed=1")
    parser.add_argument("--slow-instance", metavar="I:FACTOR", help="make instance I FACTOR times slower")
    parser.add_argument("--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)")


def run(args) -> int:
    from prefix_routing.cli.stages import load_stage_arg
    from prefix_routing.emulator.faults import Faults
    from prefix_routing.emulator.fleet_backend import start_emulator

    config = load_stage_arg(args.stage)
    cache = None
    if args.cache_tokens is not None:
        cache = math.inf if args.cache_tokens == "infinite" else _number("--cache-tokens", args.cache_tokens)
    slow = None
    if args.slow_instance:
        instance, _, factor = args.slow_instance.partition(":")
        if not instance.isdigit() or not factor:
            raise UserError(f"--slow-instance {args.slow_instance!r}: expected INSTANCE:FACTOR, e.g. 0:3")
        slow = (int(instance), _number("--slow-instance factor", factor))
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: allowed 0 to 65535")
    server = start_emulator(
        config, port=args.port, speed=args.speed, faults=Faults.from_spec(args.faults), preset=args.preset,
        cache_tokens=cache, slow_instance=slow,
    )
    print(
        f"emulating {config.endpoint_name} / {config.component_name} ({config.routing.strategy}) at {server.url}\n"
        f"  boto3.client('sagemaker-runtime', endpoint_url='{server.url}', region_name='us-east-1')\n"
        f"  status: {server.url}/status",
        file=sys.stderr,
        flush=True,
    )
    try:
        if args.duration:
            time.sleep(args.duration)
        else:
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def _number(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{flag} {text!r}: not a number") from None
    if not value > 0:
        raise UserError(f"{flag} {text!r}: must be > 0")
    return value
