"""The normalizer's asset carries bytecode for its runtime's Python (stacks/constructs/lambda_assets.py).

Without it, every cold start compiles every module it imports (``/var/task`` is read-only); with
bytecode for another Python, the runtime ignores it. What is checked: each ``.py`` of the synthesized
asset has a checked-hash ``.pyc`` (PEP 552) named for the function's runtime, with CPython 3.14's
magic number, whose source hash is that of the ``.py`` beside it; the compiled files are never reused
for other sources; a missing compiler stops the synth with the command that installs it. Speed is
measured by bench/bench_cold_start.py, not here.
"""

from __future__ import annotations

import _imp
from pathlib import Path

import pytest

from stacks.constructs import lambda_assets
from stacks.constructs.lambda_assets import PYODIDE_VERSION, cache_tag, compile_bytecode, compiled_path

#: CPython 3.14's bytecode magic number since 3.14rc3 (Include/internal/pycore_magic_number.h).
MAGIC_314 = 3627


def _header(pyc: Path) -> tuple[int, int, bytes]:
    data = pyc.read_bytes()[:16]
    assert data[2:4] == b"\r\n", pyc
    return int.from_bytes(data[:2], "little"), int.from_bytes(data[4:8], "little"), data[8:16]


def _matches_source(pyc: Path, source: Path) -> bool:
    raw_magic = int.from_bytes(pyc.read_bytes()[:4], "little")
    return pyc.read_bytes()[8:16] == _imp.source_hash(raw_magic, source.read_bytes())


def test_cache_tag_follows_the_runtime():
    assert cache_tag("python3.14") == "cpython-314"
    assert cache_tag("python3.9") == "cpython-39"
    with pytest.raises(ValueError):
        cache_tag("nodejs22.x")


def test_the_asset_carries_checked_hash_bytecode_of_its_runtimes_python(default_stage):
    stacks, templates = default_stage
    (function,) = [f for f in templates["normalizer"].find_resources("AWS::Lambda::Function").values()
                   if f["Properties"]["Handler"] == "run.sh"]
    tag = cache_tag(function["Properties"]["Runtime"])
    assert tag == "cpython-314"
    (asset,) = [p for p in Path(stacks.normalizer.node.root.outdir).glob("asset.*") if (p / "run.sh").is_file()]
    sources = [p for p in asset.rglob("*.py") if "__pycache__" not in p.parts]
    assert len(sources) > 300  # the vendored SDK, the handler, the web app and the library's subpackages
    for source in sources:
        pyc = compiled_path(source, tag)
        assert pyc.is_file(), f"{source.relative_to(asset)} has no {pyc.name}"
        magic, flags, _ = _header(pyc)
        assert (magic, flags) == (MAGIC_314, 0b11), f"{pyc.relative_to(asset)}: magic {magic}, flags {flags:#b}"
        assert _matches_source(pyc, source), f"{pyc.relative_to(asset)} is not {source.name}'s bytecode"
    # nothing for another Python (the machine's own bytecode never goes in)
    assert {p.name.split(".")[-2] for p in asset.rglob("*.pyc")} == {tag}


def _module_tree(root: Path, value: int) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text(f"VALUE = {value}\n")
    (root / "top.py").write_text("import pkg.mod\n")
    return root


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(lambda_assets, "PYC_CACHE", tmp_path / "cache")
    return tmp_path / "cache"


def test_compiled_files_follow_their_sources_and_are_reused_only_for_the_same_ones(tmp_path, private_cache,
                                                                                    monkeypatch):
    first = _module_tree(tmp_path / "first", 1)
    assert compile_bytecode(first, "python3.14") == 3
    assert _header(compiled_path(first / "pkg" / "mod.py", "cpython-314"))[:2] == (MAGIC_314, 0b11)
    # other sources at the same paths: compiled again, never served the first tree's bytecode
    second = _module_tree(tmp_path / "second", 2)
    compile_bytecode(second, "python3.14")
    for tree in (first, second):
        for source in tree.rglob("*.py"):
            assert _matches_source(compiled_path(source, "cpython-314"), source), source
    # the same sources again: copied from the cache, without starting the compiler
    monkeypatch.setattr(lambda_assets, "_run_compiler", lambda out, tag: pytest.fail("compiled again"))
    third = _module_tree(tmp_path / "third", 1)
    compile_bytecode(third, "python3.14")
    assert compiled_path(third / "pkg" / "mod.py", "cpython-314").read_bytes() == \
        compiled_path(first / "pkg" / "mod.py", "cpython-314").read_bytes()


def test_without_the_compiler_synth_says_how_to_install_it(tmp_path, private_cache, monkeypatch):
    monkeypatch.setattr(lambda_assets, "PYODIDE_DIR", tmp_path / "no-pyodide")
    with pytest.raises(RuntimeError, match="make install"):
        compile_bytecode(_module_tree(tmp_path / "tree", 1), "python3.14")


def test_a_module_that_does_not_compile_stops_the_synth(tmp_path, private_cache):
    tree = _module_tree(tmp_path / "tree", 1)
    (tree / "broken.py").write_text("def f(:\n")
    with pytest.raises(RuntimeError, match="broken.py|failed"):
        compile_bytecode(tree, "python3.14")


def test_the_pinned_compiler_is_the_one_npm_installs():
    """package.json and its lock pin the Pyodide that lambda_assets.py expects (`make install` runs `npm ci`)."""
    import json

    package = json.loads((lambda_assets.ROOT / "package.json").read_text())
    lock = json.loads((lambda_assets.ROOT / "package-lock.json").read_text())
    assert package["devDependencies"]["pyodide"] == PYODIDE_VERSION
    assert lock["packages"]["node_modules/pyodide"]["version"] == PYODIDE_VERSION
    assert lambda_assets.PYODIDE_DIR == lambda_assets.ROOT / "node_modules" / "pyodide"