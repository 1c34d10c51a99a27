"""The lab commands' shared arguments: trace and fleet flags, their checks, and how results are printed."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from prefix_routing.lab.common import CANDIDATE_PREFIX_LENGTHS, CANDIDATE_THRESHOLDS
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.routing import CONCURRENCY_THRESHOLD_RANGE, PREFIX_LENGTH_RANGE, Strategy
from prefix_routing.lab.slot_cache import (
    CACHE_POLICIES,
    CACHE_RAM_MIB,
    LLAMACPP_SLOTS,
    SLOT_PROMPT_SIMILARITY,
    VLLM_BLOCKS,
)
from prefix_routing.lab.traces import Trace
from prefix_routing.lab.workloads import WORKLOADS, LongContextSpec
from prefix_routing.rules.errors import UserError

if TYPE_CHECKING:
    from prefix_routing.lab.autoscaling import AutoscalingSettings
    from prefix_routing.rules.limits import LimitSettings
    from prefix_routing.rules.replication import ReplicationSettings

# Shared by cli/analyze.py, simulate.py and tune.py (argparse only; no behaviour of its own).


def _ranged_int(name: str, low: int, high: int):
    import argparse

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer (allowed: {low} to {high})") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value}: must be from {low} to {high}")
        return value

    return parse


def _positive_float(name: str):
    import argparse

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text}: must be a number > 0")
        return value

    return parse


def parse_cache_tokens(text: str) -> float:
    """``infinite`` (or ``inf``), or a token count such as ``500000``, ``500k``, ``1.4M``."""
    import argparse

    t = text.strip().lower()
    if t in ("infinite", "inf", "unbounded"):
        return math.inf
    scale = 1
    if t[-1:] in ("k", "m"):
        scale = 1_000 if t[-1] == "k" else 1_000_000
        t = t[:-1]
    try:
        value = float(t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: takes a token count (e.g. 500k) or 'infinite'") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 0")
    return value


def _strategy(text: str) -> Strategy:
    import argparse

    try:
        return Strategy.parse(text)
    except UserError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _similarity(text: str) -> float:
    """--slot-prompt-similarity: a fraction from 0 (off) to 1, as llama-server takes it."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (allowed: 0 to 1)") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text}: must be from 0 to 1 (0 = off)")
    return value


def _cache_ram(text: str) -> float:
    """--cache-ram: MiB per copy, as llama-server takes it (0 = off, -1 = no limit)."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB (0 = off, -1 = no limit)") from None
    if not (value == -1 or 0 <= value < math.inf):
        raise argparse.ArgumentTypeError(f"{text}: must be MiB >= 0 (0 = off) or -1 (no limit)")
    return value


def add_trace_arguments(parser) -> None:
    parser.add_argument(
        "trace", nargs="?", metavar="TRACE",
        help="a trace file (Mooncake JSONL, the normalizer's request log, or raw request bodies; .gz ok), "
        "or cloudwatch:LOG_GROUP to read the normalizer's log from CloudWatch Logs",
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), help="generate a workload instead of reading TRACE")
    parser.add_argument("--format", default="auto", choices=("auto", "mooncake", "log", "bodies"), help="trace format (default: from the first line)")
    parser.add_argument("--strict", action="store_true", help="fail on the first broken line instead of skipping it")
    parser.add_argument("--limit", type=_ranged_int("--limit", 1, 10**9), help="use only the first N requests")
    parser.add_argument("--start", help="cloudwatch: start time (ISO 8601 or epoch ms; default: 1 hour before --end)")
    parser.add_argument("--end", help="cloudwatch: end time (ISO 8601 or epoch ms; default: now)")
    parser.add_argument("--region", help="cloudwatch: AWS region")
    parser.add_argument("--body-rate", type=_positive_float("--body-rate"), default=1.0, help="raw bodies: arrivals per second (bodies carry no times; default 1)")
    parser.add_argument("--body-block-bytes", type=_ranged_int("--body-block-bytes", 16, 65536), help="raw bodies: bytes per hashed block (default: the normalizer's)")
    parser.add_argument("--bytes-per-token", type=_positive_float("--bytes-per-token"), default=4.0, metavar="R", help="bytes of body per prompt token (default 4)")
    parser.add_argument("--key-offset-bytes", type=_ranged_int("--key-offset-bytes", 0, 65536), default=0, metavar="B", help="JSON bytes before the prompt in the normalized body (default 0; invoke path only)")
    parser.add_argument("--api", choices=("invoke", "openai"), default="invoke",
                        help="the path the clients call: invoke (PrefixLength counts body bytes, JSON included) or "
                        "openai (it counts characters of the messages' text; --bytes-per-token then means characters)")
    parser.add_argument("--load-step", metavar="T:F", help="--workload long-context: the arrival rate × F from T seconds on (e.g. 1800:3)")
    parser.add_argument("--zipf", type=float, metavar="S", help="--workload long-context: prefix popularity ∝ 1/rank^S (default 0: uniform)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (routing, generated workloads; default 0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def add_tenant_arguments(parser) -> None:
    """--tenants and --limits (simulate, tune)."""
    parser.add_argument("--tenants", type=_ranged_int("--tenants", 1, 1000), metavar="N",
                        help="spread the requests over N tenants, each with its own routing id, a request's tenant "
                        "following its conversation as `log --tenants` does (1 to 1000); --workload noisy-tenant: "
                        "its tenants (default 8); a request log names its own")
    parser.add_argument("--limits", metavar="FILE|off",
                        help="per-tenant limits before the router, as the front door enforces them: a TOML or JSON "
                        "file in the stage's [limits] shape (default: the stage's [limits] with --stage; off: none)")


def limits_from_args(args) -> "LimitSettings | None":
    """The per-tenant limits a run models: --limits FILE, else the stage's [limits]; None when off or unset."""
    if not hasattr(args, "_limits"):
        from prefix_routing.lab.tenant_limits import load_limits, stage_limits

        given, stage = getattr(args, "limits", None), stage_from_args(args)
        if given == "off":
            settings = None
        elif given:
            settings = load_limits(given)
        else:
            settings = stage_limits(stage) if stage is not None else None
        args._limits = settings if settings is not None and settings.enabled else None
    return args._limits


