"""``python -m prefix_routing images``: the image tags the SageMaker SDK lists, to re-pin ``model.image_tag``."""

from __future__ import annotations

HELP = "list the container images (and tags) the SageMaker SDK knows for a framework in a region (offline)"


def add_arguments(parser) -> None:
    parser.add_argument("--framework", default="vllm", help="the stage's model.framework: vllm or djl-lmi")
    parser.add_argument("--region", required=True, help="AWS region, e.g. us-east-1")
    parser.add_argument("--stage", default="default", help="mark this stage's pinned image (default: the embedded default)")


def run(args) -> int:
    from prefix_routing.cli.stages import load_stage_arg
    from prefix_routing.stage.images import list_images, render

    config = load_stage_arg(args.stage)
    images = list_images(args.framework, args.region)
    print(render(images, pinned_repository=config.model.image_repository, pinned_tag=config.model.image_tag))
    return 0
