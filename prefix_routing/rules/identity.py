"""Tenant routing identity (``PrefixAwareId`` and ``cache_salt``, HMAC-SHA256), prefix fingerprints and block hashes."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Final

from prefix_routing.rules.constants import ROUTING_ID_RE, SALT_RE, FINGERPRINT_HEX_DIGITS
from prefix_routing.rules.errors import describe_value


@dataclass(frozen=True)
class RoutingIdentity:
    """Per tenant and application: the ``PrefixAwareId`` routing hint and vLLM's ``cache_salt``."""

    prefix_aware_id: str
    cache_salt: str

    def __post_init__(self) -> None:
        if not isinstance(self.prefix_aware_id, str) or not ROUTING_ID_RE.fullmatch(self.prefix_aware_id):
            raise ValueError(
                f"prefix_aware_id: not a valid PrefixAwareId (got {describe_value(self.prefix_aware_id)}); "
                "allowed: 1-64 printable ASCII characters without spaces (the routing ids this library makes, "
                "within SageMaker's PrefixAwareId: 1-64 characters, the first not whitespace, the rest printable, "
                "\\A\\S[\\p{Print}]*\\z)"
            )
        if not isinstance(self.cache_salt, str) or not SALT_RE.fullmatch(self.cache_salt):
            raise ValueError(
                f"cache_salt: not a valid salt (got {describe_value(self.cache_salt)}); "
                "allowed: 1-256 printable ASCII characters without spaces"
            )


_ID_CONTEXT: Final = b"prefix_routing/prefix-aware-id/v1\x00"
_SALT_CONTEXT: Final = b"prefix_routing/cache-salt/v1\x00"


def _identity_message(tenant: str, application: str | None) -> bytes:
    # Length-prefixed so that ("ab", "c") and ("a", "bc") and ("abc", None) never collide.
    encoded = tenant.encode("utf-8")
    parts = [len(encoded).to_bytes(4, "big"), encoded]
    if application is None:
        parts.append(b"\x00")
    else:
        app = application.encode("utf-8")
        parts += [b"\x01", len(app).to_bytes(4, "big"), app]
    return b"".join(parts)


def routing_identity(tenant: str, application: str | None, key: bytes) -> RoutingIdentity:
    """Derive the routing id and the cache salt of a tenant (and application) with HMAC-SHA256.

    ``key`` is a secret of at least 16 bytes. Neither the key nor the tenant appears in the result:
    ``prefix_aware_id`` is ``"pa-"`` + 40 hex digits (160 bits) of one HMAC, ``cache_salt`` 32 hex
    digits (128 bits) of another (separate domain strings), so one cannot be computed from the other.
    Raises :class:`ValueError` for an empty tenant or application, a non-string, or a short key.
    """
    if not isinstance(tenant, str) or not tenant:
        raise ValueError(f"tenant: must be a non-empty string (got {describe_value(tenant)})")
    if application is not None and (not isinstance(application, str) or not application):
        raise ValueError(f"application: must be None or a non-empty string (got {describe_value(application)})")
    if not isinstance(key, (bytes, bytearray, memoryview)) or len(key) < 16:
        raise ValueError("key: must be at least 16 bytes of secret key material")
    try:
        message = _identity_message(tenant, application)
    except UnicodeEncodeError:
        raise ValueError("tenant/application: must be valid Unicode (no unpaired surrogates)") from None
    key = bytes(key)
    routing = hmac.new(key, _ID_CONTEXT + message, hashlib.sha256).hexdigest()[:40]
    salt = hmac.new(key, _SALT_CONTEXT + message, hashlib.sha256).hexdigest()[:32]
    return RoutingIdentity(prefix_aware_id=f"pa-{routing}", cache_salt=salt)


# --------------------------------------------------------------------------------------------------
# Fingerprints
# --------------------------------------------------------------------------------------------------


def prefix_fingerprint(data: bytes, prefix_length: int) -> str:
    """``sha256(data[:prefix_length])``, first 16 hex digits: equal routing keys, equal fingerprints."""
    if isinstance(prefix_length, bool) or not isinstance(prefix_length, int) or prefix_length < 1:
        raise ValueError(f"prefix_length: must be a positive integer (got {prefix_length!r})")
    return hashlib.sha256(memoryview(data)[:prefix_length]).hexdigest()[:FINGERPRINT_HEX_DIGITS]


def block_hashes(data: bytes, block_bytes: int) -> tuple[str, ...]:
    """Chained hashes of the full ``block_bytes``-sized blocks of ``data`` (a partial last block is not hashed).

    ``h0 = sha256(block0)``, ``hi = sha256(h(i-1) || block i)`` on the 32-byte digests; each hash
    therefore covers everything before its block's end (like a KV-cache block hash). Returned as the
    first 16 hex digits of each digest.
    """
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < 1:
        raise ValueError(f"block_bytes: must be a positive integer (got {block_bytes!r})")
    view = memoryview(data)
    sha256 = hashlib.sha256
    previous = b""
    digests = []
    for start in range(0, len(view) - block_bytes + 1, block_bytes):
        digest = sha256(previous)
        digest.update(view[start:start + block_bytes])
        previous = digest.digest()
        digests.append(previous)
    hashes = [d[: FINGERPRINT_HEX_DIGITS // 2].hex() for d in digests]
    return tuple(hashes)