def limits_line(args, trace: Trace | None = None) -> str:
    """What the settings lines say of the limits: on (from where, which) or off."""
    from prefix_routing.lab.tenant_limits import describe_limits

    settings = limits_from_args(args)
    if settings is None:
        return "limits: off" + (" (--limits off)" if getattr(args, "limits", None) == "off" else "")
    origin = "the stage's [limits]" if not getattr(args, "limits", None) else f"--limits {args.limits}"
    line = (f"limits: on ({origin}): {describe_limits(settings)}; before the router, as the front door: a refused "
            "request is throttled (open loop: dropped; closed loop: retried after Retry-After)")
    if trace is not None and not trace.tenants:
        line += "; the trace names no tenants: all its requests are one tenant's (--tenants N spreads them)"
    return line


def add_fleet_arguments(parser, *, grid: bool) -> None:
    """The fleet flags; with ``grid`` (tune) --prefix-length and --concurrency-threshold repeat."""
    parser.add_argument("--instances", type=_ranged_int("--instances", 1, 10_000), metavar="N", help="instances (default 8; 7 for --workload long-context)")
    parser.add_argument("--copies", type=_ranged_int("--copies", 1, 1024), metavar="C", help="copies per instance (default: the preset's)")
    parser.add_argument("--strategy", type=_strategy, action="append", metavar="S", help="RANDOM, LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE or KV_AWARE; repeatable")
    pl = _ranged_int("--prefix-length", *PREFIX_LENGTH_RANGE)
    ct = _ranged_int("--concurrency-threshold", *CONCURRENCY_THRESHOLD_RANGE)
    if grid:
        parser.add_argument("--prefix-length", type=pl, action="append", metavar="B", help=f"PrefixLength to try (bytes); repeatable (default {', '.join(map(str, CANDIDATE_PREFIX_LENGTHS))})")
        parser.add_argument("--concurrency-threshold", type=ct, action="append", metavar="T", help=f"ConcurrencyThreshold to try; repeatable (default {', '.join(map(str, CANDIDATE_THRESHOLDS))})")
    else:
        parser.add_argument("--prefix-length", type=pl, metavar="B", help="PrefixLength in bytes, 1024–65536 (default 4096)")
        parser.add_argument("--concurrency-threshold", type=ct, metavar="T", help="ConcurrencyThreshold, 1–1024 (default 10)")
    parser.add_argument("--cache-tokens", type=parse_cache_tokens, metavar="K", help="KV-cache tokens per copy, or 'infinite' (default: from the preset)")
    parser.add_argument("--cache-policy", choices=CACHE_POLICIES, help="the engines' cache: vllm-blocks (an LRU of blocks; default) or llamacpp-slots (llama-server: one sequence per slot, the preset's max_num_seqs slots sharing --cache-tokens, and --cache-ram)")
    parser.add_argument("--slot-prompt-similarity", type=_similarity, metavar="F", help=f"llamacpp-slots: llama-server's --slot-prompt-similarity (default {SLOT_PROMPT_SIMILARITY:.2f}; 0 = off)")
    parser.add_argument("--cache-ram", type=_cache_ram, metavar="MIB", help=f"llamacpp-slots: llama-server's --cache-ram, MiB of saved slot states per copy (default {CACHE_RAM_MIB:.0f}; 0 = off, -1 = no limit)")
    parser.add_argument("--stage", metavar="NAME", help="model the stage's endpoint (config/NAME.toml, or default): its instance type and model, "
                        "instances_max × copies, PrefixLength, ConcurrencyThreshold, and its replication and copy autoscaling "
                        "unless --replication or --autoscaling says otherwise; other flags override")
    parser.add_argument("--autoscaling", choices=("off", "on"), help="copy autoscaling: target tracking on concurrent requests per copy, up to instances × copies (default off, or the stage's with --stage)")
    parser.add_argument("--autoscaling-target", type=_positive_float("--autoscaling-target"), metavar="C", help="concurrent requests per copy to track (default 4, the stage default)")
    parser.add_argument("--autoscaling-min", type=_ranged_int("--autoscaling-min", 0, 10_000), metavar="N", help="fewest copies (default 1; 0 scales to zero)")
    parser.add_argument("--copy-startup-s", type=_positive_float("--copy-startup-s"), metavar="S", help="seconds before a new copy serves (default 300, an assumption)")
    parser.add_argument("--replication", choices=("off", "on"), help="PREFIX_AWARE: the front door gives hot prefixes k replicas (<id>-r<j>; default off, or the stage's with --stage)")
    parser.add_argument("--replication-target-share", type=_positive_float("--replication-target-share"), metavar="F", help="replicate a prefix above F fair shares (1/copies) of recent requests (default 0.05)")
    parser.add_argument("--replication-steering", choices=("off", "on"), help="on (default): replicas chosen by load and a replica that lands where the prefix is already cached gets a fresh id, as the front door does with its shared table; off: replicas in turn")
    parser.add_argument("--replication-max-replicas", type=_ranged_int("--replication-max-replicas", 1, 64), metavar="K", help="at most K replicas per prefix (default 32)")
    parser.add_argument("--preset", metavar="NAME", help="instance × model preset (default p5.48xlarge-llama3.1-70b); 'list' lists them")
    parser.add_argument("--preset-file", metavar="FILE", help="a preset file measured on a real engine (`calibrate --out FILE`) instead of --preset")
    parser.add_argument("--speed", type=_positive_float("--speed"), default=1.0, metavar="F", help="replay F times faster than the trace (default 1)")
    parser.add_argument("--out-dir", default=None, metavar="DIR", help="where to write the PNG plots (default out/<command>)")
    parser.add_argument("--no-plots", action="store_true", help="write no PNG")
    parser.add_argument("--progress", action=__import__("argparse").BooleanOptionalAction, default=None, help="progress bar on stderr (default: when stderr is a terminal)")


