"""Routing as SageMaker does it: the strategies, the PREFIX_AWARE routing key of a request, stable 64-bit hashes."""

from __future__ import annotations

import enum
import functools
import hashlib
import math
import random
from typing import Hashable, Sequence

from prefix_routing.rules.errors import UserError

PREFIX_LENGTH_RANGE = (1024, 65536)  # PrefixAwareRoutingConfig.PrefixLength
CONCURRENCY_THRESHOLD_RANGE = (1, 1024)  # PrefixAwareRoutingConfig.ConcurrencyThreshold


DEFAULT_BYTES_PER_TOKEN = 4.0
DEFAULT_BLOCK_TOKENS = 512  # the Mooncake trace's block size


ROUTING_OVERHEAD_S = 0.0016  # AWS blog: prefix-aware routing added 1.3–1.9 ms


MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / golden ratio: Fibonacci hashing


class Strategy(str, enum.Enum):
    RANDOM = "RANDOM"
    LEAST_OUTSTANDING_REQUESTS = "LEAST_OUTSTANDING_REQUESTS"
    PREFIX_AWARE = "PREFIX_AWARE"
    KV_AWARE = "KV_AWARE"

    @classmethod
    def parse(cls, text: str) -> "Strategy":
        key = text.strip().upper().replace("-", "_")
        aliases = {"LOR": "LEAST_OUTSTANDING_REQUESTS", "PREFIX": "PREFIX_AWARE", "KV": "KV_AWARE"}
        key = aliases.get(key, key)
        try:
            return cls(key)
        except ValueError:
            raise UserError(
                f"unknown routing strategy {text!r}; allowed: {', '.join(s.value for s in cls)}"
            ) from None


PREFIX_AWARE = Strategy.PREFIX_AWARE
RANDOM = Strategy.RANDOM
KV_AWARE = Strategy.KV_AWARE
LEAST_OUTSTANDING = Strategy.LEAST_OUTSTANDING_REQUESTS


def key_blocks(
    prefix_length: int,
    bytes_per_token: float = DEFAULT_BYTES_PER_TOKEN,
    block_tokens: float = DEFAULT_BLOCK_TOKENS,
    block_bytes: float | None = None,
    key_offset_bytes: int = 0,
) -> int:
    """How many leading blocks a routing key of ``prefix_length`` body bytes covers (0: none)."""
    size = block_bytes if block_bytes else block_tokens * bytes_per_token
    prompt_bytes = prefix_length - key_offset_bytes
    return 0 if prompt_bytes <= 0 else math.ceil(prompt_bytes / size)


def routing_key(blocks: Sequence[Hashable], k: int, routing_id: str | None = None) -> Hashable:
    """The key of a request: the id of its k-th block (chained ids), or its last if shorter."""
    n = len(blocks)
    key = blocks[(k if k < n else n) - 1] if n and k else None
    return key if routing_id is None else (routing_id, key)


def stable_hash(value: Hashable) -> int:
    """A 64-bit hash that is the same in every process (``hash`` of str is salted per process)."""
    if value is None:
        return 0x5BD1E995
    if isinstance(value, int):
        return value & MASK
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, (bytes, bytearray)):
        return int.from_bytes(hashlib.blake2b(value, digest_size=8).digest(), "little")
    if isinstance(value, tuple):
        x = 0x9E3779B97F4A7C15
        for item in value:
            x = mix64(x ^ stable_hash(item))
        return x
    return stable_hash(repr(value))


# Routing keys' stable hashes, shared by every router in the process: the advisor and tune simulate
# one window under many settings, and a string key's blake2b costs more than the rest of its routing.
_key_hash = functools.lru_cache(maxsize=1 << 18)(stable_hash)


