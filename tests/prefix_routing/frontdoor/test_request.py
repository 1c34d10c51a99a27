"""Requests from Lambda events and HTTP (prefix_routing.frontdoor.request)."""

from __future__ import annotations

import pytest
from prefix_routing import frontdoor
from tests.prefix_routing.frontdoor.conftest import BODY, url_event


def test_function_url_event_with_base64_body_and_bad_base64():
    request = frontdoor.request_from_event(url_event(BODY, base64=True))
    assert request.body == BODY and request.problem is None
    event = url_event(BODY)
    event["isBase64Encoded"] = True
    event["body"] = "not base64!!"
    request = frontdoor.request_from_event(event)
    assert request.problem is not None and request.problem.code == "invalid_base64"


@pytest.mark.parametrize(
    ("event", "code"),
    [
        ([1, 2], "invalid_event"),
        ("text", "invalid_event"),
        ({"tenant": "acme"}, "invalid_event"),
        ({"body": 5, "tenant": "acme"}, "invalid_event"),
    ],
)
def test_malformed_events_are_400(event, code):
    request = frontdoor.request_from_event(event)
    assert request.problem is not None and request.problem.status == 400 and request.problem.code == code


def test_lambda_context_gives_request_id_and_deadline():
    class Context:
        aws_request_id = "lambda-req-9"

        def get_remaining_time_in_millis(self):
            return 30_000

    request = frontdoor.request_from_event(url_event(), Context())
    assert request.request_id == "lambda-req-9"
    assert request.deadline is not None and request.deadline > request.arrival + 20