def _time_ms(text: str | None, default_ms: int) -> int:
    from datetime import datetime, timezone

    if text is None:
        return default_ms
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"time {text!r}: use ISO 8601 (2026-11-30T10:00:00Z) or epoch milliseconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def load_from_args(args) -> tuple[Trace, "LongContextSpec | None"]:
    """The trace the command works on: read (any format, or CloudWatch) or generated."""
    import time

    from prefix_routing.lab import traces

    spec = None
    tenants = getattr(args, "tenants", None)
    if args.workload:
        if args.trace:
            raise UserError("give either TRACE or --workload, not both")
        spec_cls, generate = WORKLOADS[args.workload]
        options = {} if args.zipf is None else {"zipf": args.zipf}
        if args.load_step:
            options["load_step"] = _load_step(args.load_step)
        if options and spec_cls is not LongContextSpec:
            raise UserError(f"{'--zipf' if args.zipf is not None else '--load-step'} shapes the long-context workload, "
                            f"not {args.workload}")
        if tenants is not None and "tenants" in spec_cls.__dataclass_fields__:
            options["tenants"], tenants = tenants, None  # the workload's own tenants
        spec = spec_cls(**options)
        trace = generate(spec, seed=args.seed)
    elif args.zipf is not None or args.load_step:
        raise UserError(f"{'--zipf' if args.zipf is not None else '--load-step'} shapes a generated workload: "
                        "give it with --workload long-context")
    elif not args.trace:
        raise UserError("no trace: give a TRACE file (or cloudwatch:LOG_GROUP), or --workload long-context")
    elif args.trace.startswith("cloudwatch:"):
        group = args.trace.split(":", 1)[1]
        if not group:
            raise UserError("cloudwatch: needs a log group name, e.g. cloudwatch:/aws/lambda/normalizer")
        end = _time_ms(args.end, int(time.time() * 1000))
        start = _time_ms(args.start, end - 3600_000)
        if start >= end:
            raise UserError(f"--start must be before --end ({start} >= {end})")
        trace = traces.read_cloudwatch(group, start, end, region=args.region, strict=args.strict, bytes_per_token=args.bytes_per_token)
    else:
        body_options = {"rate": args.body_rate, "block_bytes": args.body_block_bytes}
        if getattr(args, "prefix_length", None) and isinstance(args.prefix_length, int):
            body_options["prefix_length"] = args.prefix_length
        trace = traces.load_trace(args.trace, args.format, strict=args.strict, bytes_per_token=args.bytes_per_token, **body_options)
    if args.limit:
        trace = trace.head(args.limit)
    if tenants is not None:
        from prefix_routing.lab.tenants import with_tenants

        trace = with_tenants(trace, tenants)
    report_skipped(trace)
    return trace, spec


