"""The summary's arithmetic (prefix_routing.loadtest.report)."""

from __future__ import annotations

import pytest
from prefix_routing import loadtest as L


def row(i, *, ok=True, ttft=None, e2e=None, prompt=None, cached=None, output=None, kind=None) -> L.RequestResult:
    return L.RequestResult(index=i, source=f"r{i}", ok=ok, error_kind=kind, error_detail=None, status=200 if ok else 502,
                           request_id=f"id-{i}", start_s=float(i), scheduled_s=None, ttft_s=ttft, e2e_s=e2e,
                           output_tokens=output, prompt_tokens=prompt, cached_tokens=cached, finish_reason=None,
                           body_bytes=10, bytes_received=10)


def test_percentile_interpolates_between_closest_ranks():
    # Hand computed: position = (n - 1) × q / 100, then linear between the two ranks around it.
    assert L.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # position 1.5: 2 + 0.5 × (3 − 2)
    assert L.percentile([10, 20, 30, 40, 50], 90) == pytest.approx(46.0)  # position 3.6: 40 + 0.6 × 10
    assert L.percentile(list(range(1, 101)), 99) == pytest.approx(99.01)  # position 98.01
    assert L.percentile([10, 20, 30, 40, 50], 0) == 10 and L.percentile([10, 20, 30, 40, 50], 100) == 50
    assert L.percentile([7.0], 90) == 7.0
    assert L.percentile([], 50) is None and L.percentile([None, float("nan")], 50) is None
    assert L.percentile([3.0, None, 1.0], 50) == 2.0  # missing values are left out


def test_summary_hit_rate_is_token_weighted_over_succeeded_requests():
    rows = [
        row(0, ttft=0.1, e2e=1.0, prompt=1000, cached=900, output=10),  # 90 %
        row(1, ttft=0.3, e2e=2.0, prompt=100, cached=0, output=10),  # 0 %
        row(2, ttft=0.2, e2e=1.5, prompt=400, cached=None, output=5),  # no cache figure: counts as 0 cached
        row(3, ok=False, kind="model_error", prompt=5000, cached=5000),  # failed: left out
        row(4, ttft=0.4, e2e=0.5, prompt=None, cached=None, output=1),  # no usage: left out
    ]
    summary = L.summarize(L.LoadResult(rows, started_at=0.0, duration_s=10.0, stopped_by="end of input"))
    # Token-weighted: (900 + 0 + 0) / (1000 + 100 + 400) = 0.6. (A mean of per-request rates gives 0.3.)
    assert summary["hit_rate"] == 0.6
    assert (summary["prompt_tokens"], summary["cached_tokens"], summary["requests_with_usage"]) == (1500, 900, 3)
    assert (summary["succeeded"], summary["failed"], summary["errors_by_kind"]) == (4, 1, {"model_error": 1})
    assert summary["error_rate"] == 0.2 and summary["achieved_rate_rps"] == 0.5
    # TTFT over succeeded requests: 0.1, 0.2, 0.3, 0.4 -> P50 0.25 (position 1.5), P90 0.37 (position 2.7).
    assert summary["ttft_p50_s"] == 0.25 and summary["ttft_p90_s"] == 0.37
    assert summary["ttft_mean_s"] == 0.25 and summary["ttft_max_s"] == 0.4
    # Output tokens of succeeded requests: 10 + 10 + 5 + 1 over 10 s.
    assert summary["output_tokens"] == 26 and summary["output_tokens_per_s"] == 2.6
    # Decode speed: (output − 1) / (e2e − ttft) for outputs > 1: 9/0.9 = 10, 9/1.7 ≈ 5.294, 4/1.3 ≈ 3.077 -> P50 5.294.
    assert summary["decode_tokens_per_s_p50"] == 5.294
    # E2E over succeeded requests: 1.0, 2.0, 1.5, 0.5 -> sorted 0.5 1.0 1.5 2.0: P50 1.25, mean 1.25, max 2.0.
    assert (summary["e2e_p50_s"], summary["e2e_mean_s"], summary["e2e_max_s"]) == (1.25, 1.25, 2.0)
    assert summary["attempts"] == 5 and summary["request_ids_seen"] == 5
    assert (summary["duration_s"], summary["stopped_by"], summary["skipped_not_sent"]) == (10.0, "end of input", 0)
    assert summary["client_cpu_utilization"] is None and summary["schedule_lag_p50_s"] is None


