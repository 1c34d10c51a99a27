"""The shared-prefix workload (prefix_routing.lab.workloads): short requests on a few system prompts."""

from __future__ import annotations

import math

from prefix_routing.lab.workloads import WORKLOADS, SharedPrefixSpec, shared_prefix_workload


def test_it_is_a_workload_of_the_lab_commands():
    assert WORKLOADS["shared-prefix"] == (SharedPrefixSpec, shared_prefix_workload)


def test_its_numbers():
    spec = SharedPrefixSpec()
    assert (spec.prefixes, spec.prefix_tokens, spec.suffix_tokens, spec.output_tokens) == (128, 2048, (100, 500),
                                                                                          (100, 300))
    assert (spec.rate_rps, spec.duration_s, spec.block_tokens, spec.instances) == (2.0, 600.0, 512, 2)
    config = spec.fleet_config()
    assert (config.instances, config.block_tokens, config.prefix_length, config.concurrency_threshold) == (2, 512, 4096,
                                                                                                          10)


def test_each_request_is_one_of_the_system_prompts_and_a_question_of_its_own():
    spec = SharedPrefixSpec()
    trace = shared_prefix_workload(spec, seed=3)
    assert trace.source == "shared-prefix workload (seed 3)"
    assert trace.block_tokens == 512
    # Poisson arrivals at 2/s for 600 s: 1,200 expected, well within 10 %.
    assert 1080 < len(trace) < 1320
    assert trace.arrivals[0] == 0.0 and trace.duration_s <= 600.0
    seen_questions = set()
    for prompt, output, blocks in zip(trace.prompt_tokens, trace.output_tokens, trace.blocks):
        assert 2048 + 100 <= prompt <= 2048 + 500 and 100 <= output <= 300
        assert len(blocks) == math.ceil(prompt / 512)
        # System prompt p is blocks 4p .. 4p + 3 (2,048 tokens = 4 blocks of 512), chained.
        p = blocks[0] // 4
        assert 0 <= p < 128 and blocks[:4] == [4 * p, 4 * p + 1, 4 * p + 2, 4 * p + 3]
        assert all(b >= 128 * 4 for b in blocks[4:])  # the question's blocks come after every prompt's
        assert not seen_questions & set(blocks[4:])
        seen_questions |= set(blocks[4:])
    assert len({b[0] for b in trace.blocks}) > 100  # most of the 128 prompts are used


def test_a_seed_gives_the_same_workload():
    assert shared_prefix_workload(seed=5).blocks == shared_prefix_workload(seed=5).blocks
    assert shared_prefix_workload(seed=5).blocks != shared_prefix_workload(seed=6).blocks
