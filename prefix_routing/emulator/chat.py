"""OpenAI-style chat and completion requests and their answers (whole or as SSE chunks), shared by the backends."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Callable

from prefix_routing.emulator.backend import BackendResponse, ErrorReply
from prefix_routing.emulator.protocol import RuntimeRequest, log_stream_arn
from prefix_routing.rules.limits import OUTPUT_LIMIT_FIELDS, output_limit_values

#: The last server-sent event of an OpenAI-style stream.
SSE_DONE = b"data: [DONE]\n\n"


def sse_event(obj: Any) -> bytes:
    """One server-sent event ``data: <compact JSON>\\n\\n``."""
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n\n"


_WORD_RE = re.compile(r"\S+")


def prompt_texts(body: Any) -> tuple[str, str]:
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
    answer_words: list[str]  # the last user turn's words (["ok"] if none): the answer repeats them to n_out
    n_out: int
    finish: str  # "length" when the body set a token limit, else "stop"
    cache_salt: str
    #: The limit the body asked for (max_completion_tokens, max_tokens or parameters.max_new_tokens), or None.
    requested: int | None = None

    def out_word(self, i: int) -> str:
        """Word ``i`` of the answer (the answer is never built whole: n_out may be large)."""
        return self.answer_words[i % len(self.answer_words)]


#: The body fields that bound the answer's length (the front door's limits charge the same ones).
LIMIT_FIELDS = OUTPUT_LIMIT_FIELDS


def _limit(body: dict[str, Any]) -> tuple[str, int] | None:
    """(field, value) of the body's token limit, each present field checked as vLLM's request model checks
    it: an integer (a float with no fraction counts, as pydantic's lax mode takes it), at least 1.
    Raises ValueError naming the field, the value and what is allowed."""
    values = output_limit_values(body) if isinstance(body, dict) else {}
    checked: dict[str, int] = {}
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}: {json.dumps(value)[:40]} is not an integer; allowed: an integer of at least 1")
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}.")
        checked[name] = value
    for name in LIMIT_FIELDS:
        if name in checked:
            return name, checked[name]
    return None


def parse_chat_request(request: RuntimeRequest, *, default_max_tokens: int) -> ChatRequest | ErrorReply:
    """Parse the body as a container would; a body it cannot serve gets ``ModelError`` (original 400).

    A token limit that is not an integer of at least 1 is such a body. The limit is not checked against
    the model's context here (the prompt's token count is the backend's): see :func:`context_error`.
    Nothing here grows with the limit."""
    try:
        body = request.json()
        everything, last_user = prompt_texts(body)
        limit = _limit(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        return client_error(request, str(exc))
    requested = limit[1] if limit else None
    n_out = requested if requested is not None else default_max_tokens
    return ChatRequest(
        body=body,
        prompt_text=everything,
        prompt_words=_WORD_RE.findall(everything),
        answer_words=_WORD_RE.findall(last_user) or ["ok"],
        n_out=n_out,
        finish="length" if requested is not None else "stop",
        cache_salt=body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else "",
        requested=requested,
    )


def within_context(request: RuntimeRequest, chat: ChatRequest, prompt_tokens: int, context_tokens: int
                   ) -> ChatRequest | ErrorReply:
    """``chat`` if it fits the model's context (``max_model_len``), else vLLM's refusal as SageMaker
    passes it on: ``ModelError`` 424 with ``OriginalStatusCode`` 400 and vLLM's own words. Without a
    limit in the body vLLM checks the prompt alone (and would answer up to the context): the default
    answer is then cut where the context ends. (The words are vLLM's ``_validate_input``, 0.6 to 0.9:
    vllm-project/vllm#20409 quotes the first message; the prompt-alone one is from its source, unconfirmed
    against a live endpoint.)"""
    if chat.requested is None:
        if prompt_tokens >= context_tokens:
            return client_error(request, f"This model's maximum context length is {context_tokens} tokens. However, "
                                         f"you requested {prompt_tokens} tokens in the messages, Please reduce the "
                                         "length of the messages.")
        return replace(chat, n_out=min(chat.n_out, context_tokens - prompt_tokens))
    if prompt_tokens + chat.requested > context_tokens:
        return client_error(request, f"This model's maximum context length is {context_tokens} tokens. However, you "
                                     f"requested {prompt_tokens + chat.requested} tokens ({prompt_tokens} in the "
                                     f"messages, {chat.requested} in the completion). Please reduce the length of "
                                     "the messages or completion.")
    return chat


def client_error(request: RuntimeRequest, text: str) -> ErrorReply:
    """``ModelError`` for a body the container refuses with 400, its body vLLM's error object."""
    message = json.dumps({"object": "error", "message": text, "type": "BadRequestError", "param": None, "code": 400})
    return ErrorReply(
        "ModelError",
        f'Received client error (400) from primary with message "{message}".',
        original_status_code=400,
        original_message=message,
        log_stream_arn=log_stream_arn(request.endpoint_name),
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

    n_out = chat.n_out

    def groups() -> Iterator[tuple[int, str]]:
        yield 0, chat.out_word(0)
        for start in range(1, n_out, tokens_per_chunk):
            yield start, "".join(" " + chat.out_word(i) for i in range(start, min(n_out, start + tokens_per_chunk)))

    def streamed() -> Iterator[bytes]:
        try:
            for i, text in groups():
                wait(i)
                delta: dict[str, Any] = {"content": text}
                if i == 0:
                    delta = {"role": "assistant", **delta}
                finish = chat.finish if i + (1 if i == 0 else tokens_per_chunk) >= n_out else None
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
            message = {"role": "assistant", "content": " ".join(chat.out_word(i) for i in range(n_out))}
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
