"""Replica steering's shared state: one :class:`HotPrefixState` per hot prefix, in DynamoDB.

A Lambda execution environment serves one request at a time, so the in-flight counts the rule
(:mod:`prefix_routing.rules.steering`) chooses by live in one store every environment shares: the
front door's table (the one that holds the per-tenant limits' counts; the stack creates it whenever
limits or steering need it), one item per hot prefix, ``replicas#<routing id>#<fingerprint>``:

- ``v``: a version, for optimistic concurrency: every write is conditional on the version it read
  (or on the item's absence) and sets the next one; a lost race reads again, at most
  :data:`MAX_ROUNDS` rounds and not past :data:`SEND_BUDGET_MS`, then the store counts as failed;
- ``s``: the slots, a list of ``{m: number, f: in flight, q: requests, j: judged}`` (at most
  :data:`MAX_SLOTS`: the rule uses ``min(replicas, copies)`` slots and ``max_replicas`` ≤ 64);
  ``n``: the next fresh number, ``rd``: redraws, ``c``: collisions;
- ``expires_at``: DynamoDB's TTL, :func:`keep_s` after the last write (a few half-lives of the
  share estimate: a prefix idle that long is cold again, and a fresh state is as good).

At the send: one consistent read and one conditional put (:meth:`Steering.choose`). At the answer's
end: one conditional update that only gives the in-flight count back (and marks the replica judged)
when :meth:`HotPrefixState.answered` would do no more than that; the first answer of a replica that
may reveal a collision, or a slot retired meanwhile, reads the state and applies the rule itself
(:meth:`Steering.answered`). A failure raises: the caller falls back to replicas in turn.

Nothing here imports boto3: the DynamoDB client is passed in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from prefix_routing.rules.limits import RELEASE_TIMEOUT_MS
from prefix_routing.rules.replication import ReplicationSettings
from prefix_routing.rules.steering import HotPrefixState, ReplicaSlot, reveals_collision
from prefix_routing.rules.telemetry import LIMITS_TABLE_KEY, LIMITS_TABLE_TTL

KEY: Final = LIMITS_TABLE_KEY
TTL_ATTRIBUTE: Final = LIMITS_TABLE_TTL
ITEM_PREFIX: Final = "replicas#"
#: Slots an item holds at most (``max_replicas`` ≤ 64): an item stays far below DynamoDB's 400 KB.
MAX_SLOTS: Final = 64
#: Read-and-write rounds of one decision before the store counts as failed (each lost a race).
MAX_ROUNDS: Final = 3
#: Each store call's own bound at the send (the client's connect and read timeouts, no retries).
SEND_TIMEOUT_MS: Final = 50
#: No new round begins once the send's store calls have taken this long: the most the store adds to
#: the first token is this plus one call's bound.
SEND_BUDGET_MS: Final = 100
#: The answer's calls (after the answer's end marker is handed on) get the limits' release bound.
ANSWER_TIMEOUT_MS: Final = RELEASE_TIMEOUT_MS
#: An item outlives its last write by this many half-lives of the share estimate, and at least
#: :data:`MIN_KEEP_S` (longer than a request may stream, so an answer finds its state).
KEEP_HALF_LIVES: Final = 4
MIN_KEEP_S: Final = 900.0


class StoreContended(Exception):
    """Every round lost its race (or the budget ran out): the decision falls back to turns."""


def item_key(routing_id: str | None, fingerprint: str | None) -> str:
    """The partition key value of a prefix's state."""
    return f"{ITEM_PREFIX}{routing_id or ''}#{fingerprint or ''}"


def keep_s(settings: ReplicationSettings) -> float:
    """How long an item outlives its last write."""
    return max(MIN_KEEP_S, KEEP_HALF_LIVES * settings.half_life_s)


