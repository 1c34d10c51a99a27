"""The lab's tenants and their limits, rule by rule: :class:`LimitModel`'s counts, leases and
Retry-After, :class:`TenantBook`, the tenant choice and the dominant tenant. Expected values are hand
computations from the modules' docstrings and docs/lab.md."""

from __future__ import annotations
