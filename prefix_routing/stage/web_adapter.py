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


def web_adapter_layer_arn(region: str, partition: str) -> str:
    """The pinned layer version's ARN in ``region`` of ``partition`` (botocore's client knows it:
    ``client.meta.partition``; a stack passes its own, a CDK token)."""
    return f"arn:{partition}:lambda:{region}:{LWA_LAYER_ACCOUNT}:layer:{LWA_LAYER_NAME}:{LWA_LAYER_VERSION}"
