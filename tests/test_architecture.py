"""The shape of the house (docs/architecture.md), read with ``ast`` from the source (nothing is
imported), imports inside functions included:

- the direction of imports: each subpackage imports only the subpackages below it. Every module of
  ``prefix_routing/``, ``stacks/`` and ``lambda/`` is put in one subpackage below; a new module that
  is in none fails here, so whoever adds it decides where it belongs;
- no import cycle between modules, and no ``from module import _name`` across modules: a name
  another module needs is public where it lives;
- modules of at most 600 lines, classes of at most 200 (no exceptions: split by ownership).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Subpackage of every module (dotted name, or a package prefix ending in "."): the subpackages of
#: prefix_routing, plus the stacks and the Lambda handlers (prefix_routing/__init__.py and
#: docs/architecture.md say why).
SUBPACKAGES = {
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
    "prefix_routing.canary": "canary",  # the isolation canary: the scheduled function and its command
    "prefix_routing.canary.": "canary",
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

#: Which subpackages each may import (itself always), and which packages outside the standard library.
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
    "canary": ({"rules", "frontdoor"}, {"boto3", "botocore"}),  # the front door's configuration: its components, salts, bodies
    "benchmark": ({"rules", "stage", "lab"}, {"boto3", "botocore"}),
    "cli": ({"rules", "stage", "lab", "emulator", "loadtest", "frontdoor", "verify", "engines", "advisor", "benchmark",
             "canary",
             "package"}, set()),
    "stacks": ({"stage", "package"}, {"aws_cdk", "constructs", "cdk_nag", "jsii"}),
    "lambda": ({"frontdoor", "advisor", "canary", "rules", "package"}, {"boto3", "botocore"}),
}
#: The stacks may use the rules subpackage only for the telemetry names.
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


def subpackage_of(module: str) -> str | None:
    if module in SUBPACKAGES:
        return SUBPACKAGES[module]
    prefixes = [p for p in SUBPACKAGES if p.endswith(".") and module.startswith(p)]
    return SUBPACKAGES[max(prefixes, key=len)] if prefixes else None


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
    own = subpackage_of(module)
    allowed, packages = ALLOWED[own]
    problems = []
    for name in sorted(imported):
        top = name.split(".")[0]
        if ours(name):
            target = subpackage_of(name) or "unknown"
            if own == "stacks" and target == "rules":
                if name not in STACKS_MAY_USE:
                    problems.append(f"{module} ({own}) imports {name}: the stacks may use only the telemetry names")
                continue
            if target != own and target not in allowed and target != "package":
                problems.append(f"{module} ({own}) imports {name} ({target}); allowed: {sorted(allowed) or 'none of ours'}")
            if target == "cli" and own != "cli":
                problems.append(f"{module} ({own}) imports {name}: nothing imports the command line")
        elif top not in sys.stdlib_module_names and top not in packages and top != "__future__":
            problems.append(f"{module} ({own}) imports {top}, outside the standard library; allowed: "
                            f"{sorted(packages) or 'none'}")
    return problems




def test_every_module_is_in_a_subpackage():
    missing = [str(p) for p in source_files() if subpackage_of(module_name(p)) is None]
    assert not missing, f"put these modules in a subpackage of tests/test_architecture.py: {missing}"


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


# --------------------------------------------------------------------------- cycles, private names, sizes

MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 200


def graph_key(path: Path) -> str:
    """A module's node in the import graph: its dotted name; a Lambda handler's, with its folder
    (both functions have a ``handler.py``)."""
    return ".".join(path.with_suffix("").parts) if path.parts[0] == "lambda" else module_name(path)


def edges_of(path: Path, source: str, known: set[str]) -> set[str]:
    """The graph keys of our modules that a source imports: ``from package import module`` points
    at the module, ``from module import name`` at the module, a Lambda's ``import server`` at its
    neighbour in the same folder."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module
                     for alias in node.names]
        else:
            continue
        for name in names:
            if path.parts[0] == "lambda" and "." not in name:
                name = ".".join((*path.parts[:-1], name))
            if name in known:
                found.add(name)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, or of one that imports itself
    (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    cycles.append(sorted(component))
    return cycles


def private_imports(module: str, source: str) -> list[str]:
    """``from other_module import _name`` in a source: a private name taken across modules."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module != module and ours(node.module):
            found += [f"{module} imports {alias.name} from {node.module}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def oversized(path: str, source: str) -> list[str]:
    problems = []
    lines = source.count("\n")
    if lines > MAX_MODULE_LINES:
        problems.append(f"{path}: {lines} lines; allowed: at most {MAX_MODULE_LINES} (split it by ownership)")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
            problems.append(f"{path}: class {node.name} is {node.end_lineno - node.lineno + 1} lines; "
                            f"allowed: at most {MAX_CLASS_LINES}")
    return problems


def test_no_module_takes_part_in_an_import_cycle():
    files = source_files()
    known = {graph_key(p) for p in files}
    graph = {graph_key(p): edges_of(p, (ROOT / p).read_text(encoding="utf-8"), known) - {graph_key(p)} for p in files}
    assert import_cycles(graph) == []


@pytest.mark.parametrize("path", source_files(), ids=str)
def test_no_private_name_is_taken_from_another_module(path):
    assert private_imports(module_name(path), (ROOT / path).read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", source_files(), ids=str)
def test_modules_and_classes_stay_small(path):
    assert oversized(str(path), (ROOT / path).read_text(encoding="utf-8")) == []


def test_a_cycle_is_found_however_long_and_only_a_cycle():
    # a -> b -> c -> a, lazy or not, is one cycle; d -> a is not part of it; e imports itself
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert import_cycles(graph) == [["a", "b", "c"], ["e"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_a_lazy_import_is_an_edge_and_a_lambda_neighbour_is_its_own_folders():
    known = {"prefix_routing.lab.traces", "prefix_routing.lab.sampling", "lambda.normalizer.server",
             "lambda.normalizer.handler", "lambda.advisor.handler"}
    lazy = "def f():\n    from prefix_routing.lab.sampling import SourceSample\n"
    assert edges_of(Path("prefix_routing/lab/traces.py"), lazy, known) == {"prefix_routing.lab.sampling"}
    assert edges_of(Path("lambda/normalizer/server.py"), "import handler\n", known) == {"lambda.normalizer.handler"}
    package = "from prefix_routing.lab import traces, something_else\n"
    assert edges_of(Path("x.py"), package, known | {"prefix_routing.lab"}) == {"prefix_routing.lab.traces",
                                                                               "prefix_routing.lab"}


def test_a_private_name_across_modules_is_caught_and_one_of_its_own_is_not():
    source = "from prefix_routing.rules.errors import _describe, describe_value\nfrom os import _exit\n"
    assert private_imports("prefix_routing.rules.limits", source) == [
        "prefix_routing.rules.limits imports _describe from prefix_routing.rules.errors"]
    assert private_imports("prefix_routing.rules.errors", "from prefix_routing.rules.errors import _x\n") == []
    assert private_imports("x", "from __future__ import annotations\nfrom prefix_routing.rules import __doc__\n") == []


def test_a_long_module_or_class_is_caught_at_one_past_the_limit():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES - 1))
    assert oversized("m.py", f"class Fits:\n{body}\n") == []  # 1 + 199 = 200 lines
    assert oversized("m.py", f"class Big:\n{body}\n    y = 0\n") == ["m.py: class Big is 201 lines; allowed: at most 200"]
    assert oversized("m.py", "x = 1\n" * MAX_MODULE_LINES) == []
    assert oversized("m.py", "x = 1\n" * (MAX_MODULE_LINES + 1))[0].startswith("m.py: 601 lines")
