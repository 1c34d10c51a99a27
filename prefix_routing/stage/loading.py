"""Reading a stage: its TOML file under ``config/`` (or the default stage, ``config/default.toml``,
wherever stage files are read from), and pydantic's validation errors as one line each, naming the
file, the field path, the value and what is allowed.

The functions here take the stage's model as an argument: :mod:`prefix_routing.stage.config`
defines it, with ``parse_stage`` and ``load_stage`` for it.
"""

from __future__ import annotations

import os
import re
import tomllib
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from prefix_routing.stage.reference_text import allowed_words, range_text, without_none
from prefix_routing.stage.value_checks import (ENVIRONMENT_MAX_ENTRIES, STACK_ENVIRONMENT_ENTRIES, STAGE_NAME,
                                               shown_environment_value)

# PREFIX_ROUTING_CONFIG_DIR points synth at another folder of stage files (tests use it).
CONFIG_DIR = Path(os.environ.get("PREFIX_ROUTING_CONFIG_DIR") or Path(__file__).resolve().parents[2] / "config")
DEFAULT_STAGE = "default"
#: Where the configuration reference lives (generated: ``tools/config_reference.py``).
REFERENCE_DOC = "docs/configuration.md"


class ConfigError(Exception):
    """The stage configuration is invalid. ``str()`` lists every problem, one per line."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


#: The default stage, what synth deploys without ``-c stage``: Llama 3.1 8B on single-GPU
#: ml.g6e.xlarge instances, two of them at rest (one copy each), so that prefix-aware routing always
#: has a choice to make; up to three under load. It synthesizes with no account. It is read from the
#: clone's ``config/`` even when ``PREFIX_ROUTING_CONFIG_DIR`` names another folder (one without a
#: ``default.toml`` of its own).
DEFAULT_STAGE_FILE = Path(__file__).resolve().parents[2] / "config" / f"{DEFAULT_STAGE}.toml"
#: The default stage's data, as its file holds it (read once).
DEFAULT_STAGE_DATA: dict[str, Any] = tomllib.loads(DEFAULT_STAGE_FILE.read_text(encoding="utf-8"))

Model = TypeVar("Model", bound=BaseModel)


def field_at(stage_model: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    """The pydantic FieldInfo of the field of ``stage_model`` at ``loc`` (e.g. ``("routing",
    "prefix_length")``, or ``("limits", "tenants", "<key>", "concurrent_streams")`` inside a table of
    sections), or None."""
    model: Any = stage_model
    field = None
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        field = fields[part]
        model = without_none(field.annotation)[0]
        if typing.get_origin(model) is dict and parts:  # a table of sections: its key, then the section
            model = typing.get_args(model)[1]
            parts.pop(0)
    return field


def _allowed_range(stage_model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """'allowed: 1024 to 65536' from the Field bounds of the field at ``loc``."""
    field = field_at(stage_model, loc)
    text = range_text(field.metadata if field else None)
    return f"allowed: {text}" if text else None


def _format_error(stage_model: type[BaseModel], source: str, error: dict[str, Any]) -> str:
    loc = tuple(error["loc"])
    path = ".".join(str(part) for part in loc) or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return f"{source}: {path}: unknown key (a typo?); see the configuration reference in {REFERENCE_DOC}"
    if error["type"] == "missing":
        return f"{source}: {path}: required field is missing"
    if loc[:2] == ("model", "environment") and len(loc) > 2:
        # A variable's name or value: the value is never shown whole (it may be a secret).
        if loc[-1] == "[key]":
            return f"{source}: model.environment key {error['input']!r}: {message}"
        if "allowed" not in message:
            message = "allowed: a string"  # a value of another type (TOML gives numbers and booleans)
        return f"{source}: model.environment.{loc[2]} = {shown_environment_value(error['input'])}: {message}"
    if error["type"] == "too_long" and isinstance(error["input"], (dict, list)):
        limit = error.get("ctx", {}).get("max_length")
        why = (f" (SageMaker takes {ENVIRONMENT_MAX_ENTRIES} variables; the stack sets up to {STACK_ENVIRONMENT_ENTRIES})"
               if loc == ("model", "environment") else "")
        return f"{source}: {path}: {len(error['input'])} entries; allowed: at most {limit}{why}"
    field = field_at(stage_model, tuple(part for part in loc if not isinstance(part, int)))  # a list's items: the list's field
    leaf = field is not None and not _is_section(field.annotation)
    if isinstance(error["input"], dict) and not leaf:  # a rule across fields: the message names them and their values
        return f"{source}: {path}: {message}"
    if error["type"] in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        message = _allowed_range(stage_model, loc) or message
    if error["type"] == "finite_number":  # inf, -inf, nan
        bounds = _allowed_range(stage_model, loc)
        message = f"{bounds}, a finite number" if bounds else "allowed: a finite number"
    if "allowed" not in message and leaf:  # pydantic's own words (a type, a pattern): what the reference says instead
        message = allowed_words(field) if error["type"] != "value_error" else f"{message}; {allowed_words(field)}"
    return f"{source}: {path} = {error['input']!r}: {message}"


def _is_section(annotation: Any) -> bool:
    base = without_none(annotation)[0]
    return isinstance(base, type) and issubclass(base, BaseModel)


def parse_model(stage_model: type[Model], data: dict[str, Any], *, source: str) -> Model:
    """``data`` validated as ``stage_model``; :class:`ConfigError` with every problem, one line each,
    each beginning with ``source``."""
    try:
        return stage_model.model_validate(data)
    except ValidationError as error:
        errors = error.errors(include_url=False)
        # A variable whose name is refused needs no second line about its value.
        refused = {e["loc"][:3] for e in errors
                   if tuple(e["loc"][:2]) == ("model", "environment") and e["loc"][-1] == "[key]"}
        errors = [e for e in errors if len(e["loc"]) != 3 or tuple(e["loc"]) not in refused]
        raise ConfigError([_format_error(stage_model, source, e) for e in errors]) from None


def _case_twins(name: str, config_dir: Path) -> list[str]:
    """Other stages whose names differ from ``name`` only in case (they would share the endpoint)."""
    names = {p.stem for p in config_dir.glob("*.toml")} | {DEFAULT_STAGE}
    return sorted(other for other in names if other != name and other.lower() == name.lower())


def load_model(stage_model: type[Model], name: str, *, config_dir: Path) -> Model:
    """The stage ``name`` validated as ``stage_model``: ``config_dir/<name>.toml``, or the default
    stage's data when ``config_dir`` has no file of that name."""
    path = config_dir / f"{name}.toml"
    files = {p.name for p in config_dir.glob("*.toml")}  # exact names, on case-insensitive disks too
    if not re.fullmatch(STAGE_NAME, name) or (path.name not in files and name != DEFAULT_STAGE):
        available = sorted(p.removesuffix(".toml") for p in files) + [DEFAULT_STAGE]
        raise ConfigError([f"stage {name!r}: no file {path}; available stages: {', '.join(sorted(set(available)))}"])
    twins = _case_twins(name, config_dir)
    if twins:
        raise ConfigError([
            f"{path if path.name in files else 'embedded default stage'}: name {name!r} differs only in case from "
            f"stage {', '.join(map(repr, twins))}: both would deploy the endpoint {name.lower()}-prefix-llm; "
            "allowed: stage names that differ in more than case (rename one file)"
        ])
    if name == DEFAULT_STAGE and path.name not in files:
        return parse_model(stage_model, DEFAULT_STAGE_DATA, source="embedded default stage")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError([f"{path}: not valid TOML: {error}"]) from None
    problems = []
    if data.get("name", name) != name:
        problems.append(
            f"{path}: name = {data['name']!r}: must equal the file name {name!r} (a stage is selected by its file "
            f"name, -c stage={name}); allowed: {name!r}, or leave name out"
        )
        data["name"] = name  # the other fields are still checked, all problems at once
    data.setdefault("name", name)
    try:
        config = parse_model(stage_model, data, source=str(path))
    except ConfigError as error:
        problems.extend(error.problems)
    if problems:
        raise ConfigError(problems)
    return config