def mix64(x: int) -> int:
    """splitmix64's finalizer: a cheap, well-spread 64-bit mix."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def spill_copy(out: Sequence[int], home: int, threshold: int, copies: int) -> int:
    """Where ConcurrencyThreshold sends a request whose home copy is busy.

    ``out`` is the in-flight count of every copy (``copies`` per instance). Another copy on the home
    instance below the threshold first (the least loaded, in order from the home copy), then one on
    another instance (from the next one on); when every copy is at the threshold, the least loaded
    of all (home on ties).
    """
    n, c = len(out), copies
    base = home - home % c
    best, best_load = -1, threshold
    for j in range(1, c):  # other copies on the same instance, in order from the home copy
        g = base + (home - base + j) % c
        if out[g] < best_load:
            best, best_load = g, out[g]
    if best >= 0:
        return best
    instances = n // c
    for i in range(1, instances):  # other instances, from the next one on
        b = ((base // c + i) % instances) * c
        for g in range(b, b + c):
            if out[g] < best_load:
                best, best_load = g, out[g]
    if best >= 0:
        return best
    # Every copy is at the threshold: the least loaded of all (home on ties).
    best, best_load = home, out[home]
    for j in range(1, n):
        g = (home + j) % n
        if out[g] < best_load:
            best, best_load = g, out[g]
    return best


def no_choice(active: list[int]) -> tuple[int, bool]:
    """Fewer than two copies serving: the one there is, or none (copy -1: the request fails,
    NoCapacityInvocationFailures)."""
    return (active[0], False) if active else (-1, False)


class RoutingPolicy:
    """One strategy's choice of a copy, behind one interface: ``choose(key, out) -> (copy, spilled)``
    given each copy's in-flight count (copy -1: none is serving). It reads its :class:`Router`'s
    shared state (the copies, the serving ones, the seed, the threshold), and :meth:`Router.choose`
    is its ``choose`` itself, bound once, so routing costs no call more than a branch would."""

    __slots__ = ("router",)

    def __init__(self, router: "Router") -> None:
        self.router = router

    def choose(self, key: Hashable, out: Sequence[int]) -> tuple[int, bool]:  # pragma: no cover - interface
        raise NotImplementedError


class PrefixAwarePolicy(RoutingPolicy):
    """The key's home copy by a seeded 64-bit hash, with the ConcurrencyThreshold spill of
    :func:`spill_copy`; among the serving copies only, rendezvous hashing (:meth:`Router.set_active`)."""

    __slots__ = ()

    def choose(self, key: Hashable, out: Sequence[int]) -> tuple[int, bool]:
        router = self.router
        active = router.active
        if active is not None:
            if len(active) < 2:
                return no_choice(active)
            home = router.home(key) if router.keep_homes else -1
            if home < 0 or home not in active:
                kh = mix64(_key_hash(key) ^ router.seed_mix)
                home = max(active, key=lambda c: mix64(kh ^ (c + 1) * GOLDEN & MASK))
            if out[home] < router.threshold:
                return home, False
            loads = [out[c] for c in active]
            spill = active[spill_copy(loads, active.index(home), router.threshold, 1)]
            return spill, spill != home
        if router.n == 1:
            return 0, False
        g = router.home(key)
        if out[g] >= router.threshold:
            spill = spill_copy(out, g, router.threshold, router.copies_per_instance)
            return spill, spill != g
        return g, False


class RandomPolicy(RoutingPolicy):
    """A serving copy drawn at random."""

    __slots__ = ()

    def choose(self, key: Hashable, out: Sequence[int]) -> tuple[int, bool]:
        router = self.router
        active = router.active
        if active is not None:
            if len(active) < 2:
                return no_choice(active)
            return active[int(router.rng.random() * len(active))], False
        n = router.n
        if n == 1:
            return 0, False
        return int(router.rng.random() * n), False


class LeastOutstandingPolicy(RoutingPolicy):
    """The serving copy with the fewest requests in flight, ties broken from a random start."""

    __slots__ = ()

    def choose(self, key: Hashable, out: Sequence[int]) -> tuple[int, bool]:
        router = self.router
        active = router.active
        if active is not None:
            if len(active) < 2:
                return no_choice(active)
            start = int(router.rng.random() * len(active))
            order = active[start:] + active[:start]
            return min(order, key=out.__getitem__), False
        n = router.n
        if n == 1:
            return 0, False
        start = int(router.rng.random() * n)
        g, best = start, out[start]
        for j in range(start + 1, start + n):
            j = j if j < n else j - n
            if out[j] < best:
                g, best = j, out[j]
        return g, False


class CacheAwarePolicy(RoutingPolicy):
    """KV_AWARE: it needs the copies' caches, which only the fleet model has (``Fleet``)."""

    __slots__ = ()

    def choose(self, key: Hashable, out: Sequence[int]) -> tuple[int, bool]:
        router = self.router
        active = router.active
        if active is not None:
            if len(active) < 2:
                return no_choice(active)
        elif router.n == 1:
            return 0, False
        raise UserError(f"strategy {router.strategy.value}: needs the copies' caches; route it with the fleet model")


