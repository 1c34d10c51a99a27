"""``python -m prefix_routing normalize``, run as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefix_routing.rules.body import normalize_body
from prefix_routing.rules.identity import prefix_fingerprint
from prefix_routing.rules.settings import FreezeRule, NormalizerSettings

ROOT = Path(__file__).resolve().parents[3]
BODY = json.dumps({
    "temperature": 0.2,
    "messages": [{"content": "Today is 2026-11-30.  \r\nBe brief.\n", "role": "system"},
                 {"role": "user", "content": "Cafe\u0301?"}],
}, indent=2).encode()


def cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "prefix_routing", "normalize", *args], input=stdin,
                          capture_output=True, env=env, cwd=ROOT, timeout=60)


def test_file_to_stdout_exact_bytes(tmp_path):
    path = tmp_path / "body.json"
    path.write_bytes(BODY)
    run = cli(str(path))
    assert run.returncode == 0, run.stderr
    assert run.stdout == normalize_body(BODY).body  # no newline added
    assert run.stdout.startswith(b'{"messages":[{"role":"system","content":"Today is 2026-11-30.\\nBe brief."}')
    assert run.stderr == b""


@pytest.mark.parametrize("args", [(), ("-",)])
def test_standard_input(args):
    run = cli(*args, stdin=BODY)
    assert run.returncode == 0 and run.stdout == normalize_body(BODY).body and run.stderr == b""


def test_explain_goes_to_stderr(tmp_path):
    run = cli("--explain", "--prefix-length", "1024", stdin=BODY)
    assert run.returncode == 0
    expected = normalize_body(BODY, NormalizerSettings(prefix_length=1024))
    assert run.stdout == expected.body
    report = run.stderr.decode()
    assert "kind: chat" in report
    assert f"prefix_fingerprint: {prefix_fingerprint(expected.body, 1024)} (first 1024 bytes)" in report
    assert "CRLF/CR line endings to LF in 1 text: messages[0].content" in report
    assert "Unicode NFC in 1 text: messages[1].content" in report
    assert "top-level fields reordered" in report
    assert "Today" not in report and "Cafe" not in report  # no prompt text
    again = cli("--explain", stdin=run.stdout)
    assert again.stdout == run.stdout and "changes: none" in again.stderr.decode()


def test_config_file_with_freeze_rules(tmp_path):
    config = tmp_path / "normalizer.json"
    config.write_text(json.dumps({"prefix_length": 2048, "freeze_rules": [{"name": "date", "pattern": r"\d{4}-\d{2}-\d{2}"}]}))
    run = cli("--config", str(config), stdin=BODY)
    assert run.returncode == 0, run.stderr
    settings = NormalizerSettings(prefix_length=2048, freeze_rules=(FreezeRule("date", r"\d{4}-\d{2}-\d{2}"),))
    assert run.stdout == normalize_body(BODY, settings).body
    assert "⟦date:1⟧".encode() in run.stdout
    # --prefix-length overrides the file
    run = cli("--config", str(config), "--prefix-length", "4096", "--explain", stdin=BODY)
    assert "(first 4096 bytes)" in run.stderr.decode()


MALFORMED = {
    "invalid-json": (b'{"messages": [', "invalid JSON"),
    "not-utf8": (b'{"prompt": "\xff"}', "not valid UTF-8"),
    "not-object": (b"[1, 2]", "not a JSON object"),
    "empty": (b"", "empty"),
    "duplicate-key": (b'{"prompt": "a", "prompt": "b"}', "duplicate key"),
    "nan": (b'{"prompt": "a", "temperature": NaN}', "temperature: non-finite number"),
    "too-deep": (b'{"prompt": "a", "x": ' + b"[" * 100 + b"]" * 100 + b"}", "nested deeper than 64"),
    "very-deep": (b"[" * 200000, "nested deeper"),
    "no-prompt": (b'{"model": "m"}', 'exactly one of "messages"'),
    "bad-content": (b'{"messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
    "bad-role": (b'{"messages": [{"content": "x"}]}', "messages[0].role: missing"),
    "surrogate": (b'{"prompt": "\\ud800"}', "unpaired surrogate"),
}


@pytest.mark.parametrize("body, expected", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_input_one_line_exit_2_nothing_on_stdout(body, expected):
    run = cli(stdin=body)
    assert run.returncode == 2
    assert run.stdout == b""
    lines = run.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: standard input: ") and expected in lines[0]
    assert "Traceback" not in run.stderr.decode()


def test_too_large_input(tmp_path):
    config = tmp_path / "small.json"
    config.write_text('{"max_body_bytes": 100}')
    run = cli("--config", str(config), stdin=json.dumps({"prompt": "x" * 200}).encode())
    assert (run.returncode, run.stdout) == (2, b"")
    assert run.stderr.decode().splitlines() == ["error: standard input: body: too large: 214 bytes; allowed: at most 100 bytes"]


@pytest.mark.parametrize(
    "args, config, expected",
    [
        (["missing.json"], None, "missing.json: cannot read: No such file or directory"),
        (["--config", "missing-config.json"], None, "missing-config.json: (file): cannot read"),
        (["--config", "{config}"], '{"prefix_length": 4096, "colour": 1}', "colour: unknown setting; allowed: prefix_length"),
        (["--config", "{config}"], '{"prefix_length": ', "not valid JSON"),
        (["--config", "{config}"], '{"freeze_rules": [{"name": "d", "pattern": "("}]}', "freeze_rules[0].pattern"),
        (["--prefix-length", "100"], None, "prefix_length: out of range or not an integer (got number 100); allowed: an integer 1024..65536"),
        (["--prefix-length", "abc"], None, "invalid int value"),
        (["--bogus"], None, "unrecognized arguments"),
    ],
)
def test_bad_files_and_flags(tmp_path, args, config, expected):
    if config is not None:
        (tmp_path / "config.json").write_text(config)
    args = [a.replace("{config}", str(tmp_path / "config.json")) for a in args]
    run = cli(*args, stdin=BODY)
    assert run.returncode == 2
    assert run.stdout == b""
    lines = run.stderr.decode().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in run.stderr.decode()
