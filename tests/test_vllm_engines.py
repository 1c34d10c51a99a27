"""vLLM, the engine SageMaker's vLLM containers run, on this machine's CPU: the engines' command line,
the emulator and the front door on it, salt isolation and the engine's own metrics.

One engine, started by ``engines start --kind vllm`` for this module and stopped by ``engines stop``
(every process it started checked gone by its id), serves the tests but the last, which runs
``emulate --engine-kind vllm`` with two trust domains (two engines of its own) and stops it with
SIGTERM. ``make test`` installs vLLM first (``make engines``, cached per pin); without it the tests
skip, and CI (``PREFIX_ROUTING_REQUIRE_ENGINES=1``) fails instead. vLLM starts in 25-90 s here.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from prefix_routing.emulator.engine_backend import start_engine_emulator
from prefix_routing.emulator.engine_health import EngineHealth
from prefix_routing.engines import process, session
from prefix_routing.engines.vllm import Vllm
from prefix_routing.frontdoor.local import LOCAL_TENANT_KEY, LocalFrontDoor
from prefix_routing.loadtest import LambdaUrlTarget
from prefix_routing.rules.domains import SALT_ISOLATES
from prefix_routing.rules.identity import routing_identity
from prefix_routing.stage.config import load_stage
from prefix_routing.stage.front_door_env import front_door_environment

ROOT = Path(__file__).resolve().parents[1]
REQUIRE = os.environ.get("PREFIX_ROUTING_REQUIRE_ENGINES") == "1"
ARN = "arn:aws:iam::000000000000:user/{}"  # the local front door names a caller by its access key id
BLOCK = 32  # the engines' KV block (the smallest vLLM takes on CPUs)
START_TIMEOUT_S = 900


def librarian(topic: str, rules: int = 150) -> str:
    """About 13 tokens a rule with the tiny model's tokenizer: 150 rules and the template ≈ 2,000 tokens."""
    return f"The rules of {topic}. " + " ".join(f"Rule {i}: answer in the voice of a patient librarian."
                                                  for i in range(rules))


def chat(content: str, **extra) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 2, "stream": True,
                       **extra}).encode()


