"""Measuring a real engine's prefill and decode times and fitting the lab's latency model to them.

Against any OpenAI-compatible server (``POST /v1/chat/completions``, streamed with usage), timed by
the client: TTFT at the first content chunk, the decode time per token from the chunks after it,
token counts from the final chunk's ``usage`` (``prompt_tokens``, ``prompt_tokens_details.cached_tokens``).
Three kinds of points, each the median of a few repeats:

- cold prompts of about 256 … 4,096 tokens, made of random words from a seeded RNG so that no two
  share more than the chat template (checked: a cold prompt that was cached is reported; the
  command draws a fresh seed per run, since an engine may keep an earlier run's prompts, e.g.
  llama.cpp's ``--cache-ram``);
- cached prefixes: a prefix of c tokens, then the same prefix plus n new words, for c × n pairs
  (checked: ``cached_tokens`` must cover the prefix, else the run is reported and left out);
- decode: the cold prompts' streamed answers (32 tokens by default) give the time per token at
  each context length.

The fits (:func:`fit_prefill`, :func:`fit_decode`) are least squares on relative errors (the
points span 50× in time; plain least squares would fit the largest and ignore the rest), with every
coefficient kept >= 0 (an exact search over which coefficients are zero). Measuring talks to the
server through ``stream``/``get``/``clock`` so that tests can drive it without sockets or sleeps.
"""

from __future__ import annotations

import http.client
import itertools
import json
import random
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prefix_routing.engines.model import ModelShape
from prefix_routing.engines.words import COMMON_WORDS
from prefix_routing.rules.errors import UserError
from prefix_routing.stage.preset_file import PresetFile
from prefix_routing.stage.presets import LatencyCoefficients

Stream = Callable[[str, dict], Iterator[dict]]  # (url, JSON body) -> the parsed SSE data objects
Get = Callable[[str], Any]  # url -> parsed JSON, or None when the server has no such endpoint
GetText = Callable[[str], "str | None"]  # url -> the body as text, or None when there is no such endpoint
Clock = Callable[[], float]