def report_skipped(trace: Trace) -> None:
    """Broken lines (with their line numbers) and the summary, on stderr."""
    skipped = trace.skipped
    for example in skipped.examples:
        print(f"warning: {example}", file=sys.stderr)
    if skipped.count > len(skipped.examples):
        print(f"warning: ... and {skipped.count - len(skipped.examples):,} more", file=sys.stderr)
    summary = skipped.summary(trace.lines)
    if summary:
        print(f"{trace.source}: {summary}", file=sys.stderr)
    for note in trace.notes:
        print(f"{trace.source}: {note}", file=sys.stderr)


def key_offset_bytes(args) -> int:
    """Bytes of the routing key that are not prompt text: the JSON before the prompt on the invoke
    path; none on the OpenAI-compatible path, whose PrefixLength counts message text only."""
    if getattr(args, "api", "invoke") == "openai":
        if args.key_offset_bytes:
            raise UserError(f"--key-offset-bytes {args.key_offset_bytes}: the OpenAI-compatible path counts the "
                            "messages' text only; leave it out with --api openai")
        return 0
    return args.key_offset_bytes


def _preset_from_args(args):
    """The preset of --preset-file (None without it); with --preset too, a UserError."""
    path = getattr(args, "preset_file", None)
    if path is None:
        return None
    if args.preset:
        raise UserError(f"--preset {args.preset} and --preset-file {path}: give one of them")
    from prefix_routing.stage.preset_file import load_preset_file

    return load_preset_file(path)


def _load_step(text: str) -> tuple[float, float]:
    at, _, factor = text.partition(":")
    try:
        value = (float(at), float(factor))
    except ValueError:
        raise UserError(f"--load-step {text!r}: expected SECONDS:FACTOR, e.g. 1800:3") from None
    if not (value[0] >= 0 and value[1] > 0):
        raise UserError(f"--load-step {text!r}: needs SECONDS >= 0 and FACTOR > 0")
    return value


def stage_from_args(args):
    """The ``--stage`` stage (None without the flag), loaded once per run."""
    name = getattr(args, "stage", None)
    if not name:
        return None
    cached = getattr(args, "_stage_config", None)
    if cached is None or cached.name != name:
        from prefix_routing.cli.stages import load_stage_arg

        cached = load_stage_arg(name)
        args._stage_config = cached
    return cached


