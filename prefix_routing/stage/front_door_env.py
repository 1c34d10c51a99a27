"""The front door's environment from a stage: one mapping for the deployed function and the local one.

The normalizer stack sets these variables on the function (with the Lambda Web Adapter's and the
tenant key's, which are the deployment's own); ``emulate --front-door`` reads the same through
``prefix_routing.frontdoor.InvokeConfig.from_env``, so the local front door behaves as the stage's.
"""

from __future__ import annotations

from prefix_routing.stage.config import StageConfig

#: Seconds kept between the front door's own deadline and Lambda's timeout, to answer 504 and log.
DEADLINE_MARGIN_S = 5
#: SageMaker's runtime gives a container 60 s to answer; a read waits a little longer than that.
MAX_READ_TIMEOUT_S = 65


def front_door_environment(config: StageConfig) -> dict[str, str]:
    """The variables ``InvokeConfig.from_env`` reads, as the stage sets them (all strings)."""
    settings = config.normalizer
    replication = settings.replication
    request_timeout_s = max(1, settings.timeout_s - DEADLINE_MARGIN_S)
    return {
        "ENDPOINT_NAME": config.endpoint_name,
        "INFERENCE_COMPONENT_NAME": config.component_name,
        "ROUTING_STRATEGY": config.routing.strategy,
        "PREFIX_LENGTH": str(config.routing.prefix_length or 0),
        "BLOCK_BYTES": str(settings.block_bytes),
        "TENANCY": settings.tenancy,
        "TENANT_HEADER": settings.tenant_header,
        "ALLOW_DIRECT_INVOKE": "true" if settings.allow_direct_invoke else "false",
        "REQUEST_TIMEOUT_S": str(request_timeout_s),
        "UPSTREAM_READ_TIMEOUT_S": str(min(MAX_READ_TIMEOUT_S, request_timeout_s)),
        # Hot-prefix replication (normalizer.replication; prefix_routing.rules.replication), and the copy
        # bounds it assumes before it has read the component's copy count.
        "REPLICATION_ENABLED": "true" if replication.enabled else "false",
        "REPLICATION_MAX_REPLICAS": str(replication.max_replicas),
        "REPLICATION_TARGET_SHARE_FACTOR": repr(float(replication.target_share_factor)),
        "REPLICATION_HALF_LIFE_S": repr(float(replication.half_life_s)),
        "REPLICATION_MIN_REQUESTS": repr(float(replication.min_requests)),
        "COPIES_MIN": str(config.endpoint.copies_min),
        "COPIES_MAX": str(config.endpoint.copies_max),
    }
