"""The configuration reference is generated from the stage model, and the defaults docs quote match the code."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from prefix_routing.rules.replication import ReplicationSettings
from prefix_routing.stage.config import ReplicationStageSettings, StageConfig, load_stage
from prefix_routing.stage.front_door_env import front_door_environment

ROOT = Path(__file__).resolve().parents[3]
REGENERATE = ".venv/bin/python tools/config_reference.py"


def _generator():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "tools" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_configuration_md_is_the_generators_output():
    current = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert current == _generator().render(), f"docs/configuration.md differs from the stage model: run {REGENERATE}"


def _fields(model=StageConfig, prefix=""):
    for name, field in model.model_fields.items():
        yield prefix + name, field
        if hasattr(field.annotation, "model_fields"):
            yield from _fields(field.annotation, f"{prefix}{name}.")


def test_every_field_has_a_meaning():
    missing = [path for path, field in _fields() if not (field.description or "").strip()]
    assert not missing, f"fields without description=: {missing}"


class _Demo(BaseModel):
    count: int = Field(3, ge=1, le=5, description="how many")
    mode: Literal["a", "b"] = Field("a", description="which")
    share: float | None = Field(None, gt=0, lt=1, description="a | share")
    label: str = Field(pattern=r"^x|y$", max_length=4, description="shown as <label>",
                       json_schema_extra={"allowed": "not `xx`"})
    flag: bool = Field(False, description="on or off")
    tags: list[str] = Field(default_factory=list, max_length=3, description="tags")


def test_rows_come_from_the_fields_constraints():
    rows = _generator()._rows(_Demo, "demo.")
    assert rows == [
        "| `demo.count` | integer | `3` | from 1 to 5 | how many |",
        "| `demo.mode` | string | `\"a\"` | `a`, `b` | which |",
        "| `demo.share` | number or unset | unset | more than 0, less than 1 | a \\| share |",
        "| `demo.label` | string | required | at most 4 characters; matches `^x\\|y$`; not `xx` | shown as &lt;label&gt; |",
        "| `demo.flag` | boolean | `false` | `true`, `false` | on or off |",
        "| `demo.tags` | list of strings | `[]` | at most 3 entries | tags |",
    ]


def test_the_reference_says_what_a_stage_is_and_how_errors_look():
    text = _generator().render()
    for needed in ("`config/<name>.toml`", "`-c stage=<name>`", "embedded default stage", "PREFIX_ROUTING_CONFIG_DIR",
                   "exit status 2", "one line each"):
        assert needed in text
    default = load_stage()
    assert f"× `{default.endpoint.instance_type}`" in text and f"`{default.model.model_id}`" in text
    assert "| `routing.prefix_length` | integer or unset | `4096` | from 1024 to 65536 |" in text
    assert "| `normalizer.block_bytes` | integer | `2048` | from 512 to 65536 |" in text


def test_check_mode_tells_how_to_regenerate(tmp_path, monkeypatch, capsys):
    module = _generator()
    stale = tmp_path / "configuration.md"
    stale.write_text("old\n")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "OUTPUT", stale)
    assert module.main(["config_reference.py", "--check"]) == 1
    assert f"configuration.md is out of date: run {REGENERATE}" in capsys.readouterr().err
    assert module.main(["config_reference.py"]) == 0
    assert stale.read_text() == module.render()
    assert module.main(["config_reference.py", "--check"]) == 0


# ------------------------------------------------------------------- docs/normalizer-lambda.md's defaults

def _replication_row() -> tuple[list[str], list[str]]:
    """(variables, quoted defaults) of the REPLICATION_* row of the function's environment table."""
    text = (ROOT / "docs" / "normalizer-lambda.md").read_text(encoding="utf-8")
    section = text.split("## Configuration (environment, set by the stack)", 1)[1].split("\n## ", 1)[0]
    (row,) = [line for line in section.splitlines() if "`REPLICATION_ENABLED`" in line]
    _, variables, meaning, _ = row.split("|")
    names = re.findall(r"`(REPLICATION_[A-Z_]+)`", variables)
    defaults = re.search(r"absent: ([^|]*)$", meaning.strip()).group(1).strip(" .").split(", ")
    return names, defaults


def test_replication_defaults_quoted_in_the_function_doc_are_the_codes():
    names, defaults = _replication_row()
    assert len(names) == len(defaults), (names, defaults)
    code = ReplicationSettings()
    stage = ReplicationStageSettings()
    mismatches = []
    for name, quoted in zip(names, defaults):
        field = name.removeprefix("REPLICATION_").lower()
        actual = getattr(code, field)
        if isinstance(actual, bool):
            ok = quoted == ("on" if actual else "off")
        else:
            ok = re.fullmatch(r"-?\d+(\.\d+)?", quoted) is not None and float(quoted) == actual
        if not ok:
            mismatches.append(f"{name}: docs/normalizer-lambda.md says {quoted}, ReplicationSettings() has {actual!r}")
        assert getattr(stage, field) == actual, f"the stage's default of replication.{field} differs from the rules'"
    assert not mismatches, mismatches


def test_the_function_doc_names_every_replication_variable_the_stack_sets():
    names, _ = _replication_row()
    set_by_stack = {k for k in front_door_environment(load_stage()) if k.startswith("REPLICATION_")}
    assert set(names) == set_by_stack
    assert {n.removeprefix("REPLICATION_").lower() for n in names} == set(ReplicationStageSettings.model_fields)
