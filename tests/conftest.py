import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

# Fake AWS credentials for every test and subprocess, a guard that fails any test reaching beyond
# 127.0.0.1 (tests/network_guard.py), and one that fails the run if an engine a test started is left
# running at its end (tests/leftover_guard.py).
pytest_plugins = ["tests.network_guard", "tests.leftover_guard", "pytester"]

# Hypothesis: the same examples on every run by default (CI); HYPOTHESIS_PROFILE=wide for a longer,
# random search on demand. No deadline: an example's time says how loaded the machine is, not whether
# the code is right (speed is measured in bench/, against a baseline in the same run).
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("wide", max_examples=1000, derandomize=False, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The real Mooncake trace lives beside the repository (../shared/traces), never inside it. A slice of
# it (tests/data/, with its source and licence) serves the tests that need real lines but not the
# whole trace's figures.
MOONCAKE_TRACE = SHARED / "traces" / "conversation_trace.jsonl"
MOONCAKE_SLICE = ROOT / "tests" / "data" / "mooncake_slice.jsonl"
REQUIRE_SHARED = os.environ.get("PREFIX_ROUTING_REQUIRE_SHARED") == "1"


def require_shared_trace() -> Path:
    """The whole trace's path; a skip where ../shared is absent, a failure when CI requires it."""
    if not MOONCAKE_TRACE.exists():
        message = f"the Mooncake trace is not at {MOONCAKE_TRACE}"
        if REQUIRE_SHARED:
            pytest.fail(message + " and PREFIX_ROUTING_REQUIRE_SHARED=1", pytrace=False)
        pytest.skip(message)
    return MOONCAKE_TRACE


@pytest.fixture(scope="session")
def mooncake_trace():
    """The whole trace, read once per test process (see ``require_shared_trace``)."""
    from prefix_routing.lab import traces

    return traces.read_mooncake(require_shared_trace())


@pytest.fixture(scope="session")
def mooncake_slice():
    """The slice of the trace kept in the repository, read once per test process."""
    from prefix_routing.lab import traces

    return traces.read_mooncake(MOONCAKE_SLICE)


def pytest_report_header(config):
    shared = "found" if MOONCAKE_TRACE.exists() else "MISSING (whole-trace tests skip)"
    required = ", required" if REQUIRE_SHARED else ""
    return [f"shared trace: {MOONCAKE_TRACE} {shared}{required}",
            f"hypothesis profile: {settings.get_current_profile_name()}"]


@pytest.fixture(scope="session")
def local_dynamo():
    """dynalite on 127.0.0.1 (the front door's limits store), one per test process, stopped by its pid."""
    from prefix_routing.emulator.local_store import LocalDynamo

    with LocalDynamo() as store:
        yield store
