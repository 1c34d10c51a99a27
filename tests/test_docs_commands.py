"""Every command that README.md and docs/*.md show runs as written.

The fenced blocks of the README and of every page under docs/ are read; each line that starts with
``python -m prefix_routing``, ``python bench/``, ``make`` or ``npx`` (or pipes into
``python -m prefix_routing``) is a command, its ``\\``-continued lines joined and its ``# comment``
dropped. Each distinct command runs once through ``bash``, with this environment's ``bin`` first on
the ``PATH`` (``python`` is the one the README's ``source .venv/bin/activate`` gives), in a scratch
copy of the clone's layout (links to its files; what a command writes lands there) that has
``../shared`` beside it where the clone has. It must exit with status 0 and print no traceback; a
benchmark may also exit 1 (a short run on a shared machine can miss its target, which the script
says); a command shown as ``$ command`` with output under it must print exactly that output.

What the test changes, all of it listed here and in docs/development.md:

- commands that run for minutes, or until stopped, get their own shortening flags (``SHORTER``);
- fixed ports become free ones, the documentation's ``URL`` and ``http://127.0.0.1:8000`` the URL
  of an engine the test starts (``ENGINE_URLS``);
- a synopsis runs without its ``[optional]`` parts and with its placeholders filled in
  (``PLACEHOLDERS``);
- ``make`` runs as ``make -n`` (a dry run: the target and its variables exist);
- ``canary --stage default`` on llama.cpp must exit 1 with an isolation breach (the stage counts on
  salts the engine ignores);
- every AWS client goes to a closed port on 127.0.0.1: ``preflight`` must end with one line per
  check, and may exit 1 (a shipped stage's gated model id is a ✘ without AWS);
- ``../shared/traces/`` is read where it is beside the clone; elsewhere the trace slice in
  ``tests/data/`` takes its place (a failure instead with ``PREFIX_ROUTING_REQUIRE_SHARED=1``);
- the engines' commands run on an engine cache of their own that links the built ``llama-server``
  and model and the installed vLLM (skipped without them, a failure with
  ``PREFIX_ROUTING_REQUIRE_ENGINES=1``), so that ``engines stop`` stops exactly what this test's
  ``engines start`` started, and whatever a command leaves recorded there is stopped at the end;
- inputs a reader is expected to have are provided: ``request.json`` (the README's "Before" body,
  also every command's standard input),
  ``engine.json`` (a preset with docs/lab.md's calibrated coefficients, replaced by ``calibrate``'s
  own where the engines run), ``requests.jsonl`` (written by the README's own ``log`` command).

Commands that need an AWS account are in ``NOT_RUN`` with the reason; a command that is neither run
nor listed there fails, and so does an entry of ``NOT_RUN`` that no page shows any more.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
SLICE = "tests/data/mooncake_slice.jsonl"
WHOLE_TRACE = "../shared/traces/conversation_trace.jsonl"
REQUIRE_SHARED = os.environ.get("PREFIX_ROUTING_REQUIRE_SHARED") == "1"
REQUIRE_ENGINES = os.environ.get("PREFIX_ROUTING_REQUIRE_ENGINES") == "1"
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 240  # per command; the slowest, tune on the whole trace, takes about 20 s on an idle machine
VLLM_TIMEOUT_S = 600  # a command that starts vLLM engines: 25-90 s each to start, more on a loaded machine

#: Commands that are shown but not run here, with the reason.
NOT_RUN = {
    "npx cdk diff   -c stage=llama8b-g6e": "needs an AWS account (deploy)",
    "npx cdk deploy --all -c stage=llama8b-g6e": "needs an AWS account (deploy)",
    "npx cdk destroy --all -c stage=llama8b-g6e": "needs an AWS account (deploy)",
    "python -m prefix_routing verify --stage llama8b-g6e --region us-east-1": "needs an AWS account (a deployed stage)",
    "python -m prefix_routing verify --stage llama8b-g6e --region us-east-1 --invoke":
        "needs an AWS account (a deployed stage)",
    "python -m prefix_routing usage --log-group /aws/lambda/NAME --since 24h --stage llama8b-g6e --csv":
        "needs an AWS account (reads the request log from CloudWatch Logs)",
    "python -m prefix_routing advise --stage NAME [--since 1h] [--log-group NAME] [--region R] [--sample R|auto]":
        "needs an AWS account (reads the request log from CloudWatch Logs)",
    "python -m prefix_routing benchmark --stage llama70b-p5 --workload shared-prefix":
        "needs an AWS account (a deployed stage; runs a billed benchmark job)",
    "python -m prefix_routing benchmark --stage llama70b-p5 --workload long-context --json":
        "needs an AWS account (a deployed stage; runs a billed benchmark job)",
    "python -m prefix_routing benchmark --stage llama70b-p5 --workload TRACE --limit 2000":
        "needs an AWS account (a deployed stage; runs a billed benchmark job)",
}

#: The flags that shorten a command (its own; later flags win in argparse), by the command's start.
SHORTER = [
    ("python -m prefix_routing emulate", "--duration 2"),  # serves until Ctrl-C
    ("python -m prefix_routing demo --engines", "--requests 8"),  # ~2 minutes
    ("python -m prefix_routing demo", "--conversation-requests 40 --long-context-requests 20"),  # ~2 minutes
    ("python -m prefix_routing calibrate", "--quick"),  # ~20 s
    ("python bench/bench_simulate.py", "--requests 20000 --repeats 1"),  # 3 x 1,000,000 requests
    ("python bench/bench_handler_import.py", "--runs 1"),
    ("python bench/bench_front_door.py", "--requests 50 --warmup 5"),
    ("python bench/bench_fidelity.py", "--requests 8 --preset-file engine.json"),  # minutes
]
#: A synopsis's placeholders and what they stand for here (optional ``[...]`` parts are left out).
PLACEHOLDERS = {"TRACE": SLICE, "NAME": "default", "LOG.jsonl": "requests.jsonl"}
#: Addresses of the reader's own servers: an engine this test starts takes their place.
ENGINE_URLS = ("URL", "http://127.0.0.1:8000")
#: Where every AWS client of a command goes unless the command names its own endpoint: nowhere.
UNREACHABLE_AWS = "http://127.0.0.1:9"
#: Commands that start, stop or call real engines; of them, those that need vLLM installed too.
NEEDS_ENGINES = re.compile(r"prefix_routing engines |--engines\b|--engine-url\b|prefix_routing calibrate\b|bench_fidelity"
                           r"|prefix_routing canary\b")
NEEDS_VLLM = re.compile(r"--(engine-)?kind vllm\b")
#: Files a reader is expected to have, and the command of the documentation that writes each.
WRITTEN_BY = {"requests.jsonl": f"python -m prefix_routing log --trace {SLICE} --out requests.jsonl"}
#: docs/lab.md, "Calibrating against a real engine", in seconds: prompt ms ≈ 22.4 + 0.185·n_new +
#: 1.59e-4·n_new·(n_cached + n_new/2), decode step ms ≈ 2.24 + 0.0016·context (1 slot of 8,192 tokens).
LAB_MD_CALIBRATION = (0.0224, 0.185e-3, 1.59e-7, 0.00224, 0.0016e-3)


@dataclass(frozen=True)
class Command:
    text: str
    where: str  # page:line of its first appearance
    expected: str | None = None  # the output shown under a `$ command`


def _strip_comment(line: str) -> str:
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _is_command(text: str) -> bool:
    return (text.startswith(("python -m prefix_routing", "python bench/", "npx ")) or re.match(r"make(\s|$)", text)
            is not None or "| python -m prefix_routing" in text)


def commands_of(page: str) -> list[Command]:
    lines = (ROOT / page).read_text().splitlines()
    found, fence, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
            i += 1
            continue
        if fence is None or fence in ("python", "json", "toml", "mermaid"):
            i += 1
            continue
        start, text = i, line
        while text.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text.rstrip()[:-1].rstrip() + " " + lines[i].strip()
        prompt = text.startswith("$ ")
        command = " ".join(_strip_comment(text[2:] if prompt else text).split())
        if _is_command(command):
            expected = None
            if prompt:
                output = []
                while i + 1 < len(lines) and lines[i + 1].strip() and not lines[i + 1].startswith(("$ ", "```")):
                    i += 1
                    output.append(lines[i])
                expected = "\n".join(output)
            found.append(Command(command, f"{page}:{start + 1}", expected))
        i += 1
    return found


def all_commands() -> list[Command]:
    seen: dict[str, Command] = {}
    for page in PAGES:
        for command in commands_of(page):
            seen.setdefault(command.text, command)
    return list(seen.values())


COMMANDS = all_commands()
NOT_RUN_NORMALIZED = {" ".join(k.split()): v for k, v in NOT_RUN.items()}


def test_the_pages_show_commands_and_every_listed_exception_is_still_shown():
    texts = {c.text for c in COMMANDS}
    assert len(texts) > 40  # the README's and the docs' blocks were found
    stale = sorted(set(NOT_RUN_NORMALIZED) - texts)
    assert not stale, f"NOT_RUN lists commands that no page shows any more: {stale}"


# -- the scratch clone, its inputs, the engines


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("docs")
    clone = base / "clone"
    clone.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in ("out", ".git") and not entry.name.endswith(".egg-info"):
            (clone / entry.name).symlink_to(entry)
    if SHARED.is_dir():
        (base / "shared").symlink_to(SHARED)
    # The README's "Before" body, as the reader's request.json.
    readme = (ROOT / "README.md").read_text()
    before = re.search(r"^Before \(.*?^```json\n(.*?)^```", readme, re.S | re.M)
    (clone / "request.json").write_text(before.group(1))
    # A preset as `calibrate --out engine.json` writes it, with docs/lab.md's coefficients.
    from prefix_routing.stage.preset_file import PresetFile, write_preset_file
    from prefix_routing.stage.presets import LatencyCoefficients

    write_preset_file(clone / "engine.json", PresetFile(
        name="local-llama.cpp-cpu", coefficients=LatencyCoefficients(*LAB_MD_CALIBRATION), slots=1,
        context_per_slot=8192, kv_bytes_per_token=4096, model_name="tiny.gguf", model_shape=None, measured=None))
    return clone


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """An engine cache of this test's own (linking the built server and model, and vLLM's pin where it is
    installed) and one running llama.cpp engine; every engine recorded there is stopped at the end."""
    from prefix_routing.engines import build, process, session, vllm
    from prefix_routing.engines.engine_kind import EngineOptions
    from prefix_routing.engines.llama_cpp import LlamaCpp

    if not session.built():
        message = "llama-server is not built (make engines)"
        if REQUIRE_ENGINES:
            pytest.fail(message + " and PREFIX_ROUTING_REQUIRE_ENGINES=1", pytrace=False)
        pytest.skip(message)
    real = build.cache_root()
    xdg = tmp_path_factory.mktemp("xdg")
    own = xdg / real.relative_to(real.parents[2])
    own.mkdir(parents=True)
    for name in ("bin", "models", "vocab", "BUILD_INFO.json"):
        if (real / name).exists():
            (own / name).symlink_to(real / name)
    real_vllm = vllm.cache_root()
    if session.built("vllm"):
        own_vllm = xdg / real_vllm.relative_to(real_vllm.parents[2])
        own_vllm.mkdir(parents=True)
        for name in ("venv", "models", "INSTALLED.json"):
            (own_vllm / name).symlink_to(real_vllm / name)
    run = own / "run"
    state = run / "test-fixture.json"
    launch = LlamaCpp().launch(EngineOptions(), binary=own / "bin" / "llama-server", model=build.model_path(real))
    (engine,) = process.start(1, launch, state, log_dir=run / "logs")
    try:
        yield xdg, engine.url
    finally:
        # ours, and whatever a command left recorded in this cache (every kind)
        for recorded in (xdg / "prefix-routing" / "engines").glob("*/run/*.json"):
            process.stop(recorded)


def _shell_command(command: Command, engine_url: str | None) -> str:
    text = command.text
    if re.match(r"make(\s|$)", text):
        return "make -n" + text[len("make"):]
    if re.search(r"\s\[[^\]]*\]", text) or re.search(r"(?<=\s)(TRACE|NAME|LOG\.jsonl)(?=\s|$)", text):
        text = re.sub(r"\s*\[[^\]]*\]", "", text)  # a synopsis: the optional parts left out
        for placeholder, value in PLACEHOLDERS.items():
            text = re.sub(rf"(?<=\s){re.escape(placeholder)}(?=\s|$)", value, text)
    if WHOLE_TRACE in text and not SHARED.is_dir():
        if REQUIRE_SHARED:
            pytest.fail(f"{SHARED} is missing and PREFIX_ROUTING_REQUIRE_SHARED=1", pytrace=False)
        text = text.replace(WHOLE_TRACE, SLICE)
    for address in ENGINE_URLS:
        text = re.sub(rf"(?<=\s){re.escape(address)}(?=\s|$)", engine_url or address, text)
    text = re.sub(r"--port \d+", "--port 0", text)
    text = re.sub(r"--front-door \d+", "--front-door 0", text)
    for start, flags in SHORTER:
        if text.startswith(start):
            text = f"{text} {flags}"
            break
    return text


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.where} {c.text[:60]}" for c in COMMANDS])
def test_the_command_runs_as_written(command, workdir, request):
    if command.text in NOT_RUN_NORMALIZED:
        pytest.skip(NOT_RUN_NORMALIZED[command.text])
    # AWS_ENDPOINT_URL: a command that needs AWS but is not listed in NOT_RUN fails here, on 127.0.0.1.
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               AWS_ENDPOINT_URL=UNREACHABLE_AWS)
    engine_url = None
    if NEEDS_ENGINES.search(command.text):
        xdg, engine_url = request.getfixturevalue("engines")
        env["XDG_CACHE_HOME"] = str(xdg)
        if NEEDS_VLLM.search(command.text):
            from prefix_routing.engines import session

            if not session.built("vllm"):
                if REQUIRE_ENGINES:
                    pytest.fail("vLLM is not installed (make engines) and PREFIX_ROUTING_REQUIRE_ENGINES=1",
                                pytrace=False)
                pytest.skip("vLLM is not installed (make engines)")
    shell = _shell_command(command, engine_url)
    for name, writer in WRITTEN_BY.items():
        if re.search(rf"(?<=\s){re.escape(name)}(?=\s|$)", shell) and writer != shell and not (workdir / name).exists():
            made = subprocess.run(["bash", "-c", writer], cwd=workdir, env=env, capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
            assert made.returncode == 0, f"{writer} (writes {name}) failed:\n{made.stderr[-3000:]}"
    result = subprocess.run(["bash", "-c", shell], cwd=workdir, env=env, input=(workdir / "request.json").read_text(),
                            capture_output=True, text=True,
                            timeout=VLLM_TIMEOUT_S if NEEDS_VLLM.search(command.text) else TIMEOUT_S)
    report = f"{command.where}: {shell}\nexit status {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    assert "Traceback (most recent call last)" not in result.stderr, report
    if command.expected is not None:
        assert (result.stdout + result.stderr).strip() == command.expected.strip(), report
    elif shell.startswith("python bench/"):
        assert result.returncode in (0, 1), report  # 1: a target missed by a short run
    elif shell.startswith("python -m prefix_routing canary --stage default") and "vllm" not in shell:
        assert result.returncode == 1 and "isolation breach" in result.stdout, report  # llama.cpp ignores salts
    elif shell.startswith("python -m prefix_routing preflight"):
        # No AWS within reach: every check that asks it is a ?, and a shipped stage's gated model id a
        # ✘ (exit status 1); what must hold is that it ends with one line per check and its summary.
        assert result.returncode in (0, 1) and re.search(r"\d+ ✔, \d+ ✘, \d+ \?$", result.stdout.strip()), report
    else:
        assert result.returncode == 0, report
