"""The front door's table: the per-tenant limits' counts and replica steering's states, which every
execution environment shares.

One item per tenant for its stream leases and minute's counts (``tenant#<id>``,
``prefix_routing.frontdoor.limiter``), one per hot prefix for its replicas' in-flight counts
(``replicas#<routing id>#<fingerprint>``, ``prefix_routing.frontdoor.steering_store``). On demand (the load is the front door's own), items
expire by DynamoDB's TTL on ``expires_at``, encrypted with the AWS managed key.
"""

from __future__ import annotations

from aws_cdk import RemovalPolicy, aws_dynamodb as dynamodb
from constructs import Construct

from prefix_routing.rules.telemetry import LIMITS_TABLE_KEY, LIMITS_TABLE_TTL
from stacks.nag import acknowledge


class TenantLimitsTable(Construct):
    """Attributes: ``table`` and ``cfn_table``."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name=LIMITS_TABLE_KEY, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            time_to_live_attribute=LIMITS_TABLE_TTL,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=False),
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.cfn_table = self.table.node.default_child
        acknowledge(
            self.table,
            "DDB3",
            "The table holds only counts that expire within minutes (stream leases, per-minute request and token "
            "counts, hot prefixes' in-flight counts); a restore would bring back stale counts, never data worth "
            "keeping.",
        )
