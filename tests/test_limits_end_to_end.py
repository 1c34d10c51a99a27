"""Per-tenant limits end to end: several front-door processes sharing one real store (dynalite), the
emulated runtime behind them, SigV4-signed callers in front, as in production several execution
environments share the table.

- Exactness: however many of a tenant's callers press at once, the endpoint never has more than
  its ``concurrent_streams`` of that tenant's answers in flight (from the emulator's own record).
- A front door killed mid-stream holds its slot only until its lease runs out.
- A store frozen for 8 s (paused by its process id) leaves leases behind that refuse a tenant within
  its limit for at most one lease after it resumes, whatever the function's timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.server import serve_runtime
from prefix_routing.rules.limits import LimitSettings, TenantLimits

ROOT = Path(__file__).resolve().parents[1]
ENDPOINT, COMPONENT = "test-prefix-llm", "test-prefix-llm-ic"

_FRONT_DOOR = """
import json, sys, time
from prefix_routing.frontdoor.local import LocalFrontDoor
environment = json.loads(sys.argv[1])
door = LocalFrontDoor(sys.argv[2], environment, limits_store_url=sys.argv[3], emit=lambda line: None)
print(door.server.server_address[1], flush=True)
time.sleep(3600)
"""


def _environment(limit: int, table: str, lease_s: int = 60) -> dict[str, str]:
    limits = LimitSettings(default=TenantLimits(concurrent_streams=limit), store_timeout_ms=2000, lease_s=lease_s)
    return {"ENDPOINT_NAME": ENDPOINT, "INFERENCE_COMPONENT_NAME": COMPONENT, "TENANCY": "iam",
            "LIMITS": limits.to_json(), "LIMITS_TABLE": table}


class FrontDoors:
    """Front-door processes on 127.0.0.1, each stopped by its own pid."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen] = []

    def start(self, environment: dict, runtime_url: str, store_url: str) -> int:
        process = subprocess.Popen([sys.executable, "-c", _FRONT_DOOR, json.dumps(environment), runtime_url, store_url],
                                   cwd=ROOT, stdout=subprocess.PIPE, text=True,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.processes.append(process)
        line = process.stdout.readline()
        assert line.strip().isdigit(), f"a front door did not start: {line!r}"
        return int(line)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)


@pytest.fixture
def doors():
    started = FrontDoors()
    yield started
    started.stop()


def _call(port: int, tenant: str = "tenant-a", *, read: bool = True, timeout: float = 30, max_tokens: int = 6):
    body = json.dumps({"messages": [{"role": "user", "content": "one two three four five six"}],
                       "stream": True, "max_tokens": max_tokens}).encode()
    url = f"http://127.0.0.1:{port}/"
    signed = AWSRequest(method="POST", url=url, data=body, headers={"content-type": "application/json"})
    SigV4Auth(Credentials(tenant, "not-checked-locally"), "lambda", "us-east-1").add_auth(signed)
    request = urllib.request.Request(url, data=body, method="POST", headers=dict(signed.headers.items()))
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as refused:
        return refused.code, {k.lower(): v for k, v in refused.headers.items()}, json.loads(refused.read())
    if not read:
        return response.status, dict(response.headers), response
    return response.status, dict(response.headers), response.read()


def _most_in_flight(records) -> int:
    """The most answers in flight at once, from the emulator's arrival and finish times."""
    events = sorted([(r.request.arrival, 1) for r in records] + [(r.finished_at, -1) for r in records])
    most = current = 0
    for _, step in events:
        current += step
        most = max(most, current)
    return most


def test_a_tenant_never_has_more_streams_in_flight_than_its_limit_across_front_doors(local_dynamo, doors):
    limit, callers, rounds = 3, 12, 3
    with serve_runtime(EchoBackend(first_chunk_delay=0.05, token_delay=0.05, max_tokens=6),
                       endpoints=[ENDPOINT]) as runtime:
        environment = _environment(limit, "limits-exact")
        ports = [doors.start(environment, runtime.url, local_dynamo.url) for _ in range(2)]
        statuses: list[int] = []

        def caller(index: int) -> None:
            for round_ in range(rounds):
                statuses.append(_call(ports[(index + round_) % 2])[0])

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        runtime.wait_until_idle(10)
        served = [r for r in runtime.requests if r.outcome == "ok"]
    assert sorted(set(statuses)) == [200, 429] and len(statuses) == callers * rounds
    assert len(served) == statuses.count(200)  # every admitted request, and only they, reached the endpoint
    assert _most_in_flight(served) <= limit
    assert _most_in_flight(served) == limit  # the pressure did fill the limit: the check is not vacuous


