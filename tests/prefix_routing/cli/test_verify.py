"""``python -m prefix_routing verify``: its help, and bad input as one line with status 2 (no AWS call)."""

import subprocess
import sys

from prefix_routing.cli.main import COMMANDS, main
from tests.stacks.conftest import ROOT


def test_verify_is_a_command_with_help():
    assert COMMANDS["verify"] == "verify"
    result = subprocess.run([sys.executable, "-m", "prefix_routing", "verify", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for flag in ("--stage", "--region", "--invoke", "--json"):
        assert flag in result.stdout


def test_unknown_stage_is_one_line_and_status_2(capsys):
    assert main(["verify", "--stage", "no-such-stage", "--region", "us-east-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no-such-stage" in err and err.count("\n") == 1


def test_no_region_anywhere_is_one_line_and_status_2(monkeypatch, capsys):
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    assert main(["verify"]) == 2
    assert "error: no region: pass --region" in capsys.readouterr().err
