"""``python -m prefix_routing emulate``: the stage's endpoint, emulated on 127.0.0.1.

SIGTERM and SIGINT (Ctrl-C) stop it cleanly: the front door and the runtime server stop, and the engines
``--engines N`` started are ended by their process ids (a signal while they start ends those started so
far); then it exits with status 0. A second signal while it stops is ignored, so that it cannot cut the
stopping short and orphan an engine.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time

from prefix_routing.engines.engine_kind import KIND_NAMES
from prefix_routing.rules.errors import UserError

MAX_DURATION_S = 30 * 24 * 3600

HELP = ("serve the SageMaker runtime API on 127.0.0.1 with the stage's routing over the lab's fleet model "
        "or over real engines")


def add_arguments(parser) -> None:
    parser.add_argument("--port", type=int, default=8080, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--stage", default="default", help="stage whose routing settings to emulate")
    parser.add_argument("--speed", type=float, default=1.0, help="model time runs this many times faster")
    parser.add_argument("--preset", help="lab preset (default: the one matching the stage's instance and model)")
    parser.add_argument("--preset-file", metavar="FILE",
                        help="a preset measured on a real engine (`calibrate --out FILE`) instead of --preset (default: none)")
    parser.add_argument("--cache-tokens", help="KV-cache tokens per copy, or 'infinite' (default: the preset's)")
    parser.add_argument("--faults", default="", help="e.g. throttle_rate=0.05,stream_error_rate=0.01,seed=1 (default: none)")
    parser.add_argument("--slow-instance", metavar="I:FACTOR", help="make instance I FACTOR times slower (default: none)")
    parser.add_argument("--autoscaling", choices=("off", "on"), default="off",
                        help="the copies scale within the stage's bounds as its target tracking would (default off)")
    engines = parser.add_argument_group("real engines instead of the fleet model (one copy per engine)")
    engines.add_argument("--engines", type=int, metavar="N",
                         help="start N local engines of --engine-kind (engines build first); with trust domains, N per domain "
                              "(default: none, the fleet model)")
    engines.add_argument("--engine-kind", choices=KIND_NAMES, default=KIND_NAMES[0],
                         help="--engines: llama.cpp (default) or vllm (vLLM for CPUs: engines build --kind vllm first)")
    engines.add_argument("--engine-url", action="append", metavar="URL",
                         help="an OpenAI-compatible server (llama.cpp, vLLM) as one copy; repeatable (default: none)")
    engines.add_argument("--engine-slots", type=int, default=1, metavar="S",
                         help="--engines: sequences each engine runs at once (llama.cpp's slots, vLLM's --max-num-seqs; "
                              "default 1)")
    engines.add_argument("--engine-context", type=int, default=8192, metavar="T",
                         help="--engines: context tokens per engine (llama.cpp: shared by its slots; vLLM: the longest "
                              "sequence; default 8192)")
    engines.add_argument("--engine-cache-ram", type=int, metavar="MIB",
                         help="--engines, llama.cpp: MiB of saved slot states per engine (default llama.cpp's 8192)")
    engines.add_argument("--engine-cache-tokens", type=int, metavar="T",
                         help="--engines, vllm: KV-cache tokens per engine, whole blocks (default 262,144): small to "
                              "see eviction")
    engines.add_argument("--engine-block-size", type=int, metavar="B",
                         help="--engines, vllm: tokens per KV block, a multiple of 32 (default 128, vLLM's on CPUs)")
    parser.add_argument("--front-door", type=int, metavar="PORT",
                        help="also serve the front door (the normalizer function's web app) on this port of 127.0.0.1, "
                             "called as its Function URL is (SigV4; the access key id names the caller; default: no front door)")
    parser.add_argument("--duration", type=float,
                        help="stop after this many seconds (default: until SIGTERM or Ctrl-C)")


_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Signalled(BaseException):
    """SIGTERM or SIGINT arrived: unwind, stopping what was started on the way out."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _Stopper:
    """The signal handler: raises once, in the main thread; ignored once stopping has begun."""

    def __init__(self) -> None:
        self.stopping = False

    def __call__(self, signum: int, frame) -> None:
        if self.stopping:
            return
        self.stopping = True
        raise _Signalled(signum)


_stopper = _Stopper()