def test_a_front_door_killed_mid_stream_holds_its_slot_only_until_its_lease_runs_out(local_dynamo, doors):
    lease_s = 10
    with serve_runtime(EchoBackend(first_chunk_delay=0.05, token_delay=0.5, max_tokens=60),
                       endpoints=[ENDPOINT]) as runtime:
        environment = _environment(1, "limits-crash", lease_s=lease_s)
        doomed = doors.start(environment, runtime.url, local_dynamo.url)
        survivor = doors.start(environment, runtime.url, local_dynamo.url)
        status, _, stream = _call(doomed, read=False)  # a 30 s answer holds the tenant's one slot
        assert status == 200 and stream.read1(100)
        taken_at = time.monotonic()
        os.kill(doors.processes[0].pid, signal.SIGKILL)  # its environment dies: nothing gives the slot back
        doors.processes[0].wait(10)
        status, headers, body = _call(survivor)
        assert status == 429 and body["error"]["limit"] == "concurrent_streams" and headers["retry-after"] == "1"
        while time.monotonic() - taken_at < lease_s + 1:
            time.sleep(0.25)
        status, _, _ = _call(survivor)
        assert status == 200  # the lease ran out: the slot is free again


def test_a_noisy_tenant_is_refused_with_retry_after_and_the_quiet_one_is_served(local_dynamo):
    """The noisy-neighbour scenario's counts (its latencies are bench/bench_noisy_neighbour.py's): 8 callers
    of one tenant against a limit of 2 streams, one caller of another tenant."""
    from prefix_routing.frontdoor.local import LOCAL_TENANT_KEY, LocalFrontDoor
    from prefix_routing.rules.identity import routing_identity

    lines: list[str] = []
    with serve_runtime(EchoBackend(first_chunk_delay=0.05, token_delay=0.03, max_tokens=6),
                       endpoints=[ENDPOINT]) as runtime:
        with LocalFrontDoor(runtime.url, _environment(2, "limits-noisy"), emit=lines.append,
                            limits_store_url=local_dynamo.url) as door:
            port = door.server.server_address[1]
            answers: dict[str, list] = {"noisy": [], "quiet": []}

            def caller(tenant: str, count: int) -> None:
                for _ in range(count):
                    answers[tenant].append(_call(port, tenant)[:2])

            threads = [threading.Thread(target=caller, args=("noisy", 5)) for _ in range(8)]
            threads.append(threading.Thread(target=caller, args=("quiet", 5)))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
        runtime.wait_until_idle(10)
        records = list(runtime.requests)
    noisy_statuses = [status for status, _ in answers["noisy"]]
    assert noisy_statuses.count(429) > 0 and noisy_statuses.count(200) > 0
    assert all(headers["retry-after"] == "1" for status, headers in answers["noisy"] if status == 429)
    assert [status for status, _ in answers["quiet"]] == [200] * 5  # its own slots: never refused
    noisy_id = routing_identity("arn:aws:iam::000000000000:user/noisy", None, LOCAL_TENANT_KEY).prefix_aware_id
    noisy_served = [r for r in records if r.request.headers.prefix_aware_id == noisy_id]
    assert len(noisy_served) == noisy_statuses.count(200) and _most_in_flight(noisy_served) <= 2


def test_after_a_store_freeze_false_refusals_stop_within_one_lease():
    """Three callers against ``concurrent_streams = 3`` (every 429 is false), each process as in
    production (the emulator, the front door with the default stage's limits environment and the local
    store timeout, dynalite), the store paused by its process id for 8 s. Admissions and releases that
    time out meanwhile are written or lost when it resumes: the leases they leave are nobody's, and must
    stop refusing within one lease of the store resuming, whatever the function's timeout."""
    bench = Path(__file__).resolve().parents[1] / "bench"
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))
    from bench_limits_faults import run_freeze

    from prefix_routing.rules.limits import LEASE_S

    result = run_freeze(clients=3, freeze_s=8, after_s=LEASE_S + 5, warm_s=4)
    assert result["refused_before"] == 0 and result["served"] > 0 and result["errors"] == 0, result
    last = result["last_refusal_after_resume_s"]
    assert last is None or last <= LEASE_S, f"false refusals went on {last:.1f} s after the store resumed"
