"""The SDK's image table (prefix_routing.stage.images): offline, and never imported by synth."""

import os
import subprocess
import sys

import pytest
from aws_cdk.region_info import Fact, FactName

from prefix_routing.rules.errors import UserError
from prefix_routing.stage.images import Image, list_images, render
from tests.stacks.conftest import ROOT


def test_vllm_images_come_from_the_same_registry_account_as_the_stacks_fact():
    images = list_images("vllm", "us-east-1")
    account = Fact.find("us-east-1", FactName.DLC_REPOSITORY_ACCOUNT)  # what the endpoint construct uses
    servers = [i for i in images if i.sdk_framework == "vllm-server"]
    assert servers and all(i.uri.startswith(f"{account}.dkr.ecr.us-east-1.amazonaws.com/vllm:") for i in servers)
    assert {i.sdk_framework for i in images} == {"vllm-server", "vllm"}
    versions = [tuple(int(p) for p in i.version.split(".")) for i in servers]
    assert versions == sorted(versions, reverse=True)  # newest first


def test_the_pin_is_marked_or_said_to_be_missing():
    images = [Image("vllm-server", "2.6", "1.dkr.ecr.r.amazonaws.com/vllm:server-sagemaker-cuda-v2.6"),
              Image("vllm-server", "1", "1.dkr.ecr.r.amazonaws.com/vllm:server-sagemaker-cuda-v1")]
    text = render(images, pinned_repository="vllm", pinned_tag="server-sagemaker-cuda-v1")
    (marked,) = [line for line in text.splitlines() if " * " in line]
    assert marked.endswith("vllm:server-sagemaker-cuda-v1") and "not in the SDK's table" not in text
    text = render(images, pinned_repository="vllm", pinned_tag="server-sagemaker-cuda-v9")
    assert " * " not in text and "server-sagemaker-cuda-v9 is not in the SDK's table" in text


def test_unknown_framework_and_region_are_user_errors():
    with pytest.raises(UserError, match="--framework 'tgi': allowed: vllm, djl-lmi"):
        list_images("tgi", "us-east-1")
    with pytest.raises(UserError, match="--region 'xx-nowhere-1': the SDK lists no vllm image there"):
        list_images("vllm", "xx-nowhere-1")


def test_synth_never_imports_the_sagemaker_sdk(tmp_path):
    env = {**os.environ, "CDK_OUTDIR": str(tmp_path), "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    result = subprocess.run([sys.executable, "-X", "importtime", "app.py"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    modules = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "aws_cdk" in modules  # the check sees what synth imported
    assert not {m for m in modules if m == "sagemaker" or m.startswith("sagemaker.")}
