"""AIPerf's summary export: its figures (by hand from the file below), its units, and finding it under the
job's results in S3, as a file or inside a .tar.gz, with one clear line when it is not there."""

from __future__ import annotations

import pytest

from prefix_routing.benchmark.results import EXPORT_NAME, Figures, parse_export, read_export
from prefix_routing.rules.errors import UserError
from tests.prefix_routing.benchmark.conftest import BUCKET, NOW, RESULTS, body, export, tar_gz

# conftest.export(): TTFT p50 120.5 ms, p90 310.25 ms; 1.96 requests/s; 392.4 output tokens/s; 1,169 requests.
EXPECTED = Figures(ttft_p50_ms=120.5, ttft_p90_ms=310.25, request_throughput_rps=1.96, output_throughput_tok_s=392.4,
                   hit_rate=None, requests=1169)


def test_the_figures_of_aiperfs_export():
    assert EXPORT_NAME == "profile_export_aiperf.json"
    assert parse_export(export(), "x") == EXPECTED


@pytest.mark.parametrize(("unit", "p50", "p90"), [("sec", 0.1205, 0.31025), ("us", 120500.0, 310250.0),
                                                  ("ns", 120_500_000, 310_250_000)])
def test_ttft_in_other_time_units_is_converted_to_ms(unit, p50, p90):
    figures = parse_export(export(time_to_first_token={"unit": unit, "p50": p50, "p90": p90}), "x")
    assert (figures.ttft_p50_ms, figures.ttft_p90_ms) == pytest.approx((120.5, 310.25))


@pytest.mark.parametrize(("data", "expected"), [
    (b"{not json", "s3://b/k: not JSON ("),
    (b"[1, 2]", "s3://b/k: not a JSON object"),
    (export(time_to_first_token=None), "s3://b/k: no 'time_to_first_token' in AIPerf's export (keys: input_config, "
                                       "output_token_throughput, request_count, request_throughput, "
                                       "time_to_first_token, was_cancelled)"),
    (export(time_to_first_token={"unit": "ms", "p50": 1.0}), "s3://b/k: time_to_first_token.p90 is None, not a number"),
    (export(time_to_first_token={"unit": "ms", "p50": True, "p90": 1}),
     "s3://b/k: time_to_first_token.p50 is True, not a number"),
    (export(time_to_first_token={"unit": "minutes", "p50": 1, "p90": 1}),
     "s3://b/k: time_to_first_token in unit 'minutes'; expected one of ns, us, ms, sec"),
    (export(request_throughput={"unit": "requests/min", "avg": 60}),
     "s3://b/k: request_throughput in unit 'requests/min'; expected 'requests/sec'"),
])
def test_an_export_that_cannot_be_read_is_one_line_saying_why(data, expected):
    with pytest.raises(UserError) as raised:
        parse_export(data, "s3://b/k")
    assert str(raised.value).startswith(expected)


def _listing(stubbers, keys, *, token=None, next_token=None):
    params = {"Bucket": BUCKET, "Prefix": RESULTS, **({"ContinuationToken": token} if token else {})}
    answer = {"Contents": [{"Key": RESULTS + k, "Size": 100, "LastModified": NOW} for k in keys],
              "IsTruncated": next_token is not None, **({"NextContinuationToken": next_token} if next_token else {})}
    stubbers["s3"].add_response("list_objects_v2", answer, params)


def test_the_export_is_found_in_the_jobs_own_folder(stubbed):
    clients, stubbers = stubbed
    _listing(stubbers, ["bmk-prod-job-1a2b/logs/aiperf.log", f"bmk-prod-job-1a2b/artifacts/{EXPORT_NAME}"])
    key = f"{RESULTS}bmk-prod-job-1a2b/artifacts/{EXPORT_NAME}"
    stubbers["s3"].add_response("get_object", {"Body": body(export())}, {"Bucket": BUCKET, "Key": key})
    assert read_export(clients.s3, BUCKET, RESULTS) == (f"s3://{BUCKET}/{key}", EXPECTED)


