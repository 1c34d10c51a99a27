"""The isolation canary on real engines, as ``python -m prefix_routing canary`` runs it: the engines
it starts (one per trust domain, stopped by their ids), the emulated runtime, the front door's
salts and bodies. Three cases:

- a stage that counts on salts (vLLM) served by llama.cpp, which ignores them: two tenants share one
  copy's cache, and the canary must report the breach (what an image update to an engine without
  salts would do);
- the same stage on vLLM: its salts keep the tenants apart, and the canary passes;
- a stage of two trust domains on an engine without salts (LMI's, llama.cpp here): the second tenant
  is the other domain's, on that domain's copies, and the canary passes.

In every case the first tenant's repeat must be cached (the cache and routing are alive). Skipped
without the engines built (``make engines``); CI (``PREFIX_ROUTING_REQUIRE_ENGINES=1``) fails instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefix_routing.canary import TEMPLATE_TOKENS
from prefix_routing.engines import session

ROOT = Path(__file__).resolve().parent.parent
REQUIRE = os.environ.get("PREFIX_ROUTING_REQUIRE_ENGINES") == "1"


def needs(kind: str) -> None:
    if not session.built(kind):
        message = f"{kind} is not built or installed (make engines)"
        if REQUIRE:
            pytest.fail(message + " and PREFIX_ROUTING_REQUIRE_ENGINES=1", pytrace=False)
        pytest.skip(message)


def canary(stage: str, kind: str, tmp_path: Path, stage_text: str | None = None) -> tuple[int, list[dict]]:
    environment = dict(os.environ)
    if stage_text is not None:
        (tmp_path / f"{stage}.toml").write_text(stage_text)
        environment["PREFIX_ROUTING_CONFIG_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "prefix_routing", "canary", "--stage", stage, "--engine-kind", kind,
                           "--prompt-tokens", "400", "--json"], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env=environment)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_two_tenants_sharing_a_llama_cpp_copy_are_a_breach(tmp_path):
    needs("llama.cpp")
    status, (verdict,) = canary("default", "llama.cpp", tmp_path)  # a vLLM stage: it counts on salts
    assert status == 1 and verdict["isolation_breach"] and not verdict["cache_cold"]
    assert verdict["other_cached"] >= 0.9 * verdict["prompt_tokens"]  # all of A's prompt, beyond the template


def test_vllms_salts_keep_the_tenants_of_one_copy_apart(tmp_path):
    needs("vllm")
    status, (verdict,) = canary("default", "vllm", tmp_path)
    assert status == 0 and not verdict["isolation_breach"] and not verdict["cache_cold"]
    assert verdict["other_cached"] <= TEMPLATE_TOKENS and verdict["repeat_cached"] >= 0.9 * verdict["prompt_tokens"]


TWO_DOMAINS = """
name = "walled"
[model]
framework = "djl-lmi"
image_repository = "djl-inference"
image_tag = "0.33.0-lmi15.0.0-cu128"
model_s3_uri = "s3://weights-bucket/llama/8b/"
[endpoint]
instance_type = "ml.g6e.xlarge"
instances_min = 2
instances_max = 2
copies_min = 2
copies_max = 2
[routing]
strategy = "PREFIX_AWARE"
[domains.a]
tenants = ["arn:aws:iam::111122223333:role/a-*"]
copies_min = 1
copies_max = 1
[domains.b]
copies_min = 1
copies_max = 1
[tenancy]
default_domain = "b"
"""


def test_across_trust_domains_an_engine_without_salts_keeps_the_tenants_apart(tmp_path):
    needs("llama.cpp")
    status, verdicts = canary("walled", "llama.cpp", tmp_path, TWO_DOMAINS)
    assert status == 0 and [v["domain"] for v in verdicts] == ["a", "b"]
    for verdict in verdicts:
        assert not verdict["isolation_breach"] and not verdict["cache_cold"], verdict
        assert verdict["other_cached"] <= TEMPLATE_TOKENS
