"""The emulator with boto3's own sagemaker-runtime client, unmodified, pointed at it."""

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from prefix_routing.emulator.fleet_backend import FleetBackend, fleet_config_for_stage, preset_for_stage, start_emulator
from prefix_routing.emulator.server import serve_runtime
from prefix_routing.rules.errors import UserError
from prefix_routing.stage.config import DEFAULT_STAGE_DATA, load_stage, parse_stage

ROOT = Path(__file__).resolve().parents[3]
SYSTEM = "You are a careful assistant for the billing team. Answer briefly and cite the policy. " * 200  # ~17 KB: past the 8,192-byte key


def _client(server):
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"total_max_attempts": 1}),
    )


def _body(question, system=SYSTEM, stream=True, max_tokens=4):
    return json.dumps(
        {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
         "max_tokens": max_tokens, "stream": stream}
    ).encode()


def _stream(client, config, body, **extra):
    response = client.invoke_endpoint_with_response_stream(
        EndpointName=config.endpoint_name, InferenceComponentName=config.component_name, Body=body,
        ContentType="application/json", **extra,
    )
    payload = b"".join(event["PayloadPart"]["Bytes"] for event in response["Body"])
    events = [json.loads(line[6:]) for line in payload.decode().split("\n\n") if line.startswith("data: {")]
    return response, events


@pytest.fixture
def emulator():
    config = load_stage("llama8b-g6e")
    server = start_emulator(config, speed=50.0)
    yield config, server
    server.stop()


def test_streaming_call_with_every_header_gets_tokens_and_usage(emulator):
    config, server = emulator
    client = _client(server)
    response, events = _stream(
        client, config, _body("How do refunds work?"),
        PrefixAwareId="tenant-a", CustomAttributes="trace=1", Accept="text/event-stream",
        InferenceId="inference-1", TargetVariant="AllTraffic", TargetContainerHostname="primary", SessionId="s1",
    )
    assert response["InvokedProductionVariant"] == "AllTraffic"
    assert response["CustomAttributes"] == "trace=1"
    text = "".join(e["choices"][0]["delta"]["content"] for e in events if e["choices"])
    assert text.split() and events[-1]["usage"]["completion_tokens"] == 4
    assert events[-1]["usage"]["prompt_tokens"] > 1000
    server.wait_until_idle(5)
    (record,) = server.requests
    headers = record.headers
    assert (headers.inference_component, headers.prefix_aware_id, headers.custom_attributes) == (
        config.component_name, "tenant-a", "trace=1")
    assert (headers.accept, headers.inference_id, headers.target_variant, headers.target_container_hostname,
            headers.session_id, headers.content_type) == (
        "text/event-stream", "inference-1", "AllTraffic", "primary", "s1", "application/json")
    assert record.outcome == "ok"


def test_non_streaming_call(emulator):
    config, server = emulator
    response = _client(server).invoke_endpoint(
        EndpointName=config.endpoint_name, InferenceComponentName=config.component_name,
        Body=_body("Hello there", stream=False), ContentType="application/json", PrefixAwareId="t",
    )
    answer = json.loads(response["Body"].read())
    assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] == 4


def test_shared_prefix_goes_to_one_copy_and_hits_its_cache(emulator):
    config, server = emulator
    client = _client(server)
    usages = [_stream(client, config, _body(f"question {i}?"), PrefixAwareId="tenant-a")[1][-1]["usage"]
              for i in range(5)]
    assert usages[0]["prompt_tokens_details"]["cached_tokens"] == 0
    assert all(u["prompt_tokens_details"]["cached_tokens"] > 0.8 * u["prompt_tokens"] for u in usages[1:])
    served = list(server.backend.served.values())
    assert len({(s.instance, s.copy) for s in served}) == 1


