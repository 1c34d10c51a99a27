"""Fixtures the command-line tests share with the load tester's tests."""

from tests.prefix_routing.loadtest.conftest import trace_file  # noqa: F401 - a fixture, found by name
