"""The whole path on real engines: boto3 / the front door → the emulator's router → llama.cpp.

Two ``llama-server`` engines (the pinned build, the tiny random-weight model) on 127.0.0.1, started
once for this module and stopped by their process ids. ``make test`` builds the engine first
(``make engines``, cached per pin); without a build the tests skip, and CI (which sets
``PREFIX_ROUTING_REQUIRE_ENGINES=1``) fails instead. About 100 requests in all (calibration included).
"""

from __future__ import annotations

import json
import os
import time

import boto3
import pytest
from botocore.config import Config

from prefix_routing import frontdoor
from prefix_routing.cli.demo_engines import EngineDemoSpec, fidelity_rows
from prefix_routing.cli.main import main
from prefix_routing.emulator.engine_backend import start_engine_emulator
from prefix_routing.engines import session
from prefix_routing.rules.settings import NormalizerSettings
from prefix_routing.stage.config import load_stage
from prefix_routing.stage.preset_file import load_preset_file
from tests.prefix_routing.frontdoor.conftest import Lines, url_event

REQUIRE = os.environ.get("PREFIX_ROUTING_REQUIRE_ENGINES") == "1"
SYSTEM = " ".join(f"Rule {i}: answer in the voice of a patient librarian." for i in range(120))  # ~1,500 tokens


@pytest.fixture(scope="module")
def engines():
    if not session.built():
        message = "llama-server is not built (make engines)"
        if REQUIRE:
            pytest.fail(message + " and PREFIX_ROUTING_REQUIRE_ENGINES=1", pytrace=False)
        pytest.skip(message)
    with session.local_engines(2, slots=1, cache_ram_mib=40, say=lambda text: None) as started:
        yield started


@pytest.fixture
def emulator(engines):
    config = load_stage()  # PREFIX_AWARE, PrefixLength 4096
    server = start_engine_emulator(config, [e.url for e in engines])
    yield config, server
    server.stop()


def runtime_client(server):
    """boto3's own sagemaker-runtime client on the emulator: one attempt, time for a cold prefill."""
    return boto3.client("sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1",
                        aws_access_key_id="t", aws_secret_access_key="t",
                        config=Config(retries={"total_max_attempts": 1}, read_timeout=60))


