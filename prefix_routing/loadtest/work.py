"""What goes out: work items from a Mooncake trace or a file of bodies, varied and/or normalized like a client would."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prefix_routing.lab import bodies, traces
from prefix_routing.rules.errors import UserError


@dataclass(frozen=True)
class WorkItem:
    """One request to send: its body and, for trace replays, its arrival time in the trace."""

    index: int
    body: bytes
    #: Seconds from the first request of the source (trace timing); ``None`` for bodies files.
    at_s: float | None = None
    #: Where it came from (``FILE:LINE``), for the report.
    source: str = ""


def _trace_records(path: str, skip: int = 0) -> tuple[Iterator[dict[str, Any]], list[str]]:
    """Mooncake records (dicts) with ``at_s``, read by :func:`traces.read_mooncake` (broken lines are
    reported in the notes, as the lab reports them)."""
    trace = traces.read_mooncake(path)
    notes = [trace.skipped.summary(trace.lines)] if trace.skipped.count else []

    def rows() -> Iterator[dict[str, Any]]:
        base = trace.arrivals[skip] if skip < len(trace) else 0.0
        for i in range(skip, len(trace)):
            yield {
                "at_s": trace.arrivals[i] - base,
                "input_length": trace.prompt_tokens[i],
                "output_length": trace.output_tokens[i],
                "hash_ids": trace.blocks[i],
                "source": f"{path}#{i + 1}",
            }

    return rows(), notes


def trace_requests(
    path: str,
    *,
    system_blocks: int = 1,
    model: str | None = None,
    skip: int = 0,
    notes: list[str] | None = None,
    **params: Any,
) -> Iterator[WorkItem]:
    """Requests of a Mooncake trace: :func:`bodies.chat_body` of each record, serialized compactly.

    Records whose ids do not fit their length are reported in ``notes`` and not sent.
    """
    records, found = _trace_records(path, skip)
    if notes is not None:
        notes.extend(found)
    index = 0
    for record in records:
        try:
            body = bodies.chat_body(record, system_blocks, model=model, **params)
        except ValueError as error:
            if notes is not None:
                notes.append(f"{record['source']}: not sent: {error}")
            continue
        yield WorkItem(index, bodies.serialize(body), record["at_s"], record["source"])
        index += 1


def body_requests(path: str, *, skip: int = 0) -> Iterator[WorkItem]:
    """Requests of a bodies file: one body per non-empty line, sent byte for byte (no timing)."""
    if not os.path.exists(path):
        raise UserError(f"bodies file not found: {path}")
    if os.path.isdir(path):
        raise UserError(f"bodies path is a directory, not a file: {path}")
    try:
        handle = open(path, "rb")
    except OSError as error:
        raise UserError(f"cannot read bodies file {path}: {error.strerror or error}") from None

    def items() -> Iterator[WorkItem]:
        index, seen = 0, 0
        with handle:
            for lineno, line in enumerate(handle, 1):
                line = line.rstrip(b"\r\n")
                if not line.strip():
                    continue
                seen += 1
                if seen <= skip:
                    continue
                yield WorkItem(index, line, None, f"{path}:{lineno}")
                index += 1

    return items()


class BodyPreparer:
    """Client variation and/or normalization of each body before it is sent.

    ``vary``: :func:`bodies.vary` with ``random.Random(f"{seed}:{index}")`` (reproducible per request).
    ``normalize``: :func:`prefix_routing.rules.normalize_body` with ``settings`` (default settings
    when ``None``). Raises ``ValueError`` with the reason when a body cannot be prepared.
    """

    def __init__(self, *, vary: bool = False, normalize: bool = False, settings: Any = None, seed: int = 0,
                 text_line_endings: bool = False):
        self.vary, self.normalize, self.seed = vary, normalize, seed
        self.text_line_endings = text_line_endings
        self._normalize_body = None
        self._settings = settings
        if normalize:
            try:
                from prefix_routing import rules as norm
            except ImportError as error:
                raise UserError(
                    f"--normalize needs prefix_routing.rules, which cannot be imported: {error}"
                ) from None
            self._normalize_body = norm.normalize_body
            self._settings = settings if settings is not None else norm.NormalizerSettings()

    @property
    def active(self) -> bool:
        return self.vary or self.normalize

    def __call__(self, item: WorkItem) -> bytes:
        body = item.body
        if self.vary:
            try:
                data = json.loads(body)
            except ValueError as error:
                raise ValueError(f"cannot vary a body that is not JSON: {error}") from None
            if not isinstance(data, dict):
                raise ValueError("cannot vary a body that is not a JSON object")
            body = bodies.vary(data, random.Random(f"{self.seed}:{item.index}"),
                               text_line_endings=self.text_line_endings)
        if self.normalize:
            try:
                body = self._normalize_body(body, self._settings).body
            except ValueError as error:  # NormalizationError
                raise ValueError(f"rejected by the normalizer: {error}") from None
        return body