def cli(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prefix_routing", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def processes_of(record: dict) -> list[tuple[int, int]]:
    """(pid, start time) of an engine as ``engines start`` recorded it: itself and its workers."""
    return [(record["pid"], record["started"]), *[tuple(w) for w in record["workers"]]]


def kill_left(processes: list[tuple[int, int]]) -> list[int]:
    """Those still running, killed (by their ids) so that a failing test leaves nothing behind."""
    left = [pid for pid, started in processes if process.still_running(pid, started)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.fixture(scope="module")
def installed():
    if not session.built("vllm"):
        message = "vLLM is not installed (make engines)"
        if REQUIRE:
            pytest.fail(message + " and PREFIX_ROUTING_REQUIRE_ENGINES=1", pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="module")
def engine(installed, tmp_path_factory):
    state = tmp_path_factory.mktemp("vllm") / "engines.json"
    started = cli("engines", "start", "--kind", "vllm", "--count", "1", "--block-size", str(BLOCK), "--context",
                  "4096", "--slots", "4", "--state", str(state), "--json", timeout=START_TIMEOUT_S)
    assert started.returncode == 0, started.stderr
    (shown,) = json.loads(started.stdout)["engines"]
    (recorded,) = json.loads(state.read_text())["engines"]
    try:
        yield {**shown, "state": state, "recorded": recorded}
    finally:
        stopped = cli("engines", "stop", "--state", str(state), timeout=120)
        left = kill_left(processes_of(recorded))
        assert stopped.returncode == 0 and f"stopped 1 engine(s): {recorded['pid']}" in stopped.stdout, stopped
        assert not left, f"engines stop left {left} running"


# ----------------------------------------------------------------------------- the engines' command line


def test_engines_start_records_the_vllm_engine_with_its_workers_and_status_reads_its_counter(engine):
    recorded = engine["recorded"]
    assert recorded["kind"] == "vllm" and engine["url"] == f"http://127.0.0.1:{engine['port']}"
    titles = {Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] for pid, _ in recorded["workers"]}
    assert {b"VLLM::EngineCore", b"VLLM::Worker"} <= titles  # what stop must end too: they rename themselves
    status = cli("engines", "status", "--state", str(engine["state"]), "--json")
    (row,) = json.loads(status.stdout)["engines"]
    assert row["kind"] == "vllm" and row["pid"] == recorded["pid"] and row["slots"] is None
    assert isinstance(row["prompt_tokens_cached_total"], float)
    health = EngineHealth([engine["url"]])  # as the emulator checks every engine: GET /health
    assert health.check(0) and health.healthy() == [0]


def test_vllm_engines_refuse_the_llama_cpp_options_and_blocks_they_cannot_take(installed):
    from prefix_routing.engines.engine_kind import EngineOptions
    from prefix_routing.rules.errors import UserError

    with pytest.raises(UserError, match=r"cache_ram_mib \(--cache-ram, emulate's --engine-cache-ram\): not an option "
                                        "of vllm engines"):
        Vllm().launch(EngineOptions(cache_ram_mib=40), say=lambda text: None)
    with pytest.raises(UserError, match="block_size 48: vLLM on CPUs takes multiples of 32"):
        Vllm().launch(EngineOptions(block_size=48), say=lambda text: None)


# ----------------------------------------------------------------------------- salt isolation


def test_the_front_doors_salt_keeps_two_tenants_apart_on_one_vllm_engine(engine):
    """One vLLM engine, one domain: tenant B gets none of tenant A's prompt from the cache, A gets its
    own back, and the isolation is the salt the front door sets (not routing, not a client's salt)."""
    assert SALT_ISOLATES["vllm"] is True  # what this test backs (rules/domains.py)
    config = load_stage()  # the embedded default: vLLM, one component, tenancy iam
    assert config.model.framework == "vllm" and len(config.components()) == 1
    server = start_engine_emulator(config, [engine["url"]])
    door = LocalFrontDoor(server.url, front_door_environment(config), emit=lambda line: None)
    a, b = (LambdaUrlTarget.local_caller(door.url + "/", name) for name in ("tenant-a", "tenant-b"))
    try:
        body = chat(librarian("the first archive"))
        first, other, again = a.send(body), b.send(body), a.send(body)
        for attempt in (first, other, again):
            assert attempt.ok, (attempt.kind, attempt.detail)
        assert 1900 <= first.prompt_tokens == other.prompt_tokens == again.prompt_tokens <= 2100
        assert first.cached_tokens == 0
        assert other.cached_tokens == 0  # the same prompt, another tenant: nothing of A's
        assert again.cached_tokens >= 0.9 * again.prompt_tokens  # A's own repeat
        # B writes A's salt into its body: the front door replaces it with B's own.
        salt_a = routing_identity(ARN.format("tenant-a"), None, LOCAL_TENANT_KEY).cache_salt
        second = librarian("the second archive")
        assert a.send(chat(second)).ok
        forged = b.send(chat(second, cache_salt=salt_a))
        assert forged.ok and forged.cached_tokens == 0
        # ... while the engine itself shares the cache with whoever sends that salt: the salt is the wall.
        runtime = urllib.request.Request(
            f"{server.url}/endpoints/{config.endpoint_name}/invocations",
            json.dumps({"cache_salt": salt_a, "messages": [{"role": "user", "content": second}],
                        "max_tokens": 2}).encode(),
            {"Content-Type": "application/json", "X-Amzn-SageMaker-Inference-Component": config.component_name})
        with urllib.request.urlopen(runtime, timeout=60) as response:
            usage = json.loads(response.read())["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.9 * usage["prompt_tokens"]
    finally:
        for target in (a, b):
            target.close()
        door.stop()
        server.stop()


# ----------------------------------------------------------------------------- the engine's metrics


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return response.read().decode()


def counter(exposition: str, name: str) -> float:
    value = process.counter_value(exposition, name)
    assert value is not None, f"{name} is not in /metrics"
    return value


def usage_of(url: str, content: str) -> dict:
    """One streamed chat answer's usage, read as a client reads it (the final chunk's usage)."""
    connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=60)
    connection.request("POST", "/v1/chat/completions", chat(content, stream_options={"include_usage": True}),
                       {"Content-Type": "application/json"})
    usage = None
    for line in connection.getresponse().read().split(b"\n"):
        if line.startswith(b"data: {"):
            usage = json.loads(line[6:]).get("usage") or usage
    connection.close()
    return usage


def token_ids(url: str, content: str) -> list[int]:
    request = urllib.request.Request(f"{url}/tokenize", json.dumps(
        {"messages": [{"role": "user", "content": content}], "add_generation_prompt": True}).encode(),
        {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["tokens"]


def test_the_engines_counters_agree_with_its_answers_and_the_alarm_selects_them(engine):
    from stacks.metrics import EngineMetrics

    url = engine["url"]
    base = librarian("the metrics archive", rules=100)
    prompts = [base, base, base[: len(base) // 2] + " and then something else entirely", "a short question?"]
    before = scrape(url)
    answers = [usage_of(url, p) for p in prompts]
    after = scrape(url)
    prompt = sum(u["prompt_tokens"] for u in answers)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in answers)
    hits = counter(after, "vllm:prefix_cache_hits_total") - counter(before, "vllm:prefix_cache_hits_total")
    queries = counter(after, "vllm:prefix_cache_queries_total") - counter(before, "vllm:prefix_cache_queries_total")
    assert (hits, queries) == (cached, prompt) and hits / queries == cached / prompt
    # Each answer's cached tokens follow vLLM's rule, which the lab models: whole blocks, never the last token.
    ids = [token_ids(url, p) for p in prompts]
    for i, usage in enumerate(answers):
        assert usage["prompt_tokens"] == len(ids[i])
        shared = max((common_prefix(ids[i], ids[j]) for j in range(i)), default=0)
        assert usage["prompt_tokens_details"]["cached_tokens"] == min(shared, len(ids[i]) - 1) // BLOCK * BLOCK
    assert answers[1]["prompt_tokens_details"]["cached_tokens"] > 0 and answers[2]["prompt_tokens_details"][
        "cached_tokens"] > 0
    # The alarm's and the widget's query select the counters the engine exposes, and the names without _total.
    query = EngineMetrics(component_name="ic", publish_frequency_s=60).hit_rate(5)
    patterns = re.findall(r'__name__=~"([^"]+)"', query)
    exposed = {line.split("{")[0].split()[0] for line in after.splitlines() if line and not line.startswith("#")}
    selected = [{name for name in exposed if re.fullmatch(pattern, name)} for pattern in patterns]
    assert selected == [{"vllm:prefix_cache_hits_total"}, {"vllm:prefix_cache_queries_total"}]
    assert [bool(re.fullmatch(p, p.split("(")[0])) for p in patterns] == [True, True]  # the names without _total


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ----------------------------------------------------------------------------- the emulator on vLLM


DOMAINS_STAGE = """\
# The default stage's model (vLLM) with two trust domains, one tenant each.
[model]
framework = "vllm"
image_repository = "vllm"
image_tag = "server-sagemaker-cuda-v1"
model_id = "meta-llama/Llama-3.1-8B-Instruct"
tensor_parallel_degree = 1
accelerators_per_copy = 1
memory_per_copy_mb = 32768

[endpoint]
instance_type = "ml.g6e.12xlarge"
instances_min = 1
instances_max = 2
copies_min = 2
copies_max = 4

[routing]
strategy = "PREFIX_AWARE"
prefix_length = 4096
concurrency_threshold = 16

[scaling]
target_concurrent_requests_per_copy = 8

[normalizer]
tenancy = "iam"

[domains.a]
tenants = ["arn:aws:iam::000000000000:user/tenant-a"]
copies_min = 1
copies_max = 2

[domains.b]
tenants = ["arn:aws:iam::000000000000:user/tenant-b"]
copies_min = 1
copies_max = 2

[tenancy]
unknown_tenants = "refuse"
"""


def test_emulate_serves_each_trust_domain_on_vllm_engines_of_its_own_and_stops_them_on_sigterm(installed, tmp_path):
    (tmp_path / "vllm-domains.toml").write_text(DOMAINS_STAGE)
    env = {**os.environ, "PREFIX_ROUTING_CONFIG_DIR": str(tmp_path)}
    emulate = subprocess.Popen(
        [sys.executable, "-m", "prefix_routing", "emulate", "--stage", "vllm-domains", "--engines", "1",
         "--engine-kind", "vllm", "--engine-block-size", str(BLOCK), "--engine-context", "4096",
         "--engine-cache-tokens", "8192", "--port", "0", "--front-door", "0"],
        stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    recorded: list[tuple[int, int]] = []
    try:
        lines, door_url, server_url = [], None, None
        deadline = time.monotonic() + START_TIMEOUT_S
        for line in emulate.stderr:
            lines.append(line)
            if (found := re.search(r"^emulating .* at (http://127\.0\.0\.1:\d+)", line)):
                server_url = found[1]
            if (found := re.search(r"^front door .* at (http://127\.0\.0\.1:\d+)", line)):
                door_url = found[1]
                break
            assert time.monotonic() < deadline, "".join(lines)
        assert door_url and server_url, "".join(lines)
        model_line = next(line for line in lines if line.strip().startswith("model:"))
        pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", model_line)]
        assert len(pids) == 2  # one engine per domain
        (state,) = (Vllm().cache_root() / "run").glob(f"session-{emulate.pid}-*.json")
        records = json.loads(state.read_text())["engines"]
        recorded = [p for record in records for p in processes_of(record)]
        assert sorted(r["pid"] for r in records) == sorted(pids)
        a, b = (LambdaUrlTarget.local_caller(door_url + "/", name) for name in ("tenant-a", "tenant-b"))
        try:
            body = chat(librarian("the domains archive", rules=60))
            first, again, other = a.send(body), a.send(body), b.send(body)
        finally:
            a.close()
            b.close()
        assert first.ok and again.ok and other.ok, (first.detail, again.detail, other.detail)
        assert again.cached_tokens >= 0.9 * again.prompt_tokens and other.cached_tokens == 0
        with urllib.request.urlopen(f"{server_url}/status", timeout=10) as response:
            components = json.loads(response.read())["backend"]["components"]
        served = {name: [e["requests"] for e in status["engines"]] for name, status in components.items()}
        assert served == {"vllm-domains-a-ic": [2], "vllm-domains-b-ic": [1]}, served
        emulate.send_signal(signal.SIGTERM)
        assert emulate.wait(120) == 0
        assert "stopped (SIGTERM)" in emulate.stderr.read()
        deadline = time.monotonic() + 30
        while any(process.still_running(pid, started) for pid, started in recorded) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not kill_left(recorded), "emulate left engine processes running"
    finally:
        if emulate.poll() is None:
            emulate.kill()
            emulate.wait(30)
        kill_left(recorded)