def test_tenants_route_apart_and_do_not_share_a_key(emulator):
    config, server = emulator
    client = _client(server)
    for tenant in range(12):
        _stream(client, config, _body("same question"), PrefixAwareId=f"tenant-{tenant}")
    copies = {(s.instance, s.copy) for s in server.backend.served.values()}
    assert len(copies) > 1  # 12 tenants on 16 copies: a single copy would mean the id is ignored


def test_random_routing_scatters_the_same_prefix():
    data = json.loads(json.dumps(DEFAULT_STAGE_DATA))
    data["endpoint"].update(instance_type="ml.g6e.12xlarge", instances_max=4, copies_max=16)
    data["routing"] = {"strategy": "RANDOM"}
    config = parse_stage(data, source="test")
    server = start_emulator(config, speed=50.0, seed=3)
    try:
        client = _client(server)
        for i in range(12):
            _stream(client, config, _body(f"q{i}"))
        assert len({(s.instance, s.copy) for s in server.backend.served.values()}) > 3
    finally:
        server.stop()


def test_unknown_component_and_endpoint_are_validation_errors(emulator):
    config, server = emulator
    client = _client(server)
    with pytest.raises(client.exceptions.ValidationError, match="Inference Component other does not exist"):
        client.invoke_endpoint_with_response_stream(
            EndpointName=config.endpoint_name, InferenceComponentName="other", Body=_body("x"))
    with pytest.raises(client.exceptions.ValidationError):
        client.invoke_endpoint(EndpointName="not-this-one", Body=_body("x", stream=False))


def test_slow_instance_has_slower_first_tokens():
    config = load_stage("llama70b-p5")
    server = start_emulator(config, speed=40.0, slow_instance=(0, 5.0), seed=1)
    try:
        client = _client(server)
        for i in range(80):  # distinct prefixes until instance 0 got two (keys hash to copies)
            _stream(client, config, _body(f"q{i}", system=f"system prompt {i} " * 400), PrefixAwareId="t")
            served = list(server.backend.served.values())
            if sum(s.instance == 0 for s in served) >= 2:
                break
        slow = [s.ttft_s for s in served if s.instance == 0]
        fast = [s.ttft_s for s in served if s.instance != 0]
        assert slow and fast and min(slow) > 2 * max(fast)
    finally:
        server.stop()


def test_status_endpoint_shows_per_instance_load_and_hit_rate(emulator):
    config, server = emulator
    client = _client(server)
    for i in range(3):
        _stream(client, config, _body(f"q{i}"), PrefixAwareId="t")
    status = json.loads(urllib.request.urlopen(f"{server.url}/status", timeout=5).read())
    backend = status["backend"] if "backend" in status else status
    assert backend["strategy"] == "PREFIX_AWARE" and backend["requests"] == 3
    assert len(backend["instances"]) == config.endpoint.instances_max
    assert sum(i["requests"] for i in backend["instances"]) == 3
    assert backend["hit_rate"] > 0.5


def test_stage_settings_drive_the_fleet():
    config = load_stage("llama70b-p5")
    fleet = fleet_config_for_stage(config)
    assert (fleet.instances, fleet.copies, fleet.prefix_length, fleet.concurrency_threshold) == (7, 1, 4096, 10)
    assert preset_for_stage(config).name == "p5.48xlarge-llama3.1-70b"
    odd = parse_stage({**json.loads(json.dumps(DEFAULT_STAGE_DATA)), "endpoint": {"instance_type": "ml.g5.12xlarge"}},
                      source="t")
    with pytest.raises(UserError, match="no lab preset for ml.g5.12xlarge"):
        preset_for_stage(odd)


