"""Deterministic request bodies for traces that carry no text (the Mooncake trace), and realistic
client variation of a body that keeps its meaning.

Used by the load tester, the demo and the emulator; standard library only.

The text of a prompt is made block by block from its chained block ids (``hash_ids``, one per
512-token block). A block's text depends only on its id (and its length): words drawn from a PRNG
seeded with the id. Because the ids are chained (equal id ⇒ equal prefix up to and including that
block), two prompts share a byte prefix exactly as far as they share leading block ids; the first
differing block differs from its first word on (with overwhelming probability: both are drawn from
a 222-word vocabulary by independent PRNG streams).

- A full block is exactly ``round(block_tokens × bytes_per_token)`` UTF-8 bytes (2,048 by default),
  so block *k* of a prompt starts at byte ``k × 2048`` of :func:`prompt_text`'s encoding. The last,
  partial block has ``round(tokens × bytes_per_token)`` bytes. Every block ends with a line feed.
- Words are common short English words, some of them accented (``café``, ``naïve``, ``Zürich``), in
  NFC, so that :func:`vary` can send them in NFD; sentences end with ``.``, paragraphs with ``\\n``.
  The EchoBackend counts whitespace-separated words as tokens: a block is about 400 words.

:func:`chat_body` turns a trace record into an OpenAI chat body (system prompt = the first block(s),
user turn = the rest, ``max_tokens`` = the record's output length, ``stream: true``), with the
prompt-bearing field first, as the normalizer writes it. :func:`vary` serializes a body the way a
different client might: key order, indentation, ``\\r\\n``, sampling parameters before ``messages``,
NFD, ``\\u`` escapes; ``json.loads`` of the result equals the body after NFC (and, with
``text_line_endings=True``, after CRLF → LF in the text), and the normalizer maps every variant back
to the same bytes.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import random
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from prefix_routing.lab.input_bounds import MAX_PROMPT_TOKENS

__all__ = [
    "BLOCK_TOKENS",
    "BYTES_PER_TOKEN",
    "BLOCK_BYTES",
    "SAMPLING_KEYS",
    "block_text",
    "prompt_text",
    "chat_body",
    "serialize",
    "vary",
    "common_prefix_length",
]

BLOCK_TOKENS = 512
BYTES_PER_TOKEN = 4.0
BLOCK_BYTES = int(round(BLOCK_TOKENS * BYTES_PER_TOKEN))  # 2048

#: Fields a client may put before ``messages`` (sampling and generation parameters).
SAMPLING_KEYS = (
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
)

_SEED_PREFIX = "prefix-routing-block:"

# Short common words and a few accented ones (in NFC).
_WORDS = tuple(
    """the of and to in is it you that he was for on are as with his they at be this have from or one
    had by word but not what all were we when your can said there use an each which she do how their if
    will up other about out many then them these so some her would make like him into time has look two
    more write go see number no way could people my than first water been call who oil its now find long
    down day did get come made may part over new sound take only little work know place year live me back
    give most very after thing our just name good sentence man think say great where help through much
    before line right too mean old any same tell boy follow came want show also around form three small
    set put end does another well large must big even such because turn here why ask went men read need
    land different home us move try kind hand picture again change off play spell air away animal house
    cache token prefix route model block query answer context layer batch queue copy node load key""".split()
)
_ACCENTED = ("café", "naïve", "résumé", "déjà", "façade", "über", "señor", "jalapeño", "crème", "brûlée",
             "fiancée", "piñata", "São", "Zürich", "Ångström", "Málaga", "Côte", "Noël", "Şişli", "Ñandú")
_FILL_LETTERS = "etaoinshrdlucmfwyp"


# Accented words make up about 5 % of the draws.
_POOL = _WORDS * 2 + _ACCENTED
_CAPITAL = {w: w[:1].upper() + w[1:] for w in _POOL}
_SIZE = {w: len(w.encode("utf-8")) for w in _POOL}
_BATCH = 512


@functools.lru_cache(maxsize=8192)
def _block_text(block_id: Any, nbytes: int) -> str:
    """Sentences of 6-16 words, paragraphs of 3-7 sentences, cut to exactly ``nbytes`` bytes."""
    if nbytes <= 0:
        return ""
    rng = random.Random(f"{_SEED_PREFIX}{block_id!r}")
    randint, choices = rng.randint, rng.choices
    out: list[str] = []
    append = out.append
    budget = nbytes - 2  # keep a filler letter and the closing line feed (no space before it)
    used = 0
    sentence_left, paragraph_left, capital = randint(6, 16), randint(3, 7), True
    done = False
    while not done:
        for word in choices(_POOL, k=_BATCH):
            size = _SIZE[word] + 1
            if used + size > budget:
                done = True
                break
            if capital:
                word, capital = _CAPITAL[word], False
            sentence_left -= 1
            if sentence_left:
                append(word + " ")
            else:
                if used + size + 1 > budget:
                    done = True
                    break
                size += 1
                sentence_left, capital = randint(6, 16), True
                paragraph_left -= 1
                if paragraph_left:
                    append(word + ". ")
                else:
                    paragraph_left = randint(3, 7)
                    append(word + ".\n")
            used += size
    left = nbytes - used  # 2 .. (longest piece + 2), or 1 when nbytes is 1
    # Exact length: a filler word of ASCII letters, then the line feed that ends every block.
    append("".join(choices(_FILL_LETTERS, k=left - 1)) + "\n")
    return "".join(out)


def block_text(block_id: Any, nbytes: int = BLOCK_BYTES) -> str:
    """The text of one block: exactly ``nbytes`` UTF-8 bytes, a pure function of ``(block_id, nbytes)``.

    Ends with a line feed; no space or tab before any line feed (so the normalizer's line-end rule
    leaves it alone).
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be an integer >= 0, got {nbytes!r}")
    return _block_text(block_id, nbytes)


