"""The run: send the work on schedule (open loop) or with bounded concurrency, retry what is retryable, record each result."""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from prefix_routing.loadtest.stream import RETRYABLE, Attempt, describe_error
from prefix_routing.loadtest.work import WorkItem
from prefix_routing.rules.errors import UserError


@dataclass
class RequestResult:
    """One row of the report: a request, sent once (or retried), succeeded or failed with a kind."""

    index: int
    source: str
    ok: bool
    error_kind: str | None
    error_detail: str | None
    status: int | None
    request_id: str | None
    #: Seconds from the start of the run to when the request was issued / was due.
    start_s: float
    scheduled_s: float | None
    ttft_s: float | None
    e2e_s: float | None
    output_tokens: int | None
    prompt_tokens: int | None
    cached_tokens: int | None
    finish_reason: str | None
    body_bytes: int
    bytes_received: int
    attempts: int = 1
    retried: list[str] = field(default_factory=list)
    client_overhead_s: float | None = None

    @property
    def hit_rate(self) -> float | None:
        if self.prompt_tokens and self.cached_tokens is not None:
            return self.cached_tokens / self.prompt_tokens
        return None


@dataclass
class LoadResult:
    results: list[RequestResult]
    started_at: float  # time.time()
    duration_s: float
    stopped_by: str  # "end of input", "max_requests", "duration", "interrupted"
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (source, reason): not sent
    config: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: CPU seconds this process used during the run (all threads).
    client_cpu_s: float | None = None


def _send_with_retries(target: Any, body: bytes, retries: int, rng: random.Random,
                       base_delay: float = 0.1, max_delay: float = 5.0) -> tuple[Attempt, int, list[str], float]:
    """(last attempt, attempts, kinds retried, seconds from the first attempt's start)."""
    start = time.perf_counter()
    retried: list[str] = []
    attempt_no = 0
    while True:
        attempt_no += 1
        attempt_start = time.perf_counter()
        result = target.send(body)
        retryable = result.kind in RETRYABLE or (result.kind or "").startswith("http_5")
        if result.ok or attempt_no > retries or not retryable or result.bytes_received:
            offset = attempt_start - start
            if offset:  # times as the caller saw them, retries included
                if result.ttft_s is not None:
                    result.ttft_s += offset
                if result.e2e_s is not None:
                    result.e2e_s += offset
            return result, attempt_no, retried, offset
        retried.append(result.kind or "")
        time.sleep(rng.uniform(0, min(max_delay, base_delay * 2 ** (attempt_no - 1))))


