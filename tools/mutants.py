"""`make mutants`: run mutmut over the functions in tools/mutation_targets.txt and print the score per area.

The score of an area is killed ÷ (killed + survived), a timeout counting as killed and a mutant that
no test reaches as survived; the mutants listed under [equivalent] (no behaviour change, each with
its reason) are left out. Not part of `make test`: several hours on an idle 2-core machine, most of
it the normalizer rules' property tests.

    .venv/bin/python tools/mutants.py                  # every area (what `make mutants` runs)
    .venv/bin/python tools/mutants.py --area lab       # one area again (repeat --area for more)
    .venv/bin/python tools/mutants.py --report-only    # the table from the last results
    .venv/bin/python tools/mutants.py --area lab --survivors   # only the last run's survivors again

The stacks' mutants run in a second mutmut run with one worker: their tests talk to jsii's node
process, which the forked workers inherit and which cannot serve two of them at once.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

TARGETS = Path(__file__).with_name("mutation_targets.txt")
MUTMUT = str(Path(sys.executable).with_name("mutmut"))
KILLED = {"killed", "timeout"}
SURVIVED = {"survived", "no tests"}
EQUIVALENT = "equivalent"
#: Areas whose tests need jsii (one node process per test session): run with one worker.
SERIAL_AREAS = {"stacks"}


def read_targets(path: Path = TARGETS) -> tuple[dict[str, list[str]], dict[str, str]]:
    """({area: patterns}, {equivalent mutant: why}) from the targets file."""
    areas: dict[str, list[str]] = {}
    equivalent: dict[str, str] = {}
    area = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            area = line[1:-1].split(":")[0].strip()
            if area != EQUIVALENT:
                areas[area] = []
        elif area is None:
            raise SystemExit(f"{path}:{number}: pattern {line!r} before any [area] heading")
        elif area == EQUIVALENT:
            name, sep, why = line.partition(": ")
            if not sep or not why.strip():
                raise SystemExit(f"{path}:{number}: an equivalent mutant needs 'NAME: why', got {line!r}")
            equivalent[name.strip()] = why.strip()
        else:
            areas[area].append(line)
    return areas, equivalent


def statuses() -> dict[str, str]:
    out = subprocess.run([MUTMUT, "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        match = re.match(r"\s*(\S+): (.+)$", line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def run(areas: dict[str, list[str]], max_children: int, only: set[str] | None = None) -> None:
    """mutmut over the areas' patterns, or (``only``) over those of these mutants that are in the areas."""
    for serial in (False, True):
        chosen = {a: ps for a, ps in areas.items() if (a in SERIAL_AREAS) == serial}
        if only is None:
            names = [p for ps in chosen.values() for p in ps]
        else:
            names = sorted(n for n in only if any(fnmatch.fnmatchcase(n, p) for ps in chosen.values() for p in ps))
        if names:
            subprocess.run([MUTMUT, "run", "--max-children", "1" if serial else str(max_children), *names],
                           check=False)


def report(areas: dict[str, list[str]], equivalent: dict[str, str], found: dict[str, str]) -> int:
    """Print the table; returns the number of areas below 85 %."""
    total = Counter()
    low = 0
    print(f"\n{'area':<12} {'mutants':>8} {'killed':>8} {'survived':>9} {'equivalent':>11} {'score':>7}")
    for area, ps in areas.items():
        names = [name for name in found if any(fnmatch.fnmatchcase(name, p) for p in ps)]
        counts = Counter(found[name] for name in names if name not in equivalent)
        left_out = sum(name in equivalent for name in names)
        killed = sum(counts[s] for s in KILLED)
        survived = sum(counts[s] for s in SURVIVED)
        unchecked = sum(counts.values()) - killed - survived
        total.update(killed=killed, survived=survived, equivalent=left_out)
        score = 100 * killed / (killed + survived) if killed + survived else 0.0
        low += score < 85.0
        note = f"  ({unchecked} not run)" if unchecked else ""
        print(f"{area:<12} {killed + survived:>8} {killed:>8} {survived:>9} {left_out:>11} {score:>6.1f}%{note}")
    k, s = total["killed"], total["survived"]
    print(f"{'all':<12} {k + s:>8} {k:>8} {s:>9} {total['equivalent']:>11} {100 * k / (k + s) if k + s else 0:>6.1f}%")
    gone = sorted(name for name in equivalent if name not in found)
    if gone:
        print(f"[equivalent] names {len(gone)} mutant(s) mutmut no longer makes (the function changed): "
              + ", ".join(gone))
    print("survivors: .venv/bin/mutmut results; one in full: .venv/bin/mutmut show NAME")
    return low


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--area", action="append", metavar="NAME", help="run (and report) this area only; repeatable")
    parser.add_argument("--report-only", action="store_true", help="print the table from the last results")
    parser.add_argument("--survivors", action="store_true",
                        help="run only the mutants that survived (or met no test) in the last results")
    parser.add_argument("--max-children", type=int, default=2, metavar="N", help="mutmut workers (default 2)")
    args = parser.parse_args(argv)
    areas, equivalent = read_targets()
    if args.area:
        unknown = [a for a in args.area if a not in areas]
        if unknown:
            parser.error(f"unknown area {', '.join(unknown)}; the areas: {', '.join(areas)}")
        areas = {a: ps for a, ps in areas.items() if a in args.area}
    started = time.monotonic()
    if not args.report_only:
        only = None
        if args.survivors:
            only = {name for name, status in statuses().items() if status in SURVIVED and name not in equivalent}
        run(areas, args.max_children, only)
    low = report(areas, equivalent, statuses())
    if not args.report_only:
        print(f"wall time: {(time.monotonic() - started) / 60:.1f} min")
    if low:
        print(f"{low} area(s) below 85 %")
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