def _block_sizes(n_ids: int, input_length: int | None, block_tokens: int, bytes_per_token: float) -> list[int]:
    if not block_tokens > 0 or not bytes_per_token > 0:
        raise ValueError("block_tokens and bytes_per_token must be > 0")
    full = int(round(block_tokens * bytes_per_token))
    if (input_length if isinstance(input_length, int) else n_ids * block_tokens) > MAX_PROMPT_TOKENS:
        raise ValueError(f"a prompt of {input_length if isinstance(input_length, int) else n_ids * block_tokens:,} "
                         f"tokens: at most {MAX_PROMPT_TOKENS:,} (prefix_routing.lab.input_bounds)")
    if n_ids == 0:
        if input_length:
            raise ValueError(f"input_length={input_length} but no hash_ids")
        return []
    sizes = [full] * n_ids
    if input_length is not None:
        if isinstance(input_length, bool) or not isinstance(input_length, int):
            raise ValueError(f"input_length must be an integer, got {input_length!r}")
        last = input_length - block_tokens * (n_ids - 1)
        if not 0 < last <= block_tokens:
            raise ValueError(
                f"{n_ids} hash_ids do not fit input_length={input_length}: expected "
                f"ceil({input_length} / {block_tokens}) = {math.ceil(input_length / block_tokens)} ids"
            )
        sizes[-1] = max(1, int(round(last * bytes_per_token)))
    return sizes


def prompt_text(
    hash_ids: Sequence[Any],
    input_length: int | None = None,
    *,
    block_tokens: int = BLOCK_TOKENS,
    bytes_per_token: float = BYTES_PER_TOKEN,
) -> str:
    """The prompt of a trace record: one :func:`block_text` per id, concatenated.

    ``input_length`` (tokens) sizes the last, partial block; ``None`` makes every block full. Raises
    ``ValueError`` when the number of ids does not match ``ceil(input_length / block_tokens)``.
    """
    sizes = _block_sizes(len(hash_ids), input_length, block_tokens, bytes_per_token)
    return "".join(_block_text(block_id, size) for block_id, size in zip(hash_ids, sizes))