def autoscaling_from_args(args, total_copies: int) -> "AutoscalingSettings | None":
    """--autoscaling on: target tracking up to instances × copies (the fleet's size); with --stage
    and no --autoscaling, the stage's copy autoscaling when its copy bounds leave room to scale."""
    from prefix_routing.lab.autoscaling import AutoscalingSettings
    from prefix_routing.lab.stage_fleet import autoscaling_for_stage

    given = [flag for flag, value in (("--autoscaling-target", getattr(args, "autoscaling_target", None)),
                                      ("--autoscaling-min", getattr(args, "autoscaling_min", None)),
                                      ("--copy-startup-s", getattr(args, "copy_startup_s", None))) if value is not None]
    stage = stage_from_args(args)
    mode = getattr(args, "autoscaling", None)
    if mode is None and stage is not None:
        mode = "on" if stage.endpoint.copies_min < stage.endpoint.copies_max else "off"
        policy = getattr(args, "cache_policy", None)
        if mode == "on" and policy not in (None, VLLM_BLOCKS) and not given:
            args._autoscaling_note = (f"the stage's copy autoscaling is not modelled with {policy}: "
                                      "its copies_max copies serve, fixed")
            return None
    if mode != "on":
        if given:
            raise UserError(f"{given[0]} needs --autoscaling on" + (f" (stage {stage.name} has fixed copies)" if stage else ""))
        return None
    base = autoscaling_for_stage(stage) if stage is not None else AutoscalingSettings(max_copies=total_copies)
    options = {"max_copies": min(base.max_copies, total_copies) if stage is not None else total_copies}
    for name in ("autoscaling_target", "autoscaling_min", "copy_startup_s"):
        value = getattr(args, name, None)
        if value is not None:
            options[{"autoscaling_target": "target_per_copy", "autoscaling_min": "min_copies",
                     "copy_startup_s": "startup_s"}[name]] = value
    options["min_copies"] = min(options.get("min_copies", base.min_copies), options["max_copies"])
    return replace(base, **options)


def replication_from_args(args) -> "ReplicationSettings | None":
    """--replication on with its settings (on the stage's with --stage); the settings flags without
    it are an error. With --stage and no --replication: the stage's, when it enables it."""
    from prefix_routing.lab.stage_fleet import replication_for_stage
    from prefix_routing.rules.replication import ReplicationSettings

    options = {"target_share_factor": getattr(args, "replication_target_share", None),
               "max_replicas": getattr(args, "replication_max_replicas", None),
               "steering": {"on": True, "off": False, None: None}[getattr(args, "replication_steering", None)]}
    options = {k: v for k, v in options.items() if v is not None}
    stage = stage_from_args(args)
    base = replication_for_stage(stage) if stage is not None else ReplicationSettings()
    mode = getattr(args, "replication", None) or ("on" if base.enabled else "off")
    if mode != "on":
        if options:
            flag = "--replication-" + next(iter(options)).replace("target_share_factor", "target-share").replace("_", "-")
            raise UserError(f"{flag} needs --replication on" + (f" (stage {stage.name} has it off)" if stage else ""))
        return None
    try:
        return replace(base, enabled=True, **options)
    except ValueError as error:
        raise UserError(str(error)) from None


def fleet_config_from_args(args, trace: Trace | None, spec: "LongContextSpec | None", **fixed) -> FleetConfig:
    """A FleetConfig from the flags; unset flags fall back to the workload's or the lab's defaults.
    A command without some fleet flags (``analyze``) gets their defaults.

    Called once before the trace is read (``trace=None``), so that bad flags fail fast.
    """
    if spec is None and trace is None and getattr(args, "workload", None):
        spec = WORKLOADS[args.workload][0]()
    base = spec.fleet_config() if spec else FleetConfig()
    stage = stage_from_args(args)
    if stage is not None:  # the stage's endpoint, unless a flag says otherwise
        from prefix_routing.lab.stage_fleet import stage_fleet_values

        staged = stage_fleet_values(stage)
        base = replace(base, **{k: v for k, v in staged.items() if k != "copies"})
    preset = _preset_from_args(args) or args.preset
    staged_copies = staged["copies"] if stage is not None and not preset else None
    values = {
        "instances": args.instances or base.instances,
        "copies": getattr(args, "copies", None) or staged_copies,
        "preset": preset or base.preset,
        "prefix_length": base.prefix_length,
        "concurrency_threshold": base.concurrency_threshold,
        "cache_tokens": cache if (cache := getattr(args, "cache_tokens", None)) is not None else base.cache_tokens,
        "bytes_per_token": args.bytes_per_token,
        "key_offset_bytes": key_offset_bytes(args),
        "block_tokens": trace.block_tokens if trace else base.block_tokens,
        "block_bytes": trace.block_bytes if trace else base.block_bytes,
        "seed": args.seed,
    }
    values["replication"] = replication_from_args(args)
    for name in ("cache_policy", "slot_prompt_similarity", "cache_ram_mib"):
        flag = getattr(args, name if name != "cache_ram_mib" else "cache_ram", None)
        values[name] = flag if flag is not None else getattr(base, name)
    values.update(fixed)
    config = FleetConfig(**values)
    scaling = autoscaling_from_args(args, config.total_copies)  # up to the fleet's size, as built
    return config if scaling is None else replace(config, autoscaling=scaling)


