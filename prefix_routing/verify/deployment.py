"""The endpoint as deployed: status, routing, enhanced metrics and detailed observability, managed
scaling, copies and where they are placed, the image.

Read-only SageMaker and ECR calls; each check compares what AWS describes with the stage file.
"""

from __future__ import annotations

import re
from typing import Any

from prefix_routing.stage.config import StageConfig
from prefix_routing.stage.domain_checks import ComponentPlan
from prefix_routing.verify.report import Check, fail, ok, unknown

_DENIED = ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation")
_IMAGE_RE = re.compile(r"^(?P<registry>\d{12})\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(?:\.cn)?/(?P<repo>[^:@]+):(?P<tag>.+)$")


def error_code(error: Exception) -> str:
    return getattr(error, "response", {}).get("Error", {}).get("Code", type(error).__name__)


def _deploy_fix(config: StageConfig) -> str:
    return f"deploy the stage: npx cdk deploy --all -c stage={config.name}"


def check_endpoint(sagemaker: Any, config: StageConfig) -> tuple[list[Check], dict | None, dict | None]:
    """The endpoint's status; returns its endpoint config (for the routing checks) and its description
    (for the instances in service)."""
    title = f"endpoint {config.endpoint_name}"
    try:
        endpoint = sagemaker.describe_endpoint(EndpointName=config.endpoint_name)
    except Exception as error:  # noqa: BLE001 - every API error becomes a line
        if error_code(error) in _DENIED:
            return [unknown(title, f"not allowed to read it ({error_code(error)})",
                            "grant sagemaker:DescribeEndpoint")], None, None
        return [fail(title, f"not found ({error_code(error)})", _deploy_fix(config))], None, None
    status = endpoint.get("EndpointStatus")
    if status != "InService":
        reason = endpoint.get("FailureReason")
        checks = [fail(title, f"status {status}" + (f": {reason}" if reason else ""),
                       "wait while it is Creating/Updating; if Failed, read FailureReason and the container's log group "
                       f"/aws/sagemaker/Endpoints/{config.endpoint_name}")]
    else:
        checks = [ok(title, "InService")]
    try:
        endpoint_config = sagemaker.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
    except Exception as error:  # noqa: BLE001
        return checks + [unknown("endpoint config", f"cannot read it ({error_code(error)})",
                                 "grant sagemaker:DescribeEndpointConfig")], None, endpoint
    return checks, endpoint_config, endpoint


def instances_in_service(endpoint: dict | None) -> int | None:
    """The (one) variant's current instance count from ``DescribeEndpoint`` (None: not described)."""
    (variant, *_) = (endpoint or {}).get("ProductionVariants") or [{}]
    count = variant.get("CurrentInstanceCount")
    return count if isinstance(count, int) else None


def check_endpoint_config(endpoint_config: dict, config: StageConfig) -> list[Check]:
    """Routing strategy and its settings, enhanced metrics, managed instance scaling, as the stage says."""
    checks = []
    (variant, *_) = endpoint_config.get("ProductionVariants") or [{}]
    routing = variant.get("RoutingConfig") or {}
    strategy = routing.get("RoutingStrategy", "RANDOM")
    want = config.routing
    fix = f"redeploy the stage (npx cdk deploy -c stage={config.name}): a routing change replaces the endpoint config"
    if strategy != want.strategy:
        checks.append(fail("routing strategy", f"{strategy}, the stage says {want.strategy}", fix))
    elif strategy == "PREFIX_AWARE":
        prefix = routing.get("PrefixAwareRoutingConfig") or {}
        got = (prefix.get("PrefixLength"), prefix.get("ConcurrencyThreshold"))
        if got != (want.prefix_length, want.concurrency_threshold):
            checks.append(fail("routing strategy", f"PREFIX_AWARE with PrefixLength {got[0]} and ConcurrencyThreshold "
                               f"{got[1]}; the stage says {want.prefix_length} and {want.concurrency_threshold}", fix))
        else:
            checks.append(ok("routing strategy", f"PREFIX_AWARE, PrefixLength {got[0]}, ConcurrencyThreshold {got[1]}"))
    else:
        checks.append(ok("routing strategy", strategy))
    metrics = endpoint_config.get("MetricsConfig") or {}
    if metrics.get("EnableEnhancedMetrics") is True:
        checks.append(ok("enhanced metrics", "on (per-instance series for the hotspot alarms)"))
    else:
        checks.append(fail("enhanced metrics", "off: the per-instance widgets and hotspot alarms have no series",
                           fix.replace("a routing change", "a metrics change")))
    checks.append(_detailed_observability(metrics, config, fix.replace("a routing change", "a metrics change")))
    scaling = variant.get("ManagedInstanceScaling") or {}
    got = (scaling.get("Status"), scaling.get("MinInstanceCount"), scaling.get("MaxInstanceCount"))
    wanted = ("ENABLED", config.endpoint.instances_min, config.endpoint.instances_max)
    if got == wanted:
        checks.append(ok("managed instance scaling", f"{got[1]} to {got[2]} instances"))
    else:
        checks.append(fail("managed instance scaling", f"{got[0]} with {got[1]} to {got[2]} instances; the stage says "
                           f"ENABLED with {wanted[1]} to {wanted[2]}", fix.replace("a routing change", "a change")))
    return checks


