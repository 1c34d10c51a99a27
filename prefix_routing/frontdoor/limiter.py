"""Per-tenant limits, enforced in DynamoDB, which every execution environment shares.

A Lambda execution environment serves one request at a time, so nothing inside it can see a
tenant's load: the counts live in one table (the Normalizer stack's, or dynalite on 127.0.0.1),
one item per tenant (``tenant#<id>``), and an admission is one atomic conditional write
(:mod:`prefix_routing.rules.limits` is the rule):

- ``leases``: the tenant's streams in flight, a map lease → expiry (epoch seconds). Admission sets
  one lease under the condition ``size(leases) < concurrent_streams``; while the answer streams
  this environment renews it (:mod:`prefix_routing.frontdoor.lease_renewal`), and the end of the
  answer (success, error, timeout or a caller gone) removes it. A lease nobody renews (an
  environment that died mid-stream, a lost release) expires within ``lease_s``: when the map is
  full, expired leases are removed (each only if it is unchanged) and the write is tried again.
- ``win``, ``r``, ``tk``: the calendar minute counted and its requests and tokens. In the same
  minute admission adds 1 and the request's charge (its prompt estimate plus the output it asks
  for) under the condition that both stay within their limits; the first request of a new minute
  resets them. After the answer the charge is replaced by the engine's own usage (prompt +
  completion), if the minute is still the same.

Both parts are in the same write, so a request is admitted by both limits or by neither. The write
is chosen from what this environment last saw of the tenant's minute; when its condition fails,
one consistent read says why (over a limit, a new minute, expired leases, no item yet) and decides.
The item expires (DynamoDB TTL on ``expires_at``) once its leases and minute are over.

A store that fails or takes longer than ``store_timeout_ms`` (the client's own timeouts) is a store
error: with ``on_store_error = "open"`` the request is served and counted, with ``"closed"`` it
is refused (503). Nothing here imports boto3: the DynamoDB client is passed in.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from prefix_routing.frontdoor.lease_renewal import LeaseRenewer
from prefix_routing.rules.limits import (
    CONCURRENT_STREAMS,
    STREAM_RETRY_AFTER_S,
    TOKENS_PER_MINUTE,
    WINDOW_S,
    LimitSettings,
    TenantLimits,
    admission_charge,
    admission_refusal,
    requested_output_tokens,
    token_estimate,
    window_of,
    window_reset_s,
)
from prefix_routing.rules.telemetry import LIMITS_TABLE_KEY, LIMITS_TABLE_TTL

#: The table's key and TTL attributes (the stack creates the table with exactly these).
KEY: Final = LIMITS_TABLE_KEY
TTL_ATTRIBUTE: Final = LIMITS_TABLE_TTL
#: An item is kept this long after its last lease and minute (then DynamoDB's TTL deletes it).
KEEP_S: Final = 10 * WINDOW_S
#: Writes tried for one admission before it counts as a store error (each a lost race or a cleanup).
MAX_WRITES: Final = 4


class Throttled(Exception):
    """The tenant is over ``limit``: answer 429 with ``retry_after_s`` and ``headers``."""

    def __init__(self, limit: str, value: int, retry_after_s: int, headers: dict[str, str], message: str) -> None:
        super().__init__(message)
        self.limit, self.value, self.retry_after_s, self.headers, self.message = limit, value, retry_after_s, headers, message


class LimitsUnavailable(Exception):
    """The store failed and the stage says ``on_store_error = "closed"``: answer 503 with ``headers``."""

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers or {}


@dataclass(slots=True)
class Admission:
    """What one admitted request holds: its lease and minute (to release and correct at the end),
    the tokens it was charged, the rule that applied, the headers for its answer, and whether the
    store failed."""

    tenant: str
    rule: str
    limits: TenantLimits
    lease: str | None = None
    window: int | None = None
    charge: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    store_error: bool = False
    took_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class Counted:
    """The tenant's item after an admission: leases held, the minute's requests and tokens."""

    leases: int
    requests: int
    tokens: int


@dataclass(frozen=True, slots=True)
class Refused:
    """An admission the item refuses: the limit's name."""

    limit: str


