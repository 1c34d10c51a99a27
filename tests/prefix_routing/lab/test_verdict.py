"""The verdict: from the simulated gain against RANDOM, with the reuse share shown beside it."""

from __future__ import annotations

import pytest

from prefix_routing.lab.verdict import routing_verdict


def result(hit_rate: float, p50_s: float) -> dict:
    return {"hit_rate": hit_rate, "ttft_p50_s": p50_s}


def test_a_trace_below_the_reuse_rule_of_thumb_can_still_pay():
    # The Mooncake figures: 59 % of tokens cached against 13 %, P50 57 ms against 822 ms,
    # while only 44.6 % of requests reuse a prefix.
    v = routing_verdict(prefix_aware=result(0.59, 0.057), random=result(0.13, 0.822), reuse_share=0.446)
    assert v["pays"] is True and v["reuse_criterion_met"] is False
    assert v["hit_rate_gain_points"] == pytest.approx(46.0)
    assert v["ttft_p50_gain"] == pytest.approx(1 - 57 / 822)
    assert v["text"].startswith("prefix-aware routing pays here: PREFIX_AWARE caches 59.0% of prompt tokens "
                                "against RANDOM's 13.0% (+46.0 points), P50 TTFT 57 ms against 822 ms (-93%)")
    assert v["criterion"] == ("the rule of thumb: 44.6% of requests reuse a prefix seen before "
                              "(not above its 50%; the simulation decides)")


def test_a_small_gain_does_not_pay_even_with_much_reuse():
    v = routing_verdict(prefix_aware=result(0.33, 0.50), random=result(0.30, 0.55), reuse_share=0.7)
    assert v["pays"] is False and v["reuse_criterion_met"] is True
    assert v["hit_rate_gain_points"] == pytest.approx(3.0) and v["ttft_p50_gain"] == pytest.approx(1 - 0.50 / 0.55)
    assert "does not pay here" in v["text"] and "RANDOM or LEAST_OUTSTANDING_REQUESTS will do as well" in v["text"]
    assert v["criterion"].endswith("(above its 50%; the simulation decides)")


@pytest.mark.parametrize(
    ("prefix_aware", "random", "pays"),
    [
        (result(0.50, 1.0), result(0.45, 1.0), True),  # exactly +5 points (4.999… in floats)
        (result(0.399, 1.0), result(0.35, 1.0), False),  # +4.9
        (result(0.30, 0.8), result(0.30, 1.0), True),  # exactly 20 % lower P50
        (result(0.30, 0.81), result(0.30, 1.0), False),  # 19 %
        (result(0.30, 0.5), result(0.30, 0.0), False),  # no baseline latency: no TTFT gain to claim
    ],
)
def test_the_bar_is_five_points_or_a_fifth_of_p50(prefix_aware, random, pays):
    assert routing_verdict(prefix_aware=prefix_aware, random=random, reuse_share=0.5)["pays"] is pays


def test_the_whole_text_of_a_verdict_that_does_not_pay():
    # +3.0 points, P50 1,500 ms against 1,600 ms: 1 - 1500/1600 = 6.25 % lower, shown as -6%.
    v = routing_verdict(prefix_aware=result(0.33, 1.5), random=result(0.30, 1.6), reuse_share=0.25)
    assert v["text"] == (
        "prefix-aware routing does not pay here: PREFIX_AWARE caches 33.0% of prompt tokens against RANDOM's "
        "30.0% (+3.0 points), P50 TTFT 1,500 ms against 1,600 ms (-6%); it pays from +5 points or a 20% lower "
        "P50: RANDOM or LEAST_OUTSTANDING_REQUESTS will do as well"
    )
    # The rule of thumb agrees (not above 50 %, does not pay): nothing to add.
    assert v["criterion"] == "the rule of thumb: 25.0% of requests reuse a prefix seen before (not above its 50%)"
    assert v["reuse_share"] == 0.25


