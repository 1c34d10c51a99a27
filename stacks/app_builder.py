"""Composes one stage's stacks and registers the security gates (cdk-nag) on the app."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import App, Environment, Tags, Validations
from cdk_nag import AwsSolutionsChecks

from prefix_routing.stage.config import StageConfig
from stacks.endpoint_stack import EndpointStack
from stacks.normalizer_stack import NormalizerStack
from stacks.observability_stack import ObservabilityStack


@dataclass(frozen=True)
class StageStacks:
    endpoint: EndpointStack
    normalizer: NormalizerStack
    observability: ObservabilityStack


def build_stage(app: App, config: StageConfig) -> StageStacks:
    # Env-agnostic unless the stage names an account or region: synth needs no credentials.
    env = Environment(account=config.account, region=config.region) if (config.account or config.region) else None
    prefix = config.stack_prefix
    endpoint = EndpointStack(app, f"{prefix}-Endpoint", config=config, env=env)
    normalizer = NormalizerStack(app, f"{prefix}-Normalizer", config=config, env=env)
    observability = ObservabilityStack(
        app, f"{prefix}-Observability", config=config, request_log=normalizer.normalizer.log_group, env=env
    )
    # Each inference component's rolling update rolls back on alarms of the observability stack, named
    # by their fixed names (no cross-stack reference): they must exist before any component names them.
    endpoint.add_stack_dependency(observability)
    for stack in (endpoint, normalizer, observability):
        Tags.of(stack).add("project", "prefix-aware-routing")
        Tags.of(stack).add("stage", config.name)
    return StageStacks(endpoint=endpoint, normalizer=normalizer, observability=observability)


def add_security_checks(app: App) -> None:
    """cdk-nag AwsSolutions: synth fails on any finding not acknowledged with a reason."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
