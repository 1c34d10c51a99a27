"""``pip install <clone>`` installs the library, ``prefix_routing``, alone, and an application uses it
from a fresh virtual environment with nothing of the clone on its path.

The wheel is built offline (``pip wheel --no-build-isolation --no-index``) with the build backend that
``[build-system]`` pins, which must be installed in the test's own environment. The fresh environment
lives in ``tmp_path``, outside the clone; every program in it runs with ``python -I`` from
``tmp_path`` (no ``PYTHONPATH``, no script directory, no user site), and pip installs into it with
``--no-index``: nothing is downloaded.

- The base install needs the standard library only: the README's "Before" body, normalized there,
  gives the README's "After" bytes, and boto3 is not even installed.
- The ``frontdoor`` extra, installed from wheels of the versions the test's environment holds (made
  from its installed files: still ``--no-index``, so pip resolves the extra's pins against exactly
  those), runs the README's client example unchanged against an emulator on 127.0.0.1, pointed at it
  by the environment as the README says (``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME``).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
README = (ROOT / "README.md").read_text()
DISTRIBUTION = PYPROJECT["project"]["name"]
#: What stays in the clone: the CDK app, the functions' entry points, the tests, the tools.
NOT_INSTALLED = ("stacks", "tests", "bench", "tools", "app", "handler", "server")
#: Import name -> distribution, for the packages tests/test_architecture.py lets the library import.
DISTRIBUTIONS = {"boto3": "boto3", "botocore": "botocore", "aws_lambda_powertools": "aws-lambda-powertools",
                 "pydantic": "pydantic", "matplotlib": "matplotlib", "tqdm": "tqdm", "gguf": "gguf",
                 "sagemaker": "sagemaker-core"}
#: Imported by the library but pinned nowhere directly: matplotlib and gguf both require it.
TRANSITIVE = {"numpy"}
#: Imported only by engines/vllm_model.py, a script that vLLM's own virtualenv runs, with the versions
#: of engines/requirements-vllm-cpu.txt (engines build --kind vllm): no extra of ours installs them.
VLLM_ENVIRONMENT = {"torch", "tokenizers", "transformers"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_pins() -> dict[str, str]:
    pins = {}
    for name in ("requirements.txt", "requirements-dev.txt"):
        for line in (ROOT / name).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                package, _, version = line.partition("==")
                pins[canonical(package)] = version.strip()
    return pins


def extras() -> dict[str, list[str]]:
    return PYPROJECT["project"]["optional-dependencies"]


def readme_block(language: str, after: str) -> str:
    """The first fenced block of ``language`` after the line ``after`` in the README."""
    rest = README.split(after, 1)[1]
    match = re.search(rf"^```{language}\n(.*?)^```", rest, re.S | re.M)
    assert match, f"no ```{language} block after {after!r} in README.md"
    return match.group(1)


# -- the project's own description of the package


def test_the_base_install_needs_nothing_and_every_extra_pins_what_the_requirements_pin():
    assert PYPROJECT["project"].get("dependencies", []) == []
    pins = requirement_pins()
    wrong = []
    for extra, requirements in extras().items():
        for requirement in requirements:
            name, pinned, version = requirement.partition("==")
            if not pinned or pins.get(canonical(name)) != version:
                wrong.append(f"[{extra}] {requirement}: the requirements files pin {pins.get(canonical(name))}")
    assert not wrong, wrong
    others = {r for extra, requirements in extras().items() if extra != "all" for r in requirements}
    assert others - set(extras()["all"]) == set(), "`all` must hold every other extra's requirements"
    (backend,) = PYPROJECT["build-system"]["requires"]
    assert re.fullmatch(r"setuptools==\d+(\.\d+)*", backend), backend


def test_the_extras_cover_what_the_subpackages_may_import():
    from tests.test_architecture import ALLOWED

    def covered(extra: str) -> set[str]:
        return {canonical(r.partition("==")[0]) for r in extras()[extra]}

    def needed(*subpackages: str) -> set[str]:
        names = set().union(*(ALLOWED[s][1] for s in subpackages)) - TRANSITIVE - VLLM_ENVIRONMENT
        return {canonical(DISTRIBUTIONS[n]) for n in names}

    library = [s for s in ALLOWED if s not in ("stacks", "lambda", "package")]
    assert needed("frontdoor") <= covered("frontdoor")
    assert needed("lab") <= covered("lab")
    assert needed("engines") <= covered("engines")
    assert {"pydantic"} <= covered("emulator")  # it serves a stage: stage.config
    assert needed(*library) <= covered("all")


# -- the wheel and a fresh environment


def pip_env() -> dict[str, str]:
    """This machine's pip settings left out (config files, find-links, constraints): only what the
    command line says, and no version check (it would go online)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def pip(*args: str, python: Path | None = None) -> subprocess.CompletedProcess:
    target = ["--python", str(python)] if python else []
    result = subprocess.run([sys.executable, "-m", "pip", *target, *args], env=pip_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    (requirement,) = PYPROJECT["build-system"]["requires"]
    name, _, version = requirement.partition("==")
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        installed = "none"
    if installed != version:
        message = (f"the build backend {requirement} named by pyproject.toml's [build-system] is not installed "
                   f"here ({name} {installed}); the development requirements must bring it (make install)")
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    # A copy of the clone's layout (links, so the build's own build/ and egg-info stay out of the clone).
    source = tmp_path_factory.mktemp("clone")
    for entry in ROOT.iterdir():
        if entry.name not in (".git", ".venv", "build", "cdk.out", "node_modules", "mutants", "out") \
                and not entry.name.endswith(".egg-info"):
            (source / entry.name).symlink_to(entry)
    out = tmp_path_factory.mktemp("dist")
    pip("wheel", "--no-build-isolation", "--no-index", "--no-deps", "--wheel-dir", str(out), str(source))
    (built,) = out.glob("*.whl")
    return built


def fresh_environment(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def run_isolated(python: Path, cwd: Path, code: str, *args: str, env: dict[str, str] | None = None,
                 stdin: str = "") -> subprocess.CompletedProcess:
    """``python -I``: no PYTHONPATH, no script directory, no user site; run from outside the clone."""
    return subprocess.run([str(python), "-I", "-c", code, *args], cwd=cwd, env=env or pip_env(), input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_the_wheel_holds_the_library_alone(wheel):
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {n.split("/")[0] for n in names} == {"prefix_routing", f"{wheel.name.split('-')[0]}-0.1.0.dist-info"}
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "prefix_routing").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules == {n for n in names if n.endswith(".py")}
    # engines build --kind vllm installs from this lock, wherever the library is installed
    assert "prefix_routing/engines/requirements-vllm-cpu.txt" in names
    assert "Requires-Dist" not in metadata.split("Provides-Extra", 1)[0]  # no requirement outside the extras


def test_base_install_normalizes_the_readme_body_with_the_standard_library_only(wheel, tmp_path):
    python = fresh_environment(tmp_path / "venv")
    pip("install", "--no-index", str(wheel), python=python)
    before = readme_block("json", "Before (")
    after = readme_block("json", "After (").strip()
    code = """
import importlib.util, json, sys
import prefix_routing, prefix_routing.rules.telemetry
from prefix_routing.rules import NormalizerSettings, normalize_body
print(json.dumps({
    "file": prefix_routing.__file__,
    "found": {name: importlib.util.find_spec(name) is not None for name in sys.argv[1:]},
    "after": normalize_body(sys.stdin.read(), NormalizerSettings(prefix_length=4096)).body.decode("utf-8"),
}))
"""
    result = run_isolated(python, tmp_path, code, "boto3", "pydantic", *NOT_INSTALLED, stdin=before)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout)
    assert Path(seen["file"]).is_relative_to(tmp_path / "venv"), seen["file"]
    assert not any(seen["found"].values()), seen["found"]  # no dependency, nothing but the library
    assert seen["after"] == after


def wheel_of_installed(distribution: importlib.metadata.Distribution, out: Path) -> Path:
    """A wheel made from an installed pure-Python distribution's files (its RECORD), so that pip can
    install the very version this environment holds without an index."""
    name = re.sub(r"[-_.]+", "_", distribution.metadata["Name"])
    path = out / f"{name}-{distribution.version}-py3-none-any.whl"
    records, info = [], None
    with zipfile.ZipFile(path, "w") as whl:
        for file in distribution.files:
            if file.parts[0] == ".." or "__pycache__" in file.parts:
                continue  # scripts and bytecode: pip makes its own
            if file.parts[0].endswith(".dist-info"):
                info = file.parts[0]
                if file.name in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json"):
                    continue
            data = file.read_binary()
            whl.writestr(str(file), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{file},sha256={digest},{len(data)}")
        whl.writestr(f"{info}/RECORD", "\n".join([*records, f"{info}/RECORD,,"]) + "\n")
    return path


def extra_closure(extra: str) -> list[importlib.metadata.Distribution]:
    """The installed distributions that the extra's requirements need, transitively."""
    from packaging.requirements import Requirement

    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [Requirement(r) for r in extras()[extra]]
    while todo:
        requirement = todo.pop()
        if canonical(requirement.name) in found:
            continue
        distribution = importlib.metadata.distribution(requirement.name)
        found[canonical(requirement.name)] = distribution
        for text in distribution.requires or []:
            needed = Requirement(text)
            if needed.marker is None or needed.marker.evaluate({"extra": ""}):
                todo.append(needed)
    return list(found.values())


def test_the_readme_client_example_runs_with_the_frontdoor_extra_against_the_emulator(wheel, tmp_path):
    from prefix_routing.emulator.echo_backend import EchoBackend
    from prefix_routing.emulator.server import serve_runtime
    from prefix_routing.rules import NormalizerSettings, normalize_body, routing_identity

    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    for distribution in extra_closure("frontdoor"):
        wheel_of_installed(distribution, wheelhouse)
    python = fresh_environment(tmp_path / "venv")
    pip("install", "--no-index", "--no-compile", "--find-links", str(wheelhouse), f"{wheel}[frontdoor]", python=python)

    example = readme_block("python", "## Use the normalizer in your application")
    with serve_runtime(EchoBackend()) as server:
        env = dict(pip_env(), AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME=server.url, AWS_DEFAULT_REGION="us-east-1")
        result = run_isolated(python, tmp_path, example, env=env)
        requests = server.requests
    assert result.returncode == 0, result.stderr[-3000:]
    assert "opening" in result.stdout and "hours?" in result.stdout and "data: [DONE]" in result.stdout, result.stdout

    # What reached the runtime: the library's canonical bytes, the component, the tenant's routing id.
    identity = routing_identity("tenant-42", "support-bot", key=b"<your secret key>")
    body = {"messages": [{"role": "system", "content": "You are a support agent for Acme.\nBe brief."},
                         {"role": "user", "content": "Café opening hours?"}], "max_tokens": 256, "stream": True}
    (request,) = [r.request for r in requests]
    assert request.endpoint_name == "default-prefix-llm"
    assert request.headers.inference_component == "default-prefix-llm-ic"
    assert request.headers.prefix_aware_id == identity.prefix_aware_id
    assert request.body == normalize_body(body, NormalizerSettings(prefix_length=4096), identity=identity).body
