"""``python -m prefix_routing log --trace FILE --out LOG``: the request log the front door would write.

Each request of a trace (Mooncake lines, made into chat bodies as the demo and the load tester make
them, or raw bodies as ``analyze`` reads them) goes through the front door's own code
(``frontdoor.Invoker``: ``prepare`` normalizes it, fingerprints it, hashes its blocks and names its
routing id; the record and its log line are the invoker's), configured as the stage configures the
deployed function (``stage.front_door_env``), with tenants named by a header. The endpoint is a
stand-in that answers each request at once, through the lab's fleet model of the stage's endpoint
at the request's trace time: its usage reports the trace's prompt and output tokens and the
modelled cached tokens. The log line's timestamp is the trace's arrival; its timings
(``ttft_ms``, ``total_ms``) are the front door's own against that instant stand-in, not a model's.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from prefix_routing.cli import flag_values, trace_args
from prefix_routing.rules.errors import UserError

HELP = "write the request log the front door would write for a trace (then: advise --log-file LOG)"

#: Offline, the tenants' routing ids are keyed with this, not with the deployment's secret key: the
#: log's routing ids group requests as production's do, but are not production's values.
OFFLINE_TENANT_KEY = b"prefix-routing offline request log (not a deployment's key)"
TENANT_HEADER = "x-tenant-id"
BYTES_PER_TOKEN = 4.0


def add_arguments(parser) -> None:
    parser.add_argument("--trace", required=True, metavar="FILE",
                        help="a Mooncake trace or raw request bodies, one per line (.gz ok)")
    parser.add_argument("--out", required=True, metavar="LOG", help="the request log to write (JSON lines)")
    parser.add_argument("--stage", default="default", metavar="NAME",
                        help="the front door's and the endpoint's settings (config/NAME.toml; default: the embedded default)")
    parser.add_argument("--tenants", type=flag_values.ranged_int("--tenants", 1, 1000), default=1, metavar="N",
                        help="spread the requests over N tenants, each with its own routing id (1 to 1000; default 1); "
                        "a request's tenant follows its conversation (its second block) or, for bodies, its first message")
    parser.add_argument("--format", default="auto", choices=("auto", "mooncake", "bodies"),
                        help="trace format (default: from the first line)")
    parser.add_argument("--body-rate", type=flag_values.positive_float("--body-rate"), default=1.0, metavar="R",
                        help="raw bodies: arrivals per second (bodies carry no times; default 1)")
    parser.add_argument("--start", metavar="TIME",
                        help="the first request's time, ISO 8601 or epoch ms (default: so that the last one is now; "
                        "a trace in epoch milliseconds keeps its own times)")
    parser.add_argument("--strict", action="store_true", help="fail on the first broken line instead of skipping it")


@dataclass
class _Request:
    arrival_s: float  # from the trace's first request
    body: bytes
    prompt_tokens: int | None  # None: estimated from the normalized body, as the lab reads raw bodies
    output_tokens: int
    tenant_key: str  # what picks the tenant: requests that share it share a tenant


def _tenant(key: str, tenants: int) -> str:
    from prefix_routing.lab.tenants import tenant_for  # the lab's choice: simulate --tenants N gives the same

    return tenant_for(key, tenants)


class _Source:
    """The trace's requests one at a time (a body is made or read when its turn comes), in order."""

    def __init__(self, args) -> None:
        from prefix_routing.lab import input_bounds, traces

        self.args = args
        fmt = traces.sniff_format(args.trace) if args.format == "auto" else args.format
        if fmt == "log":
            raise UserError(f"{args.trace} is a request log already: give a Mooncake trace or raw bodies")
        self.trace = self.bodies = None
        self.epoch_ms: float | None = None  # the first request's time, when the trace's are epoch ms
        if fmt == "mooncake":
            self.trace = traces.read_mooncake(args.trace, strict=args.strict)
            trace_args.report_skipped(self.trace)
            origin_ms = 1000.0 * self.trace.origin_s
            self.epoch_ms = origin_ms if origin_ms >= input_bounds.EPOCH_2000_MS else None
        else:
            low, high = input_bounds.BODY_RATE_RANGE
            if not low <= args.body_rate <= high:
                raise UserError(f"--body-rate {args.body_rate:g}: must be from {low:g} to {high:,.0f} requests per second")
            self.bodies = traces.RawBodyReader(args.trace, strict=args.strict)

    @property
    def span_s(self) -> float:
        if self.trace is not None:
            return self.trace.duration_s
        from prefix_routing.lab import traces

        return max(0, traces.count_lines(self.args.trace) - 1) / self.args.body_rate  # at most: lines, not bodies

    @property
    def total(self) -> int | None:
        return len(self.trace) if self.trace is not None else None

    def __iter__(self):
        if self.trace is not None:
            yield from self._mooncake()
        else:
            yield from self._raw()

    def _mooncake(self):
        from prefix_routing.lab.bodies import chat_body, serialize
        from prefix_routing.lab.tenants import conversation_key

        t = self.trace
        for arrival, prompt, output, blocks in zip(t.arrivals, t.prompt_tokens, t.output_tokens, t.blocks):
            record = {"hash_ids": blocks, "input_length": prompt, "output_length": output}
            conversation = conversation_key(blocks)
            yield _Request(arrival, serialize(chat_body(record)), prompt, output, conversation)

    def _raw(self):
        for i, (_, raw, output) in enumerate(self.bodies):
            try:
                messages = json.loads(raw).get("messages") or [None]
                opening = json.dumps(messages[0], sort_keys=True)
            except (ValueError, AttributeError, TypeError, IndexError):
                opening = raw[:2048].decode("utf-8", "replace")
            yield _Request(i / self.args.body_rate, raw, None, output, opening)
        skipped = self.bodies.skipped
        for example in skipped.examples:
            print(f"warning: {example}", file=sys.stderr)
        if skipped.count:
            print(f"{self.args.trace}: {skipped.summary(self.bodies.lines)}", file=sys.stderr)


