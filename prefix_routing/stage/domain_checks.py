"""The stage's trust domains (``[domains.<name>]``) and how tenants are kept apart (``[tenancy]``).

Each domain is an inference component of its own on the stage's endpoint: its copies, its KV caches,
its copy autoscaling. The rule that maps a tenant to its domain is :mod:`prefix_routing.rules.domains`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from prefix_routing.rules.domains import MAX_DOMAINS, MAX_TENANT_ENTRIES
from prefix_routing.rules.domains import TrustDomains  # noqa: F401 - the stacks read the stage, not the rules
from prefix_routing.rules.limits import MAX_PATTERN
from prefix_routing.rules.tenant_match import shadowed
from prefix_routing.stage.section import Section, allowed

#: A domain's name: lower-case letters, digits and single hyphens (it becomes part of a component's name).
DOMAIN_NAME = re.compile(r"^[a-z0-9](-?[a-z0-9])*$")
#: SageMaker's bound on an inference component's name (botocore: InferenceComponentName, max 63).
COMPONENT_NAME_MAX = 63


class DomainSettings(Section):
    """One `[domains.<name>]`: the tenants whose requests its copies serve, and its copy bounds."""

    tenants: list[str] = Field(
        default_factory=list,
        description="tenant ids or patterns (`*`, `?` as in shell patterns) served by this domain's copies only; "
        "a tenant's own id first, then the first pattern that matches, in file order",
        json_schema_extra=allowed(f"at most {MAX_TENANT_ENTRIES} in all domains, each 1-{MAX_PATTERN} printable "
                                  "ASCII characters without spaces, no tenant in two domains"),
    )
    copies_min: int | None = Field(
        None, ge=0, le=1000, description="this domain's copies at least; unset: `endpoint.copies_min`"
    )
    copies_max: int | None = Field(
        None, ge=1, le=1000, description="this domain's copies at most; unset: `endpoint.copies_max`"
    )
    target_concurrent_requests_per_copy: float | None = Field(
        None, gt=0, le=1024,
        description="this domain's copy autoscaling target; unset: `scaling.target_concurrent_requests_per_copy`",
    )

    @field_validator("tenants")
    @classmethod
    def _printable(cls, value: list[str]) -> list[str]:
        for key in value:
            if not 1 <= len(key) <= MAX_PATTERN or not all("!" <= c <= "~" for c in key):
                raise ValueError(f"tenant {key[:60]!r}: allowed: a tenant id or pattern of 1-{MAX_PATTERN} printable "
                                 "ASCII characters without spaces")
        return value


class TenancySettings(Section):
    """The [tenancy] section: which domain a tenant no domain names goes to, and whether tenants who
    share a domain must be kept apart inside it."""

    default_domain: str = Field(
        "default",
        description="with `[domains]`: the domain of a tenant that no domain names (it must be one of them) "
        "when `unknown_tenants` is `default`",
    )
    unknown_tenants: Literal["default", "refuse"] = Field(
        "default", description="a tenant no domain names: `default` serves it in the default domain, `refuse` "
        "answers 403",
    )
    require_isolation: bool = Field(
        False,
        description="refuse a stage whose domains put tenants together on an engine that ignores `cache_salt` "
        "(without it, synth warns)",
    )


def check_domains(domains: dict[str, DomainSettings], tenancy: TenancySettings, *, stage_name: str,
                  copies_min: int, copies_max: int, capacity: int | None) -> None:
    """Raise ValueError naming the first problem: names, the default domain, tenants in two domains,
    copy bounds, and whether every domain's minimum copies fit ``capacity`` (copies the endpoint's
    instances hold at most; None: unknown instance type)."""
    if not domains:
        return
    if len(domains) > MAX_DOMAINS:
        raise ValueError(f"domains: {len(domains)} domains; allowed: at most {MAX_DOMAINS}")
    for name in domains:
        if not DOMAIN_NAME.match(name):
            raise ValueError(f"domains.{name}: the name {name!r}; allowed: lower-case letters, digits and single "
                             "hyphens, starting and ending with a letter or digit")
        component = component_name(stage_name, name)
        if len(component) > COMPONENT_NAME_MAX:
            raise ValueError(f"domains.{name}: its component's name {component!r} has {len(component)} characters; "
                             f"allowed: at most {COMPONENT_NAME_MAX} (shorten the stage's or the domain's name)")
    if tenancy.unknown_tenants == "default" and tenancy.default_domain not in domains:
        raise ValueError(f"tenancy.default_domain {tenancy.default_domain!r} is not one of the domains "
                         f"({', '.join(domains)}); name one, or set tenancy.unknown_tenants = \"refuse\"")
    entries = sum(len(d.tenants) for d in domains.values())
    if entries > MAX_TENANT_ENTRIES:
        raise ValueError(f"domains: {entries} tenant ids or patterns in all; allowed: at most {MAX_TENANT_ENTRIES}")
    owner: dict[str, str] = {}
    for name, domain in domains.items():
        for tenant in domain.tenants:
            if tenant in owner:
                raise ValueError(f"domains: tenant {tenant!r} is in both {owner[tenant]!r} and {name!r}; allowed: "
                                 "one domain per tenant")
            owner[tenant] = name
    dead = shadowed(list(owner))  # in file order: the order the front door tries the patterns in
    if dead:
        raise ValueError("domains: " + "; ".join(
            f"domains.{owner[key]} tenant {key!r} never applies: the earlier pattern {by!r} (domains.{owner[by]}) "
            "takes every tenant it matches" for key, by in dead) + "; allowed: a pattern before the more general ones "
            "that would take its tenants, or none")
    default = tenancy.default_domain if tenancy.unknown_tenants == "default" else None
    idle = [name for name, domain in domains.items() if not domain.tenants and name != default]
    if idle:
        raise ValueError(f"domains: {', '.join(f'domains.{name}' for name in idle)} name no tenants and are not the "
                         "default domain: their copies would serve no request; allowed: tenants = [...], or "
                         "tenancy.default_domain naming it (with tenancy.unknown_tenants = \"default\")")
    total_min = 0
    for name, domain in domains.items():
        low = copies_min if domain.copies_min is None else domain.copies_min
        high = copies_max if domain.copies_max is None else domain.copies_max
        if low > high:
            raise ValueError(f"domains.{name}: copies_min ({low}) is above copies_max ({high})")
        if capacity is not None and high > capacity:
            raise ValueError(f"domains.{name}: copies_max ({high}) exceeds the {capacity} copies the endpoint's "
                             "instances_max instances hold")
        total_min += low
    if capacity is not None and total_min > capacity:
        raise ValueError(f"domains: their copies_min add up to {total_min}, more than the {capacity} copies the "
                         "endpoint's instances_max instances hold; lower the domains' copies_min")


def tenancy_without_effect(tenancy: TenancySettings, has_domains: bool) -> str | None:
    """A line naming the ``[tenancy]`` settings the stage sets that cannot take effect, or None:
    ``default_domain`` and ``unknown_tenants`` without domains, ``default_domain`` when unknown tenants
    are refused. A setting is set when it differs from its default (a default written out, as a stage
    dumped and read again writes it, changes nothing)."""
    given = {name for name, field in TenancySettings.model_fields.items() if getattr(tenancy, name) != field.default}
    if not has_domains:
        idle = [name for name in ("default_domain", "unknown_tenants") if name in given]
        if idle:
            return (f"{', '.join(f'tenancy.{name}' for name in idle)}: set on a stage without [domains.<name>], where "
                    "every tenant is served by the one component; allowed: leave them out, or add the domains "
                    "they choose between")
        return None
    if "default_domain" in given and tenancy.unknown_tenants == "refuse":
        return ("tenancy.default_domain: set while tenancy.unknown_tenants = \"refuse\", which serves no tenant in a "
                "default domain; allowed: leave it out, or tenancy.unknown_tenants = \"default\"")
    return None


@dataclass(frozen=True)
class ComponentPlan:
    """One inference component the stage deploys: its domain (None: the stage has no domains), name,
    copy bounds and copy autoscaling target."""

    domain: str | None
    name: str
    copies_min: int
    copies_max: int
    target_concurrent_requests_per_copy: float


def component_name(stage_name: str, domain: str) -> str:
    """The inference component of ``domain`` on the stage's endpoint."""
    return f"{stage_name}-{domain}-ic".lower()
