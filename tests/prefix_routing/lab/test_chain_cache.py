"""The chain cache (lab/chain_cache.py) against an OrderedDict LRU written here, request by request."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings, strategies as st

from prefix_routing.lab.chain_cache import ChainLRU, chained


class ReferenceLRU:
    """The LRU of the fleet model, plainly: a prompt's leading held blocks are its cached part; all
    its blocks are then touched tail first (its first block ends the most recent) and the least
    recent evicted beyond capacity."""

    def __init__(self, capacity: int) -> None:
        self.blocks: OrderedDict = OrderedDict()
        self.capacity = capacity

    def held(self, ids) -> int:
        m = 0
        for b in ids:
            if b not in self.blocks:
                break
            m += 1
        return m

    def place(self, ids) -> int:
        m = self.held(ids)
        for b in reversed(ids):
            self.blocks[b] = None
            self.blocks.move_to_end(b)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)
        return m


def _prompts(draw_ops) -> list[list[int]]:
    """Chained prompts from (kind, which, length) steps: a new root, a continuation of an earlier
    prompt, or a branch off an earlier prompt at some depth (the ids of a trie, like Mooncake's)."""
    prompts: list[list[int]] = []
    next_id = 0
    for kind, which, depth, length in draw_ops:
        if kind == 0 or not prompts:
            base: list[int] = []
        else:
            earlier = prompts[which % len(prompts)]
            base = earlier if kind == 1 else earlier[: depth % (len(earlier) + 1)]
        fresh = list(range(next_id, next_id + length))
        next_id += length
        prompts.append(base + fresh)
    return prompts


_steps = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1000), st.integers(0, 40), st.integers(0, 6)),
                  min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(_steps, st.integers(0, 30), st.lists(st.integers(0, 1000), max_size=60))
def test_it_holds_what_an_ordered_dict_lru_holds_in_the_same_order(steps, capacity, repeats):
    prompts = _prompts(steps)
    # Requests: the prompts in order, with earlier prompts sent again in between (warm hits).
    requests = []
    for i, ids in enumerate(prompts):
        requests.append(ids)
        if i < len(repeats):
            requests.append(prompts[repeats[i] % (i + 1)])
    cache, reference = ChainLRU(capacity), ReferenceLRU(capacity)
    for ids in requests:
        probe = requests[(len(ids) * 7) % len(requests)]
        assert cache.held(probe) == reference.held(probe)
        assert cache.place(list(ids)) == reference.place(ids)
        assert list(cache) == list(reference.blocks)
        assert len(cache) == len(reference.blocks)
    assert list(cache.to_ordered()) == list(reference.blocks)


def test_a_hand_worked_example():
    cache = ChainLRU(5)
    assert cache.place([1, 2, 3]) == 0
    assert list(cache) == [3, 2, 1]  # least recent first: the tail was touched first
    assert cache.place([1, 2, 4, 5]) == 2  # shares 1, 2; 4 and 5 enter, 3 is now the oldest
    assert list(cache) == [3, 5, 4, 2, 1]
    assert cache.place([1, 6]) == 1  # 6 enters; 3 (the least recent) goes
    assert list(cache) == [5, 4, 2, 6, 1]
    assert cache.held([1, 2, 4, 5]) == 4 and cache.held([1, 2, 3]) == 2 and cache.held([7]) == 0
    # 9 and 8 enter, the four held move up: 6, 9, 8, 5, 4, 2, 1; the two least recent go, 6 and
    # the prompt's own tail 9 (touched first, so the least recent of the prompt).
    assert cache.place([1, 2, 4, 5, 8, 9]) == 4
    assert list(cache) == [8, 5, 4, 2, 1]


def test_the_order_after_a_prompt_that_diverges_deep_in_a_run():
    cache, reference = ChainLRU(100), ReferenceLRU(100)
    long = list(range(40))
    for ids in (long, long[:25] + [100, 101], long[:3] + [200], long + [300], long[:25] + [100, 102]):
        assert cache.place(ids) == reference.place(ids)
        assert list(cache) == list(reference.blocks)


def test_a_prompt_longer_than_the_cache_keeps_its_head():
    cache, reference = ChainLRU(3), ReferenceLRU(3)
    for ids in ([1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 2, 3, 4, 5]):
        assert cache.place(ids) == reference.place(ids)
        assert list(cache) == list(reference.blocks)
    assert list(cache) == [3, 2, 1]


def test_a_cache_of_no_blocks_holds_nothing():
    cache = ChainLRU(0)
    assert cache.place([1, 2]) == 0 and cache.place([1, 2]) == 0
    assert list(cache) == [] and len(cache) == 0 and cache.held([1]) == 0
    assert cache.place([]) == 0


def test_runs_emptied_by_hits_do_not_pile_up():
    cache = ChainLRU(1_000)
    cache.place([1, 2, 3])
    for _ in range(10_000):  # every request a hit: each leaves an emptied run behind
        assert cache.place([1, 2, 3]) == 3
    assert len(cache.runs) <= 2 * 3 + 64 + 1
    assert list(cache) == [3, 2, 1]


@pytest.mark.parametrize(
    "blocks, expected",
    [
        ([[1, 2, 3], [1, 2, 4], [5], [], [1, 2, 3, 6]], True),
        ([[1, 2, 3], [7, 2]], False),  # 2 has two parents
        ([[1, 2], [2]], False),  # 2 is a first block and a second one
        ([[1, 2, 1]], False),  # an id twice in one prompt
        ([[1, 1]], False),
        ([[(0, "a"), (1, "b")], [(0, "a"), (1, "c")]], True),  # any hashable ids
        ([[None, 2], [2]], False),  # even None: 2's parent is None, then no block
    ],
)
def test_chained_ids_have_one_parent_each(blocks, expected):
    assert chained(blocks) is expected


def test_a_reader_says_whether_its_ids_are_chained_and_a_trace_checks_once(tmp_path):
    import json

    from prefix_routing.lab import traces

    def mooncake(name, id_lists):
        path = tmp_path / name
        path.write_text("".join(json.dumps({"timestamp": i, "input_length": 512 * len(ids), "output_length": 1,
                                            "hash_ids": ids}) + "\n" for i, ids in enumerate(id_lists)))
        return traces.read_mooncake(path)

    assert mooncake("chained.jsonl", [[1, 2], [1, 3]]).chained is True
    assert mooncake("not.jsonl", [[1, 2], [3, 2]]).chained is False
    trace = traces.Trace([0.0, 1.0], [1024, 1024], [1, 1], [[1, 2], [3, 2]], 512)
    assert trace.chained is None and trace.ids_chained() is False
    trace.blocks[1] = [3, 4]  # a trace checks once and remembers (its ids are not expected to change)
    assert trace.ids_chained() is False
    assert traces.Trace([0.0], [512], [1], [[1, 1]], 512, chained=True).ids_chained() is True  # its word
