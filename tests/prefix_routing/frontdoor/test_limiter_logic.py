"""The limiter's logic without a server: :class:`Limiter` over a fake store, and
:class:`DynamoLimitStore`'s requests checked with botocore's Stubber (the writes it makes, and what it
decides from the answers). tests/prefix_routing/frontdoor/test_limiter.py runs the same rule against
dynalite; these run where dynalite is not (mutmut's copy of the tree).

Expected values are hand computations from the module's docstring and docs/normalizer-lambda.md
("Per-tenant limits").
"""

from __future__ import annotations
