"""Writes docs/configuration.md, the configuration reference, from the stage model's own fields.

Every row comes from the stage model, StageConfig in prefix_routing/stage/config.py and the sections
it composes (prefix_routing/stage/*_sections.py, domain_checks.py, benchmark.py): the field's name,
its type, its default, what is allowed (the field's bounds, lengths, pattern and choices, and the
``allowed`` text of fields whose rule is a validator) and its meaning (``description=``). Edit the
model, then run

    .venv/bin/python tools/config_reference.py           # rewrites docs/configuration.md
    .venv/bin/python tools/config_reference.py --check   # exit status 1 if it is out of date

tests/prefix_routing/stage/test_config_reference.py fails while the file differs from the output.
"""

from __future__ import annotations

import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pydantic import BaseModel  # noqa: E402
from pydantic_core import PydanticUndefined  # noqa: E402

from prefix_routing.stage import config as stage_config  # noqa: E402
from prefix_routing.stage.reference_text import allowed_text, code_span, type_text, without_none  # noqa: E402

OUTPUT = ROOT / stage_config.REFERENCE_DOC
COMMAND = ".venv/bin/python tools/config_reference.py"


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _cell(text: str) -> str:
    """Table-cell text: a "|" would end the cell, a line break the row, and "<x>" outside code would
    be an HTML tag."""
    pieces = " ".join(text.split()).split("`")
    for i in range(0, len(pieces), 2):  # outside code spans
        pieces[i] = pieces[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(pieces).replace("|", "\\|")


def _docstring(model: type[BaseModel]) -> str:
    """The class docstring's paragraphs, reStructuredText ``code`` as Markdown `code`."""
    paragraphs = re.split(r"\n\s*\n", model.__doc__ or "")
    return "\n\n".join(" ".join(p.split()).replace("``", "`") for p in paragraphs if p.strip())


def default_text(field: Any) -> str:
    extra = field.json_schema_extra or {}
    if "doc_default" in extra:
        return extra["doc_default"]
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return code_span(str(value).lower())
    if isinstance(value, str):
        return code_span(f'"{value}"')
    if isinstance(value, (list, dict)):
        return code_span("[]" if isinstance(value, list) else "{}") if not value else code_span(value)
    return code_span(value)


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        if _is_section(field.annotation):
            continue
        cells = (code_span(prefix + name), type_text(field.annotation), default_text(field), allowed_text(field),
                 field.description or "")
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return rows


def _sections(model: type[BaseModel], prefix: str = "") -> list[tuple[str, type[BaseModel]]]:
    found = []
    for name, field in model.model_fields.items():
        if _is_section(field.annotation):
            found.append((prefix + name, field.annotation))
            found.extend(_sections(field.annotation, f"{prefix}{name}."))
    return found


def _named_sections(model: type[BaseModel], prefix: str = "") -> list[tuple[str, type[BaseModel]]]:
    """Tables of sections (``[domains.<name>]``) whose fields no section above lists already (a
    ``[limits.tenants."<id>"]`` override has the ``[limits]`` fields)."""
    found = []
    for name, field in model.model_fields.items():
        base, _ = without_none(field.annotation)
        if typing.get_origin(base) is dict:
            _, value = typing.get_args(base)
            if isinstance(value, type) and issubclass(value, BaseModel) and not issubclass(model, value):
                found.append((f"{prefix}{name}.<name>", value))
        elif _is_section(field.annotation):
            found.extend(_named_sections(field.annotation, f"{prefix}{name}."))
    return found


def _default_stage_summary() -> str:
    data = stage_config.DEFAULT_STAGE_DATA
    model, endpoint, routing = data["model"], data["endpoint"], data["routing"]
    text = (
        f"`{model['model_id']}` on `{model['framework']}` (image `{model['image_repository']}:{model['image_tag']}`), "
        f"{endpoint['instances_min']}–{endpoint['instances_max']} × `{endpoint['instance_type']}` with "
        f"{endpoint['copies_min']}–{endpoint['copies_max']} copies, `{routing['strategy']}`"
    )
    if routing["strategy"] == "PREFIX_AWARE":
        text += f" (prefix length {routing['prefix_length']}, concurrency threshold {routing['concurrency_threshold']})"
    return text


TABLE_HEADER = ("| field | type | default | allowed | meaning |", "| --- | --- | --- | --- | --- |")


def render() -> str:
    """The whole of docs/configuration.md."""
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated from prefix_routing/stage/config.py by tools/config_reference.py: do not edit by hand; "
        f"run `{COMMAND}` after changing the stage model. -->",
        "",
        "A *stage* is one deployment's settings: a TOML file `config/<name>.toml`, selected with "
        "`-c stage=<name>` (`npx cdk synth -c stage=llama8b-g6e`, `make synth STAGE=llama8b-g6e`). Without "
        "`-c stage`, synth uses the embedded default stage, which needs no file: "
        f"{_default_stage_summary()}. Set `PREFIX_ROUTING_CONFIG_DIR` to read stage files from another folder.",
        "",
        "A stage is validated once, before any construct is built. Unknown keys (typos), wrong types "
        '(`"4096"` is not `4096`, `1` is not `true`), infinities and NaN, and values outside what is allowed '
        "stop synth with exit status 2 and one line each, naming the file, the field, the value and what is "
        "allowed, all problems at once:",
        "",
        "```text",
        "configuration error (stage 'typo'):",
        "config/typo.toml: routing.prefix_length = 512: allowed: from 1024 to 65536",
        "```",
        "",
        "Legal settings that probably do not do what was meant print a warning (not an error): `PREFIX_AWARE` "
        "when fewer than two copies can serve, replication enabled without `PREFIX_AWARE`, an instance type "
        "that is not in the lab's instance table (its accelerator and memory fit are then not checked), "
        "a framework that reports no cached tokens, and tenants who share copies on an engine that ignores "
        "`cache_salt` (refused instead with `tenancy.require_isolation`).",
        "",
        "Each table lists a section's fields: the TOML key (`[routing]` then `prefix_length = 4096` is "
        "`routing.prefix_length`), its type, its default (\"required\": no default), what is allowed and "
        "what it means. Ranges include both ends unless they say \"more than\" or \"less than\".",
        "",
        "## Top level",
        "",
        _docstring(stage_config.StageConfig),
        "",
        *TABLE_HEADER,
        *_rows(stage_config.StageConfig, ""),
    ]
    for path, model in _sections(stage_config.StageConfig) + _named_sections(stage_config.StageConfig):
        lines += ["", f"## `[{path}]`", "", _docstring(model), "", *TABLE_HEADER, *_rows(model, path + ".")]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        print(f"usage: {COMMAND} [--check]", file=sys.stderr)
        return 2
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