class ModelledEndpoint:
    """A stand-in for the ``sagemaker-runtime`` client that answers each request at once, with the
    usage the lab's fleet model gives it at the request's trace time (``now``, set by the caller)."""

    def __init__(self, fleet, block_bytes: int) -> None:
        self.fleet = fleet
        self.block_bytes = block_bytes
        self.now = 0.0
        self.prompt_tokens: int | None = None
        self.output_tokens = 1
        self.timed_out = 0
        self.calls = 0
        self.prompt_total = self.cached_total = 0

    @property
    def hit_rate(self) -> float:
        return self.cached_total / self.prompt_total if self.prompt_total else 0.0

    def invoke_endpoint_with_response_stream(self, **params):
        from prefix_routing.lab.fleet import Request
        from prefix_routing.rules import block_hashes

        body = params["Body"]
        prompt = self.prompt_tokens if self.prompt_tokens is not None else -(-len(body) // int(BYTES_PER_TOKEN))
        self.fleet.advance(self.now)
        placement = self.fleet.submit(Request(prompt, self.output_tokens, block_hashes(body, self.block_bytes),
                                              routing_id=params.get("PrefixAwareId")), self.now)
        self.calls += 1
        self.timed_out += placement.timed_out
        cached = 0 if placement.timed_out else int(placement.cached_tokens)
        self.prompt_total += prompt
        self.cached_total += cached
        usage = {"prompt_tokens": prompt, "completion_tokens": self.output_tokens,
                 "total_tokens": prompt + self.output_tokens, "prompt_tokens_details": {"cached_tokens": cached}}
        head = {"id": f"log-{self.calls}", "object": "chat.completion.chunk", "model": "modelled"}
        choice = {"index": 0, "delta": {"content": "..."}, "finish_reason": "length"}
        events = [b"data: " + json.dumps({**head, "choices": [choice]}).encode() + b"\n\n",
                  b"data: " + json.dumps({**head, "choices": [], "usage": usage}).encode() + b"\n\n",
                  b"data: [DONE]\n\n"]
        return {"Body": iter([{"PayloadPart": {"Bytes": e}} for e in events]), "ContentType": "text/event-stream"}


class _ControlPlane:
    """``DescribeInferenceComponent`` of the modelled endpoint: its copies (for replication's sizing)."""

    def __init__(self, copies: int) -> None:
        self.copies = copies

    def describe_inference_component(self, **_):
        return {"RuntimeConfig": {"DesiredCopyCount": self.copies, "CurrentCopyCount": self.copies}}


def _start_ms(args, source: _Source) -> float:
    from prefix_routing.lab import input_bounds

    if args.start is not None:
        start = flag_values.time_ms(args.start, 0)
        if input_bounds.epoch_ms_problem("--start", start):
            raise UserError(f"--start {args.start}: give a time from 2000-01-01 to a day from now")
        return float(start)
    if source.epoch_ms is not None:
        return source.epoch_ms
    return float(int(time.time() * 1000 - 1000.0 * source.span_s))  # the last request arrives now


def run(args) -> int:
    from prefix_routing import frontdoor
    from prefix_routing.cli.stages import load_stage_arg
    from prefix_routing.lab.progress import progress_bar
    from prefix_routing.lab.fleet import Fleet
    from prefix_routing.lab.fleet_config import FleetConfig
    from prefix_routing.lab.stage_fleet import stage_fleet_values
    from prefix_routing.rules.telemetry import REQUEST_LOG_MESSAGE
    from prefix_routing.stage.front_door_env import front_door_environment

    stage = load_stage_arg(args.stage)
    out = Path(args.out)
    if out.is_dir():
        raise UserError(f"--out {out}: a directory; give a file name")
    source = _Source(args)
    start_ms = _start_ms(args, source)
    try:
        config = replace(frontdoor.InvokeConfig.from_env(front_door_environment(stage)), tenancy="header",
                         tenant_header=TENANT_HEADER, allow_direct_invoke=False)
    except frontdoor.ConfigurationError as error:
        raise UserError(f"stage {stage.name}: the front door's settings: {error}") from None
    block_bytes = config.settings.block_bytes
    fleet_config = FleetConfig(**stage_fleet_values(stage), strategy=stage.routing.strategy,
                               bytes_per_token=BYTES_PER_TOKEN, block_tokens=block_bytes / BYTES_PER_TOKEN,
                               block_bytes=block_bytes)
    endpoint = ModelledEndpoint(Fleet(fleet_config), block_bytes)
    clock = lambda: endpoint.now  # noqa: E731 - the trace's time, for the copy counts and replication
    statuses: dict[int, int] = {}
    written = [0]
    with _AtomicLines(out) as log:
        def keep(line: str) -> None:  # the request log lines; the EMF documents are not the log's
            if json.loads(line).get("message") == REQUEST_LOG_MESSAGE:
                log.write(line)
                written[0] += 1

        telemetry = frontdoor.Telemetry(config, keep, copies=frontdoor.CopyCounts(
            lambda: _ControlPlane(fleet_config.total_copies), config.metric_component, clock=clock))
        replicas = frontdoor.Replicas(config, copies=telemetry.copies, clock=clock) if config.replication.enabled else None
        invoker = frontdoor.Invoker(endpoint, config, OFFLINE_TENANT_KEY, telemetry_sink=telemetry,
                                    replicas=replicas, sleep=lambda s: None)
        bar = progress_bar(source.total, "log", None)
        try:
            for request in source:
                endpoint.now = request.arrival_s
                endpoint.prompt_tokens, endpoint.output_tokens = request.prompt_tokens, max(1, request.output_tokens)
                front = frontdoor.FrontRequest(
                    body=request.body, arrival_ms=int(start_ms + 1000.0 * request.arrival_s),
                    headers={TENANT_HEADER: _tenant(request.tenant_key, args.tenants), "content-type": "application/json"})
                status = invoker.buffered(front).status
                statuses[status] = statuses.get(status, 0) + 1
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
    print(_summary(out, written[0], statuses, stage, config, fleet_config, args.tenants, endpoint))
    return 0


class _AtomicLines:
    """The whole log or none of it: lines go to a temporary file beside ``path``, renamed at the end
    (removed if anything fails on the way)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> "_AtomicLines":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self._tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as an ordinary new file (mkstemp's is private to its owner)
        self._out = os.fdopen(fd, "w", encoding="utf-8")
        return self

    def write(self, line: str) -> None:
        self._out.write(line + "\n")

    def __exit__(self, kind, error, traceback) -> None:
        try:
            if kind is None:
                self._out.flush()
                os.fsync(self._out.fileno())
            self._out.close()
            if kind is None:
                os.replace(self._tmp, self.path)
        finally:
            Path(self._tmp).unlink(missing_ok=True)


def _summary(out: Path, written: int, statuses: dict, stage, config, fleet_config, tenants: int,
             endpoint: ModelledEndpoint) -> str:
    failed = sum(n for status, n in statuses.items() if status >= 400)
    text = (f"wrote {written:,} request log lines to {out} (stage {stage.name}: PrefixLength "
            f"{config.settings.prefix_length}, blocks of {config.settings.block_bytes} bytes; {tenants} "
            f"tenant{'s' if tenants != 1 else ''})\n"
            f"cached tokens from the lab's model of {fleet_config.instances} × {fleet_config.preset.name} "
            f"({fleet_config.copies} cop{'y' if fleet_config.copies == 1 else 'ies'} each), "
            f"{fleet_config.strategy.value}: {endpoint.hit_rate:.1%} of prompt tokens")
    if failed:
        by_status = ", ".join(f"{n:,} × {status}" for status, n in sorted(statuses.items()) if status >= 400)
        text += (f"\n{failed:,} request{'s' if failed != 1 else ''} failed at the front door ({by_status}): "
                 "logged as it logs them")
    if endpoint.timed_out:
        text += (f"\n{endpoint.timed_out:,} requests timed out in the modelled fleet (it is overloaded): logged as "
                 "served, with no cached tokens")
    return text + f"\nnext: python -m prefix_routing advise --stage {stage.name} --log-file {out}"
