"""The AWS Lambda Web Adapter layer the normalizer function runs with: pinned here, read by the
Normalizer stack (its layer) and by ``preflight`` (that the region serves it).

AWS publishes the adapter as a public layer in account 753240598075 of every commercial region
(arm64 name below; x86_64 is LambdaAdapterLayerX86). Version 30 is LWA 1.1.0: the adapter's examples
that use it pin 1.1.0 (its guide names 27 for 1.0.0, its README 28 for 1.0.1;
https://github.com/aws/aws-lambda-web-adapter). Bump it after testing; ``aws lambda
get-layer-version-by-arn`` (or ``preflight``) shows what a region serves.
"""

from __future__ import annotations

from typing import Final

LWA_LAYER_ACCOUNT: Final = "753240598075"
LWA_LAYER_NAME: Final = "LambdaAdapterLayerArm64"
LWA_LAYER_VERSION: Final = 30


def partition_of(region: str) -> str:
    """The ARN partition of a region (``cn-north-1``: ``aws-cn``; ``us-gov-west-1``: ``aws-us-gov``)."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def web_adapter_layer_arn(region: str, partition: str | None = None) -> str:
    """The pinned layer version's ARN in ``region`` (``partition`` given: as it is, e.g. a CDK token)."""
    return (f"arn:{partition or partition_of(region)}:lambda:{region}:{LWA_LAYER_ACCOUNT}:layer:{LWA_LAYER_NAME}:"
            f"{LWA_LAYER_VERSION}")
