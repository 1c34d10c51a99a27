"""Which of a stage's tenant keys applies to a tenant, for per-tenant limits and trust domains alike:
the tenant's own id first, else the first shell pattern (``*``, ``?``, ``[...]``) that matches it, in
the order written."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence


def is_pattern(key: str) -> bool:
    return "*" in key or "?" in key or "[" in key


def first_match(tenant: str, keys: Sequence[str]) -> int | None:
    """The index of the key that applies to ``tenant``, or None."""
    for index, key in enumerate(keys):
        if key == tenant:
            return index
    for index, key in enumerate(keys):
        if is_pattern(key) and fnmatch.fnmatchcase(tenant, key):
            return index
    return None