def test_the_export_is_found_inside_the_jobs_tar_gz(stubbed):
    clients, stubbers = stubbed
    _listing(stubbers, ["bmk-prod-job-1a2b/output.tar.gz"])
    archive = tar_gz({"output/profile_export.jsonl": b'{"metrics": {}}\n', f"output/{EXPORT_NAME}": export()})
    key = f"{RESULTS}bmk-prod-job-1a2b/output.tar.gz"
    stubbers["s3"].add_response("get_object", {"Body": body(archive)}, {"Bucket": BUCKET, "Key": key})
    assert read_export(clients.s3, BUCKET, RESULTS) == (f"s3://{BUCKET}/{key}:{EXPORT_NAME}", EXPECTED)


def test_the_listing_is_followed_to_its_last_page(stubbed):
    clients, stubbers = stubbed
    _listing(stubbers, ["a/logs.txt"], next_token="page-2")
    _listing(stubbers, [f"a/{EXPORT_NAME}"], token="page-2")
    stubbers["s3"].add_response("get_object", {"Body": body(export())}, {"Bucket": BUCKET, "Key": f"{RESULTS}a/{EXPORT_NAME}"})
    assert read_export(clients.s3, BUCKET, RESULTS)[1] == EXPECTED


def test_results_missing_names_what_is_there(stubbed):
    clients, stubbers = stubbed
    _listing(stubbers, ["bmk/logs.txt", "bmk/config.yaml"])
    with pytest.raises(UserError) as raised:
        read_export(clients.s3, BUCKET, RESULTS)
    assert str(raised.value) == (
        f"no {EXPORT_NAME} under s3://{BUCKET}/{RESULTS} (found bmk/logs.txt, bmk/config.yaml): the job wrote no "
        "AIPerf summary; read the job's log (its CloudWatch log stream) for why")


def test_no_results_at_all(stubbed):
    clients, stubbers = stubbed
    _listing(stubbers, [])
    with pytest.raises(UserError, match=r"\(found nothing\)"):
        read_export(clients.s3, BUCKET, RESULTS)


def test_an_archive_without_the_export_is_results_missing(stubbed):
    clients, stubbers = stubbed
    _listing(stubbers, ["out/output.tar.gz"])
    stubbers["s3"].add_response("get_object", {"Body": body(tar_gz({"output/other.json": b"{}"}))},
                                {"Bucket": BUCKET, "Key": f"{RESULTS}out/output.tar.gz"})
    with pytest.raises(UserError, match=rf"^no {EXPORT_NAME} under .* \(found out/output.tar.gz\)"):
        read_export(clients.s3, BUCKET, RESULTS)


def test_a_broken_archive_is_one_line(stubbed):
    clients, stubbers = stubbed
    _listing(stubbers, ["out/output.tar.gz"])
    stubbers["s3"].add_response("get_object", {"Body": body(b"not gzip at all")},
                                {"Bucket": BUCKET, "Key": f"{RESULTS}out/output.tar.gz"})
    with pytest.raises(UserError, match=rf"^s3://{BUCKET}/{RESULTS}out/output.tar.gz: not a readable .tar.gz"):
        read_export(clients.s3, BUCKET, RESULTS)


def test_a_results_prefix_we_may_not_list_is_one_line(stubbed):
    clients, stubbers = stubbed
    stubbers["s3"].add_client_error("list_objects_v2", "AccessDenied", "Access Denied", 403,
                                    expected_params={"Bucket": BUCKET, "Prefix": RESULTS})
    with pytest.raises(UserError) as raised:
        read_export(clients.s3, BUCKET, RESULTS)
    assert str(raised.value) == f"cannot list the job's results under s3://{BUCKET}/{RESULTS}: AccessDenied: Access Denied"


def test_an_export_too_large_to_be_a_summary_is_not_read(stubbed):
    clients, stubbers = stubbed
    stubbers["s3"].add_response("list_objects_v2", {"Contents": [
        {"Key": f"{RESULTS}{EXPORT_NAME}", "Size": 17 * 1024 * 1024}], "IsTruncated": False},
        {"Bucket": BUCKET, "Prefix": RESULTS})
    with pytest.raises(UserError, match=r"is 17,825,792 bytes; an AIPerf summary is kilobytes"):
        read_export(clients.s3, BUCKET, RESULTS)
