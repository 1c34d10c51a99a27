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
