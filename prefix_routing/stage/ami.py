"""Which inference AMI (``ProductionVariant.InferenceAmiVersion``) runs which serving image.

The facts, with their sources:

- The AMI versions and what each carries: the pinned botocore model's documentation of
  ``ProductionVariant.InferenceAmiVersion`` (botocore 1.44.5): ``al2-ami-sagemaker-inference-gpu-2``
  driver 535 / CUDA 12.2; ``-gpu-2-1`` 535 / 12.2 and ``-gpu-3-1`` 550 / 12.4, both "NVIDIA Container
  Toolkit with disabled CUDA-compat mounting"; ``al2023-ami-sagemaker-inference-gpu-4-1`` 580 / 13.0.
  An endpoint config without one gets SageMaker's default GPU AMI, driver 535 / CUDA 12.2 for
  ml.p5 and ml.g6 (https://docs.aws.amazon.com/sagemaker/latest/dg/inference-gpu-drivers.html).
- A newer CUDA than the driver's runs through the CUDA forward-compatibility libraries, which
  AWS's Deep Learning Containers load themselves on the AMIs that no longer mount them
  (https://docs.aws.amazon.com/sagemaker/latest/dg/container-nvidia-compliance.html).
- The SageMaker vLLM DLC (``vllm:server-sagemaker-cuda-v1``) is built for CUDA 12.9, and AWS's
  deployment page for it sets ``al2-ami-sagemaker-inference-gpu-3-1``; a DJL LMI tag names its CUDA
  (``…-cu128``: 12.8).

So: an AMI whose own CUDA is at least the image's runs it; an AMI that leaves forward
compatibility to the container runs an AWS DLC of a newer CUDA 12; SageMaker's default AMI and
``-gpu-2`` run neither, and a copy of such an image fails its health check after the start-up timeout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Ami:
    """What an inference AMI carries (botocore's documentation of ``InferenceAmiVersion``)."""

    driver: int
    cuda: tuple[int, int]
    container_loads_compat: bool  # "NVIDIA Container Toolkit with disabled CUDA-compat mounting"


#: The GPU AMI versions of the pinned botocore model (its enum also holds a Neuron AMI, for Inferentia):
#: the values ``endpoint.inference_ami_version`` allows.
AMIS: Final = {
    "al2-ami-sagemaker-inference-gpu-2": Ami(535, (12, 2), False),
    "al2-ami-sagemaker-inference-gpu-2-1": Ami(535, (12, 2), True),
    "al2-ami-sagemaker-inference-gpu-3-1": Ami(550, (12, 4), True),
    "al2023-ami-sagemaker-inference-gpu-4-1": Ami(580, (13, 0), True),
}
#: An endpoint config without ``InferenceAmiVersion`` (SageMaker's default GPU AMI for ml.p5, ml.g6).
DEFAULT_AMI: Final = Ami(535, (12, 2), False)
#: The AMI a stage gets per serving container when it sets none: AWS's deployment page for the vLLM
#: DLC sets gpu-3-1; the LMI images of CUDA 12.x run there too (forward compatibility, above).
AMI_FOR_FRAMEWORK: Final = {"vllm": "al2-ami-sagemaker-inference-gpu-3-1",
                            "djl-lmi": "al2-ami-sagemaker-inference-gpu-3-1"}
#: The CUDA each known vLLM DLC tag was built for (AWS's release notes of the image).
VLLM_TAG_CUDA: Final = {"server-sagemaker-cuda-v1": (12, 9)}
_CU_TAG = re.compile(r"-cu(\d{2})(\d)(?:-|$)")


def image_cuda(repository: str, tag: str) -> tuple[int, int] | None:
    """The CUDA version a serving image is built for, when its repository and tag tell; else None."""
    if repository == "vllm":
        return VLLM_TAG_CUDA.get(tag)
    found = _CU_TAG.search(tag)
    return (int(found.group(1)), int(found.group(2))) if found else None


def ami_runs_image(ami_version: str | None, cuda: tuple[int, int]) -> tuple[bool, str]:
    """(whether the AMI, None for SageMaker's default, runs an AWS DLC built for ``cuda``, why)."""
    ami = DEFAULT_AMI if ami_version is None else AMIS.get(ami_version)
    name = ami_version or "SageMaker's default AMI"
    if ami is None:
        return False, f"{name} is not a GPU AMI"
    image = f"CUDA {cuda[0]}.{cuda[1]}"
    if ami.cuda >= cuda:
        return True, f"{name} has driver {ami.driver} (CUDA {ami.cuda[0]}.{ami.cuda[1]}), enough for {image}"
    if ami.container_loads_compat and ami.cuda[0] == cuda[0]:
        return True, (f"{name} has driver {ami.driver} (CUDA {ami.cuda[0]}.{ami.cuda[1]}); the image's {image} "
                      "runs through its own forward-compatibility libraries")
    return False, f"{name} has driver {ami.driver} (CUDA {ami.cuda[0]}.{ami.cuda[1]}), too old for the image's {image}"


def ami_for(framework: str, chosen: str | None) -> str | None:
    """The AMI a stage's endpoint config sets: the stage's ``endpoint.inference_ami_version``, else its
    serving container's default (None: SageMaker's default AMI)."""
    return chosen or AMI_FOR_FRAMEWORK.get(framework)
