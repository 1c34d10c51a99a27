"""The command line's dispatcher."""

import subprocess
import sys
from pathlib import Path

from prefix_routing.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[3]


def _run(*args, stdin=""):
    return subprocess.run([sys.executable, "-m", "prefix_routing", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_overview_lists_every_command_with_its_summary():
    result = _run("--help")
    assert result.returncode == 0
    for name in COMMANDS:
        assert f"    {name}" in result.stdout
    assert "see:" not in result.stdout and result.stdout.count("\n") > 2 * len(COMMANDS)


def test_no_command_is_exit_2_with_the_overview():
    result = _run()
    assert result.returncode == 2 and "COMMAND" in result.stderr


def test_normalize_imports_only_what_it_needs():
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "prefix_routing", "normalize", "-"],
                            cwd=ROOT, input='{"prompt": "hi"}', capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == '{"prompt":"hi"}'
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "prefix_routing.rules" in imported
    assert not imported & {"prefix_routing.lab", "prefix_routing.lab.fleet", "prefix_routing.frontdoor", "matplotlib", "boto3", "pydantic"}