def state_to_item(state: HotPrefixState) -> dict[str, Any]:
    """The state's attributes (DynamoDB's typed JSON), key, version and TTL aside."""
    return {
        "s": {"L": [{"M": {"m": {"N": str(s.number)}, "f": {"N": str(s.in_flight)}, "q": {"N": str(s.requests)},
                           "j": {"BOOL": s.judged}}} for s in state.slots[:MAX_SLOTS]]},
        "n": {"N": str(state.next_number)},
        "rd": {"N": str(state.redraws)},
        "c": {"N": str(state.collisions)},
    }


def state_from_item(item: dict[str, Any]) -> tuple[HotPrefixState, int]:
    """(state, version) of an item; an unreadable one is a fresh state at its version (it is rewritten)."""
    version = _int(item.get("v"))
    try:
        slots = [ReplicaSlot(_int(m["M"]["m"], -1), max(0, _int(m["M"]["f"])), max(0, _int(m["M"]["q"])),
                             bool(m["M"]["j"]["BOOL"])) for m in item["s"]["L"][:MAX_SLOTS]]
        state = HotPrefixState(slots=slots, next_number=_int(item["n"], 1), redraws=_int(item["rd"]),
                               collisions=_int(item["c"]))
    except (KeyError, TypeError, ValueError):
        return HotPrefixState(), version
    numbers = [s.number for s in slots]
    if not slots or slots[0].number != 0 or min(numbers) < 0 or len(set(numbers)) != len(numbers) \
            or state.next_number <= max(numbers):
        return HotPrefixState(), version
    return state, version


def _int(attribute: Any, default: int = 0) -> int:
    try:
        return int(attribute["N"]) if isinstance(attribute, dict) else default
    except (KeyError, TypeError, ValueError):
        return default


class SteeringStore(Protocol):
    """Where the states live (:class:`DynamoSteeringStore`; tests use one in memory)."""

    def read(self, key: str, *, answer: bool = False) -> tuple[HotPrefixState, int] | None:
        """(state, version) of the prefix ``key``, read consistently; None: no item. ``answer``: a call
        at the answer's end (its own, longer bound)."""

    def write(self, key: str, state: HotPrefixState, version: int | None, expires_at: float, *,
              answer: bool = False) -> bool:
        """Store ``state`` as version ``version + 1`` (1 when ``version`` is None) if the item is still
        at ``version`` (absent when None); False: another environment wrote first."""

    def release(self, key: str, index: int, number: int, *, judge: bool, must_be_judged: bool,
                expires_at: float) -> bool:
        """Give back one in-flight count of slot ``index`` (and mark it judged when ``judge``), as one
        write, if that slot still has number ``number``, has a request in flight and, when
        ``must_be_judged``, was judged already; False: the condition failed and nothing changed."""


class DynamoSteeringStore:
    """The states in the table ``table_name``, through a boto3 ``dynamodb`` client whose calls are
    bounded by :data:`SEND_TIMEOUT_MS`; ``answer_client`` (bounded by :data:`ANSWER_TIMEOUT_MS`)
    serves the answer's calls. ``answer=True`` on :meth:`read` and :meth:`write` picks it."""

    def __init__(self, client: Any, table_name: str, *, answer_client: Any = None) -> None:
        self.client = client
        self.answer_client = answer_client if answer_client is not None else client
        self.table = table_name

    def read(self, key: str, *, answer: bool = False) -> tuple[HotPrefixState, int] | None:
        client = self.answer_client if answer else self.client
        item = client.get_item(TableName=self.table, Key={KEY: {"S": key}}, ConsistentRead=True).get("Item")
        return None if item is None else state_from_item(item)

    def write(self, key: str, state: HotPrefixState, version: int | None, expires_at: float, *,
              answer: bool = False) -> bool:
        client = self.answer_client if answer else self.client
        item = {KEY: {"S": key}, "v": {"N": str((version or 0) + 1)}, TTL_ATTRIBUTE: {"N": str(int(expires_at))},
                **state_to_item(state)}
        if version is None:
            condition = {"ConditionExpression": "attribute_not_exists(#k)", "ExpressionAttributeNames": {"#k": KEY}}
        else:
            condition = {"ConditionExpression": "v = :v", "ExpressionAttributeValues": {":v": {"N": str(version)}}}
        try:
            client.put_item(TableName=self.table, Item=item, **condition)
        except client.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def release(self, key: str, index: int, number: int, *, judge: bool, must_be_judged: bool,
                expires_at: float) -> bool:
        client = self.answer_client
        slot = f"s[{int(index)}]"
        update = f"SET {slot}.f = {slot}.f - :one, v = v + :one, #t = :exp" + (f", {slot}.j = :yes" if judge else "")
        condition = f"{slot}.m = :m AND {slot}.f > :zero" + (f" AND {slot}.j = :yes" if must_be_judged else "")
        values = {":one": {"N": "1"}, ":zero": {"N": "0"}, ":m": {"N": str(number)}, ":exp": {"N": str(int(expires_at))}}
        if judge or must_be_judged:
            values[":yes"] = {"BOOL": True}
        try:
            client.update_item(TableName=self.table, Key={KEY: {"S": key}}, UpdateExpression=update,
                               ConditionExpression=condition, ExpressionAttributeNames={"#t": TTL_ATTRIBUTE},
                               ExpressionAttributeValues=values)
        except client.exceptions.ConditionalCheckFailedException:
            return False
        return True


