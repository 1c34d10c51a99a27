"""Benchmark: the cost of normalization relative to a plain JSON round trip of the same body.

    python bench/bench_normalize.py [--repeat 7] [--sizes 1024,32768,1048576]

``--sizes`` are the size classes: about how many bytes of message text each generated chat body
carries (1 KiB, 32 KiB and 1 MiB by default; the ``text`` column gives the real figure). The body
itself is a different size: indented JSON and ``\\u`` escapes make the messy body larger, the
compact canonical one smaller. Every body size printed is measured on the body the row times
(``len(body)``), not taken from the class. For each body, prints the best-of-N time of
``normalize_body(body)`` and of ``json.dumps(json.loads(body))`` measured in the same run, and their
ratio; for the bodies of the largest class, the tracemalloc peak of both and their ratio.

Two body shapes per size class:
  * ``messy``: what a careless client sends and the normalizer has to fix: parameters before the
    prompt, indented JSON, ``\\u`` escapes, CRLF line endings and trailing spaces in some messages,
    mostly NFC text with some NFD;
  * ``canonical``: the normalizer's own output fed back in (the fast path: nothing to change).
A third, informational row, ``all-NFD``, decomposes every accented letter (worst case for NFC).

Target: at most 3.0x the JSON round trip (the parse and serialization every request costs anyway,
so normalizing adds little to the front door's latency) for the messy and canonical bodies
of the 32 KiB and 1 MiB classes (the printed target line names their measured sizes). Exit status
1 if a target is missed.
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

from prefix_routing.rules.body import normalize_body  # noqa: E402

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
    """A chat body with about ``size`` bytes of message text: a long system prompt and a few turns."""
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


def human(n: int) -> str:
    """A byte count in binary units: 2140 -> '2.1 KiB', 1420547 -> '1.35 MiB'."""
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / 2**20:.2f} MiB"


def text_bytes(body: bytes) -> int:
    """The UTF-8 bytes of the body's message contents (what the size class approximates)."""
    return sum(len(m["content"].encode()) for m in json.loads(body)["messages"])


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
    parser.add_argument("--sizes", default="1024,32768,1048576",
                        help="size classes: message-text bytes per body, comma-separated (the body sizes are printed)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    print(f"python {sys.version.split()[0]}; best of {args.repeat} alternating repeats (timeit)")
    print(f"{'body':>22}  {'bytes':>9}  {'text':>9}  {'normalize':>11}  {'json rt':>11}  {'ratio':>6}")
    missed, checked = [], []
    for size in sizes:
        for shape in ("messy", "canonical", "all-NFD"):
            if shape == "all-NFD" and size < max(sizes):
                continue
            body = chat_body(size, shape)
            normalize_body(body)  # warm up (regex compilation, imports)
            t_norm, t_json = best_times(lambda: normalize_body(body), lambda: json.dumps(json.loads(body)),
                                        args.repeat)
            ratio = t_norm / t_json
            label = f"chat {human(len(body))} {shape}"
            print(f"{label:>22}  {len(body):>9}  {text_bytes(body):>9}  {t_norm * 1e3:>8.3f} ms  "
                  f"{t_json * 1e3:>8.3f} ms  {ratio:>5.2f}x")
            if size in TARGET_SIZES and shape != "all-NFD":
                checked.append(human(len(body)))
                if ratio > TARGET:
                    missed.append(f"{label}: {ratio:.2f}x > {TARGET}x")

    size = max(sizes)
    print("\npeak memory (tracemalloc) for the bodies of the largest size class")
    for shape in ("messy", "canonical"):
        body = chat_body(size, shape)
        m_norm = peak_memory(lambda: normalize_body(body))
        m_json = peak_memory(lambda: json.dumps(json.loads(body)))
        print(f"{shape:>10} ({human(len(body))}): normalize {m_norm / 2**20:.2f} MiB, "
              f"json round trip {m_json / 2**20:.2f} MiB, ratio {m_norm / m_json:.2f}x")

    if missed:
        print("\ntarget missed: " + "; ".join(missed))
        return 1
    if not checked:
        print(f"\nno body of the target size classes ({', '.join(human(t) for t in TARGET_SIZES)} of text) "
              "was measured: target not checked")
        return 0
    print(f"\ntarget met: <= {TARGET}x the JSON round trip for the bodies of {', '.join(checked)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
