"""``verify``: does a live deployment of a stage do what its stage file says? Read-only, one line per check.

Run after ``cdk deploy`` with the operator's credentials: the endpoint, its config and component
(:mod:`.deployment`), the alarms and every metric the alarms and the dashboard read
(:mod:`.monitoring`), the normalizer function and, with ``invoke``, one round trip through its
Function URL (:mod:`.function`). It settles the facts of ``../shared/reference/aws-facts.md`` that
only a live account can tell (see docs/operations.md, "After deploy").

This subpackage imports the rules, the stage and the load tester (its signed Function URL target).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefix_routing.rules.errors import UserError
from prefix_routing.stage.config import StageConfig
from prefix_routing.verify.deployment import (check_component, check_endpoint, check_endpoint_config, check_image,
                                              check_placement, instances_in_service)
from prefix_routing.verify.function import check_function, check_invocation, check_invoke_principals
from prefix_routing.verify.monitoring import check_monitoring
from prefix_routing.verify.report import Check, exit_status, render_json, render_text

__all__ = ["Check", "Clients", "exit_status", "render_json", "render_text", "run_verify", "verify_stage"]


@dataclass(frozen=True, slots=True)
class Clients:
    """The boto3 clients verify reads with (tests pass stubbed ones)."""

    sagemaker: Any
    cloudwatch: Any
    cloudformation: Any
    lambda_: Any
    logs: Any
    ecr: Any
    iam: Any = None  # for the tenants' principals (IAM's policy simulator); None: those checks are not run

    @classmethod
    def from_session(cls, session: Any) -> Clients:
        return cls(*(session.client(name) for name in ("sagemaker", "cloudwatch", "cloudformation", "lambda",
                                                        "logs", "ecr", "iam")))


def verify_stage(config: StageConfig, clients: Clients, *, sender_for: Any = None,
                 log_wait_s: float = 30.0) -> list[Check]:
    """Every check, in the order an operator reads them.

    ``sender_for(url)`` gives ``send(body) -> Attempt`` for the Function URL (``--invoke``), or None.
    """
    checks, endpoint_config, endpoint = check_endpoint(clients.sagemaker, config)
    if endpoint_config is not None:
        checks += check_endpoint_config(endpoint_config, config)
    primary = None
    for plan in config.components():  # one per trust domain, the primary first
        component_checks, component = check_component(clients.sagemaker, config, plan)
        checks += component_checks
        if component is not None:
            checks.append(check_placement(config, plan, component, instances_in_service(endpoint)))
        primary = primary or component
    checks += check_image(clients.sagemaker, clients.ecr, primary)
    checks += check_monitoring(clients.cloudformation, clients.cloudwatch, config)
    function_checks, function = check_function(clients.lambda_, clients.cloudformation, config)
    checks += function_checks
    if clients.iam is not None:
        checks += check_invoke_principals(clients.iam, config.normalizer.invoke_principals, function.get("arn"))
    if sender_for is not None and function:
        checks += check_invocation(sender_for(function["url"]), clients.logs, function["log_group"],
                                   log_wait_s=log_wait_s)
    return checks


def run_verify(config: StageConfig, *, profile: str | None = None, region: str | None = None,
               invoke: bool = False) -> list[Check]:
    """``verify_stage`` with the operator's credentials (boto3's usual chain, or ``profile``)."""
    from botocore.exceptions import BotoCoreError

    from prefix_routing.loadtest.http_targets import LambdaUrlTarget
    from prefix_routing.verify.session import operator_session

    session = operator_session(profile=profile, region=region or config.region)

    def sender_for(url: str):
        return LambdaUrlTarget(url, region=session.region_name, credentials=session.get_credentials()).send

    try:
        return verify_stage(config, Clients.from_session(session), sender_for=sender_for if invoke else None)
    except BotoCoreError as error:  # no credentials, no network: one line, not a traceback
        raise UserError(f"cannot reach AWS: {error}") from None
