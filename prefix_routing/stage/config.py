"""The typed stage configuration, validated once, before any construct is built.

A stage is a TOML file under ``config/`` selected with ``cdk synth -c stage=NAME``; the stage
``default`` is ``config/default.toml``. The stacks and the local emulator read the same
:class:`StageConfig`, so what you test locally is what you deploy.

Every error names the file, the field path, the value and what is allowed; ``load_stage`` raises
:class:`ConfigError` with all of them at once. Every field has a ``description``: the configuration
reference (``docs/configuration.md``) is generated from the sections by ``tools/config_reference.py``.

:class:`StageConfig` composes the sections, which their own modules define: the endpoint's
(:mod:`.endpoint_sections`), the front door's (:mod:`.front_door_sections`), trust domains and tenancy
(:mod:`.domain_checks`), observability and deployment (:mod:`.observability_sections`) and benchmark
jobs (:mod:`.benchmark`); reading a stage file and wording its errors is :mod:`.loading`, the checks
several sections share :mod:`.value_checks`. This module exports what the stacks, the emulator and the
commands use from all of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from prefix_routing.rules.domains import MAX_DOMAINS, TrustDomains, shared_without_salt
from prefix_routing.stage.ami import ami_for
from prefix_routing.stage.benchmark import BenchmarkSettings
from prefix_routing.stage.domain_checks import (ComponentPlan, DomainSettings, TenancySettings, check_domains,
                                                component_name, tenancy_without_effect)
from prefix_routing.stage.endpoint_sections import (HOSTING_INSTANCE_TYPES, ROUTING_STRATEGIES, EndpointSettings,
                                                    ModelSettings, RoutingSettings, ScalingSettings, check_fit,
                                                    check_spill, copies_per_instance, copy_capacity, fit_warnings,
                                                    instances_at_rest, routing_warnings)
from prefix_routing.stage.front_door_sections import (BLOCK_BYTES_MIN, LimitsSettings, NormalizerFunctionSettings,
                                                      ReplicationStageSettings, TenantLimitSettings)
from prefix_routing.stage.loading import (CONFIG_DIR, DEFAULT_STAGE, DEFAULT_STAGE_DATA, DEFAULT_STAGE_FILE,
                                          REFERENCE_DOC, ConfigError, load_model, parse_model)
from prefix_routing.stage.observability_sections import (BATCH_PERCENT_MAX, BATCH_PERCENT_MIN, ENGINE_HIT_RATE_ALARM,
                                                         ENGINE_METRICS_ALARM, ERROR_RATE_ALARM, PUBLISH_FREQUENCIES,
                                                         ROLLBACK_ALARMS, TTFT_P50_ALARM, AdvisorSettings, CanarySettings,
                                                         AlarmSettings, DeploymentSettings, MetricsSettings,
                                                         alarm_name, batch_warnings, check_bake, rollback_alarm_names)
from prefix_routing.stage.reference_text import range_text
from prefix_routing.stage.section import Section, allowed
from prefix_routing.stage.value_checks import (ENVIRONMENT_MAX_ENTRIES, STACK_ENVIRONMENT_ENTRIES, STAGE_NAME,
                                               checked_s3_uri, secret_word)

__all__ = [
    "BATCH_PERCENT_MAX", "BATCH_PERCENT_MIN", "BLOCK_BYTES_MIN", "CONFIG_DIR", "DEFAULT_STAGE", "DEFAULT_STAGE_DATA",
    "DEFAULT_STAGE_FILE", "ENGINE_HIT_RATE_ALARM", "ENGINE_METRICS_ALARM", "ENVIRONMENT_MAX_ENTRIES",
    "ERROR_RATE_ALARM", "HOSTING_INSTANCE_TYPES", "PUBLISH_FREQUENCIES", "REFERENCE_DOC", "ROLLBACK_ALARMS",
    "ROUTING_STRATEGIES", "STACK_ENVIRONMENT_ENTRIES", "TTFT_P50_ALARM", "AdvisorSettings", "AlarmSettings", "CanarySettings",
    "BenchmarkSettings", "ComponentPlan", "ConfigError", "DeploymentSettings", "DomainSettings", "EndpointSettings",
    "LimitsSettings", "MetricsSettings", "ModelSettings", "NormalizerFunctionSettings", "ReplicationStageSettings",
    "RoutingSettings", "ScalingSettings", "StageConfig", "TenancySettings", "TenantLimitSettings", "alarm_name",
    "checked_s3_uri", "load_stage", "parse_stage", "range_text", "secret_word",
]


class StageConfig(Section):
    """A stage: one TOML file (``config/<name>.toml``), or the embedded default."""

    name: str = Field(
        DEFAULT_STAGE, pattern=STAGE_NAME, max_length=20,
        description="stage name: the stacks are `PrefixRouting-<name>-…`, the endpoint `<name>-prefix-llm` "
        "(lower case); in a stage file it must equal the file name, and no two stages may differ only in case",
        json_schema_extra=allowed("letters, digits and `-`, beginning and ending with a letter or digit",
                                  doc_default="the file name"),
    )
    region: str | None = Field(
        None, pattern=r"^[a-z]{2}(-[a-z]+)+-\d$", description="pins the stacks' region; unset: environment-agnostic"
    )
    account: str | None = Field(None, pattern=r"^\d{12}$", description="pins the stacks' account; unset: environment-agnostic")
    model: ModelSettings = Field(description="the serving container and the weights")
    endpoint: EndpointSettings = Field(description="instances and copies")
    routing: RoutingSettings = Field(description="the endpoint's routing")
    metrics: MetricsSettings = Field(MetricsSettings(), description="the endpoint's metrics")
    scaling: ScalingSettings = Field(ScalingSettings(), description="copy autoscaling")
    alarms: AlarmSettings = Field(AlarmSettings(), description="alarm thresholds")
    deployment: DeploymentSettings = Field(
        DeploymentSettings(), description="how a new image or model reaches the copies"
    )
    normalizer: NormalizerFunctionSettings = Field(NormalizerFunctionSettings(), description="the front-door function")
    advisor: AdvisorSettings = Field(AdvisorSettings(), description="the routing advisor function")
    canary: CanarySettings = Field(CanarySettings(), description="the isolation canary")
    limits: LimitsSettings = Field(LimitsSettings(), description="per-tenant limits at the front door")
    domains: dict[str, DomainSettings] = Field(
        default_factory=dict,
        description="trust domains: `[domains.<name>]`, each an inference component of its own (its own copies "
        "and KV caches) serving the tenants it lists; none: one component serves every tenant",
        json_schema_extra=allowed(f"at most {MAX_DOMAINS}; names of lower-case letters, digits and hyphens"),
    )
    tenancy: TenancySettings = Field(TenancySettings(), description="trust domains: unknown tenants, isolation")
    benchmark: BenchmarkSettings = Field(
        BenchmarkSettings(), description="benchmark jobs against the endpoint (`python -m prefix_routing benchmark`)"
    )

    @model_validator(mode="after")
    def _cross_section(self) -> "StageConfig":
        check_fit(self.model, self.endpoint)
        check_domains(self.domains, self.tenancy, stage_name=self.name, copies_min=self.endpoint.copies_min,
                      copies_max=self.endpoint.copies_max, capacity=copy_capacity(self.model, self.endpoint))
        idle = tenancy_without_effect(self.tenancy, bool(self.domains))
        if idle:
            raise ValueError(idle)
        if self.tenancy.require_isolation and self.tenants_sharing_a_cache:
            raise ValueError("tenancy.require_isolation: " + "; ".join(self.tenants_sharing_a_cache))
        check_bake(self.deployment, self.alarms)
        if self.canary.enabled and not self.model.reports_cached_tokens:
            # The canary reads the engine's cached tokens: without them every run would read as a cold
            # cache, and a breach could never show.
            raise ValueError(f"canary.enabled: model.framework {self.model.framework!r} reports no cached tokens, "
                             "which the canary reads; allowed: the canary on a vllm stage, or enabled = false")
        check_spill(self.routing, self.scaling,
                    {name: domain.target_concurrent_requests_per_copy for name, domain in self.domains.items()})
        return self

    @property
    def inference_ami_version(self) -> str | None:
        """The AMI the endpoint config sets: ``endpoint.inference_ami_version``, else the serving container's."""
        return ami_for(self.model.framework, self.endpoint.inference_ami_version)

    @property
    def endpoint_name(self) -> str:
        """The endpoint's name (fixed: the endpoint is updated in place, never replaced)."""
        return f"{self.name}-prefix-llm".lower()

    @property
    def stack_prefix(self) -> str:
        """The stacks are ``<prefix>-Endpoint``, ``<prefix>-Normalizer`` and ``<prefix>-Observability``."""
        return f"PrefixRouting-{self.name}"

    @property
    def dashboard_name(self) -> str:
        return f"{self.endpoint_name}-routing"

    @property
    def component_name(self) -> str:
        """The inference component's explicit name (CloudFormation's Ref gives only its ARN); with trust
        domains, the default domain's (else the first domain's): what serves a caller not yet known."""
        if self.domains:
            primary = self.tenancy.default_domain if self.tenancy.default_domain in self.domains else next(iter(self.domains))
            return component_name(self.name, primary)
        return f"{self.name}-prefix-llm-ic".lower()

    def components(self) -> list[ComponentPlan]:
        """Every inference component the stage deploys: one per trust domain, else one; the component
        named by :attr:`component_name` first."""
        endpoint, target = self.endpoint, self.scaling.target_concurrent_requests_per_copy
        if not self.domains:
            return [ComponentPlan(None, self.component_name, endpoint.copies_min, endpoint.copies_max, target)]
        plans = [
            ComponentPlan(name, component_name(self.name, name),
                          endpoint.copies_min if d.copies_min is None else d.copies_min,
                          endpoint.copies_max if d.copies_max is None else d.copies_max,
                          target if d.target_concurrent_requests_per_copy is None
                          else d.target_concurrent_requests_per_copy)
            for name, d in self.domains.items()
        ]
        return sorted(plans, key=lambda plan: plan.name != self.component_name)

    def trust_domains(self) -> TrustDomains | None:
        """The front door's rule for the stage's ``[domains]`` (None: one component for every tenant)."""
        if not self.domains:
            return None
        default = self.tenancy.default_domain if self.tenancy.unknown_tenants == "default" else None
        return TrustDomains(
            components=tuple((name, component_name(self.name, name)) for name in self.domains),
            tenants=tuple((tenant, name) for name, domain in self.domains.items() for tenant in domain.tenants),
            default=default,
        )

    @property
    def tenants_sharing_a_cache(self) -> list[str]:
        """Where tenants share copies whose engine ignores ``cache_salt`` (one line per domain)."""
        default = self.tenancy.default_domain if self.tenancy.unknown_tenants == "default" else None
        return shared_without_salt(self.model.framework, {n: d.tenants for n, d in self.domains.items()}, default,
                                   self.normalizer.tenancy)

    @property
    def detailed_observability(self) -> bool:
        """Whether the endpoint config turns detailed observability on (``metrics.detailed_observability``,
        unset: on for vLLM)."""
        return self.metrics.detailed_observability_for(self.model.framework)

    @property
    def engine_hit_rate_published(self) -> bool:
        """Whether the engine's own prefix-cache counters reach CloudWatch: the vLLM container under
        detailed observability (the engine hit-rate widget, its PromQL alarms and verify's line)."""
        return self.model.framework == "vllm" and self.detailed_observability

    def rollback_alarm_names(self, component: str) -> list[str]:
        """The alarms a component's rolling update rolls back on (none without auto-rollback)."""
        return rollback_alarm_names(self.deployment, component)

    @property
    def instances_at_rest(self) -> int:
        """Instances serving when traffic is low: the minimum, or what the minimum copies need."""
        return instances_at_rest(self.model, self.endpoint)

    @property
    def copies_per_instance(self) -> int:
        return copies_per_instance(self.model, self.endpoint)

    @property
    def warnings(self) -> list[str]:
        """Legal settings that probably do not do what was meant."""
        return (fit_warnings(self.model, self.endpoint)
                + [f"tenancy: {line}" for line in self.tenants_sharing_a_cache]
                + routing_warnings(self.model, self.endpoint, self.routing,
                                   replication=self.normalizer.replication.enabled)
                + batch_warnings(self.deployment, self.components()))


def parse_stage(data: dict[str, Any], *, source: str) -> StageConfig:
    """``data`` as a stage; :class:`ConfigError` with every problem, each line beginning with ``source``."""
    return parse_model(StageConfig, data, source=source)


def load_stage(name: str = DEFAULT_STAGE, *, config_dir: Path = CONFIG_DIR) -> StageConfig:
    """The stage ``name``: ``config_dir/<name>.toml``, or the default stage (``config/default.toml``)."""
    return load_model(StageConfig, name, config_dir=config_dir)