class DynamoLimitStore:
    """The tenants' items in the table ``table_name``, through a boto3 ``dynamodb`` client."""

    def __init__(self, client: Any, table_name: str, *, release_client: Any = None) -> None:
        self.client = client
        # Giving a stream back gets a longer bound than admitting one (rules.limits.RELEASE_TIMEOUT_MS).
        self.release_client = release_client if release_client is not None else client
        self.table = table_name
        self._minute_seen: dict[str, int] = {}  # tenant → the minute its item last held, as seen here

    def admit(self, tenant: str, limits: TenantLimits, lease: str | None, charge: int, now_s: float,
              lease_s: float) -> Counted | Refused:
        """Take ``lease`` (if the tenant has a stream limit) and count one request of ``charge``
        tokens in the minute of ``now_s`` (if it has per-minute limits), both or neither."""
        key = {KEY: {"S": f"tenant#{tenant}"}}
        window = window_of(now_s)
        counts_minute = limits.requests_per_minute is not None or limits.tokens_per_minute is not None
        new_minute = counts_minute and self._minute_seen.get(tenant, -1) < window
        for _ in range(MAX_WRITES):
            written = self._write(key, limits, lease, charge, window, now_s + lease_s, new_minute)
            if written is not None:
                self._saw(tenant, window)
                return written
            item = self.client.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item")
            if item is None:
                if self._create(key, limits, lease, charge, window, now_s + lease_s):
                    self._saw(tenant, window)
                    return Counted(1 if lease else 0, 1, charge)
                continue  # another environment created it first
            if lease is not None and "leases" not in item:
                self._add_lease_map(key)
            leases = _leases(item)
            expired = {name: value for name, value in leases.items() if value <= now_s}
            held_minute = _int(item.get("win"), -1)
            same_minute = counts_minute and held_minute == window
            refused = admission_refusal(limits, len(leases) - len(expired),
                                        _int(item.get("r")) if same_minute else 0,
                                        _int(item.get("tk")) if same_minute else 0, charge)
            self._saw(tenant, min(held_minute, window))
            if refused is not None:
                return Refused(refused)
            if lease is not None and expired and len(leases) >= limits.concurrent_streams:
                self._remove_expired(key, expired)  # a dead environment's slots, freed for this one
            new_minute = counts_minute and held_minute < window
        raise RuntimeError(f"tenant {tenant}: no admission after {MAX_WRITES} writes (contention)")

    def renew(self, tenant: str, lease: str, expires_s: float) -> bool:
        """Move ``lease``'s expiry to ``expires_s`` (and the item's with it); False if the table no
        longer holds it (it expired and was cleaned, or was given back). Off the first token's path:
        the release client's bound."""
        client = self.release_client
        try:
            client.update_item(
                TableName=self.table, Key={KEY: {"S": f"tenant#{tenant}"}},
                UpdateExpression="SET leases.#l = :e, #t = :keep", ConditionExpression="attribute_exists(leases.#l)",
                ExpressionAttributeNames={"#l": lease, "#t": TTL_ATTRIBUTE},
                ExpressionAttributeValues={":e": {"N": _num(expires_s)}, ":keep": {"N": _num(expires_s + KEEP_S)}})
        except client.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def _saw(self, tenant: str, window: int) -> None:
        if len(self._minute_seen) >= 10_000:  # bounded: a guess, not a fact, may be forgotten
            self._minute_seen.clear()
        self._minute_seen[tenant] = window

    def _write(self, key: dict, limits: TenantLimits, lease: str | None, charge: int, window: int,
               expires_s: float, new_minute: bool) -> Counted | None:
        sets, adds, conditions = [f"#t = :keep"], [], []
        names: dict[str, str] = {"#t": TTL_ATTRIBUTE}
        values: dict[str, Any] = {":keep": {"N": _num(max(expires_s, (window + 1) * WINDOW_S) + KEEP_S)}}
        if lease is not None:
            sets.append("leases.#l = :e")
            names["#l"] = lease
            values[":e"] = {"N": _num(expires_s)}
            values[":streams"] = {"N": str(limits.concurrent_streams)}
            conditions.append("size(leases) < :streams")
        if limits.requests_per_minute is not None or limits.tokens_per_minute is not None:
            values.update({":w": {"N": str(window)}, ":one": {"N": "1"}, ":est": {"N": str(charge)}})
            if new_minute:  # the first request of its minute: the counts start again
                sets += ["win = :w", "r = :one", "tk = :est"]
                conditions.append("(attribute_not_exists(win) OR win < :w)")
            else:
                adds += ["r :one", "tk :est"]
                conditions.append("win = :w")
                if limits.requests_per_minute is not None:
                    conditions.append("r < :rl")
                    values[":rl"] = {"N": str(limits.requests_per_minute)}
                if limits.tokens_per_minute is not None:
                    conditions.append("tk <= :tl")
                    values[":tl"] = {"N": str(limits.tokens_per_minute - charge)}
        update = "SET " + ", ".join(sets) + (" ADD " + ", ".join(adds) if adds else "")
        try:
            answer = self.client.update_item(
                TableName=self.table, Key=key, UpdateExpression=update,
                ConditionExpression=" AND ".join(conditions) if conditions else f"attribute_exists({KEY})",
                ExpressionAttributeNames=names, ExpressionAttributeValues=values, ReturnValues="ALL_NEW")
        except self.client.exceptions.ConditionalCheckFailedException:
            return None
        except self.client.exceptions.ClientError as error:
            # The item has no leases map yet (a tenant whose first requests had no stream limit): the
            # path is invalid until the map exists. Give it one, then the write goes again.
            if lease is not None and error.response.get("Error", {}).get("Code") == "ValidationException":
                self._add_lease_map(key)
                return None
            raise
        attributes = answer.get("Attributes") or {}
        return Counted(len(_leases(attributes)), _int(attributes.get("r")), _int(attributes.get("tk")))

    def _create(self, key: dict, limits: TenantLimits, lease: str | None, charge: int, window: int,
                expires_s: float) -> bool:
        item = {**key, TTL_ATTRIBUTE: {"N": _num(max(expires_s, (window + 1) * WINDOW_S) + KEEP_S)},
                "leases": {"M": {lease: {"N": _num(expires_s)}} if lease else {}},
                "win": {"N": str(window)}, "r": {"N": "1"}, "tk": {"N": str(charge)}}
        try:
            self.client.put_item(TableName=self.table, Item=item, ConditionExpression="attribute_not_exists(#k)",
                                 ExpressionAttributeNames={"#k": KEY})
        except self.client.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def _add_lease_map(self, key: dict) -> None:
        self.client.update_item(TableName=self.table, Key=key, UpdateExpression="SET leases = if_not_exists(leases, :m)",
                                ExpressionAttributeValues={":m": {"M": {}}})

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

    def finish(self, tenant: str, lease: str | None, window: int | None, tokens_delta: int | None) -> None:
        """Give ``lease`` back and add ``tokens_delta`` to the minute's tokens if it is still ``window``,
        in one write when both apply."""
        client = self.release_client
        key = {KEY: {"S": f"tenant#{tenant}"}}
        names = {"#l": lease} if lease is not None else {}
        if window is not None and tokens_delta:
            update = ("REMOVE leases.#l " if lease is not None else "") + "ADD tk :d"
            try:
                client.update_item(TableName=self.table, Key=key, UpdateExpression=update,
                                        ConditionExpression="win = :w",
                                        ExpressionAttributeValues={":d": {"N": str(tokens_delta)},
                                                                   ":w": {"N": str(window)}},
                                        **({"ExpressionAttributeNames": names} if names else {}))
                return
            except client.exceptions.ConditionalCheckFailedException:
                pass  # a new minute began: its counts owe nothing to this request
        if lease is not None:
            client.update_item(TableName=self.table, Key=key, UpdateExpression="REMOVE leases.#l",
                                    ExpressionAttributeNames=names)


