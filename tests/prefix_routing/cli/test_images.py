"""``images``: a pin the SDK's table does not list is said not to block a deploy, with what to check."""

from __future__ import annotations

from prefix_routing.stage import images
from tests.prefix_routing.cli.test_lab_commands import run

REGISTRY = "763104351884.dkr.ecr.us-east-1.amazonaws.com"


def test_a_pin_outside_the_sdks_table_is_not_blocking_and_says_what_to_check(capsys, monkeypatch):
    listed = [images.Image("vllm", "0.25.1", f"{REGISTRY}/vllm:0.25.1-gpu-py312-cu130-ubuntu22.04-sagemaker")]
    monkeypatch.setattr(images, "list_images", lambda framework, region: listed)
    code, out, err = run(capsys, "images", "--region", "us-east-1")  # the default stage pins server-sagemaker-cuda-v1
    assert code == 0, err
    assert "the stage's pin vllm:server-sagemaker-cuda-v1 is not in the SDK's table: not blocking." in out
    assert "Synth and deploy never read this table" in out
    assert f"what to check: that the tag exists in the region's registry, {REGISTRY}/vllm:server-sagemaker-cuda-v1" in out
    assert "python -m prefix_routing verify --stage <name>" in out


def test_a_listed_pin_is_marked_and_nothing_more_is_said(capsys, monkeypatch):
    listed = [images.Image("vllm-server", "1", f"{REGISTRY}/vllm:server-sagemaker-cuda-v1")]
    monkeypatch.setattr(images, "list_images", lambda framework, region: listed)
    code, out, _ = run(capsys, "images", "--region", "us-east-1")
    assert code == 0 and f"* {REGISTRY}/vllm:server-sagemaker-cuda-v1" in out and "not blocking" not in out
