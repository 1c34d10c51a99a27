"""One canary run over every trust domain of a deployment, and its metrics."""

from __future__ import annotations

import json
import time

from prefix_routing.canary.probe import DomainVerdict, Invoke, check_domain
from prefix_routing.frontdoor.config import InvokeConfig
from prefix_routing.rules.telemetry import CANARY_CACHE_COLD, CANARY_ISOLATION_BREACH, DIMENSION_COMPONENT, NAMESPACE


def domains_of(config: InvokeConfig) -> list[tuple[str, str]]:
    """(domain, inference component) of every trust domain the front door serves; one, ``default``,
    without domains."""
    if config.domains is None:
        return [("default", config.metric_component)]
    return list(config.domains.components)


def run_canary(invoke: Invoke, config: InvokeConfig, key: bytes, *, prompt_tokens: int, salted: bool,
               nonce: str | None = None) -> list[DomainVerdict]:
    """Every domain's verdict, with the front door's normalizer settings and tenant key. ``salted``:
    the stage's engine keeps tenants apart by salt (the second tenant shares the domain); else the
    second tenant is the next domain's (with one domain, the same: tenants share its cache)."""
    nonce = nonce or f"{time.time_ns():x}"
    domains = domains_of(config)
    verdicts = []
    for index, (domain, component) in enumerate(domains):
        other = None if salted else domains[(index + 1) % len(domains)][1]
        verdicts.append(check_domain(invoke, domain=domain, component=component, key=key, settings=config.settings,
                                     prompt_tokens=prompt_tokens, nonce=nonce, other_component=other))
    return verdicts


def emf_document(verdict: DomainVerdict, now_ms: int) -> str:
    """One Embedded Metric Format line: the domain's two verdicts, 1 or 0, under its component."""
    return json.dumps({
        "_aws": {"Timestamp": now_ms, "CloudWatchMetrics": [{
            "Namespace": NAMESPACE, "Dimensions": [[DIMENSION_COMPONENT]],
            "Metrics": [{"Name": spec.name, "Unit": spec.unit} for spec in (CANARY_ISOLATION_BREACH, CANARY_CACHE_COLD)],
        }]},
        DIMENSION_COMPONENT: verdict.component,
        CANARY_ISOLATION_BREACH.name: int(verdict.isolation_breach),
        CANARY_CACHE_COLD.name: int(verdict.cache_cold),
        "domain": verdict.domain, "prompt_tokens": verdict.prompt_tokens, "repeat_cached": verdict.repeat_cached,
        "other_cached": verdict.other_cached,
    }, separators=(",", ":"))


def check_local_runtime(runtime_url: str, environment: dict, *, prompt_tokens: int, salted: bool,
                        endpoint_name: str) -> list[DomainVerdict]:
    """A run against an emulated runtime on 127.0.0.1, with the front door's environment for the stage
    and the local front door's tenant key (what ``emulate --front-door`` uses)."""
    import boto3
    from botocore.config import Config

    from prefix_routing.canary.probe import runtime_invoke
    from prefix_routing.frontdoor.local import LOCAL_TENANT_KEY

    client = boto3.client("sagemaker-runtime", endpoint_url=runtime_url, region_name="us-east-1",
                          aws_access_key_id="local", aws_secret_access_key="local",
                          config=Config(read_timeout=300, retries={"max_attempts": 1}))
    return run_canary(runtime_invoke(client, endpoint_name), InvokeConfig.from_env(environment), LOCAL_TENANT_KEY,
                      prompt_tokens=prompt_tokens, salted=salted)