def test_summary_of_a_paced_run_with_retries_skips_and_client_figures():
    rows = [row(i, ttft=0.1 * (i + 1), e2e=1.0, prompt=10, cached=5, output=2) for i in range(4)]
    for i, r in enumerate(rows):
        r.scheduled_s = float(i)
        r.start_s = i + 0.01 * (i + 1)  # late by 10, 20, 30, 40 ms
        r.client_overhead_s = 0.001 * (i + 1)
    rows[1].attempts = 3
    rows[2].request_id = None
    result = L.LoadResult(rows, started_at=0.0, duration_s=4.0, stopped_by="duration",
                          skipped=[("x:1", "bad line")], client_cpu_s=1.0)
    summary = L.summarize(result)
    assert summary["attempts"] == 6 and summary["request_ids_seen"] == 3 and summary["skipped_not_sent"] == 1
    assert summary["stopped_by"] == "duration" and summary["achieved_rate_rps"] == 1.0
    assert summary["client_cpu_utilization"] == 0.25  # 1 CPU second over 4 s
    assert summary["client_overhead_p50_s"] == 0.0025  # 1, 2, 3, 4 ms -> 2.5 ms
    assert summary["schedule_lag_p50_s"] == 0.025 and summary["schedule_lag_max_s"] == 0.04
    assert summary["error_rate"] == 0.0 and summary["errors_by_kind"] == {}
    assert summary["hit_rate"] == 0.5
    empty = L.summarize(L.LoadResult([], started_at=0.0, duration_s=0.0, stopped_by="end of input"))
    assert empty["error_rate"] is None and empty["achieved_rate_rps"] is None and empty["hit_rate"] is None
    assert empty["ttft_p50_s"] is None and empty["ttft_mean_s"] is None and empty["output_tokens_per_s"] is None


def test_summary_rounds_rates_to_their_digits_and_guards_its_divisions():
    rows = [
        row(0, ttft=0.5, e2e=1.5, prompt=100, cached=50, output=2),  # decode: (2 − 1) / 1.0 = 1.0 token/s
        row(1, ttft=0.5, e2e=0.5, prompt=100, cached=0, output=10),  # e2e == ttft: no decode speed
        row(2, ttft=0.2, e2e=0.9, prompt=100, cached=0, output=None),  # no output count: 0 tokens
        row(3, ok=False, kind="throttled"),
    ]
    summary = L.summarize(L.LoadResult(rows, started_at=0.0, duration_s=3.14159, stopped_by="end of input",
                                       client_cpu_s=1.0))
    # By hand: 1 failure of 4 = 0.25; 4 / 3.14159 s = 1.273; 12 tokens / 3.14159 s = 3.82; 1 / 3.14159 = 0.318.
    assert summary["error_rate"] == 0.25 and summary["duration_s"] == 3.142
    assert summary["achieved_rate_rps"] == 1.273 and summary["output_tokens"] == 12
    assert summary["output_tokens_per_s"] == 3.82 and summary["client_cpu_utilization"] == 0.318
    assert summary["decode_tokens_per_s_p50"] == 1.0
    assert summary["hit_rate"] == round(50 / 300, 4) == 0.1667
    third = L.summarize(L.LoadResult(rows[:3] + [rows[3], row(4, ok=False, kind="x")] + [rows[3]] * 1,
                                     started_at=0.0, duration_s=0.5, stopped_by="end of input"))
    # 3 of 6 failed; a run shorter than a second still has rates: 6 / 0.5 s = 12.0.
    assert third["error_rate"] == 0.5 and third["achieved_rate_rps"] == 12.0
    assert third["output_tokens_per_s"] == 24.0
    one_of_three = L.summarize(L.LoadResult(rows[:2] + [rows[3]], started_at=0.0, duration_s=1.0,
                                            stopped_by="end of input"))
    assert one_of_three["error_rate"] == 0.3333  # four digits


def test_summary_times_are_rounded_to_the_microsecond():
    rows = [row(0, ttft=1 / 3, e2e=2 / 3, output=1), row(1, ttft=1 / 3, e2e=2 / 3, output=1)]
    for r in rows:
        r.client_overhead_s = 1 / 7
    summary = L.summarize(L.LoadResult(rows, started_at=0.0, duration_s=1.0, stopped_by="end of input"))
    # six digits: 1/3 s = 0.333333 s, 2/3 s = 0.666667 s, 1/7 s = 0.142857 s
    assert (summary["ttft_p50_s"], summary["ttft_mean_s"], summary["ttft_max_s"]) == (0.333333, 0.333333, 0.333333)
    assert (summary["e2e_p99_s"], summary["e2e_mean_s"]) == (0.666667, 0.666667)
    assert summary["client_overhead_p50_s"] == 0.142857


def test_a_request_with_zero_prompt_tokens_adds_none_and_client_cpu_needs_a_duration():
    rows = [row(0, ttft=0.1, e2e=0.2, prompt=0, cached=0, output=1),
            row(1, ttft=0.1, e2e=0.2, prompt=10, cached=2, output=1)]
    summary = L.summarize(L.LoadResult(rows, started_at=0.0, duration_s=0.5, stopped_by="end of input",
                                       client_cpu_s=0.25))
    assert (summary["prompt_tokens"], summary["cached_tokens"], summary["hit_rate"]) == (10, 2, 0.2)
    assert summary["requests_with_usage"] == 2
    assert summary["client_cpu_utilization"] == 0.5  # 0.25 CPU s over 0.5 s
    instant = L.summarize(L.LoadResult(rows, started_at=0.0, duration_s=0.0, stopped_by="interrupted",
                                       client_cpu_s=0.25))
    assert instant["client_cpu_utilization"] is None and instant["achieved_rate_rps"] is None
