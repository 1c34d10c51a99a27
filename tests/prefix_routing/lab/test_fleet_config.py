"""The fleet configuration's validation (prefix_routing.lab.fleet_config)."""

from __future__ import annotations

import pytest

from prefix_routing.lab.fleet_config import FleetConfig
from prefix_routing.lab.routing import Strategy
from prefix_routing.rules.errors import UserError
from tests.prefix_routing.lab.conftest import cfg


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"prefix_length": 512}, "prefix_length=512: must be an integer from 1024 to 65536"),
        ({"prefix_length": 70000}, "prefix_length"),
        ({"concurrency_threshold": 0}, "concurrency_threshold=0"),
        ({"concurrency_threshold": 1025}, "concurrency_threshold"),
        ({"copies": 2}, "at most 1 copies per instance"),
        ({"strategy": "FASTEST"}, "unknown routing strategy 'FASTEST'"),
        ({"preset": "p9"}, "unknown preset"),
        ({"cache_tokens": -1}, "cache_tokens"),
    ],
)
def test_bad_configuration_is_a_user_error(kw, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        cfg(**kw)


def test_strategy_names_parse_loosely():
    assert Strategy.parse("prefix-aware") is Strategy.PREFIX_AWARE
    assert Strategy.parse("lor") is Strategy.LEAST_OUTSTANDING_REQUESTS
    assert FleetConfig(strategy="KV_AWARE").strategy is Strategy.KV_AWARE
