"""A preset in a JSON file: a real engine's measured latency and capacity, usable wherever a preset is.

``python -m prefix_routing calibrate`` measures an engine and writes the file through
:func:`write_preset_file`; ``simulate``/``tune --preset-file`` (and the emulator) read it with
:func:`load_preset_file`. This module is the one definition of the format, so the writer checks
what it writes with the reader's checks. Loading validates every field and rejects unknown keys:
a hand-edited file fails with the file, the field, the value and what is allowed.

The format (``"format": "prefix-routing-preset", "version": 1``)::

    name                     the preset's name (what the lab prints)
    engine.description       what ran it ("local llama.cpp (CPU)"): the preset's instance name
    engine.slots             sequences the engine runs at once (llama.cpp: -np): max_num_seqs
    engine.context_per_slot  tokens per slot (llama.cpp: -c / -np); slots × this = KV tokens per copy
    engine.max_batched_tokens  tokens per engine step (llama.cpp's -b, default 2048): the prefill chunk
    engine.kind              optional: "llama.cpp" (default) or "vllm", the engine that was measured
    engine.block_tokens      optional (vLLM): tokens per KV block; cached tokens are whole blocks of it
    engine.kv_tokens         optional (vLLM): its KV cache in tokens (default slots × context_per_slot)
    model.name, model.kv_bytes_per_token, optionally model.layers/kv_heads/head_dim/dtype_bytes
    latency.{prefill_constant_s, prefill_s_per_token, attention_s_per_token_pair,
             step_base_s, step_s_per_context_token}   the fit's a, b, c, d, e (seconds)
    measured                 optional: url, date, the medians per point, the fit errors, notes
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from prefix_routing.rules.errors import UserError
from prefix_routing.stage.presets import VLLM_GPU_BLOCK_TOKENS, Gpu, Instance, LatencyCoefficients, Model, Preset

FORMAT = "prefix-routing-preset"
VERSION = 1
DEFAULT_MAX_BATCHED_TOKENS = 2048  # llama.cpp's default -b
DEFAULT_DESCRIPTION = "local llama.cpp (CPU)"
#: The context of the ``decode_step_s`` and the prompt of the ``prefill_tokens_per_s`` figures.
DECODE_CONTEXT_TOKENS = 2048
PREFILL_PROMPT_TOKENS = 4096

_TOP = ("format", "version", "name", "engine", "model", "latency", "measured")
_ENGINE = ("description", "slots", "context_per_slot", "max_batched_tokens", "kind", "block_tokens", "kv_tokens")
#: The kinds of local engine (``engines start --kind``) a preset file may come from.
ENGINE_KINDS = ("llama.cpp", "vllm")
_MODEL = ("name", "kv_bytes_per_token", "layers", "kv_heads", "head_dim", "dtype_bytes")
_SHAPE = ("layers", "kv_heads", "head_dim", "dtype_bytes")
_LATENCY = ("prefill_constant_s", "prefill_s_per_token", "attention_s_per_token_pair", "step_base_s",
            "step_s_per_context_token")
#: Pairs that must not both be 0: a prompt must cost something per token, and so must a step.
_NOT_BOTH_ZERO = (("prefill_s_per_token", "attention_s_per_token_pair"), ("step_base_s", "step_s_per_context_token"))
_MEASURED = ("url", "date", "duration_s", "repeats", "seed", "prefill", "decode", "fit_errors", "notes", "sources")
_MEASURED_REQUIRED = ("url", "date", "prefill", "decode", "fit_errors")
_PREFILL_POINT = ("cached_tokens", "new_tokens", "prompt_s", "samples")
_DECODE_POINT = ("context_tokens", "step_s", "samples")
_ERRORS = ("median", "worst")


@dataclass(frozen=True)
class PresetFile:
    """The content of a preset file, typed (``measured`` stays the plain JSON object it is)."""

    name: str
    coefficients: LatencyCoefficients
    slots: int
    context_per_slot: int
    kv_bytes_per_token: int
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    description: str = DEFAULT_DESCRIPTION
    model_name: str = "unknown"
    model_shape: tuple[int, int, int, int] | None = None  # layers, kv_heads, head_dim, dtype_bytes
    measured: dict[str, Any] | None = field(default=None, compare=False)
    engine_kind: str = ENGINE_KINDS[0]
    block_tokens: int | None = None  # vLLM: tokens per KV block
    cache_tokens: int | None = None  # vLLM: its KV cache in tokens (its blocks × block_tokens)

    @property
    def kv_tokens(self) -> int:
        """The engine's KV cache in tokens: vLLM's blocks, else llama.cpp's slots × their context."""
        return self.cache_tokens if self.cache_tokens is not None else self.slots * self.context_per_slot

    def as_json(self) -> dict[str, Any]:
        model: dict[str, Any] = {"name": self.model_name, "kv_bytes_per_token": self.kv_bytes_per_token}
        if self.model_shape is not None:
            model.update(zip(_SHAPE, self.model_shape))
        document: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "engine": {"description": self.description, "slots": self.slots,
                       "context_per_slot": self.context_per_slot, "max_batched_tokens": self.max_batched_tokens,
                       "kind": self.engine_kind,
                       **({"block_tokens": self.block_tokens} if self.block_tokens is not None else {}),
                       **({"kv_tokens": self.cache_tokens} if self.cache_tokens is not None else {})},
            "model": model,
            "latency": {key: getattr(self.coefficients, key) for key in _LATENCY},
        }
        if self.measured is not None:
            document["measured"] = self.measured
        return document


