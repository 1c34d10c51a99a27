"""Shared pieces of the load tester's tests: trace lines, work items, targets, and the accounting check."""

from __future__ import annotations

import json
import pytest
from prefix_routing import loadtest as L
from prefix_routing.lab import bodies
from tests.network_guard import ISOLATED_AWS_ENV



TOKEN = "test-token"
FAKE_KEY_ID = ISOLATED_AWS_ENV["AWS_ACCESS_KEY_ID"]  # the isolated credentials sign the requests


def mooncake_lines(n: int, output_length: int = 6) -> list[str]:
    """A small trace: 3 conversations whose prompts grow turn by turn (chained ids), 1 s apart."""
    lines = []
    for i in range(n):
        conversation, turn = i % 3, i // 3
        ids = [0] + [1000 * (conversation + 1) + k for k in range(turn + 1)]
        lines.append(json.dumps({"timestamp": i * 1000, "input_length": 512 * len(ids) - 100,
                                 "output_length": output_length, "hash_ids": ids}))
    return lines


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(mooncake_lines(24)) + "\n")
    return str(path)


def items(n: int, output_length: int = 6) -> list[L.WorkItem]:
    out = []
    for i, line in enumerate(mooncake_lines(n, output_length)):
        body = bodies.serialize(bodies.chat_body(json.loads(line)))
        out.append(L.WorkItem(i, body, float(i), f"test:{i}"))
    return out


def sagemaker(server) -> L.SageMakerTarget:
    return L.SageMakerTarget("ep", inference_component="ic-1", prefix_aware_id="tenant-a", endpoint_url=server.url,
                             timeout=5, concurrency=4)


def openai(server, token=TOKEN) -> L.OpenAITarget:
    return L.OpenAITarget(f"{server.url}/endpoints/ep/openai/v1", token=token, timeout=5)


def check_accounting(result: L.LoadResult, server, sent: int) -> dict:
    """requests sent = succeeded + failed = what the server recorded; returns the server's records by id."""
    assert server.wait_until_idle(5)
    summary = L.summarize(result)
    assert summary["requests_sent"] == sent == len(result.results)
    assert summary["succeeded"] + summary["failed"] == sent
    assert sum(summary["errors_by_kind"].values()) == summary["failed"]
    assert sorted(r.index for r in result.results) == list(range(sent))  # none lost, none twice
    records = {r.request.request_id: r for r in server.requests}
    assert len(server.requests) == summary["attempts"] == sent
    ids = [r.request_id for r in result.results]
    assert None not in ids and len(set(ids)) == sent and set(ids) == set(records)
    for row in result.results:
        assert row.ok == (row.error_kind is None)
        if not row.ok:
            assert row.error_detail
    return records
