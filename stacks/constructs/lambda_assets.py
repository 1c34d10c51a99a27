"""What the Python functions' assets share: the library rooms copied in, and log retention days.

Assets are laid out by copying files (``ILocalBundling``), so synth needs neither Docker nor the
network; each function copies only the rooms of ``prefix_routing`` it runs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from aws_cdk import aws_logs as logs

ROOT = Path(__file__).resolve().parents[2]
#: No bytecode: it would be for this machine's Python, which the function's runtime ignores.
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


def copy_library(out: Path, packages: tuple[str, ...], *, modules: dict[str, tuple[str, ...]] | None = None) -> None:
    """``prefix_routing/__init__.py``, the rooms in ``packages`` whole, and of other rooms only the
    ``modules`` named (e.g. ``{"stage": ("__init__.py", "presets.py")}``), into ``out``."""
    package = out / "prefix_routing"
    package.mkdir(exist_ok=True)
    shutil.copy2(ROOT / "prefix_routing" / "__init__.py", package / "__init__.py")
    for name in packages:
        shutil.copytree(ROOT / "prefix_routing" / name, package / name, dirs_exist_ok=True, ignore=IGNORE)
    for name, files in (modules or {}).items():
        (package / name).mkdir(exist_ok=True)
        for file in files:
            shutil.copy2(ROOT / "prefix_routing" / name / file, package / name / file)


#: The stage's ``log_retention_days`` (which allows exactly these values) as CloudWatch's enum.
RETENTION = {
    1: logs.RetentionDays.ONE_DAY, 3: logs.RetentionDays.THREE_DAYS, 5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK, 14: logs.RetentionDays.TWO_WEEKS, 30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS, 90: logs.RetentionDays.THREE_MONTHS, 120: logs.RetentionDays.FOUR_MONTHS,
    150: logs.RetentionDays.FIVE_MONTHS, 180: logs.RetentionDays.SIX_MONTHS, 365: logs.RetentionDays.ONE_YEAR,
}
