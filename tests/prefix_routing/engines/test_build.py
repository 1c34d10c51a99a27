"""Building llama-server once per pin (prefix_routing.engines.build), without building here."""

import pytest

from prefix_routing.engines import build
from prefix_routing.rules.errors import UserError


def test_the_cache_is_outside_the_clone_and_keyed_by_the_pin(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = build.cache_root()
    assert root == tmp_path / "prefix-routing" / "engines" / f"llama-cpp-python-{build.VERSION}"
    binary = build.binary_path(root)
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"\x7fELF")
    said = []
    assert build.build(say=said.append) == binary  # cached: no download, no compiler
    assert "cached at" in said[0]


def test_missing_compilers_are_named_with_their_debian_packages(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert build.missing_tools(lambda program: None if program == "ninja" else "/usr/bin/" + program) == [
        "ninja (Debian package ninja-build)"]
    monkeypatch.setattr(build, "missing_tools", lambda: ["ninja (Debian package ninja-build)"])
    with pytest.raises(UserError, match=r"needs ninja \(Debian package ninja-build\).*apt-get install ninja-build"):
        build.build()


def test_the_build_is_portable_and_only_the_server(monkeypatch):
    assert "-DGGML_NATIVE=OFF" in build.CMAKE_OPTIONS and "-DLLAMA_BUILD_TESTS=OFF" in build.CMAKE_OPTIONS
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in build.CMAKE_OPTIONS  # nothing is downloaded while configuring


def test_a_model_needs_the_vocabulary_the_build_keeps(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(UserError, match="no tokenizer vocabulary at .*run `python -m prefix_routing engines build`"):
        build.ensure_model(say=lambda text: None)
