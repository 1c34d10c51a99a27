"""Shared helpers and fixtures of the lab's tests: chained block ids, fleet configurations, the trace."""

from __future__ import annotations

import math

import pytest

from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.routing import Strategy
from tests.conftest import MOONCAKE_TRACE

P5_70B = "p5.48xlarge-llama3.1-70b"
P5_8B = "p5.48xlarge-llama3.1-8b"  # 8 copies per instance
TRACE = MOONCAKE_TRACE


def chain(root: int, n: int, start: int = 0) -> list[int]:
    """n chained block ids: a shared root then ids unique to `start`."""
    return [root] + list(range(10_000 + start, 10_000 + start + n - 1))


def cfg(**kw) -> FleetConfig:
    base = dict(instances=4, preset=P5_70B, strategy=Strategy.PREFIX_AWARE, concurrency_threshold=1024)
    base.update(kw)
    return FleetConfig(**base)


@pytest.fixture
def trace(mooncake_trace):
    return mooncake_trace


@pytest.fixture(scope="module")
def eight_infinite():
    """8 instances, infinite caches, ConcurrencyThreshold 1024 (the issue's comparison)."""
    return FleetConfig(instances=8, cache_tokens=math.inf, concurrency_threshold=1024)
