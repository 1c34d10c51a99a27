"""The benchmarks' reading of ``cdk.out`` (which asset is the normalizer's, whether its bytecode is
sound): deterministic, nothing timed (the timing is in bench/)."""

from __future__ import annotations

import os
import py_compile
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import bench_cold_start  # noqa: E402
import bench_handler_import  # noqa: E402


def _asset(root: Path, name: str, files: tuple[str, ...], mtime: float) -> Path:
    asset = root / "cdk.out" / f"asset.{name}"
    asset.mkdir(parents=True)
    for file in files:
        (asset / file).write_text("")
    os.utime(asset, (mtime, mtime))
    return asset


def test_find_asset_picks_the_normalizers_asset_even_when_another_handler_is_newer(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_handler_import, "ROOT", tmp_path)
    normalizer = _asset(tmp_path, "n", ("handler.py", "server.py", "run.sh"), 1_000)
    _asset(tmp_path, "advisor", ("handler.py",), 2_000)  # the routing advisor's: a handler.py, no web app
    assert bench_handler_import.find_asset() == normalizer


def test_find_asset_is_none_without_a_normalizer_asset(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_handler_import, "ROOT", tmp_path)
    _asset(tmp_path, "advisor", ("handler.py",), 2_000)
    assert bench_handler_import.find_asset() is None


@pytest.fixture
def compiled_tree(tmp_path):
    """Two modules with checked-hash bytecode for this interpreter."""
    tree = tmp_path / "asset"
    (tree / "pkg").mkdir(parents=True)
    for path, text in ((tree / "a.py", "A = 1\n"), (tree / "pkg" / "__init__.py", "B = 2\n")):
        path.write_text(text)
        py_compile.compile(str(path), invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH, doraise=True)
    return tree


RUNTIME = f"python3.{sys.version_info.minor}"


def test_sound_bytecode_passes(compiled_tree):
    assert bench_cold_start.shipped_bytecode(compiled_tree, RUNTIME) == (2, [])


def test_a_module_without_bytecode_is_reported(compiled_tree):
    (compiled_tree / "b.py").write_text("C = 3\n")
    modules, problems = bench_cold_start.shipped_bytecode(compiled_tree, RUNTIME)
    assert modules == 3 and len(problems) == 1 and problems[0].startswith("b.py: no ")


def test_bytecode_of_another_source_is_reported(compiled_tree):
    (compiled_tree / "a.py").write_text("A = 'changed after compiling'\n")
    _, problems = bench_cold_start.shipped_bytecode(compiled_tree, RUNTIME)
    assert len(problems) == 1 and "source hash is not that of a.py" in problems[0]


def test_timestamp_bytecode_and_other_pythons_are_reported(compiled_tree):
    py_compile.compile(str(compiled_tree / "a.py"), invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    (compiled_tree / "__pycache__" / "a.cpython-299.pyc").write_bytes(b"")
    _, problems = bench_cold_start.shipped_bytecode(compiled_tree, RUNTIME)
    assert any("not a checked-hash pyc" in p for p in problems)
    assert any("other Pythons: cpython-299" in p for p in problems)
