"""`make mutants`: run mutmut over the functions in tools/mutation_targets.txt and print the score.

The score of an area is killed ÷ (killed + survived), a timeout counting as killed and a mutant that
no test reaches as survived. Not part of `make test`: about 10 minutes on an idle 2-core machine.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

TARGETS = Path(__file__).with_name("mutation_targets.txt")
MUTMUT = str(Path(sys.executable).with_name("mutmut"))
KILLED = {"killed", "timeout"}
SURVIVED = {"survived", "no tests"}


def read_targets(path: Path = TARGETS) -> dict[str, list[str]]:
    areas: dict[str, list[str]] = {}
    area = None
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            area = line[1:-1].split(":")[0]
            areas[area] = []
        elif area is None:
            raise SystemExit(f"{path}: pattern {line!r} before any [area] heading")
        else:
            areas[area].append(line)
    return areas


def statuses() -> dict[str, str]:
    out = subprocess.run([MUTMUT, "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        match = re.match(r"\s*(\S+): (.+)$", line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def main(argv: list[str]) -> int:
    areas = read_targets()
    patterns = [p for ps in areas.values() for p in ps]
    if "--report-only" not in argv:
        subprocess.run([MUTMUT, "run", *patterns], check=False)
    found = statuses()
    total = Counter()
    print(f"\n{'area':<20} {'mutants':>8} {'killed':>8} {'survived':>9} {'score':>7}")
    for area, ps in areas.items():
        counts = Counter(s for name, s in found.items() if any(fnmatch.fnmatchcase(name, p) for p in ps))
        killed = sum(counts[s] for s in KILLED)
        survived = sum(counts[s] for s in SURVIVED)
        unchecked = sum(counts.values()) - killed - survived
        total.update(killed=killed, survived=survived)
        score = 100 * killed / (killed + survived) if killed + survived else 0.0
        note = f"  ({unchecked} not run)" if unchecked else ""
        print(f"{area:<20} {killed + survived:>8} {killed:>8} {survived:>9} {score:>6.1f}%{note}")
    k, s = total["killed"], total["survived"]
    print(f"{'all':<20} {k + s:>8} {k:>8} {s:>9} {100 * k / (k + s) if k + s else 0:>6.1f}%")
    print("survivors: .venv/bin/mutmut results; one in full: .venv/bin/mutmut show NAME")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
