"""Benchmark: does a trust domain wall off one tenant's KV cache from another's, on an engine that
ignores ``cache_salt``?

Real llama.cpp engines (the pinned build, the tiny model) behind the emulator and the front door's
own web app (``prefix_routing.frontdoor.local``), each request SigV4-signed as its Function URL is
called, the access key id naming the tenant. Two tenants, A and B, and ``--pairs`` long prompts
(about 1,500 tokens, each with a different start): A sends prompt i, then B the same prompt i, then
A prompt i again. Two layouts:

1. **one domain**: one component on one engine: both tenants share its cache (the salt does not
   wall it off on llama.cpp); B finds A's prompt cached.
2. **two domains**: ``[domains.a]`` with A, ``[domains.b]`` with B, one engine each: B's request
   reaches an engine that has never seen A's prompts.

Target: with two domains, B finds none of A's prompt cached (at most the chat template's first
tokens, which B's own earlier requests share), and A's own repeat still hits (at least 90 % of its
prompt cached). Exit status 1 if missed.

    python bench/bench_domains.py [--pairs 20]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prefix_routing.emulator.engine_backend import start_engine_emulator  # noqa: E402
from prefix_routing.engines import session  # noqa: E402
from prefix_routing.frontdoor.local import LocalFrontDoor  # noqa: E402
from prefix_routing.loadtest import LambdaUrlTarget  # noqa: E402
from prefix_routing.stage.config import DEFAULT_STAGE_DATA, parse_stage  # noqa: E402
from prefix_routing.stage.front_door_env import front_door_environment  # noqa: E402

TENANT_A, TENANT_B = "tenant-a", "tenant-b"  # access key ids: arn:aws:iam::000000000000:user/<id>
ARN = "arn:aws:iam::000000000000:user/{}"
#: The chat template's first tokens are the same for every prompt: B's own earlier requests share them.
TEMPLATE_TOKENS = 16
OWN_REPEAT_SHARE = 0.9


def stage(two_domains: bool):
    data = copy.deepcopy(DEFAULT_STAGE_DATA)
    data["name"] = "isolation"
    data["model"]["framework"] = "djl-lmi"  # an engine that ignores cache_salt, as llama.cpp does
    data["endpoint"].update(instances_min=1, instances_max=2, copies_min=1, copies_max=2)
    if two_domains:
        data["domains"] = {"a": {"tenants": [ARN.format(TENANT_A)], "copies_min": 1, "copies_max": 1},
                           "b": {"tenants": [ARN.format(TENANT_B)], "copies_min": 1, "copies_max": 1}}
        data["tenancy"] = {"unknown_tenants": "refuse"}
    return parse_stage(data, source="bench")


def prompt(i: int) -> bytes:
    # A different first sentence for each pair: only the chat template's first tokens are common.
    system = f"Case {i} of the archive. " + " ".join(f"Rule {i}.{j}: answer as a patient librarian." for j in range(110))
    return json.dumps({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Summarize."}],
                       "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}).encode()


def run_layout(two_domains: bool, pairs: int) -> dict:
    config = stage(two_domains)
    engines_needed = len(config.components())
    with session.local_engines(engines_needed, slots=1, cache_ram_mib=40, say=lambda text: None) as engines:
        server = start_engine_emulator(config, [e.url for e in engines])
        door = LocalFrontDoor(server.url, front_door_environment(config), emit=lambda line: None)
        targets = {t: LambdaUrlTarget.local_caller(door.url + "/", t) for t in (TENANT_A, TENANT_B)}
        rows = []
        try:
            for i in range(pairs):
                body = prompt(i)
                a = targets[TENANT_A].send(body)
                b = targets[TENANT_B].send(body)
                again = targets[TENANT_A].send(body)
                for attempt in (a, b, again):
                    if not attempt.ok:
                        raise SystemExit(f"request failed: {attempt.kind}: {attempt.detail}")
                rows.append({"prompt_tokens": b.prompt_tokens, "b_cached": b.cached_tokens or 0,
                             "a_repeat_cached": again.cached_tokens or 0, "b_ttft_s": b.ttft_s,
                             "a_cold_ttft_s": a.ttft_s})
        finally:
            for target in targets.values():
                target.close()
            door.stop()
            server.stop()
    return {"layout": "two domains" if two_domains else "one domain", "rows": rows}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    args = parser.parse_args(argv)
    if not session.built():
        print("llama-server is not built: python -m prefix_routing engines build", file=sys.stderr)
        return 1
    results = [run_layout(False, args.pairs), run_layout(True, args.pairs)]
    print("| layout | pairs | B's prompt tokens (median) | B found cached (max) | B first request cached | "
          "A's own repeat cached (min share) | B's P50 TTFT (ms) | A's cold P50 TTFT (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for result in results:
        rows = result["rows"]
        share = min(r["a_repeat_cached"] / r["prompt_tokens"] for r in rows)
        print(f"| {result['layout']} | {len(rows)} | {statistics.median(r['prompt_tokens'] for r in rows):,.0f} | "
              f"{max(r['b_cached'] for r in rows):,} | {rows[0]['b_cached']:,} | {share:.1%} | "
              f"{1000 * statistics.median(r['b_ttft_s'] for r in rows):,.0f} | "
              f"{1000 * statistics.median(r['a_cold_ttft_s'] for r in rows):,.0f} |")
    walled = results[1]["rows"]
    met = (max(r["b_cached"] for r in walled) <= TEMPLATE_TOKENS and walled[0]["b_cached"] == 0
           and min(r["a_repeat_cached"] / r["prompt_tokens"] for r in walled) >= OWN_REPEAT_SHARE)
    print(f"target: with two domains B finds at most {TEMPLATE_TOKENS} tokens cached (the template's), none on its "
          f"first request, and A's own repeat at least {OWN_REPEAT_SHARE:.0%}: {'met' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
