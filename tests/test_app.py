"""app.py as CI and the README run it: a subprocess, context from the command line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run_app(tmp_path, stage, config_dir=None):
    env = dict(os.environ, CDK_CONTEXT_JSON=json.dumps({"stage": stage}), CDK_OUTDIR=str(tmp_path / "out"))
    if config_dir:
        env["PREFIX_ROUTING_CONFIG_DIR"] = str(config_dir)
    return subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("stage", ["llama8b-g6e", "llama70b-p5"])
def test_example_stage_synthesizes(tmp_path, stage):
    result = _run_app(tmp_path, stage)
    assert result.returncode == 0, result.stderr[-3000:]
    templates = sorted((tmp_path / "out").glob("*.template.json"))
    assert [p.name for p in templates] == [
        f"PrefixRouting-{stage}-{s}.template.json" for s in ("Endpoint", "Normalizer", "Observability")
    ]
    lint = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), *map(str, templates)], cwd=ROOT, capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout  # .cfnlintrc applies: no errors, no warnings


def test_config_typo_exits_2_with_one_clear_line_and_no_traceback(tmp_path):
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    text = (ROOT / "config" / "llama8b-g6e.toml").read_text().replace("prefix_length = 8192", "prefix_lenght = 8192")
    (config_dir / "typo.toml").write_text(text)
    result = _run_app(tmp_path, "typo", config_dir)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{config_dir / 'typo.toml'}: routing.prefix_lenght: unknown key (a typo?)" in result.stderr
    assert not list((tmp_path / "out").glob("*.template.json")) if (tmp_path / "out").exists() else True