def _detailed_observability(metrics: dict, config: StageConfig, fix: str) -> Check:
    """As the stage says (absent from the description counts as off)."""
    title, want = "detailed observability", config.detailed_observability
    got = metrics.get("EnableDetailedObservability") is True
    if got == want:
        return ok(title, "on (the engine's own metrics, billed per GB ingested)" if got else "off, as the stage says")
    if want:
        return fail(title, "off: the engine's prefix-cache hit rate (its widget and alarms) has no data", fix)
    return fail(title, "on, the stage says off: OpenTelemetry metrics are billed per GB ingested", fix)


def check_component(sagemaker: Any, config: StageConfig,
                    plan: ComponentPlan | None = None) -> tuple[list[Check], dict | None]:
    """An inference component's status and copy count (returned for the image check): ``plan``, one
    of ``config.components()`` (one per trust domain), else the stage's primary component."""
    plan = plan or config.components()[0]
    title = f"inference component {plan.name}" + (f" (domain {plan.domain})" if plan.domain else "")
    try:
        component = sagemaker.describe_inference_component(InferenceComponentName=plan.name)
    except Exception as error:  # noqa: BLE001
        if error_code(error) in _DENIED:
            return [unknown(title, f"not allowed to read it ({error_code(error)})",
                            "grant sagemaker:DescribeInferenceComponent")], None
        return [fail(title, f"not found ({error_code(error)})", _deploy_fix(config))], None
    status = component.get("InferenceComponentStatus")
    checks = [ok(title, "InService") if status == "InService" else
              fail(title, f"status {status}" + (f": {component['FailureReason']}" if component.get("FailureReason") else ""),
                   "wait while it is Creating/Updating; if Failed, read FailureReason (capacity, image pull, model load)")]
    runtime = component.get("RuntimeConfig") or {}
    current, desired = runtime.get("CurrentCopyCount"), runtime.get("DesiredCopyCount")
    low, high = plan.copies_min, plan.copies_max
    if isinstance(current, int) and low <= current <= high:
        checks.append(ok("copies", f"{current} serving (desired {desired}; the stage allows {low} to {high})"))
    else:
        checks.append(fail("copies", f"{current} serving (desired {desired}); the stage allows {low} to {high}",
                           "check the copy autoscaling target (Application Auto Scaling, inference-component/"
                           f"{plan.name}) and the instance quota"))
    return checks, component


