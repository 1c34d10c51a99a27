"""Per-tenant limits, enforced in DynamoDB, which every execution environment shares.

A Lambda execution environment serves one request at a time, so nothing inside it can see a
tenant's load: the counts live in one table (the Normalizer stack's, or dynalite on 127.0.0.1),
and every decision is one atomic conditional write (:mod:`prefix_routing.rules.limits` is the rule):

- ``streams#<tenant>``: the tenant's stream leases, a map lease → expiry (epoch seconds). Admission
  sets one lease under the condition ``size(leases) < concurrent_streams``; the end of the answer
  (success, error, timeout or a caller gone) removes it. An environment that dies mid-stream
  leaves its lease to expire: when the map is full, expired leases are removed (each only if it is
  unchanged) and the write is tried once more.
- ``window#<tenant>#<minute>``: the minute's request and token counts, ``ADD r 1, tk <estimate>``
  under the condition that both stay within their limits; after the answer the estimate is replaced
  by the engine's own usage (prompt + completion). These items expire (DynamoDB TTL on
  ``expires_at``) a few minutes after their minute.

A store that fails or takes longer than ``store_timeout_ms`` (the client's own timeouts) is a store
error: with ``on_store_error = "open"`` the request is served and counted, with ``"closed"`` it
is refused (503). Nothing here imports boto3: the DynamoDB client is passed in.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

from prefix_routing.rules.limits import (
    CONCURRENT_STREAMS,
    STREAM_RETRY_AFTER_S,
    REQUESTS_PER_MINUTE,
    TOKENS_PER_MINUTE,
    WINDOW_S,
    LimitSettings,
    TenantLimits,
    token_estimate,
    window_admits,
    window_of,
    window_reset_s,
)
from prefix_routing.rules.telemetry import LIMITS_TABLE_KEY, LIMITS_TABLE_TTL

#: The table's key and TTL attributes (the stack creates the table with exactly these).
KEY: Final = LIMITS_TABLE_KEY
TTL_ATTRIBUTE: Final = LIMITS_TABLE_TTL
#: A minute's counts are kept this long after the minute (then DynamoDB's TTL deletes them).
WINDOW_KEEP_S: Final = 10 * WINDOW_S


class Throttled(Exception):
    """The tenant is over ``limit``: answer 429 with ``retry_after_s`` and ``headers``."""

    def __init__(self, limit: str, value: int, retry_after_s: int, headers: dict[str, str], message: str) -> None:
        super().__init__(message)
        self.limit, self.value, self.retry_after_s, self.headers, self.message = limit, value, retry_after_s, headers, message


class LimitsUnavailable(Exception):
    """The store failed and the stage says ``on_store_error = "closed"``: answer 503."""


@dataclass(slots=True)
class Admission:
    """What one admitted request holds: its lease and minute (to release and correct at the end),
    the rule that applied, the headers for its answer, and whether the store failed."""

    tenant: str
    rule: str
    limits: TenantLimits
    lease: str | None = None
    window: int | None = None
    estimate: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    store_error: bool = False
    took_ms: float = 0.0


class DynamoLimitStore:
    """The two kinds of items, in the table ``table_name``, through a boto3 ``dynamodb`` client."""

    def __init__(self, client: Any, table_name: str) -> None:
        self.client = client
        self.table = table_name

    # -- stream leases
    def take_stream(self, tenant: str, lease: str, expires_s: float, limit: int, now_s: float) -> int | None:
        """Hold ``lease`` among at most ``limit`` unexpired ones; the leases held after, or None if full."""
        key = {KEY: {"S": f"streams#{tenant}"}}
        for attempt in range(2):
            held = self._set_lease(key, lease, expires_s, limit)
            if held is not None:
                return held
            item = self.client.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item")
            leases = _leases(item)
            if leases is None:  # the tenant's first stream: create the map with it
                try:
                    self.client.put_item(TableName=self.table, ConditionExpression="attribute_not_exists(#k)",
                                         ExpressionAttributeNames={"#k": KEY},
                                         Item={**key, "leases": {"M": {lease: {"N": _num(expires_s)}}},
                                               TTL_ATTRIBUTE: {"N": _num(expires_s)}})
                    return 1
                except self.client.exceptions.ConditionalCheckFailedException:
                    continue  # another environment created it first: try the write again
            expired = {name: value for name, value in leases.items() if value <= now_s}
            if not expired or attempt:
                return None
            self._remove_expired(key, expired)
        return None

    def _set_lease(self, key: dict, lease: str, expires_s: float, limit: int) -> int | None:
        try:
            answer = self.client.update_item(
                TableName=self.table, Key=key, UpdateExpression="SET leases.#l = :e, #t = :e",
                ConditionExpression="size(leases) < :limit",
                ExpressionAttributeNames={"#l": lease, "#t": TTL_ATTRIBUTE},
                ExpressionAttributeValues={":e": {"N": _num(expires_s)}, ":limit": {"N": str(limit)}},
                ReturnValues="ALL_NEW")
        except self.client.exceptions.ConditionalCheckFailedException:
            return None
        return len(_leases(answer.get("Attributes")) or {})

    def _remove_expired(self, key: dict, expired: dict[str, float]) -> None:
        names = {f"#x{i}": name for i, name in enumerate(expired)}
        values = {f":x{i}": {"N": _num(value)} for i, value in enumerate(expired.values())}
        try:
            self.client.update_item(
                TableName=self.table, Key=key, UpdateExpression="REMOVE " + ", ".join(f"leases.{n}" for n in names),
                ConditionExpression=" AND ".join(f"leases.#x{i} = :x{i}" for i in range(len(expired))),
                ExpressionAttributeNames=names, ExpressionAttributeValues=values)
        except self.client.exceptions.ConditionalCheckFailedException:
            pass  # another environment cleaned or renewed them first

    def give_stream(self, tenant: str, lease: str) -> None:
        self.client.update_item(TableName=self.table, Key={KEY: {"S": f"streams#{tenant}"}},
                                UpdateExpression="REMOVE leases.#l", ExpressionAttributeNames={"#l": lease})

    # -- minute windows
    def charge_window(self, tenant: str, window: int, estimate: int, limits: TenantLimits) -> tuple[int, int] | str:
        """Count one request and ``estimate`` tokens in the minute if both fit: the minute's (requests,
        tokens) after, or the name of the limit that refused it."""
        key = {KEY: {"S": f"window#{tenant}#{window}"}}
        conditions, values = [], {":one": {"N": "1"}, ":est": {"N": str(estimate)},
                                  ":exp": {"N": str((window + 1) * WINDOW_S + WINDOW_KEEP_S)}}
        if limits.requests_per_minute is not None:
            conditions.append("(attribute_not_exists(r) OR r < :rl)")
            values[":rl"] = {"N": str(limits.requests_per_minute)}
        if limits.tokens_per_minute is not None:
            conditions.append("(attribute_not_exists(tk) OR tk <= :tl)")
            values[":tl"] = {"N": str(limits.tokens_per_minute - estimate)}
        try:
            answer = self.client.update_item(
                TableName=self.table, Key=key, UpdateExpression="ADD r :one, tk :est SET #t = :exp",
                ConditionExpression=" AND ".join(conditions), ExpressionAttributeNames={"#t": TTL_ATTRIBUTE},
                ExpressionAttributeValues=values, ReturnValues="ALL_NEW")
        except self.client.exceptions.ConditionalCheckFailedException:
            item = self.client.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item") or {}
            refused = window_admits(limits, _int(item.get("r")), _int(item.get("tk")), estimate)
            return refused or (REQUESTS_PER_MINUTE if limits.requests_per_minute is not None else TOKENS_PER_MINUTE)
        attributes = answer.get("Attributes") or {}
        return _int(attributes.get("r")), _int(attributes.get("tk"))

    def correct_window(self, tenant: str, window: int, requests: int, tokens: int) -> None:
        """Add ``requests`` and ``tokens`` (negative: take back) to the minute's counts."""
        self.client.update_item(TableName=self.table, Key={KEY: {"S": f"window#{tenant}#{window}"}},
                                UpdateExpression="ADD r :r, tk :t",
                                ExpressionAttributeValues={":r": {"N": str(requests)}, ":t": {"N": str(tokens)}})