def _num(value: float) -> str:
    return repr(round(float(value), 3))


def _int(attribute: Any, default: int = 0) -> int:
    try:
        return int(float(attribute["N"])) if isinstance(attribute, dict) else default
    except (KeyError, TypeError, ValueError):
        return default


def _leases(item: Any) -> dict[str, float]:
    out = {}
    for name, value in ((item or {}).get("leases", {}).get("M") or {}).items():
        try:
            out[name] = float(value["N"])
        except (KeyError, TypeError, ValueError):
            out[name] = 0.0  # unreadable: counts as expired
    return out


class Limiter:
    """Admits a tenant's request before the endpoint is called and frees what it held after.

    ``store`` is a :class:`DynamoLimitStore` (or anything with its ``admit``, ``renew`` and
    ``finish``); ``clock`` gives epoch seconds; ``new_lease`` a fresh lease id. The leases of the
    streams in flight are renewed by ``renewer`` (by default one with a thread of its own).
    """

    def __init__(self, settings: LimitSettings, store: Any, *, clock: Callable[[], float] = time.time,
                 new_lease: Callable[[], str] = lambda: uuid.uuid4().hex[:16],
                 renewer: LeaseRenewer | None = None) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        self.new_lease = new_lease
        self.renewer = renewer if renewer is not None else LeaseRenewer(
            lambda tenant, lease, expires_s: self.store.renew(tenant, lease, expires_s), settings.lease_s, clock=clock)

    def charges_tokens(self, tenant: str) -> bool:
        """Whether ``tenant`` has a ``tokens_per_minute`` (only then does the output asked for matter)."""
        return self.settings.for_tenant(tenant)[1].tokens_per_minute is not None

    def admit(self, tenant: str, body_bytes: int, output_tokens: int | None = None) -> Admission | None:
        """The admission of a request of ``body_bytes`` that asks for at most ``output_tokens``
        (None: it names no limit, and the stage's ``default_max_tokens`` is charged). None: the
        tenant has no limit. Raises :class:`Throttled` or :class:`LimitsUnavailable`."""
        rule, limits = self.settings.for_tenant(tenant)
        if limits.unlimited:
            return None
        started = time.perf_counter()
        now = self.clock()
        charge = admission_charge(body_bytes, output_tokens, self.settings.default_max_tokens)
        admission = Admission(tenant, rule, limits, charge=charge)
        reset = window_reset_s(now)
        per_minute = limits.requests_per_minute is not None or limits.tokens_per_minute is not None
        if limits.tokens_per_minute is not None and charge > limits.tokens_per_minute:
            asked = (f"{output_tokens} output tokens asked" if output_tokens is not None else
                     f"{self.settings.default_max_tokens} output tokens charged for a request without max_tokens")
            raise Throttled(TOKENS_PER_MINUTE, limits.tokens_per_minute, reset, _headers(limits, None, reset),
                            f"tokens_per_minute: this request alone (about {token_estimate(body_bytes)} prompt "
                            f"tokens + {asked}) exceeds the tenant's {limits.tokens_per_minute}; set max_tokens "
                            "lower")
        lease = self.new_lease() if limits.concurrent_streams is not None else None
        try:
            counted = self.store.admit(tenant, limits, lease, charge, now, self.settings.lease_s)
        except Exception as error:  # noqa: BLE001 - the store failed (timeout, connection, throttling, a bug of its own)
            # A write that timed out may have been applied all the same: its lease is given back at the end.
            maybe_held = lease if _may_have_been_applied(error) else None
            if self.settings.on_store_error == "closed":
                self.finish(Admission(tenant, rule, limits, lease=maybe_held), None)
                raise LimitsUnavailable("the per-tenant limits could not be checked",
                                        _headers(limits, None, reset, unchecked=True)) from None
            admission.store_error = True
            admission.lease = maybe_held
            admission.headers = _headers(limits, None, reset, unchecked=True)
            admission.took_ms = (time.perf_counter() - started) * 1000.0
            return admission
        if isinstance(counted, Refused):
            value = getattr(limits, counted.limit)
            if counted.limit == CONCURRENT_STREAMS:
                raise Throttled(CONCURRENT_STREAMS, value, STREAM_RETRY_AFTER_S, _headers(limits, None, reset),
                                f"concurrent_streams: {value} streams of this tenant are in flight; retry when one ends")
            raise Throttled(counted.limit, value, reset, _headers(limits, None, reset),
                            f"{counted.limit}: the tenant's {value} for this minute are used; retry in {reset} s")
        admission.lease = lease
        if lease is not None:
            self.renewer.hold(tenant, lease)
        admission.window = window_of(now) if per_minute else None
        admission.headers = _headers(limits, counted, reset)
        admission.took_ms = (time.perf_counter() - started) * 1000.0
        return admission

    def finish(self, admission: Admission | None, tokens_used: int | None) -> None:
        """Free the stream and replace the charge by the engine's usage (when reported), in one
        write. Never raises: a failure here leaves the lease to expire (within ``lease_s``: nothing
        renews it now) and the charge counted."""
        if admission is None:
            return
        if admission.lease is not None:
            self.renewer.drop(admission.lease)
        correct = (admission.window is not None and admission.limits.tokens_per_minute is not None
                   and tokens_used is not None)
        delta = tokens_used - admission.charge if correct else None
        if admission.lease is None and not delta:
            return
        try:
            self.store.finish(admission.tenant, admission.lease, admission.window if correct else None, delta)
        except Exception:  # noqa: BLE001 - the lease expires on its own
            pass
        admission.lease = None


