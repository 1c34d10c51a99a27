"""``emulate``'s choices: the fleet model (with a measured preset) or real engines, and what does not mix."""

from __future__ import annotations

import pytest

from prefix_routing.emulator.fleet_backend import start_emulator
from prefix_routing.stage.config import load_stage
from prefix_routing.stage.preset_file import PresetFile, load_preset_file, write_preset_file
from prefix_routing.stage.presets import LatencyCoefficients
from tests.prefix_routing.cli.test_lab_commands import run


@pytest.fixture
def preset_file(tmp_path):
    return write_preset_file(tmp_path / "engine.json", PresetFile(
        name="local-test", coefficients=LatencyCoefficients(0.0074, 0.000134, 1.8e-7, 0.00226, 8.9e-7), slots=1,
        context_per_slot=8192, kv_bytes_per_token=4096, model_name="tiny.gguf"))


def test_the_fleet_model_runs_on_a_measured_preset(preset_file):
    server = start_emulator(load_stage(), preset=load_preset_file(preset_file))
    try:
        status = server.status()["backend"]
    finally:
        server.stop()
    assert status["preset"] == "local-test"
    assert len(status["instances"]) == load_stage().endpoint.instances_max  # one copy per instance


def test_emulate_serves_with_a_preset_file_and_stops(capsys, preset_file):
    code, _, err = run(capsys, "emulate", "--port", "0", "--preset-file", preset_file, "--duration", "0.2")
    assert code == 0 and "model: the lab's fleet model" in err


def test_emulate_serves_in_front_of_named_engines(capsys):
    # Nothing listens on port 9: serving starts anyway (a request would get ModelError 502).
    code, _, err = run(capsys, "emulate", "--port", "0", "--engine-url", "http://127.0.0.1:9", "--duration", "0.2")
    assert code == 0 and "model: 1 engine(s)" in err


@pytest.mark.parametrize("argv, message", [
    (["--preset", "p5.48xlarge-llama3.1-70b", "--preset-file", "x.json"], "give one of them"),
    (["--engine-url", "http://127.0.0.1:9", "--speed", "5"], "--speed: options of the fleet model"),
    (["--engines", "2", "--cache-tokens", "1000"], "--cache-tokens: options of the fleet model"),
    (["--engines", "2", "--engine-url", "http://127.0.0.1:9"], "give one of them"),
    (["--engines", "0"], "--engines 0: allowed 1 to 16"),
    (["--engine-url", "ftp://somewhere"], "expected http://HOST:PORT"),
    (["--front-door", "70000"], "--front-door 70000: allowed 0 to 65535"),
    (["--duration", "-1"], "--duration -1: allowed above 0, at most 2592000 seconds"),
    (["--engines", "1", "--engine-slots", "0"], "--engine-slots 0: allowed 1 to 64"),
    (["--engines", "1", "--engine-context", "10"], "--engine-context 10: allowed 256 to 1048576"),
    (["--engines", "1", "--engine-cache-ram", "-1"], "--engine-cache-ram -1: allowed 0 to 1048576"),
    (["--engines", "1", "--engine-cache-tokens", "10"], "--engine-cache-tokens 10: allowed 256 to 16777216"),
    (["--engines", "1", "--engine-block-size", "8"], "--engine-block-size 8: allowed 16 to 1024"),
    (["--engine-kind", "vllm"], "--engine-kind: options of the engines --engines N starts"),
    (["--engine-url", "http://127.0.0.1:9", "--engine-block-size", "32", "--engine-cache-tokens", "4096"],
     "--engine-cache-tokens, --engine-block-size: options of the engines --engines N starts (--engine-url names "
     "running ones)"),
])
def test_emulate_refuses_what_does_not_mix(capsys, argv, message):
    argv = ["--duration", "0.1", *argv] if "--duration" not in argv else argv
    code, _, err = run(capsys, "emulate", "--port", "0", *argv)
    assert code == 2 and message in err, err


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_emulate_stops_cleanly_on_sigterm_and_sigint(signum):
    """A service manager's SIGTERM (or Ctrl-C's SIGINT) stops the servers and exits 0, at once."""
    import re
    import signal
    import socket
    import subprocess
    import sys
    import time

    process = subprocess.Popen([sys.executable, "-m", "prefix_routing", "emulate", "--port", "0", "--front-door", "0",
                                "--speed", "100"], stderr=subprocess.PIPE, text=True)
    try:
        ports = []
        for line in process.stderr:
            ports += [int(p) for p in re.findall(r"at http://127\.0\.0\.1:(\d+)", line)]
            if line.startswith("front door"):
                break
        assert len(ports) == 2, ports
        started = time.monotonic()
        process.send_signal(getattr(signal, signum))
        assert process.wait(20) == 0
        assert time.monotonic() - started < 10
        assert f"stopped ({signum})" in process.stderr.read()
        for port in ports:  # both servers closed their ports
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_emulate_front_door_serves_the_openai_sdk_and_refuses_a_forged_direct_invocation():
    """The acceptance path as a user runs it: ``emulate --front-door``, then the openai SDK through a
    SigV4 auth (streaming, with usage), then a direct invocation naming that caller's tenant."""
    import json
    import re
    import subprocess
    import sys
    import urllib.request

    import httpx2
    from openai import OpenAI

    from prefix_routing.frontdoor.sigv4 import FunctionUrlAuth
    from tests.prefix_routing.frontdoor.test_local import _Session

    process = subprocess.Popen([sys.executable, "-m", "prefix_routing", "emulate", "--port", "0", "--front-door", "0",
                                "--speed", "1000", "--duration", "60"], stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in process.stderr:
            found = re.match(r"front door \(tenancy iam\) at (http://127\.0\.0\.1:\d+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "no front door URL printed"
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                        http_client=httpx2.Client(auth=FunctionUrlAuth(region="us-east-1", session=_Session("app-1")),
                                                  timeout=30))
        chunks = list(client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "three little words"}], max_tokens=4,
            stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
        event = {"body": {"messages": [{"role": "user", "content": "hi"}]},
                 "tenant": "arn:aws:iam::000000000000:user/app-1"}
        forged = urllib.request.Request(f"{url}/events", data=json.dumps(event).encode(), method="POST",
                                        headers={"x-amzn-request-context": "null"})
        result = json.loads(urllib.request.urlopen(forged, timeout=10).read())
        assert result["statusCode"] == 403 and result["body"]["error"]["code"] == "direct_invocation_refused"
    finally:
        process.kill()
        process.wait(10)


