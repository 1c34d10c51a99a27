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
file, no request at all) always raises ``UserError``. Every count, size and time read is bounded
(:mod:`.input_bounds`): a value beyond its bound skips its line the same way, with a reason naming both.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
from typing import Iterator

from prefix_routing.lab import input_bounds
from prefix_routing.lab.misses import ClientKey
from prefix_routing.lab.source_sample import SourceSample
# Trace and Skipped are this module's results: importable from here, as they always were.
from prefix_routing.lab.trace_data import (  # noqa: F401
    EXAMPLES_KEPT,
    MOONCAKE_BLOCK_TOKENS,
    Collector,
    Skipped,
    Trace,
    is_int,
    is_number,
)
from prefix_routing.rules.errors import UserError
from prefix_routing.rules.sampling import filter_pattern as sample_pattern
from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE, LogField

DEFAULT_OUTPUT_TOKENS = 256  # bodies that do not say how many tokens they want


# --------------------------------------------------------------------------- shared helpers


LINE_TOO_LONG = f"line longer than {input_bounds.MAX_LINE_BYTES:,} bytes"


def open_lines(path: str | os.PathLike) -> Iterator[tuple[int, str | None]]:
    """(line number, text) of a text file, ``.gz`` allowed; text None for a line longer than
    ``input_bounds.MAX_LINE_BYTES`` (read past in bounded pieces, never held whole). Missing file: UserError."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise UserError(f"trace file not found: {path}")
    if os.path.isdir(path):
        raise UserError(f"trace path is a directory, not a file: {path}")
    try:
        raw = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
    except OSError as error:
        raise UserError(f"cannot read trace file {path}: {error.strerror or error}") from None
    limit = input_bounds.MAX_LINE_BYTES
    with raw as lines:  # both buffered: readline(limit) reads at most limit bytes
        lineno = 0
        while line := lines.readline(limit + 1):
            lineno += 1
            if len(line) > limit:
                while not line.endswith(b"\n") and (line := lines.readline(1 << 20)):
                    pass
                yield lineno, None
                continue
            yield lineno, line.decode("utf-8", errors="replace")


def _json_object(text: str):
    """(object, None) or (None, reason)."""
    try:
        obj = json.loads(text)
    except ValueError as error:
        return None, f"invalid JSON ({error.msg} at column {error.colno})"
    if not isinstance(obj, dict):
        return None, f"not a JSON object ({type(obj).__name__})"
    return obj, None


def _json_records(c: "Collector", path: str | os.PathLike) -> Iterator[tuple[str, str, dict]]:
    """(``file:line``, text, object) of each JSON-object line; blank lines pass, broken ones are
    counted and reported through the collector (or fail it, when strict)."""
    for lineno, text in open_lines(path):
        if text is not None and not text.strip():
            continue
        c.lines += 1
        where = f"{c.source}:{lineno}"
        if text is None:
            c.skip(where, LINE_TOO_LONG)
            continue
        obj, error = _json_object(text)
        if error:
            c.skip(where, "invalid JSON line" if error.startswith("invalid") else "not a JSON object", error)
            continue
        yield where, text, obj


# --------------------------------------------------------------------------- Mooncake


def read_mooncake(path: str | os.PathLike, *, strict: bool = False, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Trace:
    """Read a Mooncake JSONL trace. ``hash_ids`` must have ``ceil(input_length / 512)`` ids."""
    c = Collector(os.fspath(path), strict)
    for where, _, obj in _json_records(c, path):
        missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in obj]
        if missing:
            c.skip(where, f"missing field {missing[0]!r}")
            continue
        ts, prompt, output, ids = obj["timestamp"], obj["input_length"], obj["output_length"], obj["hash_ids"]
        if not is_number(ts) or ts < 0:
            c.skip(where, "bad 'timestamp'", f"{ts!r} is not a number >= 0")
        elif ts > input_bounds.latest_ms():
            c.skip(where, "'timestamp' more than a day in the future", f"{ts!r} ms")
        elif not is_int(prompt) or prompt < 0:
            c.skip(where, "bad 'input_length'", f"{prompt!r} is not an integer >= 0")
        elif problem := input_bounds.count_problem("input_length", prompt, input_bounds.MAX_PROMPT_TOKENS):
            c.skip(where, problem, repr(prompt))
        elif not is_int(output) or output < 0:
            c.skip(where, "bad 'output_length'", f"{output!r} is not an integer >= 0")
        elif problem := input_bounds.count_problem("output_length", output, input_bounds.MAX_OUTPUT_TOKENS):
            c.skip(where, problem, repr(output))
        elif not isinstance(ids, list) or not all(is_int(i) for i in ids):
            c.skip(where, "bad 'hash_ids'", "not a list of integers")
        elif len(ids) != math.ceil(prompt / block_tokens):
            c.skip(
                where,
                "'hash_ids' does not match 'input_length'",
                f"{len(ids)} ids for {prompt} tokens, expected {math.ceil(prompt / block_tokens)}",
            )
        else:
            c.add(where, (ts / 1000.0, prompt, output, ids, None))
    return c.build(block_tokens, None, with_ids=False)


# --------------------------------------------------------------------------- the normalizer's log


def _log_record(c: Collector, where: str, text: str, state: dict, bytes_per_token: float, fallback_ts_ms=None,
                keep=None) -> None:
    """One log line: a request, an ignored line, or a broken request line. ``keep``: a sample's rule
    (lab.source_sample.SourceSample.keep), asked of every request line that succeeded."""
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
    if is_int(status) and status >= 400:
        # Rejected by the normalizer (4xx) or failed upstream (5xx): no tokens to replay.
        c.skipped.ignored[f"failed requests (status {status // 100}xx)"] += 1
        return
    if keep is not None and not keep(obj):
        return
    ts = obj.get(F.TIMESTAMP_MS, fallback_ts_ms)
    if not is_number(ts):
        c.skip(where, f"missing or bad {F.TIMESTAMP_MS!r}", repr(obj.get(F.TIMESTAMP_MS)))
        return
    if problem := input_bounds.epoch_ms_problem(F.TIMESTAMP_MS, ts):
        c.skip(where, problem, repr(ts))
        return
    block_bytes = obj.get(F.BLOCK_BYTES)
    low, high = input_bounds.BLOCK_BYTES_RANGE
    if not is_int(block_bytes) or not low <= block_bytes <= high:
        c.skip(where, f"missing or bad {F.BLOCK_BYTES!r}", f"{block_bytes!r} (allowed: {low} to {high:,})")
        return
    hashes = obj.get(F.BLOCK_HASHES)
    if not isinstance(hashes, list):
        c.skip(where, f"missing or bad {F.BLOCK_HASHES!r}", "expected a list of strings")
        return
    if problem := input_bounds.count_problem(f"{F.BLOCK_HASHES} count", len(hashes), input_bounds.max_block_hashes(block_bytes)):
        c.skip(where, problem, f"{len(hashes):,} hashes of {block_bytes} bytes: more than a 6 MiB body has")
        return
    if not all(isinstance(h, (str, int)) and not isinstance(h, bool) for h in hashes):
        c.skip(where, f"missing or bad {F.BLOCK_HASHES!r}", "expected a list of strings")
        return
    if state.setdefault("block_bytes", block_bytes) != block_bytes:
        c.skip(where, f"{F.BLOCK_BYTES!r} differs from the first line's", f"{block_bytes} != {state['block_bytes']}")
        return
    prompt = obj.get(F.PROMPT_TOKENS)
    body = obj.get(F.BODY_BYTES)
    if is_int(body) and (problem := input_bounds.count_problem(F.BODY_BYTES, body, input_bounds.MAX_BODY_BYTES)):
        c.skip(where, problem, repr(body))
        return
    if prompt is None:
        if is_int(body) and body >= 0:
            prompt = math.ceil(body / bytes_per_token)
        else:
            prompt = math.ceil(len(hashes) * block_bytes / bytes_per_token)
        state["estimated_prompts"] = state.get("estimated_prompts", 0) + 1
    if not is_int(prompt) or prompt < 0:
        c.skip(where, f"bad {F.PROMPT_TOKENS!r}", repr(prompt))
        return
    if problem := input_bounds.count_problem(F.PROMPT_TOKENS, prompt, input_bounds.MAX_PROMPT_TOKENS):
        c.skip(where, problem, repr(prompt))
        return
    output = obj.get(F.OUTPUT_TOKENS, 0)
    if output is None:
        output = 0
    if not is_int(output) or output < 0:
        c.skip(where, f"bad {F.OUTPUT_TOKENS!r}", repr(output))
        return
    if problem := input_bounds.count_problem(F.OUTPUT_TOKENS, output, input_bounds.MAX_OUTPUT_TOKENS):
        c.skip(where, problem, repr(output))
        return
    routing_id = obj.get(F.ROUTING_ID)
    if routing_id is not None and not isinstance(routing_id, str):
        routing_id = str(routing_id)
    rekeyed = obj.get(F.REKEYED)  # absent in logs written before the front door judged it
    cached = obj.get(F.CACHED_TOKENS)  # None when the model reported no usage
    tenant = obj.get(F.TENANT)  # the caller, as the front door named it (lab/tenants.py)
    c.add(where, (ts / 1000.0, prompt, output, c.intern(hashes), routing_id,
                   rekeyed if isinstance(rekeyed, bool) else None, None,
                   min(cached, prompt) if is_int(cached) and cached >= 0 else None,
                   tenant if isinstance(tenant, str) and tenant else None))


def _finish_log(c: Collector, state: dict, bytes_per_token: float, sampler=None) -> Trace:
    block_bytes = state.get("block_bytes")
    trace = c.build(block_bytes / bytes_per_token if block_bytes else MOONCAKE_BLOCK_TOKENS, block_bytes, True)
    if sampler is not None:
        trace.notes.append(sampler.note())
    if state.get("estimated_prompts"):
        trace.notes.append(
            f"{state['estimated_prompts']:,} lines had no {LogField.PROMPT_TOKENS!r}: estimated from body bytes "
            f"at {bytes_per_token:g} bytes per token"
        )
    if not any(trace.routing_ids):
        trace.routing_ids = None
    return trace


def read_request_log(path: str | os.PathLike, *, strict: bool = False, bytes_per_token: float = 4.0,
                     sample_rate: float | None = None) -> Trace:
    """Read the normalizer's request log (JSON lines, e.g. exported from CloudWatch Logs).
    ``sample_rate``: only the lines of a sample at that rate (:class:`lab.source_sample.SourceSample`)."""
    source = os.fspath(path)
    c, state = Collector(source, strict), {}
    sampler = _source_sample(sample_rate)
    keep = sampler.keep if sampler is not None else None
    for lineno, text in open_lines(path):
        if text is not None and not text.strip():
            continue
        c.lines += 1
        if text is None:
            c.skip(f"{source}:{lineno}", LINE_TOO_LONG)
            continue
        _log_record(c, f"{source}:{lineno}", text, state, bytes_per_token, keep=keep)
    return _finish_log(c, state, bytes_per_token, sampler)


def _source_sample(rate: float | None) -> SourceSample | None:
    return None if rate is None or rate >= 1.0 else SourceSample(rate)


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
    sample_rate: float | None = None,
) -> Trace:
    """Read the normalizer's request log straight from CloudWatch Logs (``FilterLogEvents``).

    ``client`` is a boto3 ``logs`` client (made from ``region`` and the usual credential chain if
    not given). By default only events containing the request message are fetched. ``max_events``
    bounds the events read (a Lambda's memory and time): past it the window is cut, and the trace's
    notes say where. ``sample_rate`` below 1: only the lines of a sample at that rate cross the wire
    (``rules.sampling.filter_pattern``, in place of ``filter_pattern``), thinned as
    :class:`lab.source_sample.SourceSample` says.
    """
    import boto3  # the lab's only AWS call: imported here so the rest of the lab runs without it
    from botocore.exceptions import BotoCoreError, ClientError

    source = f"cloudwatch:{log_group}"
    client = client or boto3.client("logs", region_name=region)
    kwargs = {"logGroupName": log_group, "startTime": int(start_ms), "endTime": int(end_ms)}
    sampler = _source_sample(sample_rate)
    keep = sampler.keep if sampler is not None else None
    if sampler is not None:
        filter_pattern = sample_pattern(sample_rate)
    if filter_pattern:
        kwargs["filterPattern"] = filter_pattern
    c, state = Collector(source, strict), {}
    cut_at = None
    try:
        for page in client.get_paginator("filter_log_events").paginate(**kwargs):
            for event in page.get("events", []):
                if max_events is not None and c.lines >= max_events:
                    cut_at = event.get("timestamp")
                    break
                c.lines += 1
                where = f"{source} event {event.get('eventId', '?')} ({event.get('logStreamName', '?')})"
                _log_record(c, where, event.get("message", ""), state, bytes_per_token, event.get("timestamp"), keep)
            if cut_at is not None:
                break
    except ClientError as error:
        info = error.response.get("Error", {})
        raise UserError(f"{source}: {info.get('Code', 'error')}: {info.get('Message', error)}") from None
    except BotoCoreError as error:
        raise UserError(f"{source}: {error}") from None
    trace = _finish_log(c, state, bytes_per_token, sampler)
    if cut_at is not None:
        trace.sampled = f"read the first {max_events:,} events only"
        trace.notes.append(f"read the first {max_events:,} events only (the bound): the window was cut at "
                           f"epoch ms {cut_at}, {int(end_ms) - int(cut_at or end_ms):,} ms before its end")
    return trace


# --------------------------------------------------------------------------- raw request bodies


def _output_tokens(body: dict) -> tuple[str, int]:
    """(the field it came from, the output tokens a body asks for)."""
    for key in ("max_tokens", "max_completion_tokens", "max_new_tokens"):
        if is_int(body.get(key)):
            return key, body[key]
    params = body.get("parameters")
    if isinstance(params, dict) and is_int(params.get("max_new_tokens")):
        return "parameters.max_new_tokens", params["max_new_tokens"]
    return "max_tokens", DEFAULT_OUTPUT_TOKENS


def _raw_bodies(c: Collector, path: str | os.PathLike) -> Iterator[tuple[str, bytes, dict, int]]:
    """(``file:line``, the body's bytes as sent, its JSON, the output tokens it asks for) of each
    line; a count out of bounds skips its line."""
    for where, text, obj in _json_records(c, path):
        asked, output = _output_tokens(obj)
        if output < 0:
            c.skip(where, f"bad {asked!r}", f"{output!r} is not an integer >= 0")
        elif problem := input_bounds.count_problem(asked, output, input_bounds.MAX_OUTPUT_TOKENS):
            c.skip(where, problem, repr(output))
        else:
            yield where, text.strip().encode("utf-8"), obj, output


def count_lines(path: str | os.PathLike) -> int:
    """The non-blank lines of a file (read in bounded pieces)."""
    return sum(1 for _, text in open_lines(path) if text is None or text.strip())


class RawBodyReader:
    """The raw bodies of a file one at a time, as clients sent them (unnormalized), bounded as
    :func:`read_bodies` reads them: iterate for (``file:line``, bytes, output tokens); then
    ``skipped`` and ``lines`` say what was left out. Nothing is held but the current line."""

    def __init__(self, path: str | os.PathLike, *, strict: bool = False) -> None:
        self.path = path
        self._c = Collector(os.fspath(path), strict)

    def __iter__(self) -> Iterator[tuple[str, bytes, int]]:
        for where, raw, _, output in _raw_bodies(self._c, self.path):
            yield where, raw, output

    @property
    def skipped(self) -> Skipped:
        return self._c.skipped

    @property
    def lines(self) -> int:
        return self._c.lines


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
    low, high = input_bounds.BODY_RATE_RANGE
    if not low <= rate <= high:
        raise UserError(f"body rate {rate!r} (--body-rate): must be from {low:g} to {high:,.0f} requests per second")
    c = Collector(os.fspath(path), strict)
    size = None
    for where, raw, _, output in _raw_bodies(c, path):
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
        if problem := input_bounds.count_problem("prompt tokens", prompt, input_bounds.MAX_PROMPT_TOKENS):
            c.skip(where, problem, f"{len(body):,} bytes at {bytes_per_token:g} bytes per token")
            continue
        arrival = len(c.rows) / rate
        # The client's own first PrefixLength bytes against the normalized ones (the front door's
        # RekeyedRequests); the raw key is what routing as sent, with no front door, would use.
        head = raw[: settings.prefix_length]
        rekeyed = head != body[: settings.prefix_length]
        raw_key = ClientKey(("as-sent", hashlib.sha256(head).hexdigest()[:16])) if rekeyed else None
        c.add(where, (arrival, prompt, output, c.intern(ids), None, rekeyed, raw_key))
    size = size or settings.block_bytes
    return c.build(size / bytes_per_token, size, with_ids=False)


# --------------------------------------------------------------------------- any of them


FORMATS = ("auto", "mooncake", "log", "bodies")


def sniff_format(path: str | os.PathLike) -> str:
    """Guess the format from the first JSON line: Mooncake, the request log, or raw bodies."""
    for _, text in open_lines(path):
        if text is None or not text.strip():
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
