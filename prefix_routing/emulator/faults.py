"""Fault injection: throttling, model errors, slow first bytes, broken streams, by rate or by request index (seeded)."""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Any

from prefix_routing.emulator.protocol import ERROR_STATUS, STREAM_ERROR_KINDS
from prefix_routing.rules.errors import UserError

MAX_FIRST_CHUNK_DELAY_S = 3600


@dataclass(frozen=True)
class Faults:
    """Fault injection. Counts apply to requests in order of arrival (all operations together);
    fractions draw from ``random.Random(seed)``, the same number of draws for every request, so a
    run is reproducible for a given arrival order.

    Order of checks per request: validation, throttling, error, then the backend; stream faults
    apply to streamed answers only (``truncate`` wins over ``stream_error`` over ``drop`` when several
    are drawn for one request).
    """

    #: Throttle the first K requests, then a fraction p of the rest.
    throttle_first: int = 0
    throttle_rate: float = 0.0
    throttle_status: int = 400
    #: Answer ``error_kind`` (default ``ServiceUnavailable`` 503) to the first K requests after the
    #: throttled ones, then to a fraction p.
    error_first: int = 0
    error_rate: float = 0.0
    error_kind: str = "ServiceUnavailable"
    #: After M chunks, a ``stream_error_kind`` event instead of the rest of the answer, on a fraction
    #: of streamed answers (if the answer has fewer chunks, the error replaces its natural end).
    stream_error_after: int | None = None
    stream_error_rate: float | None = None  # default 1.0; given alone, stream_error_after defaults to 0
    stream_error_kind: str = "ModelStreamError"
    stream_error_code: str = "ModelInvocationTimeExceeded"
    #: After M chunks the stream ends cleanly, without error: a truncated answer.
    truncate_after: int | None = None
    truncate_rate: float | None = None  # default 1.0; given alone, truncate_after defaults to 0
    #: After M chunks the server closes the connection without ending the chunked body.
    drop_after: int | None = None
    drop_rate: float | None = None  # default 1.0; given alone, drop_after defaults to 0
    #: Extra delay before the first chunk (seconds), on a fraction of answers.
    first_chunk_delay: float = 0.0
    first_chunk_delay_rate: float = 1.0
    #: Split every chunk into payload parts of at most this many bytes (0: no split).
    fragment_bytes: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        # A stream fault's rate alone means "from the first chunk": before, it injected nothing, silently.
        for kind in ("stream_error", "truncate", "drop"):
            rate, after = getattr(self, f"{kind}_rate"), getattr(self, f"{kind}_after")
            if rate is not None and after is None:
                object.__setattr__(self, f"{kind}_after", 0)
            if rate is None:
                object.__setattr__(self, f"{kind}_rate", 1.0)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_rate") and not 0.0 <= value <= 1.0:
                raise UserError(f"fault {f.name}={value}: must be between 0 and 1")
            if f.name.endswith(("_first", "_after", "_bytes")) and value is not None and value < 0:
                raise UserError(f"fault {f.name}={value}: must be >= 0")
        if not 0 <= self.first_chunk_delay <= MAX_FIRST_CHUNK_DELAY_S:  # NaN fails both
            raise UserError(f"fault first_chunk_delay={self.first_chunk_delay}: allowed 0 to "
                            f"{MAX_FIRST_CHUNK_DELAY_S} seconds")
        if self.error_kind not in ERROR_STATUS:
            raise UserError(f"fault error_kind={self.error_kind!r}: one of {', '.join(ERROR_STATUS)}")
        if self.stream_error_kind not in STREAM_ERROR_KINDS:
            raise UserError(
                f"fault stream_error_kind={self.stream_error_kind!r}: one of {', '.join(STREAM_ERROR_KINDS)}"
            )

    @classmethod
    def from_spec(cls, spec: str) -> Faults:
        """Parse ``"throttle_rate=0.1,stream_error_after=3,seed=7"`` (for a command line).

        Raises :class:`~prefix_routing.rules.errors.UserError` naming the bad item.
        """
        types = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            key, sep, raw = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in types:
                raise UserError(f"fault {item!r}: expected NAME=VALUE with NAME one of {', '.join(types)}")
            kind = str(types[key])
            raw = raw.strip()
            try:
                if kind.startswith("int"):
                    values[key] = None if raw.lower() == "none" else int(raw)
                elif kind.startswith("float"):
                    values[key] = float(raw)
                else:
                    values[key] = raw
            except ValueError:
                raise UserError(f"fault {item!r}: {raw!r} is not a number") from None
        return cls(**values)


@dataclass(frozen=True)
class FaultPlan:
    throttle: bool = False
    error: bool = False
    stream_error_after: int | None = None
    truncate_after: int | None = None
    drop_after: int | None = None
    first_chunk_delay: float = 0.0


def plan_faults(faults: Faults, index: int, rng: random.Random) -> FaultPlan:
    draws = [rng.random() for _ in range(6)]  # always six: reproducible whatever is enabled
    throttle = index < faults.throttle_first or draws[0] < faults.throttle_rate
    error = not throttle and (
        faults.throttle_first <= index < faults.throttle_first + faults.error_first or draws[1] < faults.error_rate
    )
    truncate = faults.truncate_after if faults.truncate_after is not None and draws[3] < faults.truncate_rate else None
    stream_error = (
        faults.stream_error_after
        if truncate is None and faults.stream_error_after is not None and draws[2] < faults.stream_error_rate
        else None
    )
    drop = (
        faults.drop_after
        if truncate is None and stream_error is None and faults.drop_after is not None and draws[4] < faults.drop_rate
        else None
    )
    delay = faults.first_chunk_delay if draws[5] < faults.first_chunk_delay_rate else 0.0
    return FaultPlan(throttle, error, stream_error, truncate, drop, delay)
