"""The lab's candidate grids and criteria: the PrefixLengths and ConcurrencyThresholds ``tune`` and
the advisor try, the key sizes ``analyze`` groups by, and the rules of thumb its verdicts use."""

from __future__ import annotations

CANDIDATE_PREFIX_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
CANDIDATE_THRESHOLDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)
KEY_GROUP_BLOCKS = (1, 2, 4, 8, 16, 32)
REUSE_CRITERION = 0.5  # the rule of thumb: prefix routing pays when more than half the requests reuse a prefix
SPREAD_SHARE = 0.05  # a key whose largest group is below this share spreads load
