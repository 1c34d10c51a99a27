"""Benchmark: the cost of normalization relative to a plain JSON round trip of the same body.

    python bench/bench_normalize.py [--repeat 7] [--sizes 1024,32768,1048576]

For chat bodies of about 1 KB, 32 KB and 1 MB, prints the best-of-N time of
``normalize_body(body)`` and of ``json.dumps(json.loads(body))`` measured in the same run, and their
ratio; for the 1 MB body, the tracemalloc peak of both and their ratio.

Two body shapes per size:
  * ``messy``: what a careless client sends and the normalizer has to fix: parameters before the
    prompt, indented JSON, ``\\u`` escapes, CRLF line endings and trailing spaces in some messages,
    mostly NFC text with some NFD;
  * ``canonical``: the normalizer's own output fed back in (the fast path: nothing to change).
A third, informational row, ``all-NFD``, decomposes every accented letter (worst case for NFC).

Acceptance target (issue 3): at most 3.0x the JSON round trip at 32 KB and at 1 MB (messy and
canonical shapes). Exit status 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import timeit
import tracemalloc
import unicodedata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prefix_routing.normalize import normalize_body  # noqa: E402

TARGET = 3.0
TARGET_SIZES = (32 * 1024, 1024 * 1024)

WORDS = (
    "the model answers questions about invoices contracts and shipping in a friendly concise tone "
    "résumé café naïve façade über straße Ångström données coöperate 日本語 テキスト 中文 Ελληνικά"
).split()


def _text(rng: random.Random, size: int, *, crlf: bool, trailing: bool, nfd_share: float) -> str:
    lines = []
    length = 0
    while length < size:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16)))
        if nfd_share and rng.random() < nfd_share:
            line = unicodedata.normalize("NFD", line)
        if trailing and rng.random() < 0.2:
            line += "  "
        lines.append(line)
        length += len(line.encode()) + 1
    return ("\r\n" if crlf else "\n").join(lines)


def chat_body(size: int, shape: str, seed: int = 7) -> bytes:
    """A chat body of about ``size`` bytes: a long system prompt and a few turns."""
    rng = random.Random(seed)
    nfd = {"messy": 0.05, "all-NFD": 1.0}.get(shape, 0.0)
    system = _text(rng, max(200, size * 4 // 10), crlf=shape != "canonical", trailing=shape != "canonical",
                   nfd_share=nfd)
    messages = [{"role": "system", "content": system}]
    turns = 6
    for turn in range(turns):
        messages.append({"content": _text(rng, max(40, size // (2 * turns) - 60), crlf=turn % 2 == 0 and shape != "canonical",
                                          trailing=shape != "canonical", nfd_share=nfd),
                         "role": "user" if turn % 2 == 0 else "assistant"})
    body = {"temperature": 0.7, "max_tokens": 512, "stream": True, "model": "llama-3-1-8b", "messages": messages,
            "top_p": 0.9}
    if shape == "canonical":
        return normalize_body(json.dumps(body).encode()).body
    return json.dumps(body, indent=2).encode()  # ensure_ascii=True: \u escapes, as json.dumps does by default


def best_times(first, second, repeat: int) -> tuple[float, float]:
    """Best-of-``repeat`` seconds per call of two functions, measured alternately in the same run.

    Alternating keeps the two under the same machine load (other processes on a shared host).
    """
    timers = [timeit.Timer(first), timeit.Timer(second)]
    numbers = [t.autorange()[0] for t in timers]  # enough calls for >= 0.2 s per measurement
    best = [float("inf"), float("inf")]
    for _ in range(repeat):
        for index, timer in enumerate(timers):
            best[index] = min(best[index], timer.timeit(numbers[index]) / numbers[index])
    return best[0], best[1]


def peak_memory(function) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        function()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timeit repeats; the best is kept (default 7)")
    parser.add_argument("--sizes", default="1024,32768,1048576", help="body sizes in bytes, comma-separated")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    print(f"python {sys.version.split()[0]}; best of {args.repeat} alternating repeats (timeit)")
    print(f"{'body':>22}  {'bytes':>9}  {'normalize':>11}  {'json rt':>11}  {'ratio':>6}")
    missed = []
    for size in sizes:
        for shape in ("messy", "canonical", "all-NFD"):
            if shape == "all-NFD" and size < max(sizes):
                continue
            body = chat_body(size, shape)
            normalize_body(body)  # warm up (regex compilation, imports)
            t_norm, t_json = best_times(lambda: normalize_body(body), lambda: json.dumps(json.loads(body)),
                                        args.repeat)
            ratio = t_norm / t_json
            label = f"chat {size // 1024} KB {shape}"
            print(f"{label:>22}  {len(body):>9}  {t_norm * 1e3:>8.3f} ms  {t_json * 1e3:>8.3f} ms  {ratio:>5.2f}x")
            if size in TARGET_SIZES and shape != "all-NFD" and ratio > TARGET:
                missed.append(f"{label}: {ratio:.2f}x > {TARGET}x")

    size = max(sizes)
    print(f"\npeak memory (tracemalloc) for the {size // 1024} KB bodies")
    for shape in ("messy", "canonical"):
        body = chat_body(size, shape)
        m_norm = peak_memory(lambda: normalize_body(body))
        m_json = peak_memory(lambda: json.dumps(json.loads(body)))
        print(f"{shape:>10}: normalize {m_norm / 2**20:.2f} MiB, json round trip {m_json / 2**20:.2f} MiB, "
              f"ratio {m_norm / m_json:.2f}x")

    if missed:
        print("\ntarget missed: " + "; ".join(missed))
        return 1
    print(f"\ntarget met: <= {TARGET}x the JSON round trip at 32 KB and 1 MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
