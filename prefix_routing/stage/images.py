"""The container images the SageMaker Python SDK knows for a framework, to re-pin ``model.image_tag``.

Reads the SDK's own image table (``sagemaker.core.image_uris``, from the pinned ``sagemaker-core``
package of the development requirements): offline, no AWS call. Imported only by the ``images``
command, never by synth (``tests/prefix_routing/stage/test_images.py`` checks).
"""

from __future__ import annotations

from dataclasses import dataclass

from prefix_routing.rules.errors import UserError

#: The stage's ``model.framework`` -> the SDK's framework names whose images it can run.
SDK_FRAMEWORKS = {"vllm": ("vllm-server", "vllm"), "djl-lmi": ("djl-lmi",)}
#: An instance type of the right processor kind (GPU) for the SDK's lookup.
_GPU_INSTANCE = "ml.g6e.xlarge"


@dataclass(frozen=True, slots=True)
class Image:
    sdk_framework: str
    version: str
    uri: str

    @property
    def repository(self) -> str:
        return self.uri.split("/", 1)[1].split(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.uri.rsplit(":", 1)[1]


def _sdk():
    try:
        from sagemaker.core import image_uris
    except ImportError as error:
        raise UserError(f"the images command needs the SageMaker SDK's core (pip install -r requirements-dev.txt): "
                        f"{error}") from None
    return image_uris


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in version.split("."))


def list_images(framework: str, region: str) -> list[Image]:
    """Every image version the SDK lists for the stage framework in ``region``, newest first."""
    if framework not in SDK_FRAMEWORKS:
        raise UserError(f"--framework {framework!r}: allowed: {', '.join(SDK_FRAMEWORKS)}")
    image_uris = _sdk()
    found = []
    for sdk_framework in SDK_FRAMEWORKS[framework]:
        config = image_uris.config_for_framework(sdk_framework)
        versions = (config.get("inference") or config).get("versions", {})
        for version in sorted(versions, key=_version_key, reverse=True):
            try:
                uri = image_uris.retrieve(sdk_framework, region, version=version, instance_type=_GPU_INSTANCE,
                                          image_scope="inference")
            except ValueError as error:  # e.g. a version not published in this region
                if "region" in str(error).lower():
                    continue
                raise
            found.append(Image(sdk_framework, version, uri))
    if not found:
        raise UserError(f"--region {region!r}: the SDK lists no {framework} image there")
    return found


def render(images: list[Image], *, pinned_repository: str, pinned_tag: str) -> str:
    lines = [f"{'sdk framework':<14} {'version':<9} image (* = the stage's pin {pinned_repository}:{pinned_tag})"]
    for image in images:
        mark = "*" if (image.repository, image.tag) == (pinned_repository, pinned_tag) else " "
        lines.append(f"{image.sdk_framework:<14} {image.version:<9} {mark} {image.uri}")
    if not any((i.repository, i.tag) == (pinned_repository, pinned_tag) for i in images):
        registry = images[0].uri.split("/", 1)[0] if images else "<registry>"
        lines += [
            f"the stage's pin {pinned_repository}:{pinned_tag} is not in the SDK's table: not blocking. Synth and "
            "deploy never read this table, which lists only the images this SDK version knows (a registry "
            "holds tags an SDK release does not list).",
            f"what to check: that the tag exists in the region's registry, {registry}/{pinned_repository}:{pinned_tag} "
            "(`docker manifest inspect` after `aws ecr get-login-password`), or after deploying `python -m "
            "prefix_routing verify --stage <name>` (model image; the endpoint's InService status shows it was "
            "pulled); to move to a listed image, re-pin model.image_tag.",
        ]
    return "\n".join(lines)