#: The policy of each strategy.
POLICIES: dict = {}


class Router:
    """Where SageMaker sends one request among ``copies`` copies, given their in-flight counts.

    The state every strategy shares (the copies, the serving ones, the seed, the ConcurrencyThreshold)
    and the strategy's :class:`RoutingPolicy`: RANDOM, LEAST_OUTSTANDING_REQUESTS and PREFIX_AWARE as
    the fleet model routes; KV_AWARE needs the copies' caches and stays in the fleet. The emulator in
    front of real engines routes with this class, so both see the same homes for the same keys and seed.
    """

    __slots__ = ("strategy", "n", "copies_per_instance", "threshold", "rng", "seed_mix", "_home_of", "active",
                 "keep_homes", "policy", "choose")

    def __init__(self, strategy: Strategy, copies: int, *, concurrency_threshold: int,
                 copies_per_instance: int = 1, seed: int = 0, rng: random.Random | None = None) -> None:
        if copies < 1 or copies % copies_per_instance:
            raise UserError(f"copies={copies}: must be a positive multiple of copies_per_instance={copies_per_instance}")
        self.strategy = Strategy.parse(strategy) if isinstance(strategy, str) else strategy
        self.n = copies
        self.copies_per_instance = copies_per_instance
        self.threshold = concurrency_threshold
        self.rng = rng if rng is not None else random.Random(seed)
        self.seed_mix = mix64(seed & MASK)
        self._home_of: dict = {}
        self.active: list[int] | None = None  # with copy autoscaling: the copies serving now
        self.keep_homes = False
        self.policy = POLICIES[self.strategy](self)
        #: ``choose(key, out) -> (copy, spilled)`` for a request with routing ``key`` when copy g has
        #: ``out[g]`` in flight (copy -1: none is serving): the policy's own method.
        self.choose = self.policy.choose

    def set_active(self, copies: list[int] | None, *, keep_homes: bool = False) -> None:
        """Route among ``copies`` only (None: all ``n``). PREFIX_AWARE then picks a key's home by
        rendezvous hashing (the serving copy with the highest seeded hash of key and copy), so a
        change of copies moves only the keys of the copies added or removed (an assumption: AWS
        says most requests keep their instance on scaling, not how).

        ``keep_homes``: a key whose :meth:`home` is among ``copies`` stays there, and only the keys of
        the missing copies are rehashed among the others: for copies that are out for a while (an
        unhealthy engine), so that its return moves back only its own keys.
        """
        self.active = None if copies is None else list(copies)
        self.keep_homes = keep_homes

    def home(self, key: Hashable) -> int:
        """The copy a routing key maps to: Fibonacci hashing of integer ids (chained block ids),
        a memoized mix of ``stable_hash`` for other keys; the same in every process."""
        if type(key) is int:
            return ((((key ^ self.seed_mix) * GOLDEN) & MASK) >> 16) % self.n
        g = self._home_of.get(key)
        if g is None:
            g = self._home_of[key] = mix64(_key_hash(key) ^ self.seed_mix) % self.n
        return g


POLICIES.update({PREFIX_AWARE: PrefixAwarePolicy, RANDOM: RandomPolicy, LEAST_OUTSTANDING: LeastOutstandingPolicy,
                 KV_AWARE: CacheAwarePolicy})