def _failure(call: Callable[[], Any]) -> BaseException | None:
    try:
        call()
    except Exception as error:  # noqa: BLE001 - returned to the caller, which decides
        return error
    return None


def _num(value: float) -> str:
    return repr(round(float(value), 3))


def _int(attribute: Any) -> int:
    try:
        return int(float(attribute["N"])) if isinstance(attribute, dict) else 0
    except (KeyError, TypeError, ValueError):
        return 0


def _leases(item: Any) -> dict[str, float] | None:
    if not isinstance(item, dict) or "leases" not in item:
        return None
    out = {}
    for name, value in (item["leases"].get("M") or {}).items():
        try:
            out[name] = float(value["N"])
        except (KeyError, TypeError, ValueError):
            out[name] = 0.0  # unreadable: counts as expired
    return out


class Limiter:
    """Admits a tenant's request before the endpoint is called and frees what it held after.

    ``store`` is a :class:`DynamoLimitStore` (or anything with its methods); ``clock`` gives
    epoch seconds; ``new_lease`` a fresh lease id.
    """

    def __init__(self, settings: LimitSettings, store: Any, *, clock: Callable[[], float] = time.time,
                 new_lease: Callable[[], str] = lambda: uuid.uuid4().hex[:16]) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        self.new_lease = new_lease
        # The stream's lease and the minute's count are two items: written side by side, the admission
        # takes one round trip, not two (and so does the end of the answer).
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="limiter")

    def admit(self, tenant: str, body_bytes: int) -> Admission | None:
        """The request's admission (None: the tenant has no limit); raises :class:`Throttled` or
        :class:`LimitsUnavailable`."""
        rule, limits = self.settings.for_tenant(tenant)
        if limits.unlimited:
            return None
        started = time.perf_counter()
        now = self.clock()
        admission = Admission(tenant, rule, limits)
        try:
            stream = (self._pool.submit(self._take_stream, admission, now)
                      if limits.concurrent_streams is not None else None)
            failures = [_failure(lambda: self._charge_window(admission, body_bytes, now))]
            if stream is not None:
                failures.append(_failure(stream.result))
            if any(failures):  # give back what the other write took, then say why
                self._undo(admission)
                store_failure = next((f for f in failures if f is not None and not isinstance(f, Throttled)), None)
                raise store_failure or next(f for f in failures if f is not None)
        except Throttled:
            raise
        except Exception:  # noqa: BLE001 - the store failed (timeout, connection, throttling, a bug of its own)
            if self.settings.on_store_error == "closed":
                raise LimitsUnavailable("the per-tenant limits could not be checked") from None
            admission.lease, admission.window, admission.store_error = None, None, True
        admission.took_ms = (time.perf_counter() - started) * 1000.0
        return admission

    def _take_stream(self, admission: Admission, now: float) -> None:
        limit = admission.limits.concurrent_streams
        if limit is None:
            return
        lease = self.new_lease()
        held = self.store.take_stream(admission.tenant, lease, now + self.settings.lease_s, limit, now)
        headers = {"x-ratelimit-limit-streams": str(limit)}
        if held is None:
            headers["x-ratelimit-remaining-streams"] = "0"
            raise Throttled(CONCURRENT_STREAMS, limit, STREAM_RETRY_AFTER_S, headers,
                            f"concurrent_streams: {limit} streams of this tenant are in flight; retry when one ends")
        admission.lease = lease
        headers["x-ratelimit-remaining-streams"] = str(max(0, limit - held))
        admission.headers.update(headers)

    def _charge_window(self, admission: Admission, body_bytes: int, now: float) -> None:
        limits = admission.limits
        if limits.requests_per_minute is None and limits.tokens_per_minute is None:
            return
        window, estimate, reset = window_of(now), token_estimate(body_bytes), window_reset_s(now)
        if limits.tokens_per_minute is not None and estimate > limits.tokens_per_minute:
            raise Throttled(TOKENS_PER_MINUTE, limits.tokens_per_minute, reset, self._window_headers(limits, None, reset),
                            f"tokens_per_minute: this request alone (about {estimate} prompt tokens) exceeds the "
                            f"tenant's {limits.tokens_per_minute}")
        counted = self.store.charge_window(admission.tenant, window, estimate, limits)
        if isinstance(counted, str):
            value = getattr(limits, counted)
            raise Throttled(counted, value, reset, self._window_headers(limits, None, reset),
                            f"{counted}: the tenant's {value} for this minute are used; retry in {reset} s")
        admission.window, admission.estimate = window, estimate
        admission.headers.update(self._window_headers(limits, counted, reset))

    @staticmethod
    def _window_headers(limits: TenantLimits, counted: tuple[int, int] | None, reset: int) -> dict[str, str]:
        headers = {}
        for name, limit, used in (("requests", limits.requests_per_minute, counted[0] if counted else None),
                                  ("tokens", limits.tokens_per_minute, counted[1] if counted else None)):
            if limit is not None:
                headers[f"x-ratelimit-limit-{name}"] = str(limit)
                headers[f"x-ratelimit-remaining-{name}"] = str(max(0, limit - used) if used is not None else 0)
                headers[f"x-ratelimit-reset-{name}"] = f"{reset}s"
        return headers

    def finish(self, admission: Admission | None, tokens_used: int | None) -> None:
        """Free the stream and replace the token estimate by the engine's usage (when reported), side
        by side. Never raises: a failure here leaves the lease to expire and the estimate in the count."""
        if admission is None or admission.store_error:
            return
        stream = self._pool.submit(self._give_stream, admission) if admission.lease is not None else None
        if admission.window is not None and admission.limits.tokens_per_minute is not None and tokens_used is not None:
            try:
                self.store.correct_window(admission.tenant, admission.window, 0, tokens_used - admission.estimate)
            except Exception:  # noqa: BLE001 - the count keeps the estimate
                pass
        if stream is not None:
            stream.result()

    def _undo(self, admission: Admission) -> None:
        """Give back a refused request's lease and its count in the minute."""
        self._give_stream(admission)
        if admission.window is not None:
            try:
                self.store.correct_window(admission.tenant, admission.window, -1, -admission.estimate)
            except Exception:  # noqa: BLE001 - the minute keeps one request too many
                pass
            admission.window = None

    def _give_stream(self, admission: Admission) -> None:
        if admission.lease is None:
            return
        try:
            self.store.give_stream(admission.tenant, admission.lease)
        except Exception:  # noqa: BLE001 - the lease expires on its own
            pass
        admission.lease = None