@dataclass(frozen=True, slots=True)
class Ticket:
    """What a steered request holds until its answer ends: its prefix's item, its slot and number."""

    key: str
    index: int
    number: int


class Steering:
    """The rule of :mod:`prefix_routing.rules.steering` over a :class:`SteeringStore`.

    ``clock``: epoch seconds (the TTL); ``timer``: a monotonic clock in seconds (the send's budget).
    Every method raises on a store failure; the caller decides (turns at the send, a count at the end).
    """

    def __init__(self, store: Any, settings: ReplicationSettings, *, clock: Callable[[], float] = time.time,
                 timer: Callable[[], float] = time.perf_counter, budget_ms: float = SEND_BUDGET_MS) -> None:
        self.store = store
        self.keep_s = keep_s(settings)
        self.clock = clock
        self.timer = timer
        self.budget_s = budget_ms / 1000.0

    def choose(self, key: str, replicas: int, copies: int) -> Ticket:
        """The slot the next request of the prefix ``key`` goes to, its in-flight count taken in the store."""
        started = self.timer()
        rounds = 0
        while rounds < MAX_ROUNDS and (rounds == 0 or self.timer() - started <= self.budget_s):
            rounds += 1
            found = self.store.read(key)
            state, version = found if found is not None else (HotPrefixState(), None)
            slot = state.choose(replicas, copies)
            index = next(i for i, s in enumerate(state.slots) if s is slot)
            if self.store.write(key, state, version, self.clock() + self.keep_s):
                return Ticket(key, index, slot.number)
        raise StoreContended(f"{key}: no write after {rounds} rounds")

    def answered(self, ticket: Ticket, cached_tokens: int | None, key_tokens: float) -> bool:
        """The ticket's answer ended (``cached_tokens`` None: it failed, or the engine did not say):
        :meth:`HotPrefixState.answered` in the store. True when it revealed a collision."""
        expires_at = self.clock() + self.keep_s
        if self.store.release(ticket.key, ticket.index, ticket.number, judge=cached_tokens is not None,
                              must_be_judged=reveals_collision(ticket.number, cached_tokens, key_tokens),
                              expires_at=expires_at):
            return False  # a release, nothing more: what answered() would do here
        for _ in range(MAX_ROUNDS):
            found = self.store.read(ticket.key, answer=True)
            if found is None:
                return False  # expired meanwhile: its counts went with it
            state, version = found
            before = state_to_item(state)
            state.answered(ticket.number, cached_tokens, key_tokens)
            collided = state.collisions > _int(before["c"])
            if state_to_item(state) == before:
                return False  # its slot was retired meanwhile: nothing to give back
            if self.store.write(ticket.key, state, version, expires_at, answer=True):
                return collided
        raise StoreContended(f"{ticket.key}: no write after {MAX_ROUNDS} rounds")
