"""The normalizer front door: Lambda + Function URL, allowed to invoke only this endpoint."""

from __future__ import annotations

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from prefix_routing.stage.config import StageConfig
from stacks.constructs.isolation_canary import IsolationCanary
from stacks.constructs.limits_table import TenantLimitsTable
from stacks.constructs.normalizer_function import NormalizerFunction, normalizer_code


class NormalizerStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: StageConfig, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        # The front door's shared state: the per-tenant limits' counts (when some tenant has one) and
        # the hot prefixes' replica states (with replication and its steering). One table for both:
        # the same store, role statement and warm connection; their items' keys never meet.
        replication = config.normalizer.replication
        steering = replication.enabled and replication.steering
        self.limits_table = (TenantLimitsTable(self, "TenantLimits")
                             if config.limits.enabled or steering else None)
        table = self.limits_table.table if self.limits_table is not None else None
        # Names, not references: the endpoint's names are fixed by the stage, so the two stacks
        # deploy independently.
        endpoint_arn = self.format_arn(service="sagemaker", resource="endpoint", resource_name=config.endpoint_name)
        # The primary component first (its copy counts are read), then every other domain's.
        component_arns = [self.format_arn(service="sagemaker", resource="inference-component", resource_name=plan.name)
                          for plan in config.components()]
        self.normalizer = NormalizerFunction(
            self,
            "Normalizer",
            endpoint_name=config.endpoint_name,
            component_name=config.component_name,
            endpoint_arn=endpoint_arn,
            component_arns=component_arns,
            routing=config.routing,
            endpoint=config.endpoint,
            settings=config.normalizer,
            code=normalizer_code(),
            limits=config.limits,
            limits_table=table if config.limits.enabled else None,
            steering_table=table if steering else None,
            domains=config.trust_domains(),
        )
        # The isolation canary ([canary]): the front door's ids and salts for two synthetic tenants, per
        # domain, on a schedule; its alarms are the observability stack's.
        self.canary = (IsolationCanary(self, "Canary", config=config, tenant_key=self.normalizer.tenant_key,
                                       endpoint_arn=endpoint_arn, component_arns=component_arns)
                       if config.canary.enabled else None)
        CfnOutput(self, "FunctionUrl", value=self.normalizer.function_url.url)
        CfnOutput(self, "FunctionName", value=self.normalizer.function.function_name)
        # Attach to each tenant's role: the Function URL, and lambda:InvokeFunction only through it.
        CfnOutput(self, "TenantInvokePolicy", value=self.normalizer.tenant_policy.managed_policy_arn)
        # The request log the lab and the advisor read (advise --stage finds it here).
        CfnOutput(self, "RequestLogGroupName", value=self.normalizer.log_group.log_group_name)