def _may_have_been_applied(error: Exception) -> bool:
    """Whether a failed write may still have reached the table: not when the connection never opened
    or the store answered with an error; yes after a read timeout or anything unknown."""
    from botocore.exceptions import ClientError
    from botocore.exceptions import ConnectionError as NotConnected

    return not isinstance(error, (ClientError, NotConnected))


#: Said on the answers of a request the store could not count (``x-ratelimit-store``): its limits
#: were not checked, so no ``remaining`` figure is given.
STORE_UNAVAILABLE: Final = "unavailable"


def _headers(limits: TenantLimits, counted: Counted | None, reset: int, *, unchecked: bool = False) -> dict[str, str]:
    """The ``x-ratelimit-*`` headers of an answer (remaining 0 when refused; none, and
    ``x-ratelimit-store: unavailable``, when the store could not be asked)."""
    headers = {}
    for name, limit, used in (("requests", limits.requests_per_minute, counted.requests if counted else None),
                              ("tokens", limits.tokens_per_minute, counted.tokens if counted else None),
                              ("streams", limits.concurrent_streams, counted.leases if counted else None)):
        if limit is not None:
            headers[f"x-ratelimit-limit-{name}"] = str(limit)
            if not unchecked:
                headers[f"x-ratelimit-remaining-{name}"] = str(max(0, limit - used) if used is not None else 0)
            if name != "streams":
                headers[f"x-ratelimit-reset-{name}"] = f"{reset}s"
    if unchecked:
        headers["x-ratelimit-store"] = STORE_UNAVAILABLE
    return headers


def admit_request(limiter: Limiter, tenant: str, body: bytes, record: Any,
                  state: Any) -> tuple[int, str, dict, dict[str, str]] | None:
    """Admit one request of the front door (its canonical ``body``) under its tenant's limits,
    noting on its ``record`` (the log line) what applied and on ``state`` what it holds; if refused,
    (status, code, JSON body, headers) of the answer: 429 over a limit, 503 when the store failed and
    the stage says closed."""
    output_tokens = None
    if limiter.charges_tokens(tenant):  # the body is read again only where tokens are counted
        try:
            output_tokens = requested_output_tokens(json.loads(body))
        except ValueError:  # not JSON: charged the stage's default
            pass
    try:
        admission = state.admission = limiter.admit(tenant, len(body), output_tokens)
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
                                                     "status": 503}}, unavailable.headers
    if admission is not None:
        record.limit_rule, record.limiter_ms = admission.rule, admission.took_ms
        record.limiter_store_error = admission.store_error
        state.limit_headers = admission.headers
    return None
