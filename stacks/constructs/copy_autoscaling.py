"""Copy autoscaling of an inference component; instances follow through managed instance scaling."""

from __future__ import annotations

from aws_cdk import Duration, aws_applicationautoscaling as appscaling, aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from constructs import Construct

from prefix_routing.stage.config import EndpointSettings, ScalingSettings

COPY_DIMENSION = "sagemaker:inference-component:DesiredCopyCount"


class CopyAutoscaling(Construct):
    """Scalable target on the copy count, target tracking on concurrent requests per copy, and,
    when the minimum is zero, a step policy that adds a copy on the first capacity failure.

    Attributes: ``target``, ``target_tracking``, ``scale_from_zero`` and ``scale_from_zero_alarm``
    (both ``None`` unless copies_min is 0).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        component_name: str,
        endpoint: EndpointSettings,
        scaling: ScalingSettings,
        no_capacity_failures: cloudwatch.IMetric,
    ) -> None:
        super().__init__(scope, construct_id)
        self.target = appscaling.ScalableTarget(
            self,
            "Copies",
            service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
            resource_id=f"inference-component/{component_name}",
            scalable_dimension=COPY_DIMENSION,
            min_capacity=endpoint.copies_min,
            max_capacity=endpoint.copies_max,
        )
        self.target_tracking = self.target.scale_to_track_metric(
            "ConcurrentRequestsPerCopy",
            target_value=scaling.target_concurrent_requests_per_copy,
            predefined_metric=appscaling.PredefinedMetric.SAGEMAKER_INFERENCE_COMPONENT_CONCURRENT_REQUESTS_PER_COPY_HIGH_RESOLUTION,
            scale_out_cooldown=Duration.seconds(scaling.scale_out_cooldown_s),
            scale_in_cooldown=Duration.seconds(scaling.scale_in_cooldown_s),
        )
        self.scale_from_zero: appscaling.StepScalingAction | None = None
        self.scale_from_zero_alarm: cloudwatch.Alarm | None = None
        if endpoint.copies_min == 0:
            # Target tracking cannot see traffic while there is no copy: a request that finds none
            # counts as NoCapacityInvocationFailures, and that is what wakes the component.
            self.scale_from_zero = appscaling.StepScalingAction(
                self,
                "ScaleFromZero",
                scaling_target=self.target,
                adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
                cooldown=Duration.seconds(scaling.scale_out_cooldown_s),
            )
            self.scale_from_zero.add_adjustment(adjustment=1, lower_bound=0)
            self.scale_from_zero_alarm = cloudwatch.Alarm(
                self,
                "NoCapacityAlarm",
                alarm_description="A request found no copy: add one (scale from zero).",
                metric=no_capacity_failures,
                threshold=1,
                # >= 1: AWS's example uses > 1, which never fires on a single failure.
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                evaluation_periods=1,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            self.scale_from_zero_alarm.add_alarm_action(cw_actions.ApplicationScalingAction(self.scale_from_zero))