def settle_autoscaling(args, config: FleetConfig, strategies) -> FleetConfig:
    """The stage's autoscaling (not asked for with --autoscaling on) off when it models none of the
    strategies asked for: they run at fixed copies, and the settings lines say so."""
    from prefix_routing.lab.fleet_config import autoscaling_modelled

    if (config.autoscaling is None or getattr(args, "autoscaling", None) == "on"
            or any(autoscaling_modelled(s, config.cache_policy) for s in strategies)):
        return config
    args._autoscaling_note = (f"the stage's copy autoscaling is not modelled for {', '.join(s.value for s in strategies)}:"
                              f" {config.total_copies} copies serve, fixed")
    return replace(config, autoscaling=None)


def settings_lines(args, config: FleetConfig, strategies=(), trace: Trace | None = None) -> list[str]:
    """Which of the stage's fleet, copy autoscaling, hot-prefix replication, the engines' cache
    policy and the per-tenant limits a run models, and where each came from."""
    from prefix_routing.lab.fleet_config import autoscaling_modelled

    stage = stage_from_args(args)
    lines = []
    if stage is not None:
        lines.append(f"stage: {stage.name}: its endpoint (instance type and model, instances_max × copies per "
                     "instance), PrefixLength, ConcurrencyThreshold, replication and copy autoscaling; the flags given "
                     "override them")
    else:
        lines.append("stage: none (--stage NAME models a stage's endpoint and settings)")
    scaling = config.autoscaling
    if scaling is None:
        note = getattr(args, "_autoscaling_note", None)
        lines.append(f"autoscaling: off ({note or f'{config.total_copies} copies, fixed'})")
    else:
        origin = "the stage's" if getattr(args, "autoscaling", None) is None else "--autoscaling on"
        fixed = [s.value for s in strategies if not autoscaling_modelled(s, config.cache_policy)]
        lines.append(
            f"autoscaling: on ({origin}): copies {scaling.min_copies} to {scaling.max_copies}, target "
            f"{scaling.target_per_copy:g} requests in flight per copy, new copies serve after {scaling.startup_s:g} s"
            + (f"; not modelled for {', '.join(fixed)}: {config.total_copies} copies, fixed" if fixed else ""))
        lines.append("  max/mean requests and tokens count the instances that held a provisioned copy at some "
                     "time; copy-hours and copies over time are in --json (and copies_over_time.png)")
    rep = config.replication
    if rep is not None and rep.enabled:
        origin = "the stage's" if getattr(args, "replication", None) is None else "--replication on"
        lines.append(f"replication: on ({origin}): PREFIX_AWARE only, a hot prefix above "
                     f"{rep.target_share_factor:g} fair shares gets up to {rep.max_replicas} replicas, "
                     + ("steered by load, a collided replica redrawn" if rep.steering else "used in turn"))
    else:
        lines.append("replication: off")
    policy = config.cache_policy if getattr(args, "cache_policy", None) is None else f"{config.cache_policy} (--cache-policy)"
    lines.append(f"cache policy: {policy}")
    if hasattr(args, "limits"):
        lines.append(limits_line(args, trace))
    return lines


def trace_warnings(config: FleetConfig, trace: Trace) -> list[str]:
    """What a reader must know before the figures: prompts an engine refuses (llamacpp-slots)."""
    from prefix_routing.lab.overload import context_text

    if config.cache_policy != LLAMACPP_SLOTS:
        return []
    warning = context_text(trace.prompt_tokens, config.slot_tokens, config.preset.name)
    return [warning] if warning else []


