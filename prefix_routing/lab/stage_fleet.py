"""A stage's endpoint as the lab models it: its preset, fleet size, routing, replication, autoscaling.

One mapping, used by ``simulate``/``tune --stage``, by the emulator (``emulate --stage``) and by the
routing advisor, so that they all model what the stacks deploy from the same stage file.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

from prefix_routing.lab.autoscaling import AutoscalingSettings
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.replication import ReplicationSettings
from prefix_routing.stage.presets import INSTANCES, PRESETS, Preset

if TYPE_CHECKING:  # pydantic is imported only by whoever loaded the stage
    from prefix_routing.stage.config import StageConfig


def preset_for_stage(config: StageConfig) -> Preset:
    """The lab preset of the stage's instance type, model size and tensor-parallel degree."""
    return preset_for(config.endpoint.instance_type, config.model.model_id or config.model.model_s3_uri or "",
                      config.model.tensor_parallel_degree, stage=config.name)


def preset_for(instance_type: str, model: str, tp: int, *, stage: str = "") -> Preset:
    """The preset for an instance type, a model (its id or S3 URI: the size is read from it, e.g.
    ``70B``) and a tensor-parallel degree. A copy's speed and cache depend on its GPUs, not on how
    many share the host: with no preset for the exact instance type, one with the same GPU, model
    and TP is re-homed to it. (The advisor function calls this with the stage's values.)"""
    size = re.search(r"(\d+)\s*[bB]\b", model)
    instance = INSTANCES.get(instance_type)
    candidates = [
        preset
        for preset in PRESETS.values()
        if preset.tp == tp
        and size is not None
        and preset.model.name.lower().endswith(f" {size.group(1)}b")
        and instance is not None
        and preset.instance.gpu == instance.gpu
    ]
    for preset in candidates:
        if preset.instance == instance:
            return preset
    if candidates:
        preset = candidates[0]
        return replace(
            preset,
            name=f"{instance.name.removeprefix('ml.')}-{preset.name.split('-', 1)[1]} (from {preset.name})",
            instance=instance,
            replicas=instance.gpus // preset.tp,
        )
    raise UserError(
        f"{f'stage {stage!r}: ' if stage else ''}no lab preset for {instance_type} with {model} at TP {tp}; "
        f"pass --preset (one of {', '.join(PRESETS)})"
    )


def autoscaling_for_stage(config: StageConfig, startup_s: float | None = None) -> AutoscalingSettings:
    """The stage's copy autoscaling (``[scaling]``, the endpoint's copy bounds, the hotspot alarm's
    factor), as the stacks deploy it (``stacks/constructs/copy_autoscaling.py``)."""
    scaling, endpoint = config.scaling, config.endpoint
    return AutoscalingSettings(
        target_per_copy=scaling.target_concurrent_requests_per_copy,
        min_copies=endpoint.copies_min,
        max_copies=endpoint.copies_max,
        scale_out_cooldown_s=scaling.scale_out_cooldown_s,
        scale_in_cooldown_s=scaling.scale_in_cooldown_s,
        hotspot_factor=config.alarms.hotspot_factor,
        **({} if startup_s is None else {"startup_s": startup_s}),
    )


def replication_for_stage(config: StageConfig) -> ReplicationSettings:
    """The stage's ``[normalizer.replication]``, as the front door reads it from its environment."""
    r = config.normalizer.replication
    return ReplicationSettings(enabled=r.enabled, max_replicas=r.max_replicas,
                               target_share_factor=r.target_share_factor, half_life_s=r.half_life_s,
                               min_requests=r.min_requests, steering=r.steering)


def stage_fleet_values(config: StageConfig) -> dict:
    """FleetConfig fields of the stage's endpoint at its maximum size: the preset, instances, copies
    per instance, PrefixLength and ConcurrencyThreshold (RANDOM and LEAST_OUTSTANDING_REQUESTS have
    none; the fleet still wants valid values)."""
    routing = config.routing
    return {
        "instances": config.endpoint.instances_max,
        "copies": config.copies_per_instance,
        "preset": preset_for_stage(config),
        "prefix_length": routing.prefix_length or 4096,
        "concurrency_threshold": routing.concurrency_threshold or 1024,
    }