@contextlib.contextmanager
def _stop_on_signals():
    """SIGTERM and SIGINT raise ``_Signalled`` for the length of the block (main thread only), then the
    previous handlers are back."""
    global _stopper
    _stopper = _Stopper()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _stopper) for signum in _SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run(args) -> int:
    try:
        with _stop_on_signals():
            return _run(args)
    except _Signalled as stop:
        print(f"stopped ({signal.Signals(stop.signum).name})", file=sys.stderr, flush=True)
        return 0


def _run(args) -> int:
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
    for flag, port in (("--port", args.port), ("--front-door", args.front_door)):
        if port is not None and not 0 <= port <= 65535:
            raise UserError(f"{flag} {port}: allowed 0 to 65535")
    if args.front_door is not None and args.front_door != 0 and args.front_door == args.port:
        raise UserError(f"--front-door {args.front_door}: the emulator already listens on that port (--port)")
    if args.duration is not None and not 0 < args.duration <= MAX_DURATION_S:
        raise UserError(f"--duration {args.duration:g}: allowed above 0, at most {MAX_DURATION_S} seconds "
                        "(leave it out to serve until SIGTERM or Ctrl-C)")
    faults = Faults.from_spec(args.faults)
    started_only = [flag for flag, given in _engine_options(args) if given]
    if started_only and args.engines is None:
        raise UserError(f"{', '.join(started_only)}: options of the engines --engines N starts"
                        + (" (--engine-url names running ones)" if args.engine_url else ""))
    if args.engines is not None or args.engine_url:
        return _run_on_engines(args, config, faults)
    preset = args.preset
    if args.preset_file:
        from prefix_routing.stage.preset_file import load_preset_file

        if args.preset:
            raise UserError(f"--preset {args.preset} and --preset-file {args.preset_file}: give one of them")
        preset = load_preset_file(args.preset_file)
    server = start_emulator(
        config, port=args.port, speed=args.speed, faults=faults, preset=preset,
        cache_tokens=cache, slow_instance=slow, autoscaling=args.autoscaling == "on",
    )
    _serve(args, config, server, "the lab's fleet model")
    return 0


def _engine_options(args) -> list[tuple[str, bool]]:
    """The options of the engines ``--engines`` starts, and whether each was given (other than its default)."""
    return [("--engine-kind", args.engine_kind != KIND_NAMES[0]), ("--engine-slots", args.engine_slots != 1),
            ("--engine-context", args.engine_context != 8192), ("--engine-cache-ram", args.engine_cache_ram is not None),
            ("--engine-cache-tokens", args.engine_cache_tokens is not None),
            ("--engine-block-size", args.engine_block_size is not None)]


def _run_on_engines(args, config, faults) -> int:
    from prefix_routing.emulator.engine_backend import start_engine_emulator
    from prefix_routing.engines.engine_kind import (BLOCK_SIZE_RANGE, CACHE_RAM_MIB_RANGE, CACHE_TOKENS_RANGE,
                                                    CONTEXT_RANGE, SLOTS_RANGE)
    from prefix_routing.engines.session import local_engines

    fleet_only = [flag for flag, given in (("--speed", args.speed != 1.0), ("--preset", args.preset), ("--preset-file", args.preset_file),
                                           ("--cache-tokens", args.cache_tokens), ("--slow-instance", args.slow_instance),
                                           ("--autoscaling", args.autoscaling == "on"))
                  if given]
    if fleet_only:
        raise UserError(f"{', '.join(fleet_only)}: options of the fleet model; real engines have their own speed and cache")
    if args.engines is not None and args.engine_url:
        raise UserError("--engines N starts local engines, --engine-url names running ones: give one of them")
    if args.engine_url:
        server = start_engine_emulator(config, args.engine_url, port=args.port, faults=faults)
        _serve(args, config, server, f"{len(args.engine_url)} engine(s)")
        return 0
    if not 1 <= args.engines <= 16:
        raise UserError(f"--engines {args.engines}: allowed 1 to 16")
    for flag, value, (low, high) in (("--engine-slots", args.engine_slots, SLOTS_RANGE),
                                     ("--engine-context", args.engine_context, CONTEXT_RANGE),
                                     ("--engine-cache-ram", args.engine_cache_ram, CACHE_RAM_MIB_RANGE),
                                     ("--engine-cache-tokens", args.engine_cache_tokens, CACHE_TOKENS_RANGE),
                                     ("--engine-block-size", args.engine_block_size, BLOCK_SIZE_RANGE)):
        if value is not None and not low <= value <= high:
            raise UserError(f"{flag} {value}: allowed {low} to {high}")
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    count = args.engines * len(config.components())
    if args.engine_kind != "llama.cpp":
        say(f"starting {count} {args.engine_kind} engine(s) (about 1.5 minutes on 2 cores) ...")
    # With trust domains, N engines for each domain's component: no engine serves two domains.
    with local_engines(count, kind=args.engine_kind, slots=args.engine_slots, context=args.engine_context,
                       cache_ram_mib=args.engine_cache_ram, cache_tokens=args.engine_cache_tokens,
                       block_size=args.engine_block_size, say=say) as engines:
        server = start_engine_emulator(config, [e.url for e in engines], port=args.port, faults=faults)
        _serve(args, config, server, ", ".join(f"{e.url} (pid {e.pid})" for e in engines))
    return 0