def check_image(sagemaker: Any, ecr: Any, component: dict | None) -> list[Check]:
    """The model's image tag exists in the region's registry (``ecr:DescribeImages``)."""
    title = "model image"
    model_name = ((component or {}).get("Specification") or {}).get("ModelName")
    if not model_name:
        return [unknown(title, "the component names no model to read the image from")]
    try:
        image = sagemaker.describe_model(ModelName=model_name)["PrimaryContainer"]["Image"]
    except Exception as error:  # noqa: BLE001
        return [unknown(title, f"cannot read model {model_name} ({error_code(error)})", "grant sagemaker:DescribeModel")]
    match = _IMAGE_RE.match(image)
    if not match:
        return [unknown(title, f"{image} is not an ECR image URI with a tag")]
    try:
        found = ecr.describe_images(registryId=match["registry"], repositoryName=match["repo"],
                                    imageIds=[{"imageTag": match["tag"]}])
    except Exception as error:  # noqa: BLE001
        code = error_code(error)
        if code in ("ImageNotFoundException", "RepositoryNotFoundException"):
            return [fail(title, f"{image}: {code}", "pin an image tag this region's registry has (model.image_tag "
                         "in the stage file; the SageMaker DLC documentation lists the current tags) and redeploy")]
        return [unknown(title, f"{image}: cannot list it ({code}): DLC registries often refuse DescribeImages to "
                        "other accounts", "the endpoint's InService status already shows the image was pulled")]
    (detail, *_) = found.get("imageDetails") or [{}]
    return [ok(title, f"{image} ({detail.get('imageDigest', 'digest unknown')})")]


def check_placement(config: StageConfig, plan: ComponentPlan, component: dict | None, instances: int | None) -> Check:
    """Where a component's copies are, from ``RuntimeConfig.PlacementStatus``.

    PlacementStatus counts copies per *instance type*, not per instance, so how many instances hold
    copies is bounded, not read: at least ``ceil(copies / copies per instance)``, and with ``SPREAD``
    placement (which distributes copies evenly across the instances) as many as there are copies and
    instances. With ``PREFIX_AWARE`` routing, copies on fewer than two instances while more than one
    is in service is ✘ (routing by prefix is documented for two or more instances); ? when AWS
    reports no placement (or the instances in service are unknown and the copies leave it open).
    """
    title = "copy placement" + (f" (domain {plan.domain})" if plan.domain else "")
    runtime = (component or {}).get("RuntimeConfig") or {}
    placed = runtime.get("PlacementStatus")
    if not placed:
        return unknown(title, "DescribeInferenceComponent reports no PlacementStatus",
                       "run verify again once the copies are InService (an older SDK may not return the field)")
    copies = sum(p.get("CurrentCopyCount", 0) for p in placed)
    per_type = ", ".join(f"{p.get('CurrentCopyCount', 0)} on {p.get('InstanceType')}" for p in placed)
    strategy = (((component or {}).get("Specification") or {}).get("SchedulingConfig") or {}).get("PlacementStrategy")
    # An instance of the stage's type holds at most copies_per_instance of this model's copies.
    at_least = -(-copies // config.copies_per_instance) if copies else 0
    detail = (f"{copies} {'copy' if copies == 1 else 'copies'} ({per_type}), {instances if instances is not None else '?'} "
              f"instances in service, placement {strategy or 'not reported'}")
    if config.routing.strategy != "PREFIX_AWARE" or (instances is not None and instances <= 1):
        return ok(title, detail)
    if copies >= 2 and at_least >= 2:
        return ok(title, f"{detail}: on {at_least} instances at least")
    if copies >= 2 and strategy == "SPREAD":
        return ok(title, f"{detail}: SPREAD puts them on distinct instances while there are")
    if copies >= 2 and strategy != "BINPACK":
        return unknown(title, f"{detail}: {copies} copies fit on one instance and the placement strategy is not "
                       "reported", "read the component's SchedulingConfig (aws sagemaker describe-inference-component)")
    # On one instance: one copy (or none), or BINPACK filling the first instance.
    if instances is None:
        return unknown(title, detail, "grant sagemaker:DescribeEndpoint: whether more than one instance serves decides it")
    if copies < 2:
        bound = f"domains.{plan.domain}.copies_min" if plan.domain else "endpoint.copies_min"
        return fail(title, f"{detail}: every request goes to one instance, routing by prefix has no choice",
                    f"keep two copies or more at rest ({bound} = 2) so that PREFIX_AWARE routing has instances to "
                    "choose among")
    return fail(title, f"{detail}: BINPACK packs them onto as few instances as it can, and one holds "
                f"{config.copies_per_instance}: routing by prefix has no instance to choose",
                "set endpoint.placement = \"SPREAD\" and redeploy (copies move as they are added or removed)")
