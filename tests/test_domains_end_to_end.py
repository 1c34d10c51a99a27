"""Trust domains on real llama.cpp engines through the front door (``bench/bench_domains.py``, two
pairs): with one domain, tenant B finds tenant A's prompt in the shared engine's cache; with two,
B's engine has never seen it, and A's own repeat still hits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefix_routing.engines import session

ROOT = Path(__file__).resolve().parents[1]


def test_two_domains_wall_off_the_other_tenants_cache():
    if not session.built():
        if os.environ.get("PREFIX_ROUTING_REQUIRE_ENGINES") == "1":
            pytest.fail("llama-server is not built and PREFIX_ROUTING_REQUIRE_ENGINES=1", pytrace=False)
        pytest.skip("llama-server is not built (make engines)")
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_domains.py"), "--pairs", "2"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    one, two = [line.split(" | ") for line in run.stdout.splitlines() if line.startswith(("| one", "| two"))]
    prompt_tokens, b_cached_one = int(one[2].replace(",", "")), int(one[3].replace(",", ""))
    assert b_cached_one >= 0.9 * prompt_tokens  # one domain: B reads A's prompt from the cache
    assert two[4] == "0"  # two domains: B's first request finds nothing cached at all
