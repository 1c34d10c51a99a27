"""The include_usage rule the front door and the load tester share (prefix_routing.rules.stream_usage)."""

import pytest

from prefix_routing.rules.stream_usage import usage_request, with_include_usage


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"stream": True}, (False, True)),  # streams, says nothing: add it
        ({"stream": True, "stream_options": {"include_usage": True}}, (True, False)),
        ({"stream": True, "stream_options": {"include_usage": False}}, (False, False)),  # the caller decided
        ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, (False, True)),
        ({"stream": True, "stream_options": "odd"}, (False, False)),  # not ours to rewrite
        ({"stream": False}, (False, False)),
        ({"stream": "true"}, (False, False)),
        ({}, (False, False)),
        (["not", "an", "object"], (False, False)),
    ],
)
def test_usage_request(body, expected):
    assert usage_request(body) == expected


def test_with_include_usage_keeps_the_other_options_and_the_body():
    body = {"messages": [], "stream": True, "stream_options": {"continuous_usage_stats": True}}
    assert with_include_usage(body) == {"messages": [], "stream": True,
                                        "stream_options": {"continuous_usage_stats": True, "include_usage": True}}
    assert body["stream_options"] == {"continuous_usage_stats": True}  # the caller's dict is not changed
    assert with_include_usage({"stream": True})["stream_options"] == {"include_usage": True}