def test_cli_bad_stage_is_one_line_exit_2():
    result = subprocess.run([sys.executable, "-m", "prefix_routing", "emulate", "--stage", "nope", "--duration", "0.1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "stage 'nope': no file" in result.stderr


def test_cli_serves_then_stops_by_itself():
    result = subprocess.run(
        [sys.executable, "-m", "prefix_routing", "emulate", "--port", "0", "--duration", "0.5", "--speed", "10"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "emulating default-prefix-llm / default-prefix-llm-ic (PREFIX_AWARE) at http://127.0.0.1:" in result.stderr


def _one_copy_stage():
    data = json.loads(json.dumps(DEFAULT_STAGE_DATA))
    data["endpoint"].update(instances_min=1, instances_max=1, copies_min=1, copies_max=1)
    return parse_stage(data, source="test")


def test_json_layout_changes_routing_bytes_but_not_cached_tokens():
    config = _one_copy_stage()
    server = start_emulator(config, speed=50.0)
    try:
        client = _client(server)
        compact = _body("What is the refund window?")
        relaid = json.dumps({"stream": True, "max_tokens": 4, "messages": json.loads(compact)["messages"]},
                            indent=2).encode()
        _stream(client, config, compact)
        usage = _stream(client, config, relaid)[1][-1]["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0.9 * usage["prompt_tokens"]
        crlf = compact.replace(b". ", b".\\r\\n")  # the text itself changes: tokens change
        usage = _stream(client, config, crlf)[1][-1]["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] < 0.1 * usage["prompt_tokens"]
    finally:
        server.stop()


def test_cache_salt_isolates_tenants_on_the_same_copy():
    config = _one_copy_stage()
    server = start_emulator(config, speed=50.0)
    try:
        client = _client(server)

        def salted(salt):
            body = json.loads(_body("Same question"))
            return json.dumps({"cache_salt": salt, **body}).encode()

        cached = [_stream(client, config, salted(s))[1][-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
                  for s in ("tenant-1", "tenant-2", "tenant-1")]
        assert cached[0] == 0 and cached[1] == 0 and cached[2] > 1000
    finally:
        server.stop()


def test_with_autoscaling_the_emulated_copies_scale_from_zero_on_the_first_refused_request():
    from prefix_routing.emulator.fleet_backend import autoscaling_for_stage, fleet_config_for_stage

    data = json.loads(json.dumps(DEFAULT_STAGE_DATA))
    data["endpoint"].update(copies_min=0, copies_max=2)
    config = parse_stage(data, source="test")
    settings = autoscaling_for_stage(config)
    assert (settings.min_copies, settings.max_copies, settings.target_per_copy) == (0, 2, 4.0)
    assert fleet_config_for_stage(config, autoscaling=True).autoscaling == settings
    clock = {"t": 0.0}
    backend = FleetBackend(fleet_config_for_stage(config, autoscaling=True), speed=1.0, clock=lambda: clock["t"])
    # Starts with one copy; 15 quiet minutes later the copies are at zero.
    for minute in range(1, 17):
        clock["t"] = minute * 60.0
        backend.fleet.advance(clock["t"])
    assert backend.status()["copies"]["provisioned"] == 0
    with serve_runtime(backend) as server:
        client = _client(server)
        body = json.dumps({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}).encode()
        with pytest.raises(client.exceptions.ValidationError, match="no capacity"):
            client.invoke_endpoint(EndpointName="ep", Body=body)
        client.close()
    clock["t"] = 17 * 60.0
    backend.fleet.advance(clock["t"])  # the next evaluation adds a copy, serving after start-up
    copies = backend.status()["copies"]
    assert copies["provisioned"] == 1 and copies["no_capacity_failures"] == 1
    assert copies["events"][-1]["to"] == 1


def test_model_list_names_the_stages_model_and_its_context(emulator):
    config, server = emulator
    request = urllib.request.Request(f"{server.url}/endpoints/{config.endpoint_name}/openai/v1/models",
                                     headers={"Authorization": "Bearer local"})
    listing = json.loads(urllib.request.urlopen(request, timeout=5).read())
    (model,) = listing["data"]
    assert model["id"] == config.model.model_id == "meta-llama/Llama-3.1-8B-Instruct"
    assert model["max_model_len"] == server.backend.context_tokens
