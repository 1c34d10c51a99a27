"""The isolation canary's check of one trust domain: is the cache alive, and do tenants stay apart in it?

A tenant's salt or a domain's copies keep caches apart only while the engine honours them; an image
update (an engine that ignores ``cache_salt``) or a misconfigured domain turns isolation off without
an error. So, per domain, with the routing ids and salts the front door would give two synthetic
tenants (``rules.identity.routing_identity`` under the stage's tenant key, the body normalized as the
front door normalizes it):

1. tenant A sends a prompt that starts with this run's nonce (so nothing of it can be cached yet);
2. tenant A sends it again: its cached tokens must be at least :data:`REPEAT_SHARE` of the prompt,
   else the cache or routing is off (``CanaryCacheCold``);
3. tenant B sends the identical prompt: its cached tokens must not exceed :data:`TEMPLATE_TOKENS`,
   the chat template's first tokens that every prompt shares (B's own earlier runs' included), else
   B reads A's cache (``CanaryIsolationBreach``). Where the stage's engine keeps tenants apart by
   their salts (vLLM), B is a tenant of the same domain, on the same copies; where it does not (LMI:
   tenants of one domain share its cache, as synth warns), B is a tenant of the next domain, on that
   domain's copies: the wall a domain promises.

Standard library and the rules only: it runs in the canary function and on the command line alike;
``invoke`` is the one call out (the SageMaker runtime, or the emulator's).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from prefix_routing.rules.body import normalize_body
from prefix_routing.rules.identity import routing_identity
from prefix_routing.rules.settings import NormalizerSettings

#: The most cached tokens the second tenant may find: the chat template's first tokens, which every
#: prompt shares, rounded up to whole cache blocks (vLLM: 16 on GPUs, 32 on CPUs; llama.cpp: any).
TEMPLATE_TOKENS: Final = 32
#: The share of its prompt the first tenant's repeat must find cached.
REPEAT_SHARE: Final = 0.5
#: The synthetic tenants: ids no caller can have (the front door's are IAM ARNs or key ids).
TENANTS: Final = ("prefix-routing-canary-a", "prefix-routing-canary-b")
_WORDS = ("ledger", "harbour", "quartz", "meadow", "lantern", "copper", "orchard", "signal", "granite", "willow",
          "ember", "compass", "tundra", "saffron", "beacon", "cobalt")


@dataclass(frozen=True, slots=True)
class Answer:
    """What one canary request found: its prompt tokens and the cached ones (None: not reported)."""

    prompt_tokens: int
    cached_tokens: int | None


#: ``invoke(component, prefix_aware_id, body) -> Answer``: one non-streamed request to a component.
Invoke = Callable[[str, str, bytes], Answer]


@dataclass(frozen=True, slots=True)
class DomainVerdict:
    domain: str
    component: str
    prompt_tokens: int
    first_cached: int | None
    repeat_cached: int | None
    other_cached: int | None

    @property
    def cache_cold(self) -> bool:
        """The first tenant's repeat found less than :data:`REPEAT_SHARE` of its prompt (or no count)."""
        return self.repeat_cached is None or self.repeat_cached < REPEAT_SHARE * self.prompt_tokens

    @property
    def isolation_breach(self) -> bool:
        """The second tenant found more than the template's tokens of the first tenant's prompt."""
        return self.other_cached is not None and self.other_cached > TEMPLATE_TOKENS

    def as_dict(self) -> dict:
        """The verdict as the function logs it and ``canary --json`` prints it."""
        return {"domain": self.domain, "component": self.component, "prompt_tokens": self.prompt_tokens,
                "first_cached": self.first_cached, "repeat_cached": self.repeat_cached,
                "other_cached": self.other_cached, "isolation_breach": self.isolation_breach,
                "cache_cold": self.cache_cold}

    def line(self) -> str:
        mark = "✘" if self.isolation_breach or self.cache_cold else "✔"
        said = []
        if self.isolation_breach:
            said.append(f"isolation breach: the other tenant found {self.other_cached:,} of {self.prompt_tokens:,} "
                        f"prompt tokens cached (at most {TEMPLATE_TOKENS} allowed)")
        if self.cache_cold:
            found = "no cached-token count" if self.repeat_cached is None else f"{self.repeat_cached:,}"
            said.append(f"cache cold: the repeat found {found} of {self.prompt_tokens:,} cached")
        if not said:
            said.append(f"repeat {self.repeat_cached:,} of {self.prompt_tokens:,} cached; the other tenant "
                        f"{self.other_cached if self.other_cached is not None else 'no count'}")
        return f"{mark} domain {self.domain} ({self.component}): " + "; ".join(said)


def canary_prompt(prompt_tokens: int, nonce: str) -> str:
    """About ``prompt_tokens`` tokens of plain words (one word and a space are about a token), the
    ``nonce`` first: no other run's or domain's prompt shares more than the chat template with it."""
    words = [_WORDS[(i * 7 + len(nonce)) % len(_WORDS)] for i in range(max(1, prompt_tokens - 16))]
    return f"{nonce}: canary. Repeat nothing; answer with one word. " + " ".join(words)


def canary_body(prompt: str, tenant: str, key: bytes, settings: NormalizerSettings) -> tuple[str, bytes]:
    """(the tenant's PrefixAwareId, the body the front door would send for it: normalized, salted)."""
    identity = routing_identity(tenant, None, key)
    request = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 1, "temperature": 0}
    return identity.prefix_aware_id, normalize_body(request, settings, identity=identity).body


def check_domain(invoke: Invoke, *, domain: str, component: str, key: bytes, settings: NormalizerSettings,
                 prompt_tokens: int, nonce: str, other_component: str | None = None) -> DomainVerdict:
    """The three requests of one domain, in order (A, A again, B), and what they found; B's request
    goes to ``other_component`` (another domain's) when given, else to the same component."""
    # A nonce of the run and the domain: no other domain's prompt of this run shares its first words.
    prompt = canary_prompt(prompt_tokens, hashlib.sha256(f"{nonce}/{domain}".encode()).hexdigest()[:16])
    first_id, first_body = canary_body(prompt, TENANTS[0], key, settings)
    other_id, other_body = canary_body(prompt, TENANTS[1], key, settings)
    first = invoke(component, first_id, first_body)
    repeat = invoke(component, first_id, first_body)
    other = invoke(other_component or component, other_id, other_body)
    return DomainVerdict(domain, component, repeat.prompt_tokens, first.cached_tokens, repeat.cached_tokens,
                         other.cached_tokens)


def answer_of(payload: bytes) -> Answer:
    """The usage of a non-streamed OpenAI-style answer (``usage.prompt_tokens_details.cached_tokens``);
    ValueError when it has none."""
    data = json.loads(payload)
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
        raise ValueError("the answer has no usage.prompt_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Answer(usage["prompt_tokens"], cached if isinstance(cached, int) and cached >= 0 else None)


def runtime_invoke(client, endpoint_name: str) -> Invoke:
    """``Invoke`` over a ``sagemaker-runtime`` client (SageMaker's, or one pointed at the emulator)."""

    def invoke(component: str, prefix_aware_id: str, body: bytes) -> Answer:
        response = client.invoke_endpoint(EndpointName=endpoint_name, InferenceComponentName=component,
                                          PrefixAwareId=prefix_aware_id, ContentType="application/json",
                                          Accept="application/json", Body=body)
        return answer_of(response["Body"].read(1_000_000))

    return invoke