def write_preset_file(path: str | Path, content: PresetFile) -> Path:
    """Check ``content`` as the loader would, then write it atomically (temp file + rename)."""
    path = Path(path)
    document = content.as_json()
    parse_preset_document(json.loads(json.dumps(document)), str(path))  # as the file will read (NaN: refused)
    text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_preset_file(path: str | Path) -> PresetFile:
    """The file's content, every field checked (UserError naming the file and the field)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise UserError(f"preset file {path}: cannot read it ({error.strerror or error})") from None
    try:
        document = json.loads(text, parse_constant=_no_constant)
    except ValueError as error:
        raise UserError(f"preset file {path}: not JSON ({error})") from None
    return parse_preset_document(document, str(path))


def load_preset_file(path: str | Path) -> Preset:
    """A lab preset from a preset file (``FleetConfig(preset=...)``, ``LatencyModel.from_preset``)."""
    return to_preset(read_preset_file(path))


def to_preset(content: PresetFile) -> Preset:
    """One copy per instance on a stand-in 'GPU' whose memory is the engine's KV cache.

    The roofline figures (FLOP/s, bandwidth, MFU, parameters) stay 0: the measured coefficients
    replace everything ``LatencyModel`` would derive from them.
    """
    kv_bytes = content.kv_bytes_per_token
    shape = content.model_shape or (1, 1, kv_bytes // 2, 1)  # 2·1·1·(kv/2)·1: the same bytes per token
    layers, kv_heads, head_dim, dtype_bytes = shape
    model = Model(content.model_name, layers, kv_heads * head_dim, kv_heads, kv_heads, head_dim, 0.0,
                  dtype_bytes=dtype_bytes)
    gpu = Gpu(f"{content.description}: KV cache", content.kv_tokens * kv_bytes, 0.0, 0.0, 0.0)
    instance = Instance(content.description, gpu, 1, 0, 0)
    k = content.coefficients
    n = PREFILL_PROMPT_TOKENS
    prefill_s = k.prefill_constant_s + k.prefill_s_per_token * n + k.attention_s_per_token_pair * n * (n / 2)
    tokens_per_s = n / prefill_s
    return Preset(
        name=content.name,
        instance=instance,
        model=model,
        tp=1,
        replicas=1,
        prefill_tokens_per_s=tokens_per_s,
        prefill_range=(tokens_per_s, tokens_per_s),
        decode_step_s=k.step_base_s + k.step_s_per_context_token * DECODE_CONTEXT_TOKENS,  # one sequence
        table_kv_tokens=content.kv_tokens,
        confidence="measured",
        latency_coefficients=k,
        kv_tokens_override=content.kv_tokens,
        max_num_seqs_override=content.slots,
        max_batched_tokens_override=content.max_batched_tokens,
        engine_block_tokens=content.block_tokens or VLLM_GPU_BLOCK_TOKENS,
    )


def parse_preset_document(document: Any, source: str) -> PresetFile:
    """Validate a parsed preset document; ``source`` names it in the errors."""
    check = _Checker(source)
    top = check.object("", document, _TOP, required=_TOP[:-1])
    if top["format"] != FORMAT:
        check.fail("format", top["format"], f'must be "{FORMAT}"')
    if top["version"] != VERSION or isinstance(top["version"], bool):
        check.fail("version", top["version"], f"must be {VERSION}")
    name = check.text("name", top["name"])
    engine = check.object("engine", top["engine"], _ENGINE, required=("slots", "context_per_slot"))
    slots = check.integer("engine.slots", engine["slots"], 1, 1024)
    context = check.integer("engine.context_per_slot", engine["context_per_slot"], 1, 10**9)
    batched = check.integer("engine.max_batched_tokens", engine.get("max_batched_tokens", DEFAULT_MAX_BATCHED_TOKENS),
                            1, 10**9)
    description = check.text("engine.description", engine.get("description", DEFAULT_DESCRIPTION))
    kind = engine.get("kind", ENGINE_KINDS[0])
    if kind not in ENGINE_KINDS:
        check.fail("engine.kind", kind, f"must be one of {', '.join(ENGINE_KINDS)}")
    block = engine.get("block_tokens")
    block = None if block is None else check.integer("engine.block_tokens", block, 1, 4096)
    cache = engine.get("kv_tokens")
    cache = None if cache is None else check.integer("engine.kv_tokens", cache, 1, 10**12)
    model = check.object("model", top["model"], _MODEL, required=("name", "kv_bytes_per_token"))
    model_name = check.text("model.name", model["name"])
    kv_bytes = check.integer("model.kv_bytes_per_token", model["kv_bytes_per_token"], 2, 10**9)
    shape = _shape(check, model, kv_bytes)
    latency = check.object("latency", top["latency"], _LATENCY, required=_LATENCY)
    values = {key: check.number(f"latency.{key}", latency[key]) for key in _LATENCY}
    for first, second in _NOT_BOTH_ZERO:
        if values[first] == 0 and values[second] == 0:
            check.fail(f"latency.{first}", latency[first], f"must be > 0 when latency.{second} is 0")
    coefficients = LatencyCoefficients(**values)
    measured = top.get("measured")
    if measured is not None:
        _check_measured(check, measured)
    return PresetFile(name, coefficients, slots, context, kv_bytes, batched, description, model_name, shape, measured,
                      kind, block, cache)


def _shape(check: "_Checker", model: dict, kv_bytes: int) -> tuple[int, int, int, int] | None:
    given = [key for key in _SHAPE if key in model]
    if not given:
        if kv_bytes % 2:
            check.fail("model.kv_bytes_per_token", kv_bytes, "must be even (K and V) when the shape is not given")
        return None
    missing = [key for key in _SHAPE if key not in model]
    if missing:
        check.fail(f"model.{missing[0]}", None, f"must be given with {', '.join('model.' + k for k in given)} "
                   f"(all of {', '.join(_SHAPE)} or none)")
    values = tuple(check.integer(f"model.{key}", model[key], 1, 10**6) for key in _SHAPE)
    product = 2 * values[0] * values[1] * values[2] * values[3]
    if product != kv_bytes:
        check.fail("model.kv_bytes_per_token", kv_bytes,
                   f"must equal 2 × layers × kv_heads × head_dim × dtype_bytes = {product}")
    return values  # type: ignore[return-value]


def _check_measured(check: "_Checker", measured: Any) -> None:
    m = check.object("measured", measured, _MEASURED, required=_MEASURED_REQUIRED)
    check.text("measured.url", m["url"])
    date = check.text("measured.date", m["date"])
    try:
        datetime.fromisoformat(date.replace("Z", "+00:00"))
    except ValueError:
        check.fail("measured.date", date, "must be an ISO 8601 date and time, e.g. 2026-12-01T10:00:00+00:00")
    if "duration_s" in m:
        check.number("measured.duration_s", m["duration_s"])
    if "repeats" in m:
        check.integer("measured.repeats", m["repeats"], 1, 1000)
    if "seed" in m:
        check.integer("measured.seed", m["seed"], -(2**63), 2**63 - 1)
    for kind, keys in (("prefill", _PREFILL_POINT), ("decode", _DECODE_POINT)):
        points = m[kind]
        if not isinstance(points, list) or not points:
            check.fail(f"measured.{kind}", points, "must be a non-empty list of points")
        for i, point in enumerate(points):
            where = f"measured.{kind}[{i}]"
            p = check.object(where, point, keys, required=keys)
            for key in keys:
                if key == "samples":
                    check.integer(f"{where}.samples", p[key], 1, 10**6)
                else:
                    check.number(f"{where}.{key}", p[key], positive=key.endswith("_s"))
    errors = check.object("measured.fit_errors", m["fit_errors"], ("prefill", "decode"), required=("prefill", "decode"))
    for kind in ("prefill", "decode"):
        e = check.object(f"measured.fit_errors.{kind}", errors[kind], _ERRORS, required=_ERRORS)
        for key in _ERRORS:
            check.number(f"measured.fit_errors.{kind}.{key}", e[key])
    if "notes" in m:
        notes = m["notes"]
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            check.fail("measured.notes", notes, "must be a list of strings")
    if "sources" in m:
        sources = m["sources"]
        if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
            check.fail("measured.sources", sources, "must be an object of strings")


class _Checker:
    """Field checks that raise one UserError naming the file, the field, the value and what is allowed."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, name: str, value: Any, allowed: str) -> None:
        shown = json.dumps(value, default=str)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise UserError(f"preset file {self.source}: {name or 'the document'} = {shown}: {allowed}")

    def object(self, name: str, value: Any, keys: tuple[str, ...], *, required: tuple[str, ...]) -> dict:
        if not isinstance(value, dict):
            self.fail(name, value, f"must be an object with {', '.join(keys)}")
        prefix = f"{name}." if name else ""
        unknown = [key for key in value if key not in keys]
        if unknown:
            self.fail(prefix + str(unknown[0]), value[unknown[0]], f"unknown key; allowed: {', '.join(keys)}")
        for key in required:
            if key not in value:
                self.fail(prefix + key, None, "missing; it is required")
        return value

    def text(self, name: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            self.fail(name, value, "must be a non-empty string")
        return value

    def integer(self, name: str, value: Any, low: int, high: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            self.fail(name, value, f"must be an integer from {low} to {high}")
        return value

    def number(self, name: str, value: Any, *, positive: bool = False) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (value <= 0 if positive else value < 0):
            self.fail(name, value, f"must be a finite number {'> 0' if positive else '>= 0'}")
        return float(value)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")