def settings_dict(args, config: FleetConfig) -> dict:
    """The same for --json."""
    stage = stage_from_args(args)
    scaling, rep = config.autoscaling, config.replication
    return {
        "stage": stage.name if stage is not None else None,
        "autoscaling": None if scaling is None else {
            "min_copies": scaling.min_copies, "max_copies": scaling.max_copies, "target_per_copy": scaling.target_per_copy,
            "startup_s": scaling.startup_s, "max_mean_counts": "instances that held a provisioned copy"},
        "autoscaling_note": getattr(args, "_autoscaling_note", None),
        "replication": None if rep is None or not rep.enabled else {
            "target_share_factor": rep.target_share_factor, "max_replicas": rep.max_replicas},
        "cache_policy": config.cache_policy,
        **({"limits": None if (limits := limits_from_args(args)) is None else json.loads(limits.to_json())}
           if hasattr(args, "limits") else {}),
    }


def presets_table() -> str:
    """The presets, one line each (``--preset list``)."""
    from prefix_routing.stage.presets import DEFAULT_PRESET, PRESETS

    lines = [f"{'preset':<30}{'TP×copies':>10}{'KV tokens':>12}{'prefill tok/s':>15}{'decode ms':>11}  conf."]
    for name, p in PRESETS.items():
        mark = " (default)" if name == DEFAULT_PRESET else ""
        lines.append(
            f"{name:<30}{f'{p.tp}×{p.replicas}':>10}{p.kv_tokens:>12,}{p.prefill_tokens_per_s:>15,.0f}"
            f"{p.decode_step_s * 1000:>11.0f}  {p.confidence}{mark}"
        )
    return "\n".join(lines)


def plot_dir(args, command: str) -> Path | None:
    if args.no_plots:
        return None
    return Path(args.out_dir or Path("out") / command)


def describe_fleet(config: FleetConfig) -> str:
    p = config.preset
    cache = "unbounded" if math.isinf(config.capacity_tokens) else f"{config.capacity_tokens / 1e6:.2f}M tokens"
    if config.cache_policy == LLAMACPP_SLOTS:
        ram = {0: "off", -1: "no limit"}.get(config.cache_ram_mib, f"{config.cache_ram_mib:g} MiB")
        policy = (f"llamacpp-slots: {p.max_num_seqs} slots of {config.slot_tokens:,.0f} tokens, "
                  f"slot-prompt-similarity {config.slot_prompt_similarity:g}, cache-ram {ram}")
    else:
        policy = "vllm-blocks: an LRU of blocks"
    return (
        f"{config.instances} × {p.instance.name}, {p.model.name} TP{p.tp}, {config.copies} "
        f"cop{'y' if config.copies == 1 else 'ies'} each; KV cache {cache} per copy ({policy})"
    )


def print_json(obj) -> None:
    import json

    print(json.dumps(obj, indent=2, default=_json_default, allow_nan=False))


def _json_default(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Strategy):
        return value.value
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def add_sample_argument(parser) -> None:
    parser.add_argument("--sample", type=_sample_rate, metavar="R|auto",
                        help="simulate a sample of the routing keys (PrefixAwareId and first PrefixLength bytes) at rate R "
                        "(0.0001-1, or 10%%) on caches and a clock scaled by R (a miniature simulation); auto: about "
                        "200,000 requests; the hit rate comes with its sampling error")


def _sample_rate(text: str):
    from prefix_routing.lab.sampling import parse_rate

    try:
        return parse_rate(text)
    except UserError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix(f"--sample {text!r}: ")) from None


def sampled(args, trace, config, *, strategies=None, users=None, limits=None, domains=None):
    """(trace, config, speed, rate, share, requests before sampling) for ``--sample`` (rate 1: unchanged;
    ``share``: each miniature copy's share of a whole copy's traffic, see ``lab.sampling.miniature``)."""
    from prefix_routing.lab import sampling

    requested = getattr(args, "sample", None)
    speed = getattr(args, "speed", 1.0)
    if requested is None:
        return trace, config, speed, 1.0, 1.0, len(trace)
    rate = sampling.auto_rate(len(trace)) if requested == "auto" else requested
    if rate >= 1.0:
        return trace, config, speed, 1.0, 1.0, len(trace)
    sampling.check_sampling(config, users=users, limits=limits, domains=domains)
    part, fleet, share = sampling.shrink(trace, config, rate, strategies)
    return part, fleet, speed / share, rate, share, len(trace)