def chat(user: str, system: str = SYSTEM) -> bytes:
    return json.dumps({"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                       "max_tokens": 4, "stream": True}).encode()


def test_boto3_streams_from_real_engines_and_a_repeated_prefix_is_cached_and_faster(emulator):
    config, server = emulator
    client = runtime_client(server)
    runs = []
    for question in ("What is the first rule?", "What is the last rule?"):
        started = time.perf_counter()
        response = client.invoke_endpoint_with_response_stream(
            EndpointName=config.endpoint_name, InferenceComponentName=config.component_name, Body=chat(question))
        ttft, usage = None, None
        for event in response["Body"]:
            for line in event["PayloadPart"]["Bytes"].split(b"\n"):
                if line.startswith(b"data: {"):
                    data = json.loads(line[6:])
                    if ttft is None and any(c.get("delta", {}).get("content") for c in data.get("choices", [])):
                        ttft = time.perf_counter() - started
                    usage = data.get("usage") or usage
        runs.append((ttft, usage))
    (cold_ttft, cold), (warm_ttft, warm) = runs
    assert cold["prompt_tokens"] > 1000 and cold["prompt_tokens_details"]["cached_tokens"] < 50
    # The engine itself says the system prompt was reused: all of it, give or take the template.
    assert warm["prompt_tokens_details"]["cached_tokens"] > 0.9 * cold["prompt_tokens"]
    assert warm_ttft < cold_ttft
    status = server.backend.status()
    assert sum(e["cached_tokens"] for e in status["engines"]) == warm["prompt_tokens_details"]["cached_tokens"]
    assert sorted(e["requests"] for e in status["engines"]) == [0, 2]  # one prefix, one engine


def test_the_front_door_gets_the_engines_usage_through_the_emulator(emulator):
    config, server = emulator
    client = runtime_client(server)
    invoker = frontdoor.Invoker(
        client,
        frontdoor.InvokeConfig(endpoint_name=config.endpoint_name, component_name=config.component_name,
                               tenancy="iam", settings=NormalizerSettings(prefix_length=4096)),
        b"0123456789abcdef-real-engines-key", emit=Lines(), sleep=lambda seconds: None, jitter=lambda: 0.0,
    )
    system = SYSTEM.replace("librarian", "lighthouse keeper")  # a prefix no other test has sent
    answers = [invoker.buffered(frontdoor.request_from_event(url_event(chat(q, system)))) for q in ("one?", "two?")]
    client.close()
    assert [a.status for a in answers] == [200, 200]
    first, second = (a.body["usage"] for a in answers)
    assert second["prompt_tokens_details"]["cached_tokens"] > 0.9 * second["prompt_tokens"]
    assert first["prompt_tokens_details"]["cached_tokens"] < 50


def test_the_lab_predicts_the_engines_hit_rates_and_their_order(engines, tmp_path):
    """Fidelity (the test half of bench/bench_fidelity.py): calibrate an engine, then run one
    workload on fresh engines and through ``simulate`` with the calibrated preset and llama.cpp's
    slot cache. Hit rates within ±5 points and the same order; timing bands only in the benchmark."""
    spec = EngineDemoSpec(engines=2, prefixes=8, requests=40, concurrency=2)
    with session.local_engines(1, slots=1, cache_ram_mib=spec.cache_ram_mib, say=lambda text: None) as (engine,):
        assert main(["calibrate", "--engine-url", engine.url, "--out", str(tmp_path / "engine.json"), "--quick"]) == 0
    preset = load_preset_file(tmp_path / "engine.json")
    random_row, prefix_row = fidelity_rows(spec, preset, ("RANDOM", "PREFIX_AWARE"))
    for row in (random_row, prefix_row):
        assert row["succeeded"] == row["requests"] == 40
        assert abs(row["hit_measured"] - row["hit_predicted"]) <= 0.05, row
    # The demo's comparison in small, measured and predicted alike: prefix-aware keeps the caches.
    assert prefix_row["hit_measured"] > random_row["hit_measured"] + 0.1
    assert prefix_row["hit_predicted"] > random_row["hit_predicted"] + 0.1


def _running_binary(pid: int, binary: str) -> bool:
    """The process ``pid`` exists and still runs ``binary`` (a zombie or a reused pid does not)."""
    try:
        return binary in open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\0")[:2]
    except OSError:
        return False


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_emulate_engines_stops_the_engines_it_started_on_a_signal(engines, signum):
    """``emulate --engines 2`` under a service manager: SIGTERM (or Ctrl-C) must not orphan its engines."""
    import re
    import signal
    import subprocess
    import sys

    from prefix_routing.engines import build

    binary = str(build.binary_path())
    process = subprocess.Popen([sys.executable, "-m", "prefix_routing", "emulate", "--engines", "2", "--port", "0"],
                               stderr=subprocess.PIPE, text=True)
    try:
        pids = []
        for line in process.stderr:
            if line.strip().startswith("model:"):
                pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", line)]
                break
        assert len(pids) == 2 and all(_running_binary(pid, binary) for pid in pids)
        process.send_signal(getattr(signal, signum))
        assert process.wait(30) == 0
        assert f"stopped ({signum})" in process.stderr.read()
        deadline = time.monotonic() + 10
        while any(_running_binary(pid, binary) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in pids if _running_binary(pid, binary)], "engines left running"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        for pid in pids:  # never leave one behind, even when the test fails (by the pids it printed)
            if _running_binary(pid, binary):
                os.kill(pid, signal.SIGKILL)


def test_a_killed_engine_loses_its_share_and_a_restarted_one_gets_it_back(engines):
    """Two real engines, one killed: every following request is served by the other (none of the issue's
    251 failures); a llama-server started again on the dead one's port is routed to again."""
    import signal
    import subprocess

    from prefix_routing.engines import build, llama_cpp

    config = load_stage()
    with session.local_engines(2, slots=1, cache_ram_mib=40, say=lambda text: None) as pair:
        server = start_engine_emulator(config, [e.url for e in pair])
        replacement = None
        try:
            client = runtime_client(server)
            systems = [SYSTEM.replace("librarian", f"keeper of room {i}") for i in range(6)]

            def ask(system: str, question: str) -> dict:
                body = chat(question, system).replace(b'"stream": true', b'"stream": false')
                response = client.invoke_endpoint(EndpointName=config.endpoint_name,
                                                  InferenceComponentName=config.component_name, Body=body)
                return json.loads(response["Body"].read())

            def engines_status() -> list[dict]:
                return server.backend.status()["engines"]

            for system in systems:
                ask(system, "first?")
            assert all(e["requests"] > 0 for e in engines_status())  # both engines are homes
            os.kill(pair[0].pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while engines_status()[0]["healthy"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not engines_status()[0]["healthy"]
            served_before = engines_status()[1]["requests"]
            answers = [ask(system, "second?") for system in systems]  # none fails
            assert all(a["usage"]["completion_tokens"] > 0 for a in answers)
            assert engines_status()[1]["requests"] == served_before + len(systems)
            # SageMaker replaces the unhealthy copy: a new engine on the same port is taken back.
            command = llama_cpp.server_command(build.binary_path(), build.ensure_model(say=lambda text: None),
                                               pair[0].port, cache_ram_mib=40)
            replacement = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True)
            deadline = time.monotonic() + 60
            while not engines_status()[0]["healthy"] and time.monotonic() < deadline:
                time.sleep(0.1)
            assert engines_status()[0]["healthy"]
            before = engines_status()[0]["requests"]
            for system in systems:
                ask(system, "third?")
            assert engines_status()[0]["requests"] > before
            client.close()
        finally:
            server.stop()
            if replacement is not None:  # by the pid this test started
                replacement.terminate()
                try:
                    replacement.wait(10)
                except subprocess.TimeoutExpired:
                    replacement.kill()
                    replacement.wait(10)
