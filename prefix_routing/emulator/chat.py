"""OpenAI-style chat and completion requests and their answers (whole or as SSE chunks), shared by the backends."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable

from prefix_routing.emulator.backend import BackendResponse, ErrorReply
from prefix_routing.emulator.protocol import RuntimeRequest, _log_stream_arn

#: The last server-sent event of an OpenAI-style stream.
SSE_DONE = b"data: [DONE]\n\n"


def sse_event(obj: Any) -> bytes:
    """One server-sent event ``data: <compact JSON>\\n\\n``."""
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n\n"


_WORD_RE = re.compile(r"\S+")


def _prompt_text(body: Any) -> tuple[str, str]:
    """(all prompt text in order, the last user turn's text) of a chat, completions or LMI body."""

    def text_of(content: Any) -> str:
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "\n".join(
                part.get("text", "") for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
            )
        return ""

    if not isinstance(body, dict):
        raise ValueError("body is not a JSON object")
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        texts, last_user = [], ""
        for message in messages:
            if not isinstance(message, dict):
                raise ValueError("messages[] must be objects")
            text = text_of(message.get("content"))
            texts.append(f"{message.get('role', '')}: {text}")
            if message.get("role") == "user":
                last_user = text
        return "\n".join(texts), last_user
    for key in ("prompt", "inputs"):
        value = body.get(key)
        if isinstance(value, list):
            value = "\n".join(v for v in value if isinstance(v, str))
        if isinstance(value, str) and value:
            return value, value
    raise ValueError("body has no 'messages', 'prompt' or 'inputs'")


@dataclass(frozen=True)
class ChatRequest:
    """What a model backend needs from a chat, completions or LMI body."""

    body: dict[str, Any]
    prompt_text: str  # all prompt text in order, as a chat template would lay it out ("role: content")
    prompt_words: list[str]  # whitespace-separated words of all prompt text: the stand-in for tokens
    out_words: list[str]  # the answer: the last user turn's words, repeated to n_out
    n_out: int
    finish: str  # "length" when the body set a token limit, else "stop"
    cache_salt: str


def parse_chat_request(request: RuntimeRequest, *, default_max_tokens: int) -> ChatRequest | ErrorReply:
    """Parse the body as a container would; a body it cannot serve gets ``ModelError`` (original 400)."""
    try:
        body = request.json()
        everything, last_user = _prompt_text(body)
    except (ValueError, UnicodeDecodeError) as exc:
        message = json.dumps({"object": "error", "message": str(exc), "type": "BadRequestError", "code": 400})
        return ErrorReply(
            "ModelError",
            f'Received client error (400) from primary with message "{message}".',
            original_status_code=400,
            original_message=message,
            log_stream_arn=_log_stream_arn(request.endpoint_name),
        )
    limit = body.get("max_tokens") or body.get("max_completion_tokens")
    if limit is None and isinstance(body.get("parameters"), dict):
        limit = body["parameters"].get("max_new_tokens")
    n_out = limit if isinstance(limit, int) and limit > 0 else default_max_tokens
    words = _WORD_RE.findall(last_user) or ["ok"]
    return ChatRequest(
        body=body,
        prompt_text=everything,
        prompt_words=_WORD_RE.findall(everything),
        out_words=[words[i % len(words)] for i in range(n_out)],
        n_out=n_out,
        finish="length" if isinstance(limit, int) and limit > 0 else "stop",
        cache_salt=body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else "",
    )


def chat_response(
    request: RuntimeRequest,
    chat: ChatRequest,
    *,
    prompt_tokens: int,
    cached_tokens: int,
    wait: Callable[[int], None],
    whole_delay: float,
    stream_format: str = "sse",
    model: str = "echo",
    variant: str | None = None,
    on_close: Callable[[], None] | None = None,
    tokens_per_chunk: int = 1,
) -> BackendResponse:
    """An OpenAI chat-completion answer: streamed chunks ending with a usage chunk (and ``[DONE]``
    in SSE), or one JSON object after ``whole_delay`` seconds. ``wait(i)`` runs before the chunk
    whose first token is token ``i``; ``tokens_per_chunk`` > 1 groups tokens (the first chunk always
    carries the first token alone, so time to first token is unchanged). ``on_close`` runs when the
    server stops pulling, finished or not."""
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": chat.n_out,
        "total_tokens": prompt_tokens + chat.n_out,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    head = {
        "id": f"chatcmpl-{request.request_id}",
        "created": int(request.arrival_wall),
        "model": chat.body.get("model") if isinstance(chat.body.get("model"), str) else model,
    }

    def frame(obj: Any) -> bytes:
        if stream_format == "sse":
            return sse_event(obj)
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"

    def groups() -> Iterator[tuple[int, str]]:
        words = chat.out_words
        yield 0, words[0]
        for start in range(1, len(words), tokens_per_chunk):
            yield start, "".join(" " + w for w in words[start : start + tokens_per_chunk])

    def streamed() -> Iterator[bytes]:
        try:
            for i, text in groups():
                wait(i)
                delta: dict[str, Any] = {"content": text}
                if i == 0:
                    delta = {"role": "assistant", **delta}
                finish = chat.finish if i + (1 if i == 0 else tokens_per_chunk) >= len(chat.out_words) else None
                yield frame({**head, "object": "chat.completion.chunk",
                             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            yield frame({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
            if stream_format == "sse":
                yield SSE_DONE
        finally:
            if on_close:
                on_close()

    def whole() -> Iterator[bytes]:
        try:
            time.sleep(whole_delay)
            message = {"role": "assistant", "content": " ".join(chat.out_words)}
            yield json.dumps(
                {**head, "object": "chat.completion",
                 "choices": [{"index": 0, "message": message, "finish_reason": chat.finish}], "usage": usage},
                separators=(",", ":"),
                ensure_ascii=False,
            ).encode("utf-8")
        finally:
            if on_close:
                on_close()

    if request.stream:
        content_type = "text/event-stream" if stream_format == "sse" else "application/jsonlines"
        chunks = streamed()
    else:
        content_type, chunks = "application/json", whole()
    return BackendResponse(
        chunks=chunks,
        content_type=content_type,
        invoked_variant=variant or request.headers.target_variant or None,
        custom_attributes=request.headers.custom_attributes,
    )