def _field(record: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if isinstance(record, Mapping):
            if name in record:
                return record[name]
        elif hasattr(record, name):
            return getattr(record, name)
    return default


def chat_body(
    record: Any,
    system_blocks: int = 1,
    *,
    model: str | None = None,
    include_usage: bool = True,
    block_tokens: int = BLOCK_TOKENS,
    bytes_per_token: float = BYTES_PER_TOKEN,
    **params: Any,
) -> dict[str, Any]:
    """An OpenAI chat-completions body for a trace record.

    ``record``: a mapping or an object with ``hash_ids`` (or ``blocks``), ``input_length`` (or
    ``prompt_tokens``) and ``output_length`` (or ``output_tokens``), e.g. one line of a Mooncake
    trace. The first ``system_blocks`` blocks are the system prompt (its final line feed dropped, as a
    client would send it), the rest the user turn (empty when the prompt has no more blocks). Keys in
    this order: ``messages``, ``model`` (when given), ``max_tokens`` (the output length, at least 1),
    ``stream: true``, ``stream_options: {"include_usage": true}`` (so vLLM sends usage), then
    ``params`` (e.g. ``temperature=0.7``).
    """
    if isinstance(system_blocks, bool) or not isinstance(system_blocks, int) or system_blocks < 0:
        raise ValueError(f"system_blocks must be an integer >= 0, got {system_blocks!r}")
    ids = _field(record, "hash_ids", "blocks")
    if ids is None:
        raise ValueError("record has no 'hash_ids'")
    ids = list(ids)
    input_length = _field(record, "input_length", "prompt_tokens")
    output_length = _field(record, "output_length", "output_tokens", default=1)
    sizes = _block_sizes(len(ids), input_length, block_tokens, bytes_per_token)
    texts = [_block_text(block_id, size) for block_id, size in zip(ids, sizes)]
    system = "".join(texts[:system_blocks])
    user = "".join(texts[system_blocks:])
    messages = []
    if system_blocks:
        messages.append({"role": "system", "content": system[:-1] if system.endswith("\n") else system})
    messages.append({"role": "user", "content": user})
    body: dict[str, Any] = {"messages": messages}
    if model is not None:
        body["model"] = model
    out = output_length if isinstance(output_length, int) and not isinstance(output_length, bool) else 1
    body["max_tokens"] = max(1, out)
    body["stream"] = True
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    body.update(params)
    return body


def serialize(body: Any) -> bytes:
    """Compact UTF-8 JSON in the body's own key order (what a tidy client sends)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _map_strings(value: Any, fn) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [_map_strings(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map_strings(v, fn) for k, v in value.items()}
    return value


def _shuffled(d: dict, rng: random.Random) -> dict:
    keys = list(d)
    rng.shuffle(keys)
    return {k: d[k] for k in keys}


def vary(
    body: Mapping[str, Any],
    rng: random.Random,
    *,
    text_line_endings: bool = False,
) -> bytes:
    """Serialize ``body`` as some other client might, keeping its meaning; returns the bytes.

    Each call draws from ``rng`` (so a seeded ``random.Random`` gives reproducible variants):

    - top-level key order: as given, shuffled, sorted, or the sampling parameters
      (:data:`SAMPLING_KEYS`) before ``messages``; message keys (``role``/``content``) shuffled;
    - Unicode: the prompt text in NFD (accented letters decomposed) half of the time;
    - layout: compact, ``", "``/``": "`` separators, or indented by 2, 4 spaces or a tab; when indented,
      ``\\r\\n`` line endings half of the time; sometimes a final line feed;
    - ``\\u`` escapes for non-ASCII characters (``ensure_ascii``) a third of the time;
    - with ``text_line_endings=True``, also ``\\r\\n`` line endings inside the prompt text half of the
      time (the normalizer's text rules undo it, but ``json.loads`` then sees different strings).

    ``body`` is not modified.
    """
    data = copy.deepcopy(dict(body))
    messages = data.get("messages")
    if isinstance(messages, list):
        if rng.random() < 0.5:
            data["messages"] = messages = _map_strings(messages, lambda s: unicodedata.normalize("NFD", s))
        if text_line_endings and rng.random() < 0.5:
            data["messages"] = messages = _map_strings(messages, lambda s: s.replace("\n", "\r\n"))
        data["messages"] = [_shuffled(m, rng) if isinstance(m, dict) else m for m in messages]
    for key in ("prompt", "inputs"):
        if isinstance(data.get(key), (str, list)) and rng.random() < 0.5:
            data[key] = _map_strings(data[key], lambda s: unicodedata.normalize("NFD", s))

    order = rng.randrange(4)
    if order == 1:
        data = _shuffled(data, rng)
    elif order == 2:
        data = {k: data[k] for k in sorted(data)}
    elif order == 3:
        first = [k for k in data if k in SAMPLING_KEYS]
        rng.shuffle(first)
        data = {**{k: data[k] for k in first}, **{k: v for k, v in data.items() if k not in SAMPLING_KEYS}}

    ensure_ascii = rng.random() < 1 / 3
    layout = rng.randrange(5)
    if layout == 0:
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=ensure_ascii)
    elif layout == 1:
        text = json.dumps(data, ensure_ascii=ensure_ascii)  # ", " and ": "
    else:
        indent = (2, 4, "\t")[layout - 2]
        text = json.dumps(data, indent=indent, ensure_ascii=ensure_ascii)
        # json.dumps escapes line feeds inside strings, so every raw "\n" here is layout.
        if rng.random() < 0.5:
            text = text.replace("\n", "\r\n")
    if rng.random() < 0.25:
        text += "\r\n" if "\r\n" in text else "\n"
    return text.encode("utf-8")


def common_prefix_length(a: bytes | str, b: bytes | str) -> int:
    """Length of the longest common prefix of two byte (or text) strings."""
    n = min(len(a), len(b))
    lo, hi = 0, n
    # Binary search on slices (fast for long equal prefixes), then the exact position.
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
