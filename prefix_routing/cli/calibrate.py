"""``python -m prefix_routing calibrate --engine-url URL --out FILE``: fit the lab's latency model to a real engine.

Measures cold prefill, prefill after a cached prefix and decode against any OpenAI-compatible
server (``prefix_routing.engines.calibrate``), prints the fits and their errors, and writes a preset
file that ``simulate``/``tune --preset-file`` read (``prefix_routing.stage.preset_file``).
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import replace

from prefix_routing.rules.errors import UserError

HELP = "measure a real engine's prefill and decode times and write a lab preset file (--preset-file) fitted to them"


def _positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


def add_arguments(parser) -> None:
    parser.add_argument("--engine-url", required=True, metavar="URL",
                        help="the server, e.g. http://127.0.0.1:8080 (POST URL/v1/chat/completions)")
    parser.add_argument("--out", required=True, metavar="FILE", help="the preset file to write (JSON)")
    parser.add_argument("--name", help="the preset's name (default: local-llama.cpp-cpu, local-vllm-cpu, or "
                        "local-engine)")
    parser.add_argument("--slots", type=_positive_int,
                        help="sequences the engine runs at once (default: GET URL/slots; vLLM does not say: give "
                             "its --max-num-seqs)")
    parser.add_argument("--context", type=_positive_int, metavar="TOKENS",
                        help="context tokens per slot (default: n_ctx from GET URL/slots, or vLLM's max_model_len "
                             "from GET URL/v1/models)")
    parser.add_argument("--kv-bytes-per-token", type=_positive_int, metavar="B",
                        help="the model's KV bytes per token (default: from /props' model file when it is the "
                        "project's tiny model, else 4096, the 2-layer tiny model's)")
    parser.add_argument("--max-batched-tokens", type=_positive_int, default=2048, metavar="T",
                        help="tokens per engine step, the prefill chunk (default 2048, llama.cpp's -b)")
    parser.add_argument("--repeats", type=_positive_int,
                        help="requests per point; medians are kept (default 3; 1 with --quick)")
    parser.add_argument("--decode-tokens", type=_positive_int, metavar="N",
                        help="tokens per streamed answer for the decode times (default 32; 8 with --quick)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and 1 repeat: a few seconds (tests, CI)")
    parser.add_argument("--seed", type=int, help="random words of the prompts (default: a fresh seed per run, so that "
                        "no prompt is still cached from an earlier run; written to the file)")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S", help="seconds per request (default 120)")
    parser.add_argument("--json", action="store_true", help="print the written preset as JSON")


def run(args) -> int:
    from prefix_routing.engines import calibrate
    from prefix_routing.stage.preset_file import write_preset_file

    url = args.engine_url.rstrip("/")
    if args.timeout <= 0:
        raise UserError(f"--timeout {args.timeout:g}: must be > 0")
    info = calibrate.engine_info(url)
    slots = args.slots or info.slots
    context = args.context or info.context_per_slot or info.max_model_len
    if slots is None or context is None:
        said = "a vLLM engine does not say how many sequences it runs at once (--max-num-seqs)" if info.vllm else \
            f"{url}/slots does not say how many slots the engine has and their context"
        raise UserError(f"{said}: give --slots" + ("" if context else " and --context"))
    sources = {"slots": "--slots" if args.slots else "GET /slots",
               "context_per_slot": "--context" if args.context else
               "GET /v1/models (max_model_len)" if info.vllm and not info.context_per_slot else "GET /slots (n_ctx)"}
    if info.vllm:
        sources["kv_tokens"] = sources["block_tokens"] = "GET /metrics (vllm:cache_config_info)"
    kv_bytes = args.kv_bytes_per_token
    sources["kv_bytes_per_token"] = "--kv-bytes-per-token"
    if kv_bytes is None:
        kv_bytes = calibrate.kv_bytes_from_model_file(info.model_file)
        sources["kv_bytes_per_token"] = ("GET /v1/models (the tiny model's folder name)" if info.vllm else
                                         "GET /props (the tiny model's file name)")
    if kv_bytes is None:
        kv_bytes = calibrate.DEFAULT_KV_BYTES_PER_TOKEN
        sources["kv_bytes_per_token"] = "assumed: the project's 2-layer tiny model"
    plan = calibrate.QUICK_PLAN if args.quick else calibrate.Plan()
    plan = replace(plan, repeats=args.repeats or plan.repeats, decode_tokens=args.decode_tokens or plan.decode_tokens)
    say = (lambda text: print(text, file=sys.stderr))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    say(f"calibrating {url}: {slots} slot(s) × {context} tokens, {plan.repeats} repeat(s), seed {seed}")
    client = calibrate.Client(url, stream=lambda u, body: calibrate.http_stream(u, body, args.timeout),
                              model=info.model)
    measurement = calibrate.measure(client, plan, context_per_slot=context, seed=seed, say=say)
    name = "local-llama.cpp-cpu" if info.llama_cpp else "local-vllm-cpu" if info.vllm else "local-engine"
    description = ("local llama.cpp (CPU)" if info.llama_cpp else "local vLLM (CPU)" if info.vllm
                   else f"OpenAI-compatible engine at {url}")
    content = calibrate.preset_content(
        measurement, name=args.name or name, url=url,
        slots=slots, context_per_slot=context, kv_bytes_per_token=kv_bytes,
        max_batched_tokens=args.max_batched_tokens, description=description,
        model_name=info.model_file or info.model or "unknown", sources=sources,
        engine_kind="vllm" if info.vllm else "llama.cpp", block_tokens=info.block_tokens, cache_tokens=info.kv_tokens,
    )
    path = write_preset_file(args.out, content)
    if args.json:
        print(json.dumps({"out": str(path), **content.as_json()}, indent=2))
        return 0
    print(report(measurement))
    kv_tokens = content.kv_tokens
    cache = (f"a KV cache of {kv_tokens:,} tokens in blocks of {info.block_tokens}" if info.vllm
             else f"{slots * context:,} KV tokens per copy")
    print(f"slots {slots} × {context} tokens, {cache}; KV {kv_bytes:,} bytes per token ({sources['kv_bytes_per_token']})")
    print(f"wrote {path} in {measurement.duration_s:.1f} s: use it with simulate/tune --preset-file {path}")
    return 0


def report(m) -> str:
    """The fits in milliseconds, their errors and every point against its fit."""
    a, b, c = (x * 1000 for x in m.prefill_fit.coefficients)
    d, e = (x * 1000 for x in m.decode_fit.coefficients)
    pf, df = m.prefill_fit, m.decode_fit
    lines = [
        f"prefill: ms ≈ {a:.3g} + {b:.4g}·n_new + {c:.4g}·n_new·(n_cached + n_new/2)   "
        f"(error median {pf.median_error:.1%}, worst {pf.worst_error:.1%})",
        f"decode:  ms per token ≈ {d:.4g} + {e:.4g}·context   "
        f"(error median {df.median_error:.1%}, worst {df.worst_error:.1%})",
        "",
        f"{'cached':>8}{'new':>8}{'measured ms':>13}{'fit ms':>9}{'error':>8}",
    ]
    for p, fit, err in zip(m.prefill, pf.predicted, pf.relative_errors):
        lines.append(f"{p.cached_tokens:>8.0f}{p.new_tokens:>8.0f}{p.prompt_s * 1000:>13.1f}"
                     f"{fit * 1000:>9.1f}{err:>8.1%}")
    lines += ["", f"{'context':>8}{'ms/token':>10}{'fit':>8}{'error':>8}"]
    for p, fit, err in zip(m.decode, df.predicted, df.relative_errors):
        lines.append(f"{p.context_tokens:>8.0f}{p.step_s * 1000:>10.3f}{fit * 1000:>8.3f}{err:>8.1%}")
    lines += [f"note: {note}" for note in m.notes]
    return "\n".join(lines)
