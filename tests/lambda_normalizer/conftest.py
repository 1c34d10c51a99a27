"""Shared pieces of the normalizer Lambda's tests.

``lambda`` is a Python keyword, so the handler's directory goes on ``sys.path`` and its modules are
imported as ``handler`` and ``server``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAMBDA_DIR = ROOT / "lambda" / "normalizer"
if str(LAMBDA_DIR) not in sys.path:
    sys.path.insert(0, str(LAMBDA_DIR))

# The front door's log-line fixture (its helpers are imported from there by each test module).
from tests.prefix_routing.frontdoor.conftest import lines  # noqa: E402, F401 - a fixture, found by name
