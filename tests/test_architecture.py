"""The direction of imports (../shared/design.md): each room imports only the rooms below it.

Every module of ``prefix_routing/``, ``stacks/`` and ``lambda/`` is put in one room below; a new
module that is in none fails here, so whoever adds it decides where it belongs. The imports are read
with ``ast`` from the source (nothing is imported), including imports inside functions.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Room of every module (dotted name, or a package prefix ending in "."): the subpackages of
#: prefix_routing are the rooms (prefix_routing/__init__.py and docs/architecture.md say why).
ROOMS = {
    "prefix_routing": "package",  # __init__: a docstring, imports nothing
    "prefix_routing.rules": "rules",  # what runs everywhere: standard library only
    "prefix_routing.rules.": "rules",
    "prefix_routing.frontdoor": "frontdoor",  # the Lambda's logic
    "prefix_routing.frontdoor.": "frontdoor",
    "prefix_routing.stage": "stage",  # the typed stage configuration, the instance and model tables
    "prefix_routing.stage.": "stage",
    "prefix_routing.lab": "lab",  # traces, the fleet model, analyze, simulate, tune, plots
    "prefix_routing.lab.": "lab",
    "prefix_routing.emulator": "emulator",  # the local SageMaker runtime
    "prefix_routing.emulator.": "emulator",
    "prefix_routing.loadtest": "loadtest",
    "prefix_routing.loadtest.": "loadtest",
    "prefix_routing.engines": "engines",  # real engines (llama.cpp, vLLM): build, model, processes
    "prefix_routing.engines.": "engines",
    "prefix_routing.advisor": "advisor",  # the routing advisor function: the lab on production's log
    "prefix_routing.advisor.": "advisor",
    "prefix_routing.verify": "verify",  # checks a live deployment against its stage
    "prefix_routing.verify.": "verify",
    "prefix_routing.benchmark": "benchmark",  # a SageMaker AI benchmark job beside the lab's prediction
    "prefix_routing.benchmark.": "benchmark",
    "prefix_routing.cli": "cli",  # the command line and what only it runs
    "prefix_routing.cli.": "cli",
    "prefix_routing.__main__": "cli",
    "stacks.": "stacks",
    "stacks": "stacks",
    "handler": "lambda",
    "server": "lambda",
}

#: Which rooms each room may import (itself always), and which packages outside the standard library.
ALLOWED = {
    "package": (set(), set()),
    "rules": (set(), set()),
    "frontdoor": ({"rules"}, {"boto3", "botocore", "aws_lambda_powertools"}),
    "stage": ({"rules"}, {"pydantic", "sagemaker"}),  # sagemaker: stage/images.py only, imported lazily
    "lab": ({"rules", "stage"}, {"numpy", "matplotlib", "tqdm", "boto3", "botocore"}),
    "emulator": ({"rules", "stage", "lab"}, set()),
    "loadtest": ({"rules", "stage", "lab", "emulator"}, {"boto3", "botocore", "matplotlib", "tqdm", "sagemaker"}),
    # engines -> stage: calibrate writes its preset file with stage/preset_file.py, the one definition of the format
    # torch, tokenizers, transformers: engines/vllm_model.py only, a script that vLLM's own virtualenv runs
    "engines": ({"rules", "stage"}, {"gguf", "numpy", "torch", "tokenizers", "transformers"}),
    "verify": ({"rules", "stage", "loadtest"}, {"boto3", "botocore"}),
    "advisor": ({"rules", "stage", "lab"}, {"boto3", "botocore"}),
    "benchmark": ({"rules", "stage", "lab"}, {"boto3", "botocore"}),
    "cli": ({"rules", "stage", "lab", "emulator", "loadtest", "frontdoor", "verify", "engines", "advisor", "benchmark",
             "package"}, set()),
    "stacks": ({"stage", "package"}, {"aws_cdk", "constructs", "cdk_nag", "jsii"}),
    "lambda": ({"frontdoor", "advisor", "rules", "package"}, {"boto3", "botocore"}),
}
#: The stacks may use the rules room only for the telemetry names.
STACKS_MAY_USE = {"prefix_routing.rules.telemetry"}


def source_files() -> list[Path]:
    files = [p.relative_to(ROOT) for folder in ("prefix_routing", "stacks", "lambda")
             for p in (ROOT / folder).rglob("*.py")]
    return sorted(p for p in files if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    if path.parts[0] == "lambda":
        return path.stem
    parts = list(path.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


OUR_MODULES = {module_name(p) for p in source_files()}


def room_of(module: str) -> str | None:
    if module in ROOMS:
        return ROOMS[module]
    prefixes = [p for p in ROOMS if p.endswith(".") and module.startswith(p)]
    return ROOMS[max(prefixes, key=len)] if prefixes else None


def imports_of(source: str) -> set[str]:
    """Absolute module names a source imports (``from prefix_routing import x`` gives ``prefix_routing.x``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from package import module`` imports that module; ``from module import name``, the module.
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & OUR_MODULES
            found |= submodules or {node.module}
    return found


def ours(module: str) -> bool:
    return module.split(".")[0] in ("prefix_routing", "stacks") or module in ("handler", "server")


def violations(module: str, imported: set[str]) -> list[str]:
    room = room_of(module)
    rooms, packages = ALLOWED[room]
    problems = []
    for name in sorted(imported):
        top = name.split(".")[0]
        if ours(name):
            target = room_of(name) or "unknown"
            if room == "stacks" and target == "rules":
                if name not in STACKS_MAY_USE:
                    problems.append(f"{module} ({room}) imports {name}: the stacks may use only the telemetry names")
                continue
            if target != room and target not in rooms and target != "package":
                problems.append(f"{module} ({room}) imports {name} ({target}); allowed: {sorted(rooms) or 'none of ours'}")
            if target == "cli" and room != "cli":
                problems.append(f"{module} ({room}) imports {name}: nothing imports the command line")
        elif top not in sys.stdlib_module_names and top not in packages and top != "__future__":
            problems.append(f"{module} ({room}) imports {top}, outside the standard library; allowed: "
                            f"{sorted(packages) or 'none'}")
    return problems




def test_every_module_is_in_a_room():
    missing = [str(p) for p in source_files() if room_of(module_name(p)) is None]
    assert not missing, f"put these modules in a room of tests/test_architecture.py: {missing}"


@pytest.mark.parametrize("path", source_files(), ids=str)
def test_imports_point_the_right_way(path):
    module = module_name(path)
    assert violations(module, imports_of((ROOT / path).read_text(encoding="utf-8"))) == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        # Each arrow reversed once: the check must see it.
        ("prefix_routing.rules.body", "from prefix_routing.lab import fleet", "body (rules) imports prefix_routing.lab.fleet (lab)"),
        ("prefix_routing.rules.text", "import boto3", "text (rules) imports boto3, outside the standard library"),
        ("prefix_routing.rules.identity", "from prefix_routing.frontdoor import Invoker",
         "identity (rules) imports prefix_routing.frontdoor (frontdoor)"),
        ("prefix_routing.frontdoor.invoker", "from prefix_routing.lab.simulate import simulate",
         "invoker (frontdoor) imports prefix_routing.lab.simulate (lab)"),
        ("prefix_routing.frontdoor.record", "from prefix_routing.stage.config import StageConfig",
         "record (frontdoor) imports prefix_routing.stage.config (stage)"),
        ("prefix_routing.frontdoor.upstream", "import pydantic", "upstream (frontdoor) imports pydantic, outside"),
        ("prefix_routing.lab.simulate", "def f():\n    from prefix_routing import loadtest",
         "simulate (lab) imports prefix_routing.loadtest (loadtest)"),
        ("prefix_routing.lab.fleet", "import prefix_routing.emulator.server",
         "fleet (lab) imports prefix_routing.emulator.server (emulator)"),
        ("stacks.metrics", "from prefix_routing.rules import normalize_body", "the stacks may use only the telemetry names"),
        ("stacks.metrics", "from prefix_routing.rules.body import normalize_body", "the stacks may use only the telemetry names"),
        ("stacks.app_builder", "from prefix_routing.lab import simulate", "app_builder (stacks) imports prefix_routing.lab.simulate (lab)"),
        ("stacks.app_builder", "from prefix_routing.frontdoor import Invoker", "app_builder (stacks) imports prefix_routing.frontdoor"),
        ("prefix_routing.loadtest.runner", "from prefix_routing.cli import loadtest", "nothing imports the command line"),
        ("prefix_routing.emulator.server", "from prefix_routing.loadtest import run_load",
         "server (emulator) imports prefix_routing.loadtest (loadtest)"),
        ("handler", "from prefix_routing.lab import traces", "handler (lambda) imports prefix_routing.lab.traces (lab)"),
    ],
)
def test_a_reversed_arrow_is_caught(module, source, expected):
    assert any(expected in problem for problem in violations(module, imports_of(source)))


def test_the_stacks_may_read_the_telemetry_names_and_the_stage():
    assert violations("stacks.metrics", imports_of("from prefix_routing.rules import telemetry\nimport aws_cdk")) == []
    assert violations("stacks.metrics", imports_of("from prefix_routing.rules.telemetry import NAMESPACE")) == []
    assert violations("stacks.endpoint_stack", imports_of("from prefix_routing.stage.config import StageConfig")) == []
