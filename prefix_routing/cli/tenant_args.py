"""The lab commands' tenant flags: ``--tenants`` and ``--limits`` (the per-tenant limits a run models)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefix_routing.cli.flag_values import ranged_int
from prefix_routing.cli.stages import stage_from_args
from prefix_routing.lab.trace_data import Trace

if TYPE_CHECKING:
    from prefix_routing.rules.limits import LimitSettings


def add_tenant_arguments(parser) -> None:
    """--tenants and --limits (simulate, tune)."""
    parser.add_argument("--tenants", type=ranged_int("--tenants", 1, 1000), metavar="N",
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
