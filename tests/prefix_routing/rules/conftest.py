"""Shared helpers of the rules' tests: a normalizer call with defaults, body builders, freeze rules."""

from __future__ import annotations

import json
from pathlib import Path

from prefix_routing.rules.body import normalize_body
from prefix_routing.rules.settings import FreezeRule, NormalizerSettings

ROOT = Path(__file__).resolve().parents[3]
KEY = b"k" * 32
DATE = FreezeRule("date", r"\d{4}-\d{2}-\d{2}")
USER = FreezeRule("user", r"(?<=User: )[A-Z][a-z]+")


def norm(body, settings: NormalizerSettings | None = None, **kwargs):
    if not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    return normalize_body(body, settings or NormalizerSettings(), **kwargs)


def parsed(result) -> dict:
    return json.loads(result.body.decode("utf-8"))


def chat(*messages, **fields) -> dict:
    return {"messages": list(messages), **fields}


def system(text):
    return {"role": "system", "content": text}


def user(text):
    return {"role": "user", "content": text}
