"""The request record, its log line and its EMF document (prefix_routing.frontdoor.record)."""

from __future__ import annotations

import json
from prefix_routing import frontdoor
from prefix_routing.frontdoor import record as record_module
from prefix_routing.rules import telemetry
from prefix_routing.rules.identity import routing_identity
from tests.prefix_routing.frontdoor.conftest import CHAT, KEY, ROLE_TENANT, FakeRuntime, config, url_event


def _record(**values) -> frontdoor.RequestRecord:
    record = frontdoor.RequestRecord(arrival_ms=1796032800000, request_id="r1", tenant=ROLE_TENANT,
                                  routing_id="pa-1", body_kind="chat", fingerprint="0123456789abcdef",
                                  block_hashes=("aa", "bb"), body_bytes=4100, normalize_ms=0.5, sent=True,
                                  attempts=1, ttft_ms=120.5, total_ms=900.25, prompt_tokens=1000, cached_tokens=750,
                                  output_tokens=20, status=200, desired_copies=3, current_copies=2)
    for name, value in values.items():
        setattr(record, name, value)
    return record


def test_emf_document_namespace_names_units_one_dimension_high_resolution():
    document = json.loads(json.dumps(frontdoor.emf_document(_record(), config())))
    directive = document["_aws"]["CloudWatchMetrics"]
    assert len(directive) == 1 and directive[0]["Namespace"] == telemetry.NAMESPACE
    assert directive[0]["Dimensions"] == [[telemetry.DIMENSION_COMPONENT]]
    assert document[telemetry.DIMENSION_COMPONENT] == "test-prefix-llm-ic"
    definitions = {m["Name"]: m for m in directive[0]["Metrics"]}
    assert set(definitions) == {spec.name for spec in telemetry.ALL_METRICS}
    for spec in telemetry.ALL_METRICS:
        assert definitions[spec.name] == {"Name": spec.name, "Unit": spec.unit, "StorageResolution": 1}
    assert document[telemetry.TTFT.name] == [120.5] and document[telemetry.CACHED_TOKENS.name] == [750]
    assert (document["Requests"], document["ClientErrors"], document["UpstreamErrors"]) == ([1], [0], [0])
    assert isinstance(document["_aws"]["Timestamp"], int)
    assert "service" not in document and not any(k.lower() == "service" for k in document)


def test_emf_document_omits_what_is_unknown_and_counts_errors():
    client = frontdoor.emf_document(_record(sent=False, ttft_ms=None, total_ms=None, prompt_tokens=None,
                                         cached_tokens=None, status=400, origin="client", desired_copies=None,
                                         current_copies=None), config())
    names = {m["Name"] for m in client["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert names == {"Requests", "ClientErrors", "UpstreamErrors", "RekeyedRequests", "RefusedDirectInvocations",
                     "NormalizationTime"}
    assert client["RefusedDirectInvocations"] == [0]  # a 400 of the body, not a refused direct invocation
    assert client["RekeyedRequests"] == [0]  # not sent: nothing was keyed
    assert (client["Requests"], client["ClientErrors"], client["UpstreamErrors"]) == ([0], [1], [0])
    upstream = frontdoor.emf_document(_record(status=502, origin="upstream", total_ms=None, prompt_tokens=None,
                                           cached_tokens=None), config())
    assert (upstream["Requests"], upstream["ClientErrors"], upstream["UpstreamErrors"]) == ([1], [0], [1])


def test_emf_document_is_what_powertools_metrics_flushes(monkeypatch, capsys):
    """Same document as Powertools' public ``Metrics`` API with high resolution, values and all."""
    from aws_lambda_powertools import Metrics
    from aws_lambda_powertools.metrics import MetricResolution

    monkeypatch.delenv("POWERTOOLS_SERVICE_NAME", raising=False)
    record = _record()
    ours = frontdoor.emf_document(record, config(), timestamp_ms=1796032800000)
    metrics = Metrics(namespace=telemetry.NAMESPACE)
    metrics.add_dimension(name=telemetry.DIMENSION_COMPONENT, value="test-prefix-llm-ic")
    for spec, value in record_module._metric_values(record):
        metrics.add_metric(name=spec.name, unit=spec.unit, value=value, resolution=MetricResolution.High)
    metrics.set_timestamp(1796032800000)
    metrics.flush_metrics()
    theirs = json.loads(capsys.readouterr().out)
    assert json.loads(json.dumps(ours)) == theirs


def test_log_record_has_every_log_field():
    line = frontdoor.log_record(_record(), config())
    fields = {value for name, value in vars(telemetry.LogField).items() if name.isupper()}
    assert fields <= set(line)
    assert line["message"] == telemetry.REQUEST_LOG_MESSAGE
    assert line["block_hashes"] == ["aa", "bb"] and line["block_bytes"] == 2048 and line["prefix_length"] == 4096
    assert line["inference_component"] == "test-prefix-llm-ic" and line["status"] == 200


def test_telemetry_lines_carry_no_prompt_text_and_no_key(lines):
    secret_word = "zanzibar-quokka"
    body = dict(CHAT, messages=[{"role": "system", "content": f"Never say {secret_word}."},
                                {"role": "user", "content": f"what about {secret_word}?"}])
    runtime = FakeRuntime()
    invoker = frontdoor.Invoker(runtime, config(), KEY, emit=lines)
    assert invoker.buffered(frontdoor.request_from_event(url_event(json.dumps(body)))).status == 200
    bad = dict(body, messages=[{"role": "user", "content": 5, "note": secret_word}])
    assert invoker.buffered(frontdoor.request_from_event(url_event(json.dumps(bad)))).status == 400
    output = "\n".join(lines.lines)
    assert secret_word not in output and KEY.decode() not in output
    assert routing_identity(ROLE_TENANT, None, KEY).cache_salt not in output
    assert len(lines.emf) == 2 and len(lines.requests) == 2


def test_a_rekeyed_request_counts_in_rekeyed_requests_and_says_so_in_its_log_line():
    rekeyed = _record(rekeyed=True)
    assert frontdoor.emf_document(rekeyed, config())["RekeyedRequests"] == [1]
    assert frontdoor.log_record(rekeyed, config())["rekeyed"] is True
    assert frontdoor.emf_document(_record(), config())["RekeyedRequests"] == [0]
    # Rejected before it was sent: nothing was keyed, whatever its bytes.
    assert frontdoor.emf_document(_record(rekeyed=True, sent=False, origin="client", status=400),
                                  config())["RekeyedRequests"] == [0]


def test_a_log_line_never_outgrows_a_cloudwatch_log_event():
    # 6 MiB in blocks of 64 bytes: 98,304 hashes would make a 1.8 MB line, which CloudWatch Logs drops.
    hashes = tuple(f"{i:016x}" for i in range(6 * 1024 * 1024 // 64))
    line = frontdoor.log_record(_record(block_hashes=hashes), config())
    assert line["block_hashes"] == list(hashes[:12_288]) and line["block_hashes_truncated"] is True
    assert len(json.dumps(line, separators=(",", ":"))) < 256 * 1024
    short = frontdoor.log_record(_record(block_hashes=hashes[:3]), config())
    assert short["block_hashes"] == list(hashes[:3]) and "block_hashes_truncated" not in short
