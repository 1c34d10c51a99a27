"""Whether the modelled fleet keeps up, what max/mean counts with autoscaling, strategies autoscaling
does not model, and prompts an engine refuses (prefix_routing/lab/overload.py, lab/simulate.py)."""

from __future__ import annotations

import pytest

from prefix_routing import lab
from prefix_routing.lab.autoscaling import AutoscalingSettings
from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.overload import context_text, overload_text, prompts_beyond_context
from prefix_routing.lab.routing import Strategy
from prefix_routing.lab.slot_cache import LLAMACPP_SLOTS
from prefix_routing.lab.traces import Trace
from prefix_routing.rules.errors import UserError
from tests.prefix_routing.lab.conftest import P5_70B


def trace(arrivals, prompt=1000, output=10) -> Trace:
    return Trace(list(arrivals), [prompt] * len(arrivals), [output] * len(arrivals),
                 [[10_000 * i + b for b in range(-(-prompt // 512))] for i in range(len(arrivals))], source="test")


def test_the_second_of_two_long_prompts_on_one_copy_waits_the_first_ones_prefill():
    # 40,000 uncached tokens take about 2 s on a p5 TP8 copy: the second request waits that long
    # behind the first, more than 1 s; the first waits for nothing.
    one = FleetConfig(instances=1, preset=P5_70B, strategy=Strategy.RANDOM)
    together = lab.simulate(trace([0.0, 0.0], prompt=40_000), one)
    assert together.waited_share == pytest.approx(0.5)
    apart = lab.simulate(trace([0.0, 100.0], prompt=40_000), one)
    assert apart.waited_share == 0.0
    assert together.as_dict()["waited_share"] == 0.5 and together.as_dict()["wait_threshold_s"] == 1.0


def test_overloaded_means_a_timeout_or_the_median_request_waited():
    assert overload_text(0.49, 0, 100, 60.0) is None
    text = overload_text(0.5, 0, 100, 60.0)
    assert text.startswith("the modelled fleet is overloaded: 50% of requests waited more than 1 s for a copy")
    assert text.endswith("add copies or instances, or lower the load, before reading hit rates")
    assert "2 of 100 timed out after 60 s" in overload_text(0.1, 2, 100, 60.0)


def test_max_mean_counts_the_instances_that_held_a_provisioned_copy():
    # Light load: autoscaling never adds a copy to the first one, so every request is on instance 0.
    # Over the one instance that could serve, max/mean is 1; over all four it was 20 / 5 = 4.
    scaled = FleetConfig(instances=4, preset=P5_70B, strategy=Strategy.RANDOM,
                         autoscaling=AutoscalingSettings(min_copies=1, max_copies=4))
    r = lab.simulate(trace([10.0 * i for i in range(20)]), scaled)
    assert r.instance_requests == [20, 0, 0, 0]
    assert r.max_mean_instances == 1 and r.max_mean_requests == 1.0 and r.max_mean_tokens == 1.0
    fixed = lab.simulate(trace([10.0 * i for i in range(20)]), FleetConfig(instances=4, preset=P5_70B,
                                                                          strategy=Strategy.PREFIX_AWARE))
    assert fixed.max_mean_instances == 4


def test_a_strategy_autoscaling_does_not_model_runs_at_fixed_copies_and_says_so():
    scaled = FleetConfig(instances=4, preset=P5_70B, autoscaling=AutoscalingSettings(min_copies=1, max_copies=4))
    results = lab.simulate_many(trace([10.0 * i for i in range(20)]), scaled,
                                [Strategy.PREFIX_AWARE, Strategy.KV_AWARE], progress=False)
    assert results[0].autoscaling is not None and not results[0].notes
    assert results[1].autoscaling is None and results[1].config.autoscaling is None
    assert results[1].notes == ["KV_AWARE: autoscaling is not modelled for it: it ran on all 4 copies, fixed, while "
                                "the others scaled; its figures are those of the fleet at its largest"]
    assert results[1].as_dict()["notes"] == results[1].notes
    with pytest.raises(UserError, match=r"not for KV_AWARE: give --strategy PREFIX_AWARE .* or --autoscaling off"):
        lab.simulate_many(trace([0.0]), scaled, [Strategy.KV_AWARE], progress=False)


def test_prompts_of_a_slots_context_or_more_are_counted_and_named():
    assert prompts_beyond_context([100, 8191, 8192, 9000], 8192) == 2
    text = context_text([100, 8191, 8192, 9000], 8192, "local-test")
    assert text.startswith("2 of 4 prompts (50%; the longest 9,000 tokens) are at least the context of one slot of "
                           "local-test (8,192 tokens): llama-server refuses them")
    assert context_text([100, 8191], 8192, "local-test") is None
    # The same prompts in the fleet model: refused, nothing cached (the slot cache's rule).
    slots = FleetConfig(instances=1, preset=P5_70B, strategy=Strategy.RANDOM, cache_policy=LLAMACPP_SLOTS,
                        cache_tokens=8192 * 1024)  # the preset's 1,024 slots of 8,192 tokens each
    assert slots.slot_tokens == 8192

    def twice(prompt: int) -> Trace:  # the same prompt, a second apart
        blocks = list(range(-(-prompt // 512)))
        return Trace([0.0, 1.0], [prompt, prompt], [10, 10], [blocks, list(blocks)], source="test")

    assert lab.simulate(twice(9000), slots).hit_rate == 0.0  # refused: nothing kept, nothing reused
    assert lab.simulate(twice(8000), slots).hit_rate > 0.4  # within the context: the second reuses it