def test_a_verdict_that_pays_with_the_rule_of_thumb_met_says_so_plainly():
    v = routing_verdict(prefix_aware=result(0.60, 0.4), random=result(0.20, 0.5), reuse_share=0.8)
    assert v["pays"] is True and v["reuse_criterion_met"] is True
    assert v["text"] == ("prefix-aware routing pays here: PREFIX_AWARE caches 60.0% of prompt tokens against "
                         "RANDOM's 20.0% (+40.0 points), P50 TTFT 400 ms against 500 ms (-20%)")
    assert v["criterion"] == "the rule of thumb: 80.0% of requests reuse a prefix seen before (above its 50%)"


def test_half_the_requests_reusing_a_prefix_is_not_above_the_rule_of_thumb():
    v = routing_verdict(prefix_aware=result(0.30, 1.0), random=result(0.30, 1.0), reuse_share=0.5)
    assert v["reuse_criterion_met"] is False and v["pays"] is False
    assert v["ttft_p50_gain"] == 0.0 and v["hit_rate_gain_points"] == 0.0


def test_without_a_baseline_latency_the_ttft_gain_is_zero():
    v = routing_verdict(prefix_aware=result(0.30, 0.5), random=result(0.30, 0.0), reuse_share=0.1)
    assert v["ttft_p50_gain"] == 0.0
    assert "P50 TTFT 500 ms against 0 ms (" in v["text"]


def test_points_a_hair_under_five_still_pay():
    # The bar is 5 points less 1e-9 (float noise): 100 × 0.04999999999 = 4.999999999 points pays.
    v = routing_verdict(prefix_aware=result(0.04999999999, 1.0), random=result(0.0, 1.0), reuse_share=0.5)
    assert v["hit_rate_gain_points"] == 5.0 - 1e-9 and v["pays"] is True


def banded(hit: float, p50: float, hit_band: float, p50_band: tuple[float, float]) -> dict:
    return {"hit_rate": hit, "ttft_p50_s": p50, "bands": {"hit_rate": hit_band, "ttft_p50_s": p50_band}}


@pytest.mark.parametrize(("prefix_aware", "random", "text"), [
    # PREFIX_AWARE 75.9 % ± 0.4, P50 0.107 s (0.105–0.110); RANDOM 1.1 % ± 0.3, P50 0.464 s (0.4502–0.480):
    # +74.8 ± 0.7 points; P50 −77 %, from 0.105/0.480 − 1 = −78 % to 0.110/0.4502 − 1 = −76 %.
    (banded(0.759, 0.107, 0.004, (0.105, 0.110)), banded(0.011, 0.464, 0.003, (0.4502, 0.480)),
     "prefix-aware routing pays here: PREFIX_AWARE caches 75.9% ±0.4% of prompt tokens against RANDOM's 1.1% ±0.3% "
     "(+74.8 ±0.7 points), P50 TTFT 107 ms (105–110) against 464 ms (450–480) (-77%: -78% to -76%)"),
    # PREFIX_AWARE 20 % ± 5, P50 0.9 s (0.85–0.95); RANDOM 18 % ± 5, P50 1.0 s (0–1.05), a band down
    # to 0: +2.0 ± 10.0 points; P50 −10 %, from 0.85/1.05 − 1 = −19 % to +0 % (no ratio to 0).
    (banded(0.20, 0.9, 0.05, (0.85, 0.95)), banded(0.18, 1.0, 0.05, (0.0, 1.05)),
     "prefix-aware routing does not pay here: PREFIX_AWARE caches 20.0% ±5.0% of prompt tokens against RANDOM's "
     "18.0% ±5.0% (+2.0 ±10.0 points), P50 TTFT 900 ms (850–950) against 1,000 ms (0–1,050) (-10%: -19% to +0%); it "
     "pays from +5 points or a 20% lower P50: RANDOM or LEAST_OUTSTANDING_REQUESTS will do as well"),
])
def test_a_verdict_from_a_sample_gives_each_figure_its_band(prefix_aware, random, text):
    assert routing_verdict(prefix_aware=prefix_aware, random=random, reuse_share=0.9)["text"] == text