def _kv_bytes(layers: int, hidden: int, shape: ModelShape = ModelShape()) -> int:
    """K and V × layers × KV heads × head dim × 2 bytes (f16), heads as in ModelShape."""
    return 2 * layers * shape.kv_heads * (hidden // shape.heads) * 2


#: The project's tiny model (engines/model.py): 2 × 2 layers × 8 KV heads × 64 × 2 bytes = 4,096.
DEFAULT_KV_BYTES_PER_TOKEN = _kv_bytes(ModelShape().layers, ModelShape().hidden)
_TINY_MODEL = re.compile(r"tiny-llama-l(\d+)-h(\d+)-f\d+-s\d+\.gguf$")
_TINY_VLLM_MODEL = re.compile(r"tiny-llama-l(\d+)-h(\d+)-s\d+/?$")
VLLM_HEADS, VLLM_DTYPE_BYTES = 4, 4  # engines/vllm_model.py: 4 heads (of 64 at hidden 256), float32
_WORDS = COMMON_WORDS


@dataclass(frozen=True)
class Plan:
    """What to measure: cold sizes, cached × new pairs, repeats, tokens per decode answer."""

    cold_tokens: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
    cached_tokens: tuple[int, ...] = (1024, 2048)
    new_tokens: tuple[int, ...] = (64, 256, 1024)
    repeats: int = 3
    decode_tokens: int = 32


#: For tests and CI: enough points for both fits, one repeat, a few seconds.
QUICK_PLAN = Plan(cold_tokens=(256, 1024), cached_tokens=(512,), new_tokens=(64, 256), repeats=1, decode_tokens=8)


@dataclass(frozen=True)
class Sample:
    """One streamed request as the client saw it."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    per_token_s: float | None  # None with fewer than two output tokens

    @property
    def new_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True)
class PrefillPoint:
    cached_tokens: float
    new_tokens: float
    prompt_s: float
    samples: int


@dataclass(frozen=True)
class DecodePoint:
    context_tokens: float
    step_s: float
    samples: int


@dataclass(frozen=True)
class Fit:
    """Coefficients of a fit and how far each point is from it (relative to the point)."""

    coefficients: tuple[float, ...]
    predicted: tuple[float, ...]
    relative_errors: tuple[float, ...]

    @property
    def median_error(self) -> float:
        return statistics.median(self.relative_errors)

    @property
    def worst_error(self) -> float:
        return max(self.relative_errors)


def fit_prefill(points: Sequence[PrefillPoint]) -> Fit:
    """``prompt_s ≈ a + b·n_new + c·n_new·(n_cached + n_new/2)``: coefficients (a, b, c)."""
    rows = [(1.0, p.new_tokens, p.new_tokens * (p.cached_tokens + p.new_tokens / 2)) for p in points]
    return _fit(rows, [p.prompt_s for p in points], "prefill")


def fit_decode(points: Sequence[DecodePoint]) -> Fit:
    """``step_s ≈ d + e·context``: coefficients (d, e)."""
    return _fit([(1.0, p.context_tokens) for p in points], [p.step_s for p in points], "decode")


def _fit(rows: list[tuple[float, ...]], observed: list[float], what: str) -> Fit:
    import numpy as np

    width = len(rows[0]) if rows else 0
    if len(set(rows)) < width:
        raise UserError(f"calibrate: {len(set(rows))} distinct {what} points; the fit needs at least {width}")
    x, y = np.asarray(rows, dtype=float), np.asarray(observed, dtype=float)
    if not (y > 0).all():
        raise UserError(f"calibrate: a {what} time of {y.min()!r} s: times must be > 0")
    xw, ones = x / y[:, None], np.ones(len(y))  # relative errors: divide each row by its observation
    best: tuple[float, np.ndarray] | None = None
    for size in range(width, 0, -1):  # exact non-negative least squares: try each set of free columns
        for columns in itertools.combinations(range(width), size):
            solution, *_ = np.linalg.lstsq(xw[:, columns], ones, rcond=None)
            if (solution < 0).any():
                continue
            full = np.zeros(width)
            full[list(columns)] = solution
            residual = float(np.sum((xw @ full - ones) ** 2))
            if best is None or residual < best[0] * (1 - 1e-12):
                best = (residual, full)
    assert best is not None  # a single column with positive rows and observations is never negative
    coefficients = best[1]
    predicted = x @ coefficients
    errors = np.abs(predicted - y) / y
    return Fit(tuple(map(float, coefficients)), tuple(map(float, predicted)), tuple(map(float, errors)))


# ----------------------------------------------------------------------------- talking to the server


def http_stream(url: str, body: dict, timeout_s: float = 120.0) -> Iterator[dict]:
    """POST ``body`` to ``url`` and yield each ``data:`` object of the event stream (no proxies)."""
    connection, path = _connect(url, timeout_s)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json",
                                                            "Accept": "text/event-stream"})
        response = connection.getresponse()
        if response.status != 200:
            raise UserError(f"calibrate: POST {url} answered {response.status}: {response.read(300)!r}")
        for raw in response:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                yield json.loads(data)
            except ValueError:
                raise UserError(f"calibrate: POST {url}: an event that is not JSON: {data[:80]!r}") from None
    except (OSError, http.client.HTTPException) as error:
        raise UserError(f"calibrate: POST {url} failed: {error}") from None
    finally:
        connection.close()


def http_get_text(url: str, timeout_s: float = 10.0) -> str | None:
    """GET ``url`` as text (a Prometheus exposition); None when the server has no such endpoint."""
    connection, path = _connect(url, timeout_s)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        return body.decode("utf-8", errors="replace") if response.status == 200 else None
    except (OSError, http.client.HTTPException) as error:
        raise UserError(f"calibrate: GET {url} failed: {error}") from None
    finally:
        connection.close()


def http_get_json(url: str, timeout_s: float = 10.0) -> Any:
    """GET ``url`` as JSON; None when the server has no such endpoint or it is not JSON."""
    connection, path = _connect(url, timeout_s)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        return json.loads(body) if response.status == 200 else None
    except ValueError:
        return None
    except (OSError, http.client.HTTPException) as error:
        raise UserError(f"calibrate: GET {url} failed: {error}") from None
    finally:
        connection.close()


def _connect(url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise UserError(f"calibrate: {url!r}: give an http:// URL such as http://127.0.0.1:8080")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout_s), path


@dataclass
class Client:
    """One OpenAI-compatible server: ``chat`` sends one streamed request and times it."""

    url: str
    stream: Stream = http_stream
    clock: Clock = time.perf_counter
    model: str | None = None

    def chat(self, text: str, max_tokens: int) -> Sample:
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True,  # llama.cpp and vLLM: answer max_tokens tokens even after an end token
            "stream": True, "stream_options": {"include_usage": True},
        }
        if self.model:
            body["model"] = self.model
        start = self.clock()
        content_times: list[float] = []
        finished: float | None = None
        usage = None
        for chunk in self.stream(f"{self.url}/v1/chat/completions", body):
            now = self.clock()
            for choice in chunk.get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    content_times.append(now)
                if choice.get("finish_reason") and finished is None:
                    finished = now
            if chunk.get("usage"):
                usage = chunk["usage"]
        if usage is None or not isinstance(usage.get("prompt_tokens"), int):
            raise UserError(f"calibrate: {self.url} sent no usage with prompt_tokens in its last chunk "
                            "(stream_options.include_usage): the token counts are unknown")
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        completion = usage.get("completion_tokens") or len(content_times)
        first = content_times[0] if content_times else finished
        if first is None:
            raise UserError(f"calibrate: {self.url} streamed no token")
        per_token = None
        if len(content_times) >= 2 and completion >= 2:
            per_token = (content_times[-1] - content_times[0]) / (completion - 1)
        return Sample(usage["prompt_tokens"], int(cached), int(completion), first - start, per_token)


@dataclass(frozen=True)
class EngineInfo:
    """What the server says about itself, or None where it does not: llama.cpp's /slots and /props,
    vLLM's /v1/models (its longest sequence) and its /metrics (``vllm:cache_config_info``: the KV
    block and the blocks of its cache)."""

    slots: int | None = None
    context_per_slot: int | None = None
    model: str | None = None  # the id to send (/v1/models)
    model_file: str | None = None  # llama.cpp's model_path (/props); vLLM's model folder (/v1/models' root)
    llama_cpp: bool = False
    vllm: bool = False
    block_tokens: int | None = None  # vLLM: tokens per KV block
    kv_tokens: int | None = None  # vLLM: its KV cache, blocks × block size
    max_model_len: int | None = None  # vLLM: the longest sequence


_CACHE_CONFIG = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def vllm_cache_config(exposition: str | None) -> tuple[int, int] | None:
    """(block size, blocks) from a vLLM engine's ``vllm:cache_config_info`` gauge, or None."""
    match = _CACHE_CONFIG.search(exposition) if exposition else None
    if not match:
        return None
    labels = dict(_LABEL.findall(match[1]))
    try:
        block, blocks = int(labels["block_size"]), int(labels["num_gpu_blocks"])
    except (KeyError, ValueError):
        return None
    return (block, blocks) if block > 0 and blocks >= 0 else None


