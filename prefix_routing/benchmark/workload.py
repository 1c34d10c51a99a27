"""A lab trace as the Mooncake trace AIPerf replays, so that the benchmark job sends what the lab simulated.

AIPerf's Mooncake loader (github.com/ai-dynamo/aiperf, ``aiperf/dataset/loader/mooncake_trace.py``;
the line's schema is ``MooncakeTrace`` in ``aiperf/dataset/loader/models.py``) reads one JSON object
per line: ``timestamp`` (integer milliseconds, when its fixed schedule sends the request),
``input_length``, ``output_length`` and ``hash_ids``. Its prompt generator
(``aiperf/dataset/generator/prompt.py``, ``_generate_cached_prompt``) gives each hash id one block
of ``block_size`` tokens (512 unless told otherwise: ``InputTokensDefaults.BLOCK_SIZE`` in
``aiperf/common/config/config_defaults.py``), the last id the tokens that remain (1 to 512), and
the same text wherever an id comes again: equal ids are a shared prefix.

A lab trace's blocks may be another size (the long-context workload's are 250 tokens). A 512-token
block gets an id of its own unless the lab knows its whole content is shared: the id is that of the
lab's block holding its last token (equal chained ids mean equal prompts up to the end of that
block), with the block's position and length, so two requests share an AIPerf block exactly when
they share every token of it in the lab.
"""

from __future__ import annotations

import json
import math

from prefix_routing.lab.traces import Trace

#: AIPerf's block of hashed prompt tokens (its default; the workload spec passes it too).
AIPERF_BLOCK_TOKENS = 512


def mooncake_records(trace: Trace, block_tokens: int = AIPERF_BLOCK_TOKENS) -> list[dict]:
    """One Mooncake record per request of ``trace``, in its order, ids numbered from 0."""
    ids: dict[tuple, int] = {}
    records = []
    lab_block = trace.block_tokens
    for index, (arrival, prompt, output, blocks) in enumerate(
            zip(trace.arrivals, trace.prompt_tokens, trace.output_tokens, trace.blocks)):
        hash_ids = []
        for k in range(math.ceil(prompt / block_tokens)):
            end = min((k + 1) * block_tokens, prompt)  # this block holds tokens [k * block_tokens, end)
            last = math.ceil(end / lab_block) - 1  # the lab's block that holds token end - 1
            if last < len(blocks):
                key = (blocks[last], k, end - k * block_tokens)
            else:  # the lab knows nothing of these tokens: this request's own
                key = ("own", index, k)
            hash_ids.append(ids.setdefault(key, len(ids)))
        records.append({"timestamp": round(arrival * 1000), "input_length": prompt, "output_length": output,
                        "hash_ids": hash_ids})
    return records


def mooncake_jsonl(trace: Trace, block_tokens: int = AIPERF_BLOCK_TOKENS) -> bytes:
    """The trace as a Mooncake JSONL file (compact JSON, one request a line)."""
    lines = (json.dumps(record, separators=(",", ":")) for record in mooncake_records(trace, block_tokens))
    return "".join(line + "\n" for line in lines).encode("utf-8")
