"""Which of a stage's tenant keys applies to a tenant, for per-tenant limits and trust domains alike:
the tenant's own id first, else the first shell pattern (``*``, ``?``, ``[...]``) that matches it, in
the order written; and which keys can never apply, because an earlier pattern takes every tenant
they would match."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

#: What a tenant id is made of: printable ASCII without spaces (the stage refuses anything else).
_CHARACTERS = frozenset(chr(c) for c in range(ord("!"), ord("~") + 1))
_ANY = None  # a pattern's ``*``


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


def shadowed(keys: Sequence[str]) -> list[tuple[str, str]]:
    """(key, the earlier pattern that takes every tenant it would match) for each pattern in ``keys``
    that can never apply. An exact id is never shadowed: a tenant's own id comes first."""
    found = []
    for index, key in enumerate(keys):
        if not is_pattern(key):
            continue
        for earlier in keys[:index]:
            if is_pattern(earlier) and covers(earlier, key):
                found.append((key, earlier))
                break
    return found


def covers(general: str, specific: str) -> bool:
    """Whether every tenant id that ``specific`` matches is matched by ``general`` too (both shell
    patterns). Sound, not complete: True only when it holds; an unusual pair whose inclusion needs
    ``*`` to be reordered (``?*`` over ``*?``) says False, so a stage is never refused wrongly."""
    g, s = _tokens(general), _tokens(specific)
    memo: dict[tuple[int, int], bool] = {}

    def fits(i: int, j: int) -> bool:
        if (i, j) in memo:
            return memo[(i, j)]
        if i == len(g):
            result = j == len(s)
        elif g[i] is _ANY:  # matches nothing more, or takes the next of specific's parts too
            result = fits(i + 1, j) or (j < len(s) and fits(i, j + 1))
        else:  # one character of a set: specific's next part must be one character of a subset
            result = j < len(s) and s[j] is not _ANY and s[j] <= g[i] and fits(i + 1, j + 1)
        memo[(i, j)] = result
        return result

    return fits(0, 0)


def _tokens(pattern: str) -> list[frozenset | None]:
    """A pattern as fnmatch reads it: ``*`` (_ANY), or one character from a set (``?``: any, ``[...]``:
    its class, ``[!...]`` its complement, anything else: itself); runs of ``*`` are one."""
    out: list[frozenset | None] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if not out or out[-1] is not _ANY:
                out.append(_ANY)
        elif c == "?":
            out.append(_CHARACTERS)
        elif c == "[":
            j = i + (i < n and pattern[i] == "!")
            j += j < n and pattern[j] == "]"
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal [
                out.append(frozenset("["))
                continue
            out.append(_class(pattern[i:j]))
            i = j + 1
        else:
            out.append(frozenset(c))
    return out


def _class(body: str) -> frozenset:
    """The characters of a bracket expression's inside (ranges ``a-z``; a leading ``!`` negates)."""
    negate = body.startswith("!")
    body = body[1:] if negate else body
    chars: set[str] = set()
    k = 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            chars.update(chr(c) for c in range(ord(body[k]), ord(body[k + 2]) + 1))
            k += 3
        else:
            chars.add(body[k])
            k += 1
    return frozenset(_CHARACTERS - chars if negate else chars & _CHARACTERS)
