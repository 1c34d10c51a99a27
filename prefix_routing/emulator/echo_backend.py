"""A backend that echoes the prompt back, word by word, with configurable delays: the emulator's simplest model."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter, OrderedDict
from typing import Any

from prefix_routing.emulator.backend import BackendResponse, ErrorReply
from prefix_routing.emulator.chat import chat_response, parse_chat_request, within_context
from prefix_routing.emulator.protocol import RuntimeRequest

DEFAULT_CONTEXT_TOKENS = 131_072  # Llama 3.1's context window: words stand in for tokens


class EchoBackend:
    """A scripted model for tests and demos: answers OpenAI chat-completion chunks that echo the
    last user message word by word.

    - Streamed (``request.stream``): chunks ``{"id","object":"chat.completion.chunk","created","model",
      "choices":[{"index":0,"delta":{"content":...},"finish_reason":...}]}``, then a last chunk with
      ``"choices": []`` and ``usage`` (``prompt_tokens``, ``completion_tokens``, ``total_tokens``,
      ``prompt_tokens_details.cached_tokens``). With ``stream_format="sse"`` (default, what vLLM's
      OpenAI server and the SageMaker vLLM container send) each chunk is ``data: {...}\\n\\n`` and the
      stream ends with ``data: [DONE]\\n\\n``; with ``"jsonl"`` each chunk is one JSON line. Usage is
      always sent (vLLM sends it only with ``stream_options.include_usage``).
    - Not streamed: one ``chat.completion`` JSON object with ``message`` and the same ``usage``.
    - Tokens are whitespace-separated words (a stand-in for a tokenizer). ``cached_tokens`` comes
      from a tiny prefix cache: blocks of ``block_tokens`` prompt words, chained hashes seeded with the
      body's ``cache_salt``; a block counts as cached when the same chain was seen before (one cache
      shared by all requests: no instances, no eviction beyond ``cache_blocks``).
    - Latency: ``first_chunk_delay`` before the first chunk, ``token_delay`` before each next one (a
      non-streamed answer sleeps the sum). ``max_tokens`` (or ``max_completion_tokens``,
      ``parameters.max_new_tokens``) from the body, else the backend's ``max_tokens``.
    - A body without ``messages``/``prompt``/``inputs``, or with a token limit that is no integer of
      at least 1, gets ``ModelError`` with ``OriginalStatusCode`` 400, as a container rejecting it
      would; so does one whose prompt words plus limit exceed ``context_tokens`` (vLLM's words).
    """

    def __init__(
        self,
        *,
        first_chunk_delay: float = 0.0,
        token_delay: float = 0.0,
        max_tokens: int = 8,
        stream_format: str = "sse",
        model: str = "echo",
        block_tokens: int = 16,
        cache_blocks: int = 100_000,
        variant: str | None = None,
        context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    ):
        if not isinstance(context_tokens, int) or context_tokens < 1:
            raise ValueError("context_tokens must be a positive integer")
        if stream_format not in ("sse", "jsonl"):
            raise ValueError("stream_format must be 'sse' or 'jsonl'")
        self.first_chunk_delay = first_chunk_delay
        self.token_delay = token_delay
        self.max_tokens = max_tokens
        self.stream_format = stream_format
        self.model = model
        self.block_tokens = block_tokens
        self.cache_blocks = cache_blocks
        self.variant = variant
        self.context_tokens = context_tokens
        self._lock = threading.Lock()
        self._cache: OrderedDict[bytes, None] = OrderedDict()
        self._totals = Counter()

    # -- the prefix cache
    def _cached_tokens(self, words: list[str], salt: str) -> int:
        chain = hashlib.sha256(salt.encode("utf-8")).digest()
        hits, still_hitting = 0, True
        n = self.block_tokens
        with self._lock:
            for start in range(0, len(words) - n + 1, n):
                chain = hashlib.sha256(chain + "\x00".join(words[start : start + n]).encode("utf-8")).digest()
                if still_hitting and chain in self._cache:
                    hits += n
                    self._cache.move_to_end(chain)
                else:
                    still_hitting = False
                    self._cache[chain] = None
                    if len(self._cache) > self.cache_blocks:
                        self._cache.popitem(last=False)
        return hits

    def status(self) -> dict[str, Any]:
        with self._lock:
            totals = dict(self._totals)
            blocks = len(self._cache)
        prompt = totals.get("prompt_tokens", 0)
        return {
            **totals,
            "cached_blocks": blocks,
            "hit_rate": (totals.get("cached_tokens", 0) / prompt) if prompt else None,
        }

    def handle(self, request: RuntimeRequest) -> BackendResponse | ErrorReply:
        chat = parse_chat_request(request, default_max_tokens=self.max_tokens)
        if isinstance(chat, ErrorReply):
            return chat
        chat = within_context(request, chat, len(chat.prompt_words), self.context_tokens)
        if isinstance(chat, ErrorReply):
            return chat
        cached = self._cached_tokens(chat.prompt_words, chat.cache_salt)
        with self._lock:
            self._totals.update(
                requests=1, prompt_tokens=len(chat.prompt_words), cached_tokens=cached, completion_tokens=chat.n_out
            )

        def wait(i: int) -> None:
            time.sleep(self.first_chunk_delay if i == 0 else self.token_delay)

        return chat_response(
            request,
            chat,
            prompt_tokens=len(chat.prompt_words),
            cached_tokens=cached,
            wait=wait,
            whole_delay=self.first_chunk_delay + self.token_delay * max(0, chat.n_out - 1),
            stream_format=self.stream_format,
            model=self.model,
            variant=self.variant,
        )
