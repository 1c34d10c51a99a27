"""Trust domains: which model copies a tenant's requests may share a KV cache with.

A prefix cache is a timing side channel: a request whose prompt starts like another tenant's is
answered faster, so it learns how that prompt starts. Routing ids only steer; ``cache_salt`` walls
a cache off only on engines that honour it. An inference component's copies are model servers of
their own, with caches of their own: one component per trust domain is a wall on every engine.

This module is the rule, standard library only, shared by the stage (validation, warnings at synth),
the front door (which component a tenant's request goes to) and the emulator:

- **Which domain.** A stage's ``[domains.<name>]`` lists ``tenants`` (ids or shell patterns with
  ``*`` and ``?``): a tenant's own id first, in any domain, else the first pattern that matches it in
  the order written, else the default domain; with ``unknown_tenants = "refuse"``, a tenant no domain
  names is refused.
- **Which engines isolate by salt.** :data:`SALT_ISOLATES` says, per framework, whether the front
  door's per-tenant ``cache_salt`` keeps tenants apart inside one copy. Where it does not, tenants in
  one domain share a cache, and a stage that puts them together is warned (or refused, when it
  requires isolation).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Mapping

from prefix_routing.rules.errors import describe_value
from prefix_routing.rules.limits import MAX_PATTERN
from prefix_routing.rules.tenant_match import first_match, is_pattern  # noqa: F401 - first_match: part of this rule's interface

#: Per serving framework: does ``cache_salt`` isolate tenants inside one copy? vLLM mixes the salt
#: into the first block's hash for the chat and completions bodies it accepts (shown on a real vLLM
#: engine through the front door: tests/test_vllm_engines.py); LMI's bodies carry no salt (the front
#: door removes a client's); llama.cpp's server has no salt at all.
SALT_ISOLATES: Final[Mapping[str, bool]] = {"vllm": True, "djl-lmi": False, "llama.cpp": False}
UNKNOWN_TENANT_MODES: Final = ("default", "refuse")
#: The most domains a stage names (each is an inference component with its own copies) and the most
#: tenant ids or patterns in all (they travel in the function's environment, 4 KB in all).
MAX_DOMAINS: Final = 8
MAX_TENANT_ENTRIES: Final = 64


@dataclass(frozen=True)
class TrustDomains:
    """The front door's view of a stage's domains: ``components`` (domain → inference component),
    ``tenants`` ((id or pattern, domain) in the order written), ``default`` (the domain of a tenant no
    domain names; None: refuse it)."""

    components: tuple[tuple[str, str], ...]
    tenants: tuple[tuple[str, str], ...] = ()
    default: str | None = None

    def __post_init__(self) -> None:
        names = [name for name, _ in self.components]
        if not 1 <= len(names) <= MAX_DOMAINS or len(set(names)) != len(names):
            raise ValueError(f"domains: {len(names)} domains ({', '.join(names)}); allowed: 1 to {MAX_DOMAINS}, "
                             "each named once")
        if len(self.tenants) > MAX_TENANT_ENTRIES:
            raise ValueError(f"domains: {len(self.tenants)} tenant entries; allowed: at most {MAX_TENANT_ENTRIES}")
        seen: dict[str, str] = {}
        for key, domain in self.tenants:
            if not isinstance(key, str) or not 1 <= len(key) <= MAX_PATTERN or not key.isprintable():
                raise ValueError(f"domains.{domain}.tenants: {describe_value(key)}; allowed: a tenant id or pattern of "
                                 f"1-{MAX_PATTERN} printable characters")
            if domain not in names:
                raise ValueError(f"domains: tenant {key!r} names domain {domain!r}; the domains: {', '.join(names)}")
            if key in seen:
                raise ValueError(f"domains: tenant {key!r} is in two domains ({seen[key]} and {domain}); "
                                 "allowed: one domain per tenant")
            seen[key] = domain
        if self.default is not None and self.default not in names:
            raise ValueError(f"tenancy.default_domain {self.default!r} is not a domain; the domains: {', '.join(names)}")

    def domain_for(self, tenant: str) -> str | None:
        """The domain of ``tenant`` (None: no domain names it and unknown tenants are refused)."""
        index = first_match(tenant, [key for key, _ in self.tenants])
        return self.default if index is None else self.tenants[index][1]

    def component_of(self, domain: str) -> str:
        return dict(self.components)[domain]

    def to_json(self) -> str:
        """The compact form the stack puts in the function's environment (``DOMAINS``)."""
        return json.dumps({"components": [list(c) for c in self.components],
                           "tenants": [list(t) for t in self.tenants], "default": self.default},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> TrustDomains:
        """Read ``DOMAINS``; a malformed value is a ValueError naming what is wrong."""
        try:
            data = json.loads(text)
        except ValueError as error:
            raise ValueError(f"DOMAINS is not JSON: {error}") from None
        if not isinstance(data, dict) or not isinstance(data.get("components"), list):
            raise ValueError("DOMAINS: expected an object with a list of components")

        def pairs(value: Any, what: str) -> tuple[tuple[str, str], ...]:
            if not isinstance(value, list) or not all(
                    isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in value):
                raise ValueError(f"DOMAINS: {what} must be a list of [name, name] pairs")
            return tuple((a, b) for a, b in value)

        default = data.get("default")
        if default is not None and not isinstance(default, str):
            raise ValueError(f"DOMAINS: default must be a domain's name or null, got {describe_value(default)}")
        return cls(pairs(data["components"], "components"), pairs(data.get("tenants", []), "tenants"), default)


def shared_without_salt(framework: str, domains: Mapping[str, list[str]], default: str | None,
                        tenancy: str) -> list[str]:
    """Where tenants share a cache that salt does not wall off: one line per such domain, naming it
    and its tenants (empty on engines that isolate by salt, or when there is one tenant per domain).

    ``domains``: domain → its tenant ids or patterns (``{}``: no domains, every tenant in one
    component); ``default``: the domain unknown tenants go to (None: refused); ``tenancy``: how the
    front door tells tenants apart (``none``: every caller is one tenant).
    """
    if SALT_ISOLATES.get(framework, False) or tenancy == "none":
        return []
    if not domains:
        return [f"every tenant shares one component on {framework}, which ignores cache_salt: a tenant can "
                "tell from its first token's time how another's prompts begin; give tenants who must not "
                "share a cache their own [domains.<name>]"]
    found = []
    for name, tenants in domains.items():
        many = [t for t in tenants if is_pattern(t)]
        open_to_unknown = name == default
        if len(tenants) > 1 or many or open_to_unknown:
            who = ", ".join(tenants) if tenants else "no tenant by name"
            extra = " and every tenant no domain names" if open_to_unknown else ""
            found.append(f"domain {name!r} puts tenants together ({who}{extra}) on {framework}, which ignores "
                         "cache_salt: they share its copies' KV cache")
    return found