def test_emulate_front_door_starts_the_limits_store_when_the_stage_sets_limits_and_stops_it(tmp_path):
    import os
    import re
    import shutil
    import subprocess
    import sys

    from prefix_routing.stage.config import CONFIG_DIR

    for stage in CONFIG_DIR.glob("*.toml"):
        shutil.copy(stage, tmp_path)
    (tmp_path / "limited.toml").write_text((CONFIG_DIR / "llama8b-g6e.toml").read_text().replace(
        'name = "llama8b-g6e"', 'name = "limited"') + "\n[limits]\nconcurrent_streams = 2\n")
    done = subprocess.run([sys.executable, "-m", "prefix_routing", "emulate", "--stage", "limited", "--port", "0",
                           "--front-door", "0", "--duration", "1"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PREFIX_ROUTING_CONFIG_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    found = re.search(r"counts in dynalite at http://127\.0\.0\.1:\d+ \(pid (\d+)\)", done.stderr)
    assert found, done.stderr
    pid = int(found.group(1))
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive  # stopped by its pid when emulate ended


def test_the_local_front_door_waits_for_dynalite_unless_the_stage_says_how_long():
    import copy

    from prefix_routing.cli.emulate import store_timeout
    from prefix_routing.frontdoor.config import InvokeConfig
    from prefix_routing.frontdoor.local import LOCAL_STORE_TIMEOUT_MS, with_store_timeout
    from prefix_routing.stage.config import DEFAULT_STAGE_DATA, parse_stage
    from prefix_routing.stage.front_door_env import front_door_environment

    data = copy.deepcopy(DEFAULT_STAGE_DATA)
    data["limits"] = {"concurrent_streams": 3}
    unset = parse_stage(data, source="t")
    assert store_timeout(unset) == (LOCAL_STORE_TIMEOUT_MS, "dynalite on this machine; the stage sets none, and in "
                                    "Lambda the default is 50 ms") and LOCAL_STORE_TIMEOUT_MS == 1000
    data["limits"]["store_timeout_ms"] = 50
    assert store_timeout(parse_stage(data, source="t")) == (50, "the stage's limits.store_timeout_ms")
    # The local front door reads its limits from the environment the stage gives, with the timeout set.
    environment = with_store_timeout(front_door_environment(unset), LOCAL_STORE_TIMEOUT_MS)
    assert InvokeConfig.from_env({**environment, "LIMITS_TABLE": "t"}).limits.store_timeout_ms == 1000
    assert with_store_timeout(front_door_environment(unset), None) == front_door_environment(unset)
    assert "LIMITS" not in with_store_timeout({"ENDPOINT_NAME": "e"}, 1000)
