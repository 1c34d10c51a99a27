"""Copy autoscaling in the fleet model: target tracking on concurrent requests per copy, as the stacks configure it.

What the stacks deploy (``stacks/constructs/copy_autoscaling.py``): Application Auto Scaling on the
inference component's copy count, target tracking on
``ConcurrentRequestsPerCopyHighResolution`` with the stage's target, scale-out and scale-in
cooldowns and the stage's copy bounds; with a minimum of zero, a step policy adds one copy when a
request finds none (``NoCapacityInvocationFailures``). Instances follow copies (managed instance
scaling), so the model counts copies only.

The model (:class:`CopyPool`), evaluated every ``period_s`` (60 s, the alarms' period):

- the metric is the time-averaged number of requests in flight over the period, normalized by the
  copies (starting ones included), as the component-level metric is;
- target tracking wants ``ceil(copies × metric ÷ target)`` copies, within the bounds; it scales out
  when that is more than now and the scale-out cooldown has passed since the last scale-out; it
  scales in only to what each of the last 15 periods allows (the low alarm's 15 datapoints) and
  when the scale-in cooldown has passed since the last scaling of either kind;
- a new copy serves ``startup_s`` after it is added (model download and load: an assumption, as
  AWS publishes no figure; 300 s by default), with an empty cache; a removed copy takes no new
  requests, finishes those it has and loses its cache;
- with no copy serving, a request fails at once (``NoCapacityInvocationFailures``); with a
  minimum of zero the next evaluation adds one copy.

Which copy a prefix goes to when the copies change: SageMaker says most requests keep their
instance when copies scale, not how. **Assumption:** rendezvous (highest-random-weight) hashing
over the serving copies, so adding a copy moves only the keys it wins and removing one moves only
its own keys (:meth:`prefix_routing.lab.routing.Router.set_active`).

Reported: copies over time (``history``), copy-hours (the cost: provisioned copies, start-up
included), the seconds any copy's time-averaged concurrency spent above the hotspot threshold
(``hotspot_factor`` × the target, as the stage's hotspot alarm), and the scale events.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from prefix_routing.rules.errors import UserError

COPY_STARTUP_S = 300.0  # assumption (see the module docstring)
PERIOD_S = 60.0
SCALE_IN_PERIODS = 15  # target tracking's low alarm: 15 of 15 one-minute datapoints


@dataclass(frozen=True)
class AutoscalingSettings:
    target_per_copy: float = 4.0  # scaling.target_concurrent_requests_per_copy
    min_copies: int = 1
    max_copies: int = 8
    initial_copies: int | None = None  # at the start; None: min_copies (at least 1)
    scale_out_cooldown_s: float = 60.0
    scale_in_cooldown_s: float = 300.0
    startup_s: float = COPY_STARTUP_S
    period_s: float = PERIOD_S
    hotspot_factor: float = 2.0  # alarms.hotspot_factor: a copy above this × target is hot

    def __post_init__(self) -> None:
        if not (isinstance(self.target_per_copy, (int, float)) and 0 < self.target_per_copy <= 1024):
            raise UserError(f"autoscaling target_per_copy={self.target_per_copy!r}: must be more than 0, at most 1024")
        if not (isinstance(self.min_copies, int) and isinstance(self.max_copies, int)
                and 0 <= self.min_copies <= self.max_copies and self.max_copies >= 1):
            raise UserError(f"autoscaling copies {self.min_copies}..{self.max_copies}: need 0 <= min <= max, max >= 1")
        start = self.start_copies
        if not self.min_copies <= start <= self.max_copies and not (start == 1 and self.min_copies == 0):
            raise UserError(f"autoscaling initial_copies={self.initial_copies}: must be within "
                            f"{self.min_copies}..{self.max_copies}")
        for name in ("scale_out_cooldown_s", "scale_in_cooldown_s", "startup_s"):
            if not 0 <= getattr(self, name) <= 86_400:
                raise UserError(f"autoscaling {name}={getattr(self, name)!r}: seconds from 0 to 86400")
        if not 1 <= self.period_s <= 3600:
            raise UserError(f"autoscaling period_s={self.period_s!r}: seconds from 1 to 3600")

    @property
    def start_copies(self) -> int:
        return self.initial_copies if self.initial_copies is not None else max(1, self.min_copies)


class CopyPool:
    """Which of ``n`` copy slots are provisioned and serving, and the scaling decisions.

    The fleet calls :meth:`record` before every change of a copy's in-flight count (for the
    time-averaged concurrency) and :meth:`tick` at every period boundary.
    """

    def __init__(self, settings: AutoscalingSettings, n: int) -> None:
        if settings.max_copies > n:
            raise UserError(f"autoscaling max_copies={settings.max_copies}: the fleet has {n} copies")
        self.settings = settings
        self.n = n
        self.serving_from = [math.inf] * n  # inf: not provisioned
        for g in range(settings.start_copies):
            self.serving_from[g] = 0.0
        self.ever = set(range(settings.start_copies))  # copy slots provisioned at some time
        self.area = [0.0] * n
        self.last = [0.0] * n
        self.next_tick = settings.period_s
        self.last_out = self.last_scale = -math.inf
        self.copy_seconds = 0.0
        self.hotspot_seconds = 0.0
        self.no_capacity = 0  # requests that found no copy serving
        self._wanted_from_zero = False
        self.events: list[tuple[float, int, int]] = []  # (time, copies before, copies after)
        # (t, provisioned, serving, metric, the busiest serving copy's concurrency, hot)
        self.history: list[tuple[float, int, int, float, float, bool]] = []
        self._totals: deque = deque(maxlen=SCALE_IN_PERIODS)  # the last periods' total concurrency

    def provisioned(self) -> list[int]:
        return [g for g in range(self.n) if self.serving_from[g] != math.inf]

    def serving(self, now: float) -> list[int]:
        return [g for g in range(self.n) if self.serving_from[g] <= now]

    def next_start(self, now: float) -> float:
        """When the next starting copy begins to serve (inf if none is starting)."""
        return min((t for t in self.serving_from if now < t < math.inf), default=math.inf)

    def record(self, g: int, now: float, in_flight: int) -> None:
        self.area[g] += in_flight * (now - self.last[g])
        self.last[g] = now

    def tick(self, t: float, out: list[int]) -> list[int]:
        """Evaluate at ``t``; returns the copies removed now (their caches are to be dropped)."""
        s = self.settings
        period = s.period_s
        for g in range(self.n):
            self.record(g, t, out[g])
        serving = self.serving(t)
        loads = [self.area[g] / period for g in range(self.n)]
        self.area = [0.0] * self.n
        provisioned = self.provisioned()
        self.copy_seconds += len(provisioned) * period
        total = sum(loads)  # time-averaged requests in flight, all copies
        # The component's metric: concurrent requests normalized by its copies (starting ones too).
        metric = total / len(provisioned) if provisioned else 0.0
        self._totals.append(total)
        hot = any(loads[g] > s.hotspot_factor * s.target_per_copy for g in serving)
        if hot:
            self.hotspot_seconds += period
        busiest = max((loads[g] for g in serving), default=0.0)
        self.history.append((t, len(provisioned), len(serving), metric, busiest, hot))
        current = len(provisioned)
        if current == 0:
            desired = 1 if self.no_capacity and s.min_copies == 0 else 0
            self.no_capacity = 0
        else:
            desired = math.ceil(total / s.target_per_copy - 1e-9)  # = copies × metric ÷ target
            if desired < current:  # scale in only to what the last 15 periods all allow (the low alarm)
                if len(self._totals) < self._totals.maxlen:
                    desired = current
                else:
                    desired = max(desired, math.ceil(max(self._totals) / s.target_per_copy - 1e-9))
        desired = max(s.min_copies, min(s.max_copies, desired))
        removed: list[int] = []
        if desired > current and (current == 0 or t - self.last_out >= s.scale_out_cooldown_s):
            free = [g for g in range(self.n) if self.serving_from[g] == math.inf][: desired - current]
            for g in free:
                self.serving_from[g] = t + s.startup_s
            self.ever.update(free)
            self.last_out = self.last_scale = t
            self.events.append((t, current, desired))
        elif desired < current and t - self.last_scale >= s.scale_in_cooldown_s:
            removed = provisioned[desired - current:]  # the highest slots go first
            for g in removed:
                self.serving_from[g] = math.inf
            self.last_scale = t
            self.events.append((t, current, desired))
        self.next_tick = t + period
        return removed

    def summary(self) -> dict:
        outs = [t for t, before, after in self.events if after > before]
        settled = outs[-1] + self.settings.startup_s if outs else 0.0  # the last scale-out's copies serve
        return {
            "copy_hours": self.copy_seconds / 3600.0,
            "hotspot_seconds": self.hotspot_seconds,
            # Hot periods after the last scale-out's copies began to serve: what scaling did not fix.
            "hotspot_seconds_after_scaling": sum(self.settings.period_s for t, *_, hot in self.history
                                                 if hot and t > settled),
            "scale_events": [{"t_s": t, "from": a, "to": b} for t, a, b in self.events],
            "hotspot_threshold": self.settings.hotspot_factor * self.settings.target_per_copy,
            "copies_over_time": [{"t_s": t, "provisioned": p, "serving": s, "concurrency_per_copy": m,
                                  "busiest_copy": b, "hot": h} for t, p, s, m, b, h in self.history],
        }
