"""``python -m prefix_routing engines``: start without a build is one line and status 2; stop is safe when nothing runs."""

from prefix_routing.cli.main import COMMANDS, main


def test_start_without_a_build_says_how_to_build(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert COMMANDS["engines"] == "engines"
    assert main(["engines", "start", "--count", "1"]) == 2
    err = capsys.readouterr().err
    assert "no llama-server at" in err and "engines build" in err and err.count("\n") == 1


def test_stop_and_status_with_nothing_running(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["engines", "stop"]) == 0 and "stopped 0 engine(s)" in capsys.readouterr().out
    assert main(["engines", "status"]) == 0 and "no engines running" in capsys.readouterr().out


def test_each_kind_says_how_to_build_it_and_refuses_the_others_options(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["engines", "start", "--kind", "vllm", "--count", "1"]) == 2
    err = capsys.readouterr().err
    assert "vLLM is not installed at" in err and "engines build --kind vllm" in err
    assert main(["engines", "start", "--kind", "llama.cpp", "--block-size", "32"]) == 2
    assert "block_size (--block-size, emulate's --engine-block-size): not an option of llama.cpp engines" in \
        capsys.readouterr().err
    assert main(["engines", "start", "--kind", "vllm", "--cache-ram", "40"]) == 2
    assert "cache_ram_mib (--cache-ram, emulate's --engine-cache-ram): not an option of vllm engines" in \
        capsys.readouterr().err


def test_an_unknown_kind_is_refused_by_the_parser(capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_:
        main(["engines", "build", "--kind", "sglang"])
    assert exit_.value.code == 2 and "invalid choice: 'sglang'" in capsys.readouterr().err