def admit_request(limiter: Limiter, tenant: str, body_bytes: int, record: Any,
                  state: Any) -> tuple[int, str, dict, dict[str, str]] | None:
    """Admit one request of the front door under its tenant's limits, noting on its ``record`` (the
    log line) what applied and on ``state`` what it holds; if refused, (status, code, JSON body,
    headers) of the answer: 429 over a limit, 503 when the store failed and the stage says closed."""
    try:
        admission = state.admission = limiter.admit(tenant, body_bytes)
    except Throttled as throttled:
        record.limit_rule = limiter.settings.for_tenant(tenant)[0]
        record.throttled_by, record.origin = throttled.limit, "client"
        body = {"error": {"code": "rate_limited", "message": throttled.message, "status": 429,
                          "limit": throttled.limit, "retry_after_s": throttled.retry_after_s}}
        return 429, "rate_limited", body, {**throttled.headers, "retry-after": str(throttled.retry_after_s)}
    except LimitsUnavailable as unavailable:
        record.limiter_store_error, record.origin = True, "internal"
        message = f"{unavailable}: the request is refused until they can"
        return 503, "limits_unavailable", {"error": {"code": "limits_unavailable", "message": message,
                                                     "status": 503}}, {}
    if admission is not None:
        record.limit_rule, record.limiter_ms = admission.rule, admission.took_ms
        record.limiter_store_error = admission.store_error
        state.limit_headers = admission.headers
    return None
