"""``python -m prefix_routing loadtest``: replay a trace or a file of bodies against an endpoint.

Examples::

    # the emulator (or any local runtime) through boto3
    python -m prefix_routing loadtest --trace ../shared/traces/conversation_trace.jsonl --max-requests 200 \\
        --target sagemaker --endpoint default-prefix-llm --component default-prefix-llm-ic \\
        --endpoint-url http://127.0.0.1:8080 \\
        --speed 10 --concurrency 16 --out out/loadtest

    # a real endpoint (credentials and region from the environment)
    python -m prefix_routing loadtest --bodies bodies.jsonl --target sagemaker --endpoint my-ep \\
        --component my-ic --region us-east-1 --rate 2 --duration 300 --normalize --out out/real

The summary goes to standard output (``--json``: as JSON); the progress bar to standard error.
Bad input (missing file, bad flag values, unknown target): one line ``error: ...``, exit status 2.
Exit status 1 when the error rate exceeds ``--max-error-rate``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from prefix_routing.rules.errors import UserError

HELP = "replay a trace or request bodies against an endpoint; client-side TTFT, latency, errors, hit rate"

_PRINTABLE_ID_RE = re.compile(r"^[!-~][ -~]{0,63}$")


def _number(kind, name: str, low=None, strict_low: bool = False):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} {text!r}: not {'an integer' if kind is int else 'a number'}")
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{name} {text!r}: not a finite number")
        if low is not None and (value <= low if strict_low else value < low):
            raise argparse.ArgumentTypeError(f"{name} {text!r}: must be {'>' if strict_low else '>='} {low}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_argument_group("what to send")
    which = source.add_mutually_exclusive_group(required=True)
    which.add_argument("--trace", metavar="FILE", help="a Mooncake JSONL trace (bodies made from its block ids)")
    which.add_argument("--bodies", metavar="FILE", help="request bodies, one JSON body per line, sent byte for byte")
    source.add_argument("--skip", type=_number(int, "--skip", 0), default=0, metavar="N",
                        help="skip the first N requests of the file")
    source.add_argument("--system-blocks", type=_number(int, "--system-blocks", 0), default=1, metavar="N",
                        help="trace: blocks of 512 tokens that form the system prompt (default 1)")
    source.add_argument("--model", metavar="NAME", help="trace: the body's 'model' field (default: none)")
    source.add_argument("--vary", action="store_true",
                        help="send each body as another client might (key order, whitespace, CRLF, NFD, "
                             "parameters first); reproducible with --seed")
    source.add_argument("--vary-text-line-endings", action="store_true",
                        help="with --vary: also CRLF line endings inside the prompt text")
    source.add_argument("--normalize", action="store_true",
                        help="normalize each body (prefix_routing.rules) before sending (after --vary)")
    source.add_argument("--prefix-length", type=int, metavar="N", help="with --normalize: PrefixLength in bytes")
    source.add_argument("--normalizer-config", metavar="FILE", help="with --normalize: normalizer settings (JSON)")
    source.add_argument("--seed", type=int, default=0, help="seed of --vary and of retry jitter (default 0)")

    target = parser.add_argument_group("where to send it")
    target.add_argument("--target", required=True, metavar="{sagemaker,lambda-url,openai}",
                        help="sagemaker: boto3 InvokeEndpointWithResponseStream; lambda-url: the normalizer's "
                             "Function URL (SigV4); openai: an OpenAI-compatible chat-completions URL (SSE)")
    target.add_argument("--endpoint", metavar="NAME", help="sagemaker: EndpointName")
    target.add_argument("--component", metavar="NAME",
                        help="sagemaker: InferenceComponentName (required by inference-component endpoints, every stage's)")
    target.add_argument("--prefix-aware-id", metavar="ID",
                        help="sagemaker: PrefixAwareId (1-64 printable ASCII characters, the first not a space; "
                        "read by PREFIX_AWARE endpoints only)")
    target.add_argument("--endpoint-url", metavar="URL",
                        help="sagemaker: runtime URL, e.g. the emulator's http://127.0.0.1:PORT")
    target.add_argument("--region", metavar="REGION", help="AWS region (sagemaker, lambda-url signing, token)")
    target.add_argument("--profile", metavar="NAME", help="AWS profile for credentials")
    target.add_argument("--url", metavar="URL", help="lambda-url / openai: the URL to POST to")
    target.add_argument("--token", metavar="TOKEN",
                        help="openai: bearer token (default: for SageMaker's runtime URL, generated with the sagemaker "
                        "SDK's token generator; for any other server, none)")
    target.add_argument("--no-include-usage", dest="include_usage", action="store_false",
                        help="openai: send streamed bodies byte for byte (by default one without "
                        "stream_options.include_usage gets it, so that usage and cached tokens come back)")
    target.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                        help="lambda-url / openai: an extra request header (repeatable), e.g. 'x-tenant-id: t1'")

    pace = parser.add_argument_group("how fast and how long")
    pace.add_argument("--concurrency", type=_number(int, "--concurrency", 1), default=None, metavar="N",
                      help="requests in flight at most (default 8)")
    rate = pace.add_mutually_exclusive_group()
    rate.add_argument("--users", type=_number(int, "--users", 1), metavar="U",
                      help="closed loop: U clients, each sending its next request when its last one has finished "
                           "(how AWS's benchmark and most LLM benchmarks run; trace timing ignored)")
    rate.add_argument("--rate", type=_number(float, "--rate", 0, strict_low=True), metavar="R",
                      help="requests per second (default: as fast as the concurrency allows)")
    rate.add_argument("--speed", type=_number(float, "--speed", 0, strict_low=True), metavar="F",
                      help="trace: replay at the trace's own timing, F times faster")
    pace.add_argument("--max-requests", type=_number(int, "--max-requests", 1), metavar="N",
                      help="stop after sending N requests")
    pace.add_argument("--duration", type=_number(float, "--duration", 0, strict_low=True), metavar="S",
                      help="stop sending after S seconds (requests in flight finish)")
    pace.add_argument("--timeout", type=_number(float, "--timeout", 0, strict_low=True), default=120.0, metavar="S",
                      help="connect/read timeout per request (default 120)")
    pace.add_argument("--retries", type=_number(int, "--retries", 0), default=0, metavar="N",
                      help="retry throttling, timeouts, connection errors and 5xx before the first byte "
                           "(default 0: every fault is visible)")

    out = parser.add_argument_group("reports")
    out.add_argument("--out", metavar="DIR", help="write report.json, report.md, ttft_cdf.png, latency_over_time.png")
    out.add_argument("--no-plots", action="store_true", help="with --out: no PNG plots")
    out.add_argument("--json", action="store_true", help="print the summary as JSON on standard output")
    out.add_argument("--no-progress", action="store_true", help="no progress bar on standard error")
    out.add_argument("--max-error-rate", type=_number(float, "--max-error-rate", 0), metavar="F",
                     help="exit status 1 when failed / sent exceeds F (0..1)")


def _headers(values: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for value in values:
        name, sep, content = value.partition(":")
        name = name.strip()
        if not sep or not name or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name):
            raise UserError(f"--header {value!r}: expected 'NAME: VALUE'")
        if "\r" in content or "\n" in content:
            raise UserError(f"--header {value!r}: line breaks are not allowed in a header value")
        headers[name] = content.strip()
    return headers


def _settings(args: argparse.Namespace):
    if not args.normalize:
        if args.prefix_length is not None or args.normalizer_config:
            raise UserError("--prefix-length and --normalizer-config need --normalize")
        return None
    from prefix_routing.cli.normalize import load_settings

    return load_settings(args.normalizer_config, args.prefix_length)


def _target(args: argparse.Namespace):
    from prefix_routing import loadtest

    if args.target not in loadtest.TARGETS:
        raise UserError(f"unknown target {args.target!r}; allowed: {', '.join(loadtest.TARGETS)}")
    if args.target == "sagemaker":
        if args.url or args.token or args.header:
            raise UserError("--url, --token and --header are for the lambda-url and openai targets; "
                            "the sagemaker target takes --endpoint, --component, --endpoint-url")
        if not args.endpoint:
            raise UserError("the sagemaker target needs --endpoint NAME")
        if args.prefix_aware_id is not None and not _PRINTABLE_ID_RE.match(args.prefix_aware_id):
            raise UserError(f"--prefix-aware-id {args.prefix_aware_id!r}: allowed: 1-64 printable ASCII characters, "
                            "the first not a space (SageMaker's pattern \\A\\S[\\p{Print}]*\\z)")
        if args.endpoint_url and not re.match(r"^https?://", args.endpoint_url):
            raise UserError(f"--endpoint-url {args.endpoint_url!r}: expected an http:// or https:// URL")
        return loadtest.SageMakerTarget(
            args.endpoint,
            inference_component=args.component,
            prefix_aware_id=args.prefix_aware_id,
            region=args.region,
            endpoint_url=args.endpoint_url,
            profile=args.profile,
            timeout=args.timeout,
            concurrency=args.concurrency,
        )
    if args.endpoint or args.component or args.prefix_aware_id or args.endpoint_url:
        raise UserError(f"--endpoint, --component, --prefix-aware-id and --endpoint-url are for the sagemaker "
                        f"target; the {args.target} target takes --url")
    if not args.url:
        raise UserError(f"the {args.target} target needs --url URL")
    headers = _headers(args.header)
    if args.target == "lambda-url":
        if args.token:
            raise UserError("--token is for the openai target; the lambda-url target signs with SigV4")
        return loadtest.LambdaUrlTarget(args.url, region=args.region, profile=args.profile, timeout=args.timeout,
                                        headers=headers)
    return loadtest.OpenAITarget(args.url, token=args.token, region=args.region, timeout=args.timeout,
                                 headers=headers, include_usage=args.include_usage)


def _print_summary(summary: dict, written: dict[str, str]) -> None:
    def ms(value):
        return "–" if value is None else f"{value * 1000:.1f} ms"

    errors = ", ".join(f"{k} {v}" for k, v in summary["errors_by_kind"].items()) or "none"
    hit = "–" if summary["hit_rate"] is None else f"{summary['hit_rate']:.1%}"
    lines = [
        f"requests sent {summary['requests_sent']}: succeeded {summary['succeeded']}, failed {summary['failed']} "
        f"(errors: {errors}); stopped by {summary['stopped_by']} after {summary['duration_s']} s",
        f"TTFT   P50 {ms(summary['ttft_p50_s'])}  P90 {ms(summary['ttft_p90_s'])}  P99 {ms(summary['ttft_p99_s'])}",
        f"E2E    P50 {ms(summary['e2e_p50_s'])}  P90 {ms(summary['e2e_p90_s'])}  P99 {ms(summary['e2e_p99_s'])}",
        f"output {summary['output_tokens']} tokens, {summary['output_tokens_per_s'] or 0:.1f} tokens/s; "
        f"hit rate {hit} ({summary['requests_with_usage']} answers with usage)",
    ]
    if summary["skipped_not_sent"]:
        lines.append(f"{summary['skipped_not_sent']} bodies not sent (could not be prepared; see the report)")
    if written:
        lines.append("reports: " + ", ".join(written[k] for k in sorted(written)))
    print("\n".join(lines))


def run(args: argparse.Namespace) -> int:
    from prefix_routing import loadtest

    if args.target not in loadtest.TARGETS:
        raise UserError(f"unknown target {args.target!r}; allowed: {', '.join(loadtest.TARGETS)}")
    if args.users is not None:
        if args.concurrency is not None and args.concurrency != args.users:
            raise UserError(f"--users {args.users} is {args.users} requests in flight; --concurrency "
                            f"{args.concurrency} says otherwise: give one of them")
        args.concurrency = args.users
    elif args.concurrency is None:
        args.concurrency = 8
    if args.speed is not None and not args.trace:
        raise UserError("--speed replays a trace's own timing: it needs --trace (use --rate with --bodies)")
    if args.bodies and (args.system_blocks != 1 or args.model):
        raise UserError("--system-blocks and --model shape bodies made from a --trace, not --bodies")
    if args.vary_text_line_endings and not args.vary:
        raise UserError("--vary-text-line-endings needs --vary")
    if args.max_error_rate is not None and args.max_error_rate > 1:
        raise UserError(f"--max-error-rate {args.max_error_rate}: must be between 0 and 1")
    settings = _settings(args)
    notes: list[str] = []
    if args.trace:
        items = loadtest.trace_requests(args.trace, system_blocks=args.system_blocks, model=args.model,
                                        skip=args.skip, notes=notes)
        source = f"trace {args.trace}"
    else:
        items = loadtest.body_requests(args.bodies, skip=args.skip)
        source = f"bodies {args.bodies}"
    # Read the first request now, so that a bad file fails before any request is sent.
    items = iter(items)
    first = next(items, None)
    if first is None:
        raise UserError(f"{args.trace or args.bodies}: no requests to send")
    target = _target(args)
    preparer = loadtest.BodyPreparer(vary=args.vary, normalize=args.normalize, settings=settings, seed=args.seed,
                                     text_line_endings=args.vary_text_line_endings)

    def chained():
        yield first
        yield from items

    try:
        result = loadtest.run_load(
            chained(),
            target,
            concurrency=args.concurrency,
            rate=args.rate,
            speed=args.speed,
            max_requests=args.max_requests,
            duration=args.duration,
            retries=args.retries,
            prepare=preparer if preparer.active else None,
            progress=not args.no_progress,
            seed=args.seed,
        )
    finally:
        close = getattr(target, "close", None)
        if callable(close):
            close()
    result.notes.extend(notes)
    result.config = {
        "target": args.target,
        "target_description": getattr(target, "description", args.target),
        "source": source,
        "vary": args.vary,
        "normalize": args.normalize,
        "prefix_length": getattr(settings, "prefix_length", None),
        "concurrency": args.concurrency,
        "users": args.users,  # closed loop when set
        "rate": args.rate,
        "speed": args.speed,
        "max_requests": args.max_requests,
        "duration": args.duration,
        "timeout": args.timeout,
        "retries": args.retries,
        "seed": args.seed,
        "skip": args.skip,
    }
    written = loadtest.write_reports(result, args.out, plots=not args.no_plots) if args.out else {}
    summary = loadtest.summarize(result)
    if args.json:
        json.dump({"summary": summary, "reports": written}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_summary(summary, written)
    if args.max_error_rate is not None and summary["requests_sent"]:
        if summary["failed"] / summary["requests_sent"] > args.max_error_rate:
            print(f"error rate {summary['failed'] / summary['requests_sent']:.1%} exceeds --max-error-rate "
                  f"{args.max_error_rate:.1%}", file=sys.stderr)
            return 1
    return 0
