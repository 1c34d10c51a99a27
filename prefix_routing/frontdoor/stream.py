"""Reading the model's answer as it streams: usage, in-band errors and whether the stream ended cleanly."""

from __future__ import annotations

import json
from typing import Any


def _choice_text(choice: dict) -> str | None:
    """The text a chat (``delta`` or ``message`` content) or completion (``text``) choice carries."""
    piece = None
    for holder in (choice.get("delta"), choice.get("message")):
        if isinstance(holder, dict) and isinstance(holder.get("content"), str):
            piece = holder["content"]
    if piece is None and isinstance(choice.get("text"), str):
        piece = choice["text"]
    return piece


def _usage_count(usage: Any, *path: str) -> int | None:
    """A non-negative integer at ``path`` in a ``usage`` object, else None."""
    node: Any = usage
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    if isinstance(node, int) and not isinstance(node, bool) and node >= 0:
        return node
    return None


class StreamReader:
    """Follows a model's answer as it streams: SSE (``data: {...}``) or JSON lines, or one JSON document.

    Reads ``usage`` (``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``)
    wherever it appears, in-band errors (``{"error": ...}`` or ``{"object": "error"}``), and the end
    markers that make an answer :attr:`complete`:

    - OpenAI-style SSE (chunks with ``choices``): the closing ``data: [DONE]``;
    - other SSE (e.g. TGI's ``generated_text``), or JSON lines: a final chunk (a non-null
      ``finish_reason``, ``generated_text`` or ``details.finish_reason``) and, when the request asked
      for it (``expects_usage``), the ``usage`` chunk;
    - a body that is one JSON document (a non-streamed answer): that it parses, whole.

    A last line cut in the middle never parses, so a stream that ends there is incomplete too.
    With ``collect=True`` it also assembles the answer's text per choice (for buffered answers).
    """

    _LIMIT = 32 * 1024 * 1024  # bytes kept to parse a one-document answer at the end

    def __init__(self, *, expects_usage: bool = False, collect: bool = False) -> None:
        self.expects_usage = expects_usage
        self.collect = collect
        self.format: str | None = None  # "sse" | "jsonl" | "json"
        self.done = False
        self.finished = False
        self.openai_style = False
        self.usage: dict[str, Any] | None = None
        self.error: Any = None
        self.broken_tail = False
        self.document: Any = None
        self.total_bytes = 0
        self._pending = bytearray()
        self._raw: bytearray | None = bytearray()
        self._texts: dict[int, list[str]] = {}
        self._finish: dict[int, Any] = {}
        self._model: Any = None
        self._id: Any = None
        self._objects = 0
        self._first: Any = None

    # -- feeding
    def feed(self, data: bytes) -> None:
        self.total_bytes += len(data)
        if self._raw is not None:
            if len(self._raw) + len(data) <= self._LIMIT:
                self._raw += data
            else:
                self._raw = None
        pending = self._pending
        pending += data
        start = 0
        while True:
            end = pending.find(b"\n", start)
            if end < 0:
                break
            self._line(bytes(pending[start:end]))
            start = end + 1
        if start:
            del pending[:start]
        if len(pending) > self._LIMIT:  # a line this long is one document, kept in _raw if small enough
            pending.clear()
            self.broken_tail = True

    def finish(self) -> None:
        """The stream ended: read the last, unterminated line, or the whole body as one document."""
        if self._pending:
            tail = bytes(self._pending)
            self._pending.clear()
            if tail.strip() and not self._line(tail, last=True):
                self.broken_tail = True
        if (self.format == "jsonl" and self._objects == 1 and self.finished and not self.broken_tail
                and isinstance(self._first, dict) and not str(self._first.get("object", "")).endswith("chunk")):
            self.format, self.document = "json", self._first  # one line, one finished answer: a document
        if self.format is None and self._raw:
            try:
                document = json.loads(bytes(self._raw))
            except ValueError:
                self.broken_tail = True
            else:
                if isinstance(document, dict):
                    self.format = "json"
                    self.broken_tail = False
                    self.document = document
                    self._observe(document, whole=True)

    def _line(self, line: bytes, last: bool = False) -> bool:
        """Process one line; True if it was understood."""
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip():
            return True
        if line.startswith(b"data:"):
            self.format = "sse"
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                return True
            return self._json(payload)
        if line[:1] == b":" or line.startswith((b"event:", b"id:", b"retry:")):
            self.format = self.format or "sse"
            return True
        if line.lstrip()[:1] == b"{":
            understood = self._json(line)
            if understood and self.format is None:
                self.format = "jsonl"
            return understood
        return False

    def _json(self, payload: bytes) -> bool:
        try:
            obj = json.loads(payload)
        except ValueError:
            return False
        if isinstance(obj, dict):
            self._objects += 1
            if self._first is None:
                self._first = obj
            self._observe(obj)
        return True

    def _observe(self, obj: dict, whole: bool = False) -> None:
        if obj.get("object") == "error" or ("error" in obj and "choices" not in obj and "token" not in obj):
            self.error = obj.get("error", obj)
            return
        if self._id is None and isinstance(obj.get("id"), str):
            self._id = obj["id"]
        if self._model is None and isinstance(obj.get("model"), str):
            self._model = obj["model"]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = obj.get("choices")
        if isinstance(choices, list):
            self.openai_style = True
            for position, choice in enumerate(choices):
                if not isinstance(choice, dict):
                    continue
                index = choice.get("index", position)
                index = index if isinstance(index, int) and not isinstance(index, bool) else position
                if choice.get("finish_reason") is not None:
                    self.finished = True
                    self._finish[index] = choice["finish_reason"]
                piece = _choice_text(choice) if self.collect else None
                if piece:
                    self._texts.setdefault(index, []).append(piece)
        token = obj.get("token")
        if isinstance(token, dict) and self.collect and isinstance(token.get("text"), str):
            if not token.get("special"):
                self._texts.setdefault(0, []).append(token["text"])
        if obj.get("generated_text") is not None:
            self.finished = True
        details = obj.get("details")
        if isinstance(details, dict) and details.get("finish_reason") is not None:
            self.finished = True
            self._finish.setdefault(0, details["finish_reason"])
            if self.usage is None and isinstance(details.get("generated_tokens"), int):
                self.usage = {"completion_tokens": details["generated_tokens"]}
        if whole:
            self.finished = True

    # -- results
    @property
    def complete(self) -> bool:
        if self.error is not None or self.broken_tail:
            return False
        if self.format == "json":
            return True
        if self.format == "sse" and self.openai_style:
            return self.done
        if self.format in ("sse", "jsonl"):
            if self.done and not self.openai_style:
                return True
            return self.finished and (self.usage is not None or not self.expects_usage)
        return False

    @property
    def prompt_tokens(self) -> int | None:
        return _usage_count(self.usage, "prompt_tokens")

    @property
    def cached_tokens(self) -> int | None:
        return _usage_count(self.usage, "prompt_tokens_details", "cached_tokens")

    @property
    def completion_tokens(self) -> int | None:
        return _usage_count(self.usage, "completion_tokens")

    def answer(self) -> dict[str, Any]:
        """The collected answer: the document itself for a one-document answer, else the text per choice."""
        if self.format == "json" and isinstance(self.document, dict):
            return self.document
        return _assembled(self._id, self._model, self._texts, self._finish, self.usage)


def _assembled(answer_id: Any, model: Any, texts: dict[int, list[str]], finish: dict[int, Any],
               usage: dict[str, Any] | None) -> dict[str, Any]:
    """A streamed answer as one object: its id and model when it named them, the text and finish reason
    of each choice, its usage."""
    indexes = sorted(set(texts) | set(finish)) or [0]
    out: dict[str, Any] = {"object": "prefix_routing.completion"}
    if answer_id is not None:
        out["id"] = answer_id
    if model is not None:
        out["model"] = model
    out["choices"] = [
        {"index": i, "text": "".join(texts.get(i, ())), "finish_reason": finish.get(i)} for i in indexes
    ]
    out["usage"] = usage
    return out
