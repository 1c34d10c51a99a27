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


def _ninja(tmp_path, steps: int):
    """A stand-in for `cmake --build` with ninja: one `[n/N]` line per step, a line that is not one."""
    script = tmp_path / "fake_ninja.py"
    script.write_text(
        "import sys\n"
        "print('ninja: entering directory build', flush=True)\n"
        f"for i in range(1, {steps} + 1):\n"
        f"    print(f'[{{i}}/{steps}] Building CXX object src/unit{{i}}.cpp.o', flush=True)\n"
        "sys.exit(int(sys.argv[1]))\n")
    return script


def test_the_build_relays_ninjas_steps_at_each_tenth(tmp_path):
    import sys

    said, ticks = [], iter(range(100))  # one second per line read
    log = tmp_path / "build.log"
    build.run_logged([sys.executable, str(_ninja(tmp_path, 20)), "0"], log, progress=said.append,
               clock=lambda: float(next(ticks)))
    # 20 steps: a tenth is crossed every second step, and no 5 s pass without one.
    assert said == [f"building llama-server: {p}% ({p // 5}/20 steps, {p // 5} s)" for p in range(10, 101, 10)]
    assert "[20/20] Building CXX object src/unit20.cpp.o" in log.read_text()  # the log keeps every line


def test_a_long_tenth_is_reported_every_few_seconds(tmp_path):
    import sys

    said, ticks = [], iter([i / 10 for i in range(2000)])  # a tenth of a second per line
    build.run_logged([sys.executable, str(_ninja(tmp_path, 1000)), "0"], tmp_path / "build.log", progress=said.append,
               clock=lambda: next(ticks))
    # Step i is read at i/10 s: 5 s pass every 50 steps (5 %), before the next tenth is crossed.
    assert said[:3] == ["building llama-server: 5% (50/1000 steps, 5 s)",
                        "building llama-server: 10% (100/1000 steps, 10 s)",
                        "building llama-server: 15% (150/1000 steps, 15 s)"]
    assert len(said) == 20 and said[-1].startswith("building llama-server: 100% (1000/1000 steps")


def test_a_failed_build_step_names_its_log(tmp_path):
    import sys

    with pytest.raises(UserError, match=r"failed with status 2: see .*build\.log"):
        build.run_logged([sys.executable, str(_ninja(tmp_path, 3)), "2"], tmp_path / "build.log", progress=lambda text: None)
