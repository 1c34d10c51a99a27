"""The upstream call: ``InvokeEndpointWithResponseStream`` with bounded, jittered retries before the first byte."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prefix_routing.frontdoor.config import InvokeConfig
from prefix_routing.frontdoor.prepare import Prepared
from prefix_routing.frontdoor.record import RequestRecord
from prefix_routing.frontdoor.upstream_errors import UpstreamError, classify_error


class Opened:
    """An answer under way: the response, its payload chunks after the first, the first, when the call
    started and when the first chunk came, and the content type."""

    __slots__ = ("response", "events", "first", "started", "first_at", "content_type")

    def __init__(self, response, events, first, started, first_at, content_type):
        self.response = response
        self.events = events
        self.first = first
        self.started = started
        self.first_at = first_at
        self.content_type = content_type


def close_body(response: Any) -> None:
    body = response.get("Body") if isinstance(response, Mapping) else None
    close = getattr(body, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - best effort
            pass


def random_jitter() -> float:
    return int.from_bytes(os.urandom(4), "big") / 2**32  # no need to import random for this


def _payload_chunks(events: Iterator[Any]) -> Iterator[bytes]:
    """The bytes of each ``PayloadPart`` (empty parts skipped); other events are ignored."""
    for event in events:
        part = event.get("PayloadPart") if isinstance(event, Mapping) else None
        if isinstance(part, Mapping):
            data = part.get("Bytes")
            if data:
                yield bytes(data)


class Upstream:
    """Calls the endpoint until the first payload part arrives, retrying what is retryable.

    ``sleep``, ``jitter`` (a number in [0, 1) per backoff) and ``clock`` are for tests; ``clock`` is
    the clock of :attr:`FrontRequest.arrival` and of deadlines.
    """

    def __init__(self, client: Any, config: InvokeConfig, *, sleep: Callable[[float], None],
                 jitter: Callable[[], float], clock: Callable[[], float]) -> None:
        self.client = client
        self.config = config
        self.sleep = sleep
        self.jitter = jitter
        self.clock = clock

    def backoff(self, attempt: int) -> float:
        ceiling = min(self.config.backoff_max_s, self.config.backoff_base_s * (2 ** (attempt - 1)))
        return ceiling * (0.5 + 0.5 * self.jitter())  # "equal jitter": never less than half

    def params(self, prepared: Prepared, prefix_aware_id: str | None = None) -> dict[str, Any]:
        """The exact ``InvokeEndpointWithResponseStream`` parameters of a prepared request;
        ``prefix_aware_id`` (a replica's, see :mod:`.replicas`) replaces the tenant's."""
        params: dict[str, Any] = {"EndpointName": self.config.endpoint_name}
        component = prepared.component or self.config.component_name
        if component:
            params["InferenceComponentName"] = component
        params["PrefixAwareId"] = prefix_aware_id or prepared.identity.prefix_aware_id
        params["ContentType"] = "application/json"
        params["Body"] = prepared.normalized.body
        return params

    def open(self, prepared: Prepared, record: RequestRecord, deadline: float,
             prefix_aware_id: str | None = None) -> Opened:
        """Call the endpoint until the first payload part arrives; retries what is retryable."""
        params = self.params(prepared, prefix_aware_id)
        attempt = 0
        while True:
            attempt += 1
            record.attempts = attempt
            started = self.clock()
            response = None
            try:
                response = self.client.invoke_endpoint_with_response_stream(**params)
                events = _payload_chunks(iter(response["Body"]))
                first = next(events, None)
                if first is None:
                    raise UpstreamError(502, "truncated", "the model's stream ended before any output")
                content_type = response.get("ContentType") or "application/octet-stream"
                return Opened(response, events, first, started, self.clock(), content_type)
            except Exception as exc:  # noqa: BLE001 - classified below
                if response is not None:
                    close_body(response)
                error = classify_error(exc)
                if error.kind == "internal":
                    raise error from exc
                now = self.clock()
                if not error.retryable or attempt >= self.config.max_attempts:
                    raise error from None
                delay = self.backoff(attempt)
                if now + delay >= deadline:
                    raise error from None
                self.sleep(delay)
