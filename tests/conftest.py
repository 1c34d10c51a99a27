import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

# The real Mooncake trace lives beside the repository (../shared/traces), never inside it.
MOONCAKE_TRACE = SHARED / "traces" / "conversation_trace.jsonl"


@pytest.fixture(scope="session")
def mooncake_trace():
    """The trace read once per test process; tests that need it skip where shared/ is absent."""
    if not MOONCAKE_TRACE.exists():
        pytest.skip(f"the Mooncake trace is not at {MOONCAKE_TRACE}")
    from prefix_routing import traces

    return traces.read_mooncake(MOONCAKE_TRACE)