def _serve(args, config, server, model: str) -> None:
    front_door = store = None
    try:
        print(
            f"emulating {config.endpoint_name} / {config.component_name} ({config.routing.strategy}) at {server.url}\n"
            f"  model: {model}\n"
            f"  boto3.client('sagemaker-runtime', endpoint_url='{server.url}', region_name='us-east-1')\n"
            f"  status: {server.url}/status",
            file=sys.stderr,
            flush=True,
        )
        if args.front_door is not None:
            from prefix_routing.frontdoor.local import LocalFrontDoor
            from prefix_routing.stage.front_door_env import front_door_environment

            store_url = None
            replication = config.normalizer.replication
            if config.limits.enabled or (replication.enabled and replication.steering):
                # the limits' counts and the steering's states in a real DynamoDB-compatible store, started here
                from prefix_routing.emulator.local_store import LocalDynamo

                store = LocalDynamo()
                store_url = store.url
            timeout_ms, timeout_source = store_timeout(config)
            front_door = LocalFrontDoor(server.url, front_door_environment(config), port=args.front_door,
                                        limits_store_url=store_url, store_timeout_ms=timeout_ms)
            limits = (f"  per-tenant limits {config.limits.to_rules().default.as_dict() or 'by tenant'}: counts in "
                      f"dynalite at {store_url} (pid {store.pid}), store timeout {timeout_ms} ms ({timeout_source})\n"
                      if store is not None and config.limits.enabled
                      else f"  replica steering: hot prefixes' states in dynalite at {store_url} (pid {store.pid})\n"
                      if store is not None else "")
            print(
                f"front door (tenancy {config.normalizer.tenancy}) at {front_door.url}\n{limits}"
                f"  call it as the Function URL: SigV4-signed for service lambda, region us-east-1; the access key id "
                f"names the caller (arn:aws:iam::000000000000:user/<key id>)\n"
                f"  a direct invocation as the adapter forwards one: POST {front_door.url}/events with "
                f"x-amzn-request-context: null",
                file=sys.stderr,
                flush=True,
            )
        if args.duration:
            time.sleep(args.duration)
        else:
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:  # SIGINT where no handler of ours is installed (not the main thread)
        pass
    finally:
        _stopper.stopping = True  # from here on a signal must not cut the stopping short
        if front_door is not None:
            front_door.stop()
        if store is not None:
            store.stop()
        server.stop()


def store_timeout(config) -> tuple[int, str]:
    """The limits' store timeout of the local front door, and whose it is: the stage's when it sets one,
    else one that suits dynalite on a loaded machine (the stage's default suits DynamoDB in Lambda)."""
    from prefix_routing.frontdoor.local import LOCAL_STORE_TIMEOUT_MS

    if "store_timeout_ms" in config.limits.model_fields_set:
        return config.limits.store_timeout_ms, "the stage's limits.store_timeout_ms"
    return LOCAL_STORE_TIMEOUT_MS, (f"dynalite on this machine; the stage sets none, and in Lambda the default is "
                                    f"{config.limits.store_timeout_ms} ms")


def _number(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{flag} {text!r}: not a number") from None
    if not value > 0:
        raise UserError(f"{flag} {text!r}: must be > 0")
    return value