def engine_info(url: str, get: Get = http_get_json, get_text: GetText = http_get_text) -> EngineInfo:
    slots = get(f"{url}/slots")
    n_slots = n_ctx = None
    if isinstance(slots, list) and slots and all(isinstance(s, dict) and isinstance(s.get("n_ctx"), int)
                                                 for s in slots):
        n_slots, n_ctx = len(slots), min(s["n_ctx"] for s in slots)
    props = get(f"{url}/props")
    model_file = props.get("model_path") if isinstance(props, dict) else None
    models = get(f"{url}/v1/models")
    model = max_len = root = None
    if isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"] \
            and isinstance(models["data"][0], dict):
        first = models["data"][0]
        model, max_len, root = first.get("id"), first.get("max_model_len"), first.get("root")
    cache = vllm_cache_config(get_text(f"{url}/metrics"))
    vllm = cache is not None
    if vllm and model_file is None and isinstance(root, str):
        model_file = root
    return EngineInfo(n_slots, n_ctx, model if isinstance(model, str) else None,
                      model_file if isinstance(model_file, str) else None,
                      llama_cpp=isinstance(props, dict) and "build_info" in props, vllm=vllm,
                      block_tokens=cache[0] if cache else None, kv_tokens=cache[0] * cache[1] if cache else None,
                      max_model_len=max_len if vllm and isinstance(max_len, int) and not isinstance(max_len, bool)
                      else None)


