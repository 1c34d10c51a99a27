"""Readers of request traces for the routing lab.

Three sources, one result (``Trace``: arrival times, prompt and output tokens, chained block ids):

- ``read_mooncake``: the Mooncake JSONL format (``timestamp`` in ms, ``input_length``,
  ``output_length``, ``hash_ids`` = one chained id per 512-token block), e.g. the FAST'25 trace in
  ``../shared/traces/``.
- ``read_request_log`` / ``read_cloudwatch``: the normalizer's one-line-per-request JSON log (field
  names from ``telemetry.LogField``), from a file or from CloudWatch Logs through boto3. Lines whose
  ``message`` is not ``telemetry.REQUEST_LOG_MESSAGE`` (runtime lines, other logs) are counted and
  skipped, never an error.
- ``read_bodies``: raw request bodies, one JSON body per line, run through the normalizer
  (``prefix_routing.rules``, imported only when this reader runs).

Nothing is dropped silently. A line that cannot be read is skipped and recorded in
``Trace.skipped`` (a count per reason and the first few line numbers); with ``strict=True`` the
first such line raises ``UserError`` naming the file and line instead. Unreadable input (missing
file, no request at all) always raises ``UserError``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Iterator

from prefix_routing.lab.misses import ClientKey
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LogField

MOONCAKE_BLOCK_TOKENS = 512
EXAMPLES_KEPT = 5
DEFAULT_OUTPUT_TOKENS = 256  # bodies that do not say how many tokens they want


@dataclass
class Skipped:
    """Lines not turned into requests: a count per reason and the first examples."""

    reasons: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # "FILE:LINE: reason"
    ignored: Counter = field(default_factory=Counter)  # not request lines at all (log reader)

    @property
    def count(self) -> int:
        return sum(self.reasons.values())

    def add(self, where: str, reason: str, detail: str = "") -> None:
        self.reasons[reason] += 1
        if len(self.examples) < EXAMPLES_KEPT:
            self.examples.append(f"{where}: {reason}{': ' + detail if detail else ''}")

    def summary(self, lines: int | None = None) -> str:
        parts = []
        if self.reasons:
            total = f" of {lines:,} lines" if lines is not None else ""
            parts.append(
                f"skipped {self.count:,}{total}: "
                + ", ".join(f"{n:,} {reason}" for reason, n in self.reasons.most_common())
            )
        if self.ignored:
            parts.append(
                "ignored "
                + ", ".join(f"{n:,} {reason}" for reason, n in self.ignored.most_common())
            )
        return "; ".join(parts)

    def as_dict(self) -> dict:
        return {
            "count": self.count,
            "reasons": dict(self.reasons),
            "examples": list(self.examples),
            "ignored": dict(self.ignored),
        }


@dataclass
class Trace:
    """Requests in arrival order, in columns (the simulator's inner loop reads lists, not objects).

    ``blocks[i]`` are chained block ids (equal id = equal prefix up to and including that block),
    interned to ints. A block is ``block_tokens`` tokens of the prompt; when the ids hash bytes of
    the normalized body (the normalizer's log, raw bodies) ``block_bytes`` says how many.
    """

    arrivals: list[float]  # seconds from the first arrival
    prompt_tokens: list[int]
    output_tokens: list[int]
    blocks: list[list[int]]
    block_tokens: float = MOONCAKE_BLOCK_TOKENS
    block_bytes: float | None = None
    routing_ids: list[str | None] | None = None  # PrefixAwareId per request
    # Requests whose client bytes keyed routing differently from the normalized body (the log's
    # ``rekeyed``; computed for raw bodies), and for raw bodies the key of the bytes as sent.
    rekeyed: list[bool] | None = None
    raw_keys: list | None = None
    # The request log's measured cached tokens (None where the model reported none): the hit rate
    # production had, against which the lab's prediction for the same window is judged.
    cached_tokens: list[int | None] | None = None
    source: str = ""
    lines: int = 0  # lines (or log events) read
    skipped: Skipped = field(default_factory=Skipped)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.arrivals)

    @property
    def duration_s(self) -> float:
        return self.arrivals[-1] - self.arrivals[0] if self.arrivals else 0.0

    def measured_hit_rate(self) -> float | None:
        """Cached ÷ prompt tokens over the requests whose log line reports both (None: none does)."""
        if not self.cached_tokens:
            return None
        pairs = [(c, p) for c, p in zip(self.cached_tokens, self.prompt_tokens) if c is not None]
        prompt = sum(p for _, p in pairs)
        return sum(c for c, _ in pairs) / prompt if prompt else None

    def head(self, n: int) -> "Trace":
        """The first n requests (a quick look, or a fast test)."""
        return Trace(
            self.arrivals[:n],
            self.prompt_tokens[:n],
            self.output_tokens[:n],
            self.blocks[:n],
            self.block_tokens,
            self.block_bytes,
            self.routing_ids[:n] if self.routing_ids else None,
            self.rekeyed[:n] if self.rekeyed else None,
            self.raw_keys[:n] if self.raw_keys else None,
            self.cached_tokens[:n] if self.cached_tokens else None,
            self.source,
            self.lines,
            self.skipped,
            list(self.notes),
        )

    def replay(self, times: int, gap_s: float | None = None) -> "Trace":
        """The trace ``times`` times in a row; every copy gets fresh block ids and later times.

        Each replay shares nothing with the others (ids shifted by the largest id + 1), so a cache
        warmed by one replay does not help the next: the simulated load is the trace's, repeated.
        """
        gap = (self.duration_s / max(1, len(self) - 1)) if gap_s is None else gap_s
        span = self.duration_s + gap
        shift = 1 + max((max(b) for b in self.blocks if b), default=0)
        arrivals, prompt, output, blocks, ids, rekeyed = [], [], [], [], [], []
        for r in range(times):
            offset_t, offset_id = r * span, r * shift
            arrivals.extend(t + offset_t for t in self.arrivals)
            prompt.extend(self.prompt_tokens)
            output.extend(self.output_tokens)
            blocks.extend([b + offset_id for b in bl] for bl in self.blocks)
            if self.routing_ids:
                ids.extend(self.routing_ids)
            if self.rekeyed:
                rekeyed.extend(self.rekeyed)
        # Raw keys are not shifted like block ids: a replay is not routed as sent.
        return Trace(
            arrivals, prompt, output, blocks, self.block_tokens, self.block_bytes, ids or None, rekeyed or None,
            source=f"{self.source} ×{times}", lines=self.lines * times, skipped=self.skipped,
        )


# --------------------------------------------------------------------------- shared helpers


def _open_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """(line number, text) of a text file, ``.gz`` allowed. Missing file: UserError."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise UserError(f"trace file not found: {path}")
    if os.path.isdir(path):
        raise UserError(f"trace path is a directory, not a file: {path}")
    try:
        raw = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
    except OSError as error:
        raise UserError(f"cannot read trace file {path}: {error.strerror or error}") from None
    with raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace") as text:
        yield from enumerate(text, start=1)


class _Collector:
    """Accumulates requests, skips and the strict-mode failure for one reader."""

    def __init__(self, source: str, strict: bool):
        self.source, self.strict = source, strict
        self.skipped = Skipped()
        self.rows: list[tuple] = []
        self.lines = 0
        self.ids: dict[Hashable, int] = {}

    def skip(self, where: str, reason: str, detail: str = "") -> None:
        if self.strict:
            raise UserError(f"{where}: {reason}{': ' + detail if detail else ''} (--strict)")
        self.skipped.add(where, reason, detail)

    def intern(self, values: Iterable[Hashable]) -> list[int]:
        ids = self.ids
        out = []
        for v in values:
            i = ids.get(v)
            if i is None:
                i = ids[v] = len(ids)
            out.append(i)
        return out

    def build(self, block_tokens: float, block_bytes: float | None, with_ids: bool) -> Trace:
        if not self.rows:
            detail = f" ({self.skipped.summary(self.lines)})" if self.skipped.count or self.skipped.ignored else ""
            raise UserError(f"{self.source}: no requests found{detail}")
        notes = []
        if any(self.rows[i][0] > self.rows[i + 1][0] for i in range(len(self.rows) - 1)):
            self.rows.sort(key=lambda row: row[0])  # stable: equal times keep file order
            notes.append("requests were not in arrival order; sorted by time")
        t0 = self.rows[0][0]
        return Trace(
            arrivals=[row[0] - t0 for row in self.rows],
            prompt_tokens=[row[1] for row in self.rows],
            output_tokens=[row[2] for row in self.rows],
            blocks=[row[3] for row in self.rows],
            block_tokens=block_tokens,
            block_bytes=block_bytes,
            routing_ids=[row[4] for row in self.rows] if with_ids else None,
            # Rows may carry (…, rekeyed, raw key): the request log's flag, raw bodies' both.
            rekeyed=[bool(row[5]) for row in self.rows] if any(len(row) > 5 and row[5] is not None for row in self.rows) else None,
            raw_keys=[row[6] for row in self.rows] if any(len(row) > 6 and row[6] is not None for row in self.rows) else None,
            cached_tokens=[row[7] for row in self.rows] if any(len(row) > 7 and row[7] is not None for row in self.rows) else None,
            source=self.source,
            lines=self.lines,
            skipped=self.skipped,
            notes=notes,
        )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _json_object(text: str):
    """(object, None) or (None, reason)."""
    try:
        obj = json.loads(text)
    except ValueError as error:
        return None, f"invalid JSON ({error.msg} at column {error.colno})"
    if not isinstance(obj, dict):
        return None, f"not a JSON object ({type(obj).__name__})"
    return obj, None


def _json_records(c: "_Collector", path: str | os.PathLike) -> Iterator[tuple[str, str, dict]]:
    """(``file:line``, text, object) of each JSON-object line; blank lines pass, broken ones are
    counted and reported through the collector (or fail it, when strict)."""
    for lineno, text in _open_lines(path):
        if not text.strip():
            continue
        c.lines += 1
        where = f"{c.source}:{lineno}"
        obj, error = _json_object(text)
        if error:
            c.skip(where, "invalid JSON line" if error.startswith("invalid") else "not a JSON object", error)
            continue
        yield where, text, obj


# --------------------------------------------------------------------------- Mooncake


def read_mooncake(path: str | os.PathLike, *, strict: bool = False, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Trace:
    """Read a Mooncake JSONL trace. ``hash_ids`` must have ``ceil(input_length / 512)`` ids."""
    c = _Collector(os.fspath(path), strict)
    for where, _, obj in _json_records(c, path):
        missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in obj]
        if missing:
            c.skip(where, f"missing field {missing[0]!r}")
            continue
        ts, prompt, output, ids = obj["timestamp"], obj["input_length"], obj["output_length"], obj["hash_ids"]
        if not _is_number(ts) or ts < 0:
            c.skip(where, "bad 'timestamp'", f"{ts!r} is not a number >= 0")
        elif not _is_int(prompt) or prompt < 0:
            c.skip(where, "bad 'input_length'", f"{prompt!r} is not an integer >= 0")
        elif not _is_int(output) or output < 0:
            c.skip(where, "bad 'output_length'", f"{output!r} is not an integer >= 0")
        elif not isinstance(ids, list) or not all(_is_int(i) for i in ids):
            c.skip(where, "bad 'hash_ids'", "not a list of integers")
        elif len(ids) != math.ceil(prompt / block_tokens):
            c.skip(
                where,
                "'hash_ids' does not match 'input_length'",
                f"{len(ids)} ids for {prompt} tokens, expected {math.ceil(prompt / block_tokens)}",
            )
        else:
            c.rows.append((ts / 1000.0, prompt, output, ids, None))
    return c.build(block_tokens, None, with_ids=False)


# --------------------------------------------------------------------------- the normalizer's log


def _log_record(c: _Collector, where: str, text: str, state: dict, bytes_per_token: float, fallback_ts_ms=None) -> None:
    """One log line: a request, an ignored line, or a broken request line."""
    F = LogField
    obj, error = _json_object(text)
    if error:
        if REQUEST_LOG_MESSAGE in text:
            c.skip(where, "broken request log line", error)
        else:
            c.skipped.ignored["lines that are not JSON (runtime lines)"] += 1
        return
    if obj.get(F.MESSAGE) != REQUEST_LOG_MESSAGE:
        c.skipped.ignored[f"lines whose message is not {REQUEST_LOG_MESSAGE!r}"] += 1
        return
    status = obj.get(F.STATUS)
    if _is_int(status) and status >= 400:
        # Rejected by the normalizer (4xx) or failed upstream (5xx): no tokens to replay.
        c.skipped.ignored[f"failed requests (status {status // 100}xx)"] += 1
        return
    ts = obj.get(F.TIMESTAMP_MS, fallback_ts_ms)
    if not _is_number(ts):
        c.skip(where, f"missing or bad {F.TIMESTAMP_MS!r}", repr(obj.get(F.TIMESTAMP_MS)))
        return
    hashes = obj.get(F.BLOCK_HASHES)
    if not isinstance(hashes, list) or not all(isinstance(h, (str, int)) and not isinstance(h, bool) for h in hashes):
        c.skip(where, f"missing or bad {F.BLOCK_HASHES!r}", "expected a list of strings")
        return
    block_bytes = obj.get(F.BLOCK_BYTES)
    if not _is_int(block_bytes) or block_bytes <= 0:
        c.skip(where, f"missing or bad {F.BLOCK_BYTES!r}", repr(block_bytes))
        return
    if state.setdefault("block_bytes", block_bytes) != block_bytes:
        c.skip(where, f"{F.BLOCK_BYTES!r} differs from the first line's", f"{block_bytes} != {state['block_bytes']}")
        return
    prompt = obj.get(F.PROMPT_TOKENS)
    if prompt is None:
        body = obj.get(F.BODY_BYTES)
        if _is_int(body) and body >= 0:
            prompt = math.ceil(body / bytes_per_token)
        else:
            prompt = math.ceil(len(hashes) * block_bytes / bytes_per_token)
        state["estimated_prompts"] = state.get("estimated_prompts", 0) + 1
    if not _is_int(prompt) or prompt < 0:
        c.skip(where, f"bad {F.PROMPT_TOKENS!r}", repr(prompt))
        return
    output = obj.get(F.OUTPUT_TOKENS, 0)
    if output is None:
        output = 0
    if not _is_int(output) or output < 0:
        c.skip(where, f"bad {F.OUTPUT_TOKENS!r}", repr(output))
        return
    routing_id = obj.get(F.ROUTING_ID)
    if routing_id is not None and not isinstance(routing_id, str):
        routing_id = str(routing_id)
    rekeyed = obj.get(F.REKEYED)  # absent in logs written before the front door judged it
    cached = obj.get(F.CACHED_TOKENS)  # None when the model reported no usage
    c.rows.append((ts / 1000.0, prompt, output, c.intern(hashes), routing_id,
                   rekeyed if isinstance(rekeyed, bool) else None, None,
                   min(cached, prompt) if _is_int(cached) and cached >= 0 else None))


def _finish_log(c: _Collector, state: dict, bytes_per_token: float) -> Trace:
    block_bytes = state.get("block_bytes")
    trace = c.build(block_bytes / bytes_per_token if block_bytes else MOONCAKE_BLOCK_TOKENS, block_bytes, True)
    if state.get("estimated_prompts"):
        trace.notes.append(
            f"{state['estimated_prompts']:,} lines had no {LogField.PROMPT_TOKENS!r}: estimated from body bytes "
            f"at {bytes_per_token:g} bytes per token"
        )
    if not any(trace.routing_ids):
        trace.routing_ids = None
    return trace


def read_request_log(path: str | os.PathLike, *, strict: bool = False, bytes_per_token: float = 4.0) -> Trace:
    """Read the normalizer's request log (JSON lines, e.g. exported from CloudWatch Logs)."""
    source = os.fspath(path)
    c, state = _Collector(source, strict), {}
    for lineno, text in _open_lines(path):
        if not text.strip():
            continue
        c.lines += 1
        _log_record(c, f"{source}:{lineno}", text, state, bytes_per_token)
    return _finish_log(c, state, bytes_per_token)


def read_cloudwatch(
    log_group: str,
    start_ms: int,
    end_ms: int,
    *,
    client=None,
    region: str | None = None,
    strict: bool = False,
    bytes_per_token: float = 4.0,
    filter_pattern: str | None = f'"{REQUEST_LOG_MESSAGE}"',
    max_events: int | None = None,
) -> Trace:
    """Read the normalizer's request log straight from CloudWatch Logs (``FilterLogEvents``).

    ``client`` is a boto3 ``logs`` client (made from ``region`` and the usual credential chain if
    not given). By default only events containing the request message are fetched. ``max_events``
    bounds the events read (a Lambda's memory and time): past it the window is cut, and the trace's
    notes say where.
    """
    import boto3  # the lab's only AWS call: imported here so the rest of the lab runs without it
    from botocore.exceptions import BotoCoreError, ClientError

    source = f"cloudwatch:{log_group}"
    client = client or boto3.client("logs", region_name=region)
    kwargs = {"logGroupName": log_group, "startTime": int(start_ms), "endTime": int(end_ms)}
    if filter_pattern:
        kwargs["filterPattern"] = filter_pattern
    c, state = _Collector(source, strict), {}
    cut_at = None
    try:
        for page in client.get_paginator("filter_log_events").paginate(**kwargs):
            for event in page.get("events", []):
                if max_events is not None and c.lines >= max_events:
                    cut_at = event.get("timestamp")
                    break
                c.lines += 1
                where = f"{source} event {event.get('eventId', '?')} ({event.get('logStreamName', '?')})"
                _log_record(c, where, event.get("message", ""), state, bytes_per_token, event.get("timestamp"))
            if cut_at is not None:
                break
    except ClientError as error:
        info = error.response.get("Error", {})
        raise UserError(f"{source}: {info.get('Code', 'error')}: {info.get('Message', error)}") from None
    except BotoCoreError as error:
        raise UserError(f"{source}: {error}") from None
    trace = _finish_log(c, state, bytes_per_token)
    if cut_at is not None:
        trace.notes.append(f"read the first {max_events:,} events only (the bound): the window was cut at "
                           f"epoch ms {cut_at}, {int(end_ms) - int(cut_at or end_ms):,} ms before its end")
    return trace


# --------------------------------------------------------------------------- raw request bodies


def _output_tokens(body: dict) -> int:
    for key in ("max_tokens", "max_completion_tokens", "max_new_tokens"):
        if _is_int(body.get(key)):
            return body[key]
    params = body.get("parameters")
    if isinstance(params, dict) and _is_int(params.get("max_new_tokens")):
        return params["max_new_tokens"]
    return DEFAULT_OUTPUT_TOKENS


def read_bodies(
    path: str | os.PathLike,
    *,
    strict: bool = False,
    prefix_length: int = 4096,
    block_bytes: int | None = None,
    bytes_per_token: float = 4.0,
    rate: float = 1.0,
    settings=None,
) -> Trace:
    """Raw request bodies, one JSON body per line, normalized as the Lambda would.

    The normalized body's block hashes (``block_bytes`` each; the normalizer's default if None)
    become the block ids; prompt tokens are estimated as normalized bytes ÷ ``bytes_per_token``
    (JSON syntax included); output tokens come from ``max_tokens`` (or
    ``max_completion_tokens``, ``max_new_tokens``, ``parameters.max_new_tokens``; default 256).
    Bodies carry no times: they arrive evenly at ``rate`` per second, in file order.
    """
    try:
        from prefix_routing import rules as normalize
    except ImportError as error:
        raise UserError(f"reading raw bodies needs prefix_routing.rules, which is not available: {error}") from None
    if settings is None:
        kwargs = {"prefix_length": prefix_length}
        if block_bytes is not None:
            kwargs["block_bytes"] = block_bytes
        settings = normalize.NormalizerSettings(**kwargs)
    if not rate > 0:
        raise UserError(f"rate={rate}: must be > 0")
    c = _Collector(os.fspath(path), strict)
    size = None
    for where, text, obj in _json_records(c, path):
        raw = text.strip().encode("utf-8")
        try:
            result = normalize.normalize_body(raw, settings)
        except ValueError as error:  # NormalizationError: the body breaks a rule
            c.skip(where, "rejected by the normalizer", f"{type(error).__name__}: {error}")
            continue
        size = size or settings.block_bytes
        body = result.body
        ids = list(result.block_hashes)
        if len(body) % size:
            # The normalizer hashes whole blocks only; the partial last block gets an id of the
            # whole body, so that bodies shorter than a routing key still have distinct keys.
            ids.append("tail:" + hashlib.sha256(body).hexdigest()[:16])
        prompt = math.ceil(len(body) / bytes_per_token)
        arrival = len(c.rows) / rate
        # The client's own first PrefixLength bytes against the normalized ones (the front door's
        # RekeyedRequests); the raw key is what routing as sent, with no front door, would use.
        head = raw[: settings.prefix_length]
        rekeyed = head != body[: settings.prefix_length]
        raw_key = ClientKey(("as-sent", hashlib.sha256(head).hexdigest()[:16])) if rekeyed else None
        c.rows.append((arrival, prompt, _output_tokens(obj), c.intern(ids), None, rekeyed, raw_key))
    size = size or settings.block_bytes
    return c.build(size / bytes_per_token, size, with_ids=False)


# --------------------------------------------------------------------------- any of them


FORMATS = ("auto", "mooncake", "log", "bodies")


def sniff_format(path: str | os.PathLike) -> str:
    """Guess the format from the first JSON line: Mooncake, the request log, or raw bodies."""
    for _, text in _open_lines(path):
        if not text.strip():
            continue
        obj, error = _json_object(text)
        if error:
            continue
        if "hash_ids" in obj and "input_length" in obj:
            return "mooncake"
        if LogField.MESSAGE in obj or LogField.BLOCK_HASHES in obj:
            return "log"
        return "bodies"
    raise UserError(f"{os.fspath(path)}: no JSON line found to tell the trace format")


def load_trace(path: str | os.PathLike, fmt: str = "auto", *, strict: bool = False, bytes_per_token: float = 4.0, **body_options) -> Trace:
    """Read a trace file in the given format (``auto``: sniffed from the first JSON line)."""
    if fmt not in FORMATS:
        raise UserError(f"unknown trace format {fmt!r}; allowed: {', '.join(FORMATS)}")
    if fmt == "auto":
        fmt = sniff_format(path)
    if fmt == "mooncake":
        return read_mooncake(path, strict=strict)
    if fmt == "log":
        return read_request_log(path, strict=strict, bytes_per_token=bytes_per_token)
    return read_bodies(path, strict=strict, bytes_per_token=bytes_per_token, **body_options)
