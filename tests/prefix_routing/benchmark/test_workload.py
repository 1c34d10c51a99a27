"""A lab trace as AIPerf's Mooncake trace: 512-token blocks that share exactly what the lab shares."""

from __future__ import annotations

import json
import math

from prefix_routing.benchmark.workload import AIPERF_BLOCK_TOKENS, mooncake_jsonl, mooncake_records
from prefix_routing.lab.traces import Trace, read_mooncake
from prefix_routing.lab.workloads import LongContextSpec, long_context_workload, shared_prefix_workload

SLICE = "tests/data/mooncake_slice.jsonl"


def _trace():
    # Blocks of 250 tokens. B shares A's first 3 blocks (750 tokens); C shares 2 (500 tokens), then its
    # own partial block 7; D's log names only 2 blocks of its 1,100 tokens.
    return Trace(arrivals=[0.0, 1.2346, 2.0, 3.0], prompt_tokens=[1100, 1100, 600, 1100], output_tokens=[50, 60, 10, 5],
                 blocks=[[0, 1, 2, 3, 4], [0, 1, 2, 5, 6], [0, 1, 7], [0, 1]], block_tokens=250)


def test_blocks_of_512_share_what_the_lab_shares_and_no_more():
    assert AIPERF_BLOCK_TOKENS == 512
    assert mooncake_records(_trace()) == [
        # A: tokens 0-511 end in lab block 2, 512-1023 and 1024-1099 in lab block 4.
        {"timestamp": 0, "input_length": 1100, "output_length": 50, "hash_ids": [0, 1, 2]},
        # B: its first 512 tokens are A's (lab blocks 0-2 shared); the rest is its own.
        {"timestamp": 1235, "input_length": 1100, "output_length": 60, "hash_ids": [0, 3, 4]},
        # C: shares only 500 tokens with A, less than a block: nothing shared.
        {"timestamp": 2000, "input_length": 600, "output_length": 10, "hash_ids": [5, 6]},
        # D: the lab knows nothing past token 500: every block its own.
        {"timestamp": 3000, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]},
    ]


def test_the_file_is_one_compact_json_object_a_line():
    assert mooncake_jsonl(_trace()).decode().splitlines()[1] == (
        '{"timestamp":1235,"input_length":1100,"output_length":60,"hash_ids":[0,3,4]}')


def _aiperf_accepts(record: dict) -> bool:
    # aiperf/dataset/generator/prompt.py _generate_cached_prompt: the last block holds 1 to block_size tokens.
    final = record["input_length"] - (len(record["hash_ids"]) - 1) * AIPERF_BLOCK_TOKENS
    return 0 < final <= AIPERF_BLOCK_TOKENS


def test_a_mooncake_trace_comes_back_as_it_was_read(tmp_path):
    trace = read_mooncake(SLICE)
    path = tmp_path / "out.jsonl"
    path.write_bytes(mooncake_jsonl(trace))
    again = read_mooncake(path, strict=True)
    assert again.prompt_tokens == trace.prompt_tokens and again.output_tokens == trace.output_tokens
    assert again.arrivals == [round(t * 1000) / 1000 for t in trace.arrivals]
    # Same blocks, other names: a one-to-one renaming.
    pairs = {(a, b) for x, y in zip(trace.blocks, again.blocks) for a, b in zip(x, y)}
    assert len(pairs) == len({a for a, _ in pairs}) == len({b for _, b in pairs})
    with open(SLICE) as original:
        first = json.loads(original.readline())
    assert json.loads(path.read_text().splitlines()[0])["hash_ids"] == list(range(len(first["hash_ids"])))


def test_long_context_shares_its_prefix_in_whole_aiperf_blocks_only():
    spec = LongContextSpec(duration_s=120.0)
    trace = long_context_workload(spec, seed=1)
    records = mooncake_records(trace)
    assert all(_aiperf_accepts(r) for r in records)
    shared = 8000 // 512  # 15 blocks = 7,680 of the 8,000 shared tokens; block 16 mixes in the suffix
    by_prefix: dict[int, list[list[int]]] = {}
    for blocks, record in zip(trace.blocks, records):
        assert len(record["hash_ids"]) == math.ceil(record["input_length"] / 512)
        by_prefix.setdefault(blocks[0], []).append(record["hash_ids"])
    repeated = [ids for ids in by_prefix.values() if len(ids) > 1]
    assert repeated
    for ids in repeated:
        assert all(other[:shared] == ids[0][:shared] for other in ids)
        assert len({other[shared] for other in ids}) == len(ids)  # from block 16 on, each its own
    firsts = [ids[0][0] for ids in by_prefix.values()]
    assert len(set(firsts)) == len(firsts)  # different prefixes share nothing


def test_shared_prefix_is_whole_blocks_so_nothing_is_lost():
    trace = shared_prefix_workload(seed=2).head(300)
    records = mooncake_records(trace)
    assert all(_aiperf_accepts(r) for r in records)
    for blocks, record in zip(trace.blocks, records):
        others = [r for b, r in zip(trace.blocks, records) if b[0] == blocks[0]]
        assert all(r["hash_ids"][:4] == record["hash_ids"][:4] for r in others)  # 2,048 tokens = 4 blocks