def kv_bytes_from_model_file(model_file: str | None) -> int | None:
    """The project's tiny models name their shape: llama.cpp's file (``tiny-llama-l2-h512-…gguf``, heads
    as in ModelShape, f16) and vLLM's folder (``tiny-llama-l2-h256-s0``, 4 heads, float32)."""
    if not model_file:
        return None
    match = _TINY_MODEL.search(model_file)
    if match:
        return _kv_bytes(int(match[1]), int(match[2]))
    match = _TINY_VLLM_MODEL.search(model_file)
    if match:
        layers, hidden = int(match[1]), int(match[2])
        return 2 * layers * VLLM_HEADS * (hidden // VLLM_HEADS) * VLLM_DTYPE_BYTES
    return None


# ----------------------------------------------------------------------------- the measurement


class _Words:
    """Random words from a seeded RNG, sized in tokens by a probe of the server's tokenizer."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.tokens_per_word = 1.0
        self.overhead = 0.0  # tokens of the chat template around the content

    def text(self, tokens: float) -> str:
        count = max(1, round((tokens - self.overhead) / self.tokens_per_word))
        return " ".join(self.rng.choice(_WORDS) for _ in range(count))

    def words(self, tokens: float) -> str:
        """Words for ``tokens`` tokens inside a message (no template overhead)."""
        count = max(1, round(tokens / self.tokens_per_word))
        return " ".join(self.rng.choice(_WORDS) for _ in range(count))


@dataclass
class Measurement:
    """The medians per point, the two fits and what went wrong on the way."""

    prefill: list[PrefillPoint]
    decode: list[DecodePoint]
    prefill_fit: Fit
    decode_fit: Fit
    notes: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    repeats: int = 1
    seed: int = 0

    @property
    def coefficients(self) -> LatencyCoefficients:
        a, b, c = self.prefill_fit.coefficients
        d, e = self.decode_fit.coefficients
        return LatencyCoefficients(a, b, c, d, e)


def measure(client: Client, plan: Plan = Plan(), *, context_per_slot: int | None = None, seed: int = 0,
            say: Callable[[str], None] = lambda text: None) -> Measurement:
    """Run the plan against ``client`` and fit both models."""
    started = client.clock()
    words = _Words(seed)
    notes: list[str] = []
    limit = (context_per_slot or 10**9) - plan.decode_tokens - 16
    # Probe the tokenizer (and warm the engine up): 1 word, then 400 words.
    one = client.chat(words.words(1), 1)
    many = client.chat(words.words(400), 1)
    words.tokens_per_word = max(0.1, (many.prompt_tokens - one.prompt_tokens) / 399)
    words.overhead = max(0.0, one.prompt_tokens - words.tokens_per_word)
    say(f"probe: {words.tokens_per_word:.2f} tokens per word, {words.overhead:.0f} tokens of chat template")

    cold_sizes = [n for n in plan.cold_tokens if n <= limit]
    pairs = [(c, n) for c in plan.cached_tokens for n in plan.new_tokens if c + n <= limit]
    skipped = len(plan.cold_tokens) - len(cold_sizes) + len(plan.cached_tokens) * len(plan.new_tokens) - len(pairs)
    if skipped:
        notes.append(f"{skipped} point(s) left out: longer than the {context_per_slot} tokens of a slot")
    cold: dict[int, list[Sample]] = {n: [] for n in cold_sizes}
    cached: dict[tuple[int, int], list[Sample]] = {p: [] for p in pairs}
    for repeat in range(plan.repeats):
        say(f"repeat {repeat + 1}/{plan.repeats}: cold {', '.join(map(str, cold_sizes))} tokens; "
            f"cached × new {', '.join(f'{c}+{n}' for c, n in pairs)}")
        for size in cold_sizes:
            sample = client.chat(words.text(size), plan.decode_tokens)
            if sample.cached_tokens > max(16, 0.05 * sample.prompt_tokens):
                notes.append(f"cold prompt of {sample.prompt_tokens} tokens had {sample.cached_tokens} cached")
            cold[size].append(sample)
        for c in plan.cached_tokens:
            todo = [n for n in plan.new_tokens if (c, n) in cached]
            if not todo:
                continue
            prefix = words.text(c)
            warm = client.chat(prefix, 1)
            for n in todo:
                sample = client.chat(f"{prefix} {words.words(n)}", 1)
                if sample.cached_tokens < 0.8 * warm.prompt_tokens:
                    notes.append(f"prefix of {warm.prompt_tokens} tokens + {n} new: only {sample.cached_tokens} "
                                 "cached; left out (is prompt caching on?)")
                    continue
                cached[(c, n)].append(sample)
    prefill = [_prefill_point(s) for s in (*cold.values(), *cached.values()) if s]
    decode = [_decode_point(s) for s in cold.values() if any(x.per_token_s for x in s)]
    if len(decode) < 2:
        raise UserError("calibrate: fewer than 2 decode points (answers of at least 2 tokens); "
                        "raise --decode-tokens or the cold sizes")
    prefill_fit, decode_fit = fit_prefill(prefill), fit_decode(decode)
    for kind, fit, names in (("prefill", prefill_fit, "abc"), ("decode", decode_fit, "de")):
        zeros = [name for name, value in zip(names, fit.coefficients) if value == 0]
        if zeros:
            notes.append(f"the {kind} fit kept {', '.join(zeros)} at 0 (a negative value would fit better)")
    return Measurement(prefill, decode, prefill_fit, decode_fit, notes, client.clock() - started, plan.repeats, seed)


def _prefill_point(samples: list[Sample]) -> PrefillPoint:
    return PrefillPoint(statistics.median(s.cached_tokens for s in samples),
                        statistics.median(s.new_tokens for s in samples),
                        statistics.median(s.ttft_s for s in samples), len(samples))


def _decode_point(samples: list[Sample]) -> DecodePoint:
    timed = [s for s in samples if s.per_token_s]
    # A token's context is the prompt plus the tokens before it: on average half the answer.
    return DecodePoint(statistics.median(s.prompt_tokens + s.completion_tokens / 2 for s in timed),
                       statistics.median(s.per_token_s for s in timed), len(timed))  # type: ignore[misc]


def preset_content(measurement: Measurement, *, name: str, url: str, slots: int, context_per_slot: int,
                   kv_bytes_per_token: int, max_batched_tokens: int, description: str, model_name: str,
                   sources: dict[str, str], date: datetime | None = None, engine_kind: str = "llama.cpp",
                   block_tokens: int | None = None, cache_tokens: int | None = None) -> PresetFile:
    """The preset file's content: the coefficients, the engine's shape and what was measured (a vLLM
    engine's block and KV cache in tokens too)."""
    m = measurement
    shape = None
    tiny = _TINY_MODEL.search(model_name)
    tiny_vllm = _TINY_VLLM_MODEL.search(model_name)
    if tiny and kv_bytes_per_token == kv_bytes_from_model_file(model_name):
        base = ModelShape()
        shape = (int(tiny[1]), base.kv_heads, int(tiny[2]) // base.heads, 2)
    elif tiny_vllm and kv_bytes_per_token == kv_bytes_from_model_file(model_name):
        shape = (int(tiny_vllm[1]), VLLM_HEADS, int(tiny_vllm[2]) // VLLM_HEADS, VLLM_DTYPE_BYTES)
    measured = {
        "url": url,
        "date": (date or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        "duration_s": round(m.duration_s, 3),
        "repeats": m.repeats,
        "seed": m.seed,
        "prefill": [{"cached_tokens": p.cached_tokens, "new_tokens": p.new_tokens, "prompt_s": p.prompt_s,
                     "samples": p.samples} for p in m.prefill],
        "decode": [{"context_tokens": p.context_tokens, "step_s": p.step_s, "samples": p.samples} for p in m.decode],
        "fit_errors": {kind: {"median": fit.median_error, "worst": fit.worst_error}
                       for kind, fit in (("prefill", m.prefill_fit), ("decode", m.decode_fit))},
        "notes": list(m.notes),
        "sources": dict(sources),
    }
    return PresetFile(name, m.coefficients, slots, context_per_slot, kv_bytes_per_token, max_batched_tokens,
                      description, Path(model_name).name or "unknown", shape, measured, engine_kind, block_tokens,
                      cache_tokens)
