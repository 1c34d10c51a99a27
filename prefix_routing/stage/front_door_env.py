"""The front door's environment from a stage: one mapping for the deployed function and the local one.

The normalizer stack sets these variables on the function (with the Lambda Web Adapter's and the
tenant key's, which are the deployment's own); ``emulate --front-door`` reads the same through
``prefix_routing.frontdoor.InvokeConfig.from_env``, so the local front door behaves as the stage's.
"""

from __future__ import annotations

from prefix_routing.rules.domains import TrustDomains
from prefix_routing.stage.config import StageConfig
from prefix_routing.stage.endpoint_sections import EndpointSettings, RoutingSettings
from prefix_routing.stage.front_door_sections import LimitsSettings, NormalizerFunctionSettings

#: Seconds kept between the front door's own deadline and Lambda's timeout, to answer 504 and log.
DEADLINE_MARGIN_S = 5
#: SageMaker's runtime gives a container 60 s to answer; a read waits a little longer than that.
MAX_READ_TIMEOUT_S = 65


def front_door_environment(config: StageConfig) -> dict[str, str]:
    """The variables ``InvokeConfig.from_env`` reads, as the stage sets them (all strings)."""
    return function_environment(endpoint_name=config.endpoint_name, component_name=config.component_name,
                                routing=config.routing, endpoint=config.endpoint, normalizer=config.normalizer,
                                limits=config.limits, domains=config.trust_domains())


def function_environment(*, endpoint_name: str, component_name: str, routing: RoutingSettings,
                         endpoint: EndpointSettings, normalizer: NormalizerFunctionSettings,
                         limits: LimitsSettings | None = None, domains: TrustDomains | None = None) -> dict[str, str]:
    """The same from the stage's sections (what the normalizer construct is given). With limits, the
    deployment adds ``LIMITS_TABLE``, the table that holds the counts. With trust domains,
    ``component_name`` is the default domain's and ``DOMAINS`` says which component serves whom."""
    replication = normalizer.replication
    request_timeout_s = max(1, normalizer.timeout_s - DEADLINE_MARGIN_S)
    return {
        "ENDPOINT_NAME": endpoint_name,
        "INFERENCE_COMPONENT_NAME": component_name,
        "ROUTING_STRATEGY": routing.strategy,
        "PREFIX_LENGTH": str(routing.prefix_length or 0),
        "BLOCK_BYTES": str(normalizer.block_bytes),
        "TENANCY": normalizer.tenancy,
        "TENANT_HEADER": normalizer.tenant_header,
        "ALLOW_DIRECT_INVOKE": "true" if normalizer.allow_direct_invoke else "false",
        "REQUEST_TIMEOUT_S": str(request_timeout_s),
        "UPSTREAM_READ_TIMEOUT_S": str(min(MAX_READ_TIMEOUT_S, request_timeout_s)),
        # Hot-prefix replication (normalizer.replication; prefix_routing.rules.replication), and the copy
        # bounds it assumes before it has read the component's copy count.
        "REPLICATION_ENABLED": "true" if replication.enabled else "false",
        "REPLICATION_MAX_REPLICAS": str(replication.max_replicas),
        "REPLICATION_TARGET_SHARE_FACTOR": repr(float(replication.target_share_factor)),
        "REPLICATION_HALF_LIFE_S": repr(float(replication.half_life_s)),
        "REPLICATION_MIN_REQUESTS": repr(float(replication.min_requests)),
        "REPLICATION_STEERING": "true" if replication.steering else "false",
        "COPIES_MIN": str(endpoint.copies_min),
        "COPIES_MAX": str(endpoint.copies_max),
        # Per-tenant limits ([limits]).
        **({"LIMITS": limits.to_rules().to_json()}
           if limits is not None and limits.enabled else {}),
        **({"DOMAINS": domains.to_json()} if domains is not None else {}),
    }