def run_load(
    items: Iterable[WorkItem],
    target: Any,
    *,
    concurrency: int = 8,
    rate: float | None = None,
    speed: float | None = None,
    max_requests: int | None = None,
    duration: float | None = None,
    retries: int = 0,
    prepare: Callable[[WorkItem], bytes] | None = None,
    progress: bool = True,
    total_hint: int | None = None,
    seed: int = 0,
    on_result: Callable[[RequestResult], None] | None = None,
) -> LoadResult:
    """Send ``items`` to ``target`` (anything with ``send(body) -> Attempt``) and collect one
    :class:`RequestResult` per request sent.

    Pacing: ``rate`` requests per second (request *i* due at ``i / rate``), or the items' own
    ``at_s`` divided by ``speed``, or (neither) as fast as ``concurrency`` allows. A due request
    waits for a free slot when ``concurrency`` requests are in flight (its lag shows as
    ``start_s - scheduled_s``). Stops issuing at ``max_requests``, after ``duration`` seconds, or at
    the end of ``items``; then waits for the requests in flight. ``prepare`` turns an item into the
    bytes to send (variation, normalization); a ``ValueError`` from it skips the item (reported in
    ``skipped``, never sent). Ctrl-C stops issuing and waits for the requests in flight.
    """
    if concurrency < 1:
        raise UserError(f"concurrency={concurrency}: must be >= 1")
    if rate is not None and speed is not None:
        raise UserError("give either a rate or a speed, not both")
    if rate is not None and not rate > 0:
        raise UserError(f"rate={rate}: must be > 0")
    if speed is not None and not speed > 0:
        raise UserError(f"speed={speed}: must be > 0")
    if max_requests is not None and max_requests < 0:
        raise UserError(f"max_requests={max_requests}: must be >= 0")
    if duration is not None and not duration > 0:
        raise UserError(f"duration={duration}: must be > 0")
    if retries < 0:
        raise UserError(f"retries={retries}: must be >= 0")

    results: list[RequestResult] = []
    skipped: list[tuple[str, str]] = []
    lock = threading.Lock()
    slots = threading.Semaphore(concurrency)
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="loadtest")
    futures: list[Future] = []
    counts = Counter()
    bar = _progress_bar(progress, min(x for x in (max_requests, total_hint) if x is not None)
                        if (max_requests is not None or total_hint is not None) else None)
    started_wall = time.time()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    deadline = t0 + duration if duration is not None else None
    stopped_by = "end of input"

    def worker(item: WorkItem, body: bytes, scheduled: float | None, issued: float) -> None:
        rng = random.Random(f"{seed}:retry:{item.index}")
        try:
            try:
                attempt, attempts, retried, _ = _send_with_retries(target, body, retries, rng)
            except BaseException as error:  # a bug in a target must not lose the request
                attempt, attempts, retried = Attempt(kind="client_error", detail=describe_error(error)), 1, []
            row = RequestResult(
                index=item.index,
                source=item.source,
                ok=attempt.ok,
                error_kind=attempt.kind,
                error_detail=attempt.detail,
                status=attempt.status,
                request_id=attempt.request_id,
                start_s=issued - t0,
                scheduled_s=scheduled,
                ttft_s=attempt.ttft_s,
                e2e_s=attempt.e2e_s,
                output_tokens=attempt.output_tokens,
                prompt_tokens=attempt.prompt_tokens,
                cached_tokens=attempt.cached_tokens,
                finish_reason=attempt.finish_reason,
                body_bytes=len(body),
                bytes_received=attempt.bytes_received,
                attempts=attempts,
                retried=retried,
                client_overhead_s=attempt.client_overhead_s,
            )
            with lock:
                results.append(row)
                counts["ok" if row.ok else "failed"] += 1
                if bar is not None:
                    bar.set_postfix(ok=counts["ok"], failed=counts["failed"], refresh=False)
                    bar.update(1)
            if on_result is not None:
                try:
                    on_result(row)
                except Exception:
                    pass
        finally:
            slots.release()

    sent = 0
    first_at: float | None = None
    try:
        for item in items:
            if max_requests is not None and sent >= max_requests:
                stopped_by = "max_requests"
                break
            try:
                body = prepare(item) if prepare is not None else item.body
            except ValueError as error:
                skipped.append((item.source, str(error)))
                continue
            if speed is not None and item.at_s is not None:
                first_at = item.at_s if first_at is None else first_at
                scheduled = (item.at_s - first_at) / speed
            elif rate is not None:
                scheduled = sent / rate
            else:
                scheduled = None
            if scheduled is not None:
                due = t0 + scheduled
                if deadline is not None and due >= deadline:
                    stopped_by = "duration"
                    break
                _sleep_until(due)
            if deadline is not None and time.perf_counter() >= deadline:
                stopped_by = "duration"
                break
            if not _acquire_until(slots, deadline):
                stopped_by = "duration"
                break
            issued = time.perf_counter()
            try:
                futures.append(pool.submit(worker, item, body, scheduled, issued))
            except BaseException:
                slots.release()
                raise
            sent += 1
            if len(futures) > 4 * concurrency:  # forget finished requests
                futures = [f for f in futures if not f.done()]
    except KeyboardInterrupt:
        stopped_by = "interrupted"
        print("\ninterrupted: waiting for the requests in flight (Ctrl-C again to abandon them)", file=sys.stderr)
    try:
        wait(futures)
    except KeyboardInterrupt:  # abandoned: they are still counted if they finish before we report
        stopped_by = "interrupted"
    pool.shutdown(wait=False)
    duration_s = time.perf_counter() - t0
    cpu_s = time.process_time() - cpu0
    if bar is not None:
        bar.close()
    with lock:
        rows = sorted(results, key=lambda r: r.index)
    notes = list(target.notes()) if hasattr(target, "notes") else []  # what the target changed, said
    if duration_s > 1 and cpu_s / duration_s > 0.8:
        notes.append(
            f"the load tester used {cpu_s / duration_s:.0%} of a CPU core: client-side TTFT and latency include "
            "its own queuing; lower --concurrency/--rate or split the load over several processes"
        )
    return LoadResult(rows, started_wall, duration_s, stopped_by, skipped, notes=notes, client_cpu_s=cpu_s)


def _sleep_until(due: float) -> None:
    while True:
        left = due - time.perf_counter()
        if left <= 0:
            return
        time.sleep(min(left, 0.5))


def _acquire_until(semaphore: threading.Semaphore, deadline: float | None) -> bool:
    if deadline is None:
        while not semaphore.acquire(timeout=0.5):
            pass
        return True
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return semaphore.acquire(blocking=False)
        if semaphore.acquire(timeout=min(left, 0.5)):
            return True


def _progress_bar(enabled: bool, total: int | None):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency; run without a bar otherwise
        return None
    return tqdm(total=total, file=sys.stderr, unit="req", desc="loadtest", dynamic_ncols=True, leave=True)
