"""The lab commands' flag values: argparse types and the parsers of times, load steps and rates.

Each raises ``argparse.ArgumentTypeError`` (or ``UserError``) naming what is allowed."""

from __future__ import annotations

import argparse
import math

from prefix_routing.lab.routing import Strategy
from prefix_routing.rules.errors import UserError


def ranged_int(name: str, low: int, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer (allowed: {low} to {high})") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value}: must be from {low} to {high}")
        return value

    return parse


def positive_float(name: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text}: must be a number > 0")
        return value

    return parse


def parse_cache_tokens(text: str) -> float:
    """``infinite`` (or ``inf``), or a token count such as ``500000``, ``500k``, ``1.4M``."""
    t = text.strip().lower()
    if t in ("infinite", "inf", "unbounded"):
        return math.inf
    scale = 1
    if t[-1:] in ("k", "m"):
        scale = 1_000 if t[-1] == "k" else 1_000_000
        t = t[:-1]
    try:
        value = float(t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: takes a token count (e.g. 500k) or 'infinite'") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 0")
    return value


def parse_strategy(text: str) -> Strategy:
    try:
        return Strategy.parse(text)
    except UserError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def similarity(text: str) -> float:
    """--slot-prompt-similarity: a fraction from 0 (off) to 1, as llama-server takes it."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (allowed: 0 to 1)") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text}: must be from 0 to 1 (0 = off)")
    return value


def cache_ram(text: str) -> float:
    """--cache-ram: MiB per copy, as llama-server takes it (0 = off, -1 = no limit)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB (0 = off, -1 = no limit)") from None
    if not (value == -1 or 0 <= value < math.inf):
        raise argparse.ArgumentTypeError(f"{text}: must be MiB >= 0 (0 = off) or -1 (no limit)")
    return value


def time_ms(text: str | None, default_ms: int) -> int:
    from datetime import datetime, timezone

    if text is None:
        return default_ms
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"time {text!r}: use ISO 8601 (2026-11-30T10:00:00Z) or epoch milliseconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def load_step(text: str) -> tuple[float, float]:
    at, _, factor = text.partition(":")
    try:
        value = (float(at), float(factor))
    except ValueError:
        raise UserError(f"--load-step {text!r}: expected SECONDS:FACTOR, e.g. 1800:3") from None
    if not (value[0] >= 0 and value[1] > 0):
        raise UserError(f"--load-step {text!r}: needs SECONDS >= 0 and FACTOR > 0")
    return value


def sample_rate(text: str):
    from prefix_routing.lab.sampling import parse_rate

    try:
        return parse_rate(text)
    except UserError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix(f"--sample {text!r}: ")) from None
