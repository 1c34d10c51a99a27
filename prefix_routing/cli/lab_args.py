"""The lab commands' fleet flags (the endpoint, its stage, copy autoscaling, hot-prefix replication),
the settings lines that say what a run models, and how results are printed. The trace flags are in
:mod:`.trace_args`, the tenant flags in :mod:`.tenant_args`, the flags' value types in :mod:`.flag_values`."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from prefix_routing.cli.flag_values import (
    cache_ram,
    parse_cache_tokens,
    parse_strategy,
    positive_float,
    ranged_int,
    similarity,
)
from prefix_routing.cli.stages import stage_from_args
from prefix_routing.cli.tenant_args import limits_from_args, limits_line
from prefix_routing.cli.trace_args import key_offset_bytes
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.grids import CANDIDATE_PREFIX_LENGTHS, CANDIDATE_THRESHOLDS
from prefix_routing.lab.routing import CONCURRENCY_THRESHOLD_RANGE, PREFIX_LENGTH_RANGE, Strategy
from prefix_routing.lab.slot_cache import (
    CACHE_POLICIES,
    CACHE_RAM_MIB,
    LLAMACPP_SLOTS,
    SLOT_PROMPT_SIMILARITY,
    VLLM_BLOCKS,
)
from prefix_routing.lab.trace_data import Trace
from prefix_routing.lab.workloads import WORKLOADS, LongContextSpec
from prefix_routing.rules.errors import UserError

if TYPE_CHECKING:
    from prefix_routing.lab.autoscaling import AutoscalingSettings
    from prefix_routing.rules.replication import ReplicationSettings

def add_fleet_arguments(parser, *, grid: bool) -> None:
    """The fleet flags; with ``grid`` (tune) --prefix-length and --concurrency-threshold repeat."""
    parser.add_argument("--instances", type=ranged_int("--instances", 1, 10_000), metavar="N", help="instances (default 8; 7 for --workload long-context)")
    parser.add_argument("--copies", type=ranged_int("--copies", 1, 1024), metavar="C", help="copies per instance (default: the preset's)")
    parser.add_argument("--strategy", type=parse_strategy, action="append", metavar="S", help="RANDOM, LEAST_OUTSTANDING_REQUESTS, PREFIX_AWARE or KV_AWARE; repeatable")
    pl = ranged_int("--prefix-length", *PREFIX_LENGTH_RANGE)
    ct = ranged_int("--concurrency-threshold", *CONCURRENCY_THRESHOLD_RANGE)
    if grid:
        parser.add_argument("--prefix-length", type=pl, action="append", metavar="B", help=f"PrefixLength to try (bytes); repeatable (default {', '.join(map(str, CANDIDATE_PREFIX_LENGTHS))})")
        parser.add_argument("--concurrency-threshold", type=ct, action="append", metavar="T", help=f"ConcurrencyThreshold to try; repeatable (default {', '.join(map(str, CANDIDATE_THRESHOLDS))})")
    else:
        parser.add_argument("--prefix-length", type=pl, metavar="B", help="PrefixLength in bytes, 1024–65536 (default 4096)")
        parser.add_argument("--concurrency-threshold", type=ct, metavar="T", help="ConcurrencyThreshold, 1–1024 (default 10)")
    parser.add_argument("--cache-tokens", type=parse_cache_tokens, metavar="K", help="KV-cache tokens per copy, or 'infinite' (default: from the preset)")
    parser.add_argument("--cache-policy", choices=CACHE_POLICIES, help="the engines' cache: vllm-blocks (an LRU of blocks; default) or llamacpp-slots (llama-server: one sequence per slot, the preset's max_num_seqs slots sharing --cache-tokens, and --cache-ram)")
    parser.add_argument("--slot-prompt-similarity", type=similarity, metavar="F", help=f"llamacpp-slots: llama-server's --slot-prompt-similarity (default {SLOT_PROMPT_SIMILARITY:.2f}; 0 = off)")
    parser.add_argument("--cache-ram", type=cache_ram, metavar="MIB", help=f"llamacpp-slots: llama-server's --cache-ram, MiB of saved slot states per copy (default {CACHE_RAM_MIB:.0f}; 0 = off, -1 = no limit)")
    parser.add_argument("--stage", metavar="NAME", help="model the stage's endpoint (config/NAME.toml, or default): its instance type and model, "
                        "instances_max × copies, PrefixLength, ConcurrencyThreshold, and its replication and copy autoscaling "
                        "unless --replication or --autoscaling says otherwise; other flags override")
    parser.add_argument("--autoscaling", choices=("off", "on"), help="copy autoscaling: target tracking on concurrent requests per copy, up to instances × copies (default off, or the stage's with --stage)")
    parser.add_argument("--autoscaling-target", type=positive_float("--autoscaling-target"), metavar="C", help="concurrent requests per copy to track (default 4, the stage default)")
    parser.add_argument("--autoscaling-min", type=ranged_int("--autoscaling-min", 0, 10_000), metavar="N", help="fewest copies (default 1; 0 scales to zero)")
    parser.add_argument("--copy-startup-s", type=positive_float("--copy-startup-s"), metavar="S", help="seconds before a new copy serves (default 300, an assumption)")
    parser.add_argument("--replication", choices=("off", "on"), help="PREFIX_AWARE: the front door gives hot prefixes k replicas (<id>-r<j>; default off, or the stage's with --stage)")
    parser.add_argument("--replication-target-share", type=positive_float("--replication-target-share"), metavar="F", help="replicate a prefix above F fair shares (1/copies) of recent requests (default 0.05)")
    parser.add_argument("--replication-steering", choices=("off", "on"), help="on (default): replicas chosen by load and a replica that lands where the prefix is already cached gets a fresh id, as the front door does with its shared table; off: replicas in turn")
    parser.add_argument("--replication-max-replicas", type=ranged_int("--replication-max-replicas", 1, 64), metavar="K", help="at most K replicas per prefix (default 32)")
    parser.add_argument("--preset", metavar="NAME", help="instance × model preset (default p5.48xlarge-llama3.1-70b); 'list' lists them")
    parser.add_argument("--preset-file", metavar="FILE", help="a preset file measured on a real engine (`calibrate --out FILE`) instead of --preset")
    parser.add_argument("--speed", type=positive_float("--speed"), default=1.0, metavar="F", help="replay F times faster than the trace (default 1)")
    parser.add_argument("--out-dir", default=None, metavar="DIR", help="where to write the PNG plots (default out/<command>)")
    parser.add_argument("--no-plots", action="store_true", help="write no PNG")
    parser.add_argument("--progress", action=__import__("argparse").BooleanOptionalAction, default=None, help="progress bar on stderr (default: when stderr is a terminal)")


def _preset_from_args(args):
    """The preset of --preset-file (None without it); with --preset too, a UserError."""
    path = getattr(args, "preset_file", None)
    if path is None:
        return None
    if args.preset:
        raise UserError(f"--preset {args.preset} and --preset-file {path}: give one of them")
    from prefix_routing.stage.preset_file import load_preset_file

    return load_preset_file(path)


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
