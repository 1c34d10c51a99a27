"""What a benchmark job measured: AIPerf's summary export, found under the job's results in S3.

AIPerf writes its summary to ``profile_export_aiperf.json`` (github.com/ai-dynamo/aiperf:
``OutputDefaults.PROFILE_EXPORT_AIPERF_JSON_FILE`` in ``aiperf/common/config/config_defaults.py``,
written by ``aiperf/exporters/json_exporter.py``): one JSON object whose keys are metric tags
(``JsonExportData`` in ``aiperf/common/models/export_models.py``), each ``{"unit", "avg", "p50",
"p90", ...}`` (``JsonMetricResult``) in display units. ``time_to_first_token`` is a per-request
metric in ``ms`` (``aiperf/metrics/types/ttft_metric.py``) with percentiles; ``request_throughput``
(``requests/sec``), ``output_token_throughput`` (``tokens/sec``) and ``request_count``
(``requests``) are single values, kept in ``avg`` (``aiperf/post_processors/metric_results_processor.py``).

The benchmark service puts AIPerf's files under the job's ``S3OutputLocation``, in a folder of its
own and possibly packed as a ``.tar.gz``: the export is looked for under the job's results prefix,
as a file or inside an archive. AIPerf measures no KV-cache hit rate.
"""

from __future__ import annotations

import json
import math
import tarfile
from dataclasses import asdict, dataclass
from typing import Any

from prefix_routing.rules.errors import UserError

EXPORT_NAME = "profile_export_aiperf.json"
#: AIPerf's time units (``MetricTimeUnit`` in ``aiperf/common/enums/metric_enums.py``), in ms.
_MS_PER_UNIT = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "sec": 1000.0}
#: The most keys listed under a job's results, and the largest export read (a summary is kilobytes).
MAX_LISTED_KEYS = 10_000
MAX_EXPORT_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Figures:
    """The figures the command compares, measured or predicted (None: not known)."""

    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    request_throughput_rps: float | None
    output_throughput_tok_s: float | None
    hit_rate: float | None
    requests: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _metric(export: dict, tag: str, stat: str, unit: str, where: str) -> float:
    metric = export.get(tag)
    if not isinstance(metric, dict):
        raise UserError(f"{where}: no {tag!r} in AIPerf's export (keys: {', '.join(sorted(export)[:12]) or 'none'})")
    value = metric.get(stat)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise UserError(f"{where}: {tag}.{stat} is {value!r}, not a number")
    got = metric.get("unit")
    if unit == "ms":
        if got not in _MS_PER_UNIT:
            raise UserError(f"{where}: {tag} in unit {got!r}; expected one of {', '.join(_MS_PER_UNIT)}")
        return value * _MS_PER_UNIT[got]
    if got != unit:
        raise UserError(f"{where}: {tag} in unit {got!r}; expected {unit!r}")
    return float(value)


def parse_export(data: bytes, where: str) -> Figures:
    """The figures of AIPerf's ``profile_export_aiperf.json`` (``where`` names it in errors)."""
    try:
        export = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise UserError(f"{where}: not JSON ({error})") from None
    if not isinstance(export, dict):
        raise UserError(f"{where}: not a JSON object")
    return Figures(
        ttft_p50_ms=_metric(export, "time_to_first_token", "p50", "ms", where),
        ttft_p90_ms=_metric(export, "time_to_first_token", "p90", "ms", where),
        request_throughput_rps=_metric(export, "request_throughput", "avg", "requests/sec", where),
        output_throughput_tok_s=_metric(export, "output_token_throughput", "avg", "tokens/sec", where),
        hit_rate=None,
        requests=round(_metric(export, "request_count", "avg", "requests", where)),
    )


def _s3_call(what: str, call: Any, **params: Any) -> Any:
    """One S3 call; what AWS or botocore refuses becomes one line naming ``what``."""
    from botocore.exceptions import BotoCoreError

    try:
        return call(**params)
    except BotoCoreError as error:
        raise UserError(f"cannot reach AWS: {error}") from None
    except Exception as error:  # noqa: BLE001 - an API error (ClientError) becomes one line
        detail = getattr(error, "response", {}).get("Error", {})
        raise UserError(f"{what}: {detail.get('Code', type(error).__name__)}: {detail.get('Message') or error}") \
            from None


def _keys(s3: Any, bucket: str, prefix: str) -> list[tuple[str, int]]:
    """(key, size) of every object under ``prefix``, at most MAX_LISTED_KEYS."""
    found: list[tuple[str, int]] = []
    token = None
    while len(found) < MAX_LISTED_KEYS:
        page = _s3_call(f"cannot list the job's results under s3://{bucket}/{prefix}", s3.list_objects_v2,
                        Bucket=bucket, Prefix=prefix, **({"ContinuationToken": token} if token else {}))
        found += [(item["Key"], item.get("Size", 0)) for item in page.get("Contents", [])]
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            break
    return found[:MAX_LISTED_KEYS]


def _from_archive(body: Any, uri: str) -> bytes | None:
    """The export inside a ``.tar.gz`` (read as a stream: only up to the export's member)."""
    try:
        with tarfile.open(fileobj=body, mode="r|gz") as archive:
            for member in archive:
                if member.isfile() and member.name.rsplit("/", 1)[-1] == EXPORT_NAME:
                    if member.size > MAX_EXPORT_BYTES:
                        raise UserError(f"{uri}: {member.name} is {member.size:,} bytes; an AIPerf summary is "
                                        f"kilobytes (at most {MAX_EXPORT_BYTES:,} read)")
                    return archive.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError) as error:
        raise UserError(f"{uri}: not a readable .tar.gz ({error})") from None
    return None


def read_export(s3: Any, bucket: str, prefix: str) -> tuple[str, Figures]:
    """(where, figures) of the AIPerf export under ``s3://bucket/prefix``: a file of that name, else
    one inside a ``.tar.gz`` there. None there: a UserError that lists what is."""
    keys = _keys(s3, bucket, prefix)
    files = [key for key, _ in keys if key.rsplit("/", 1)[-1] == EXPORT_NAME]
    archives = [key for key, _ in keys if key.endswith(".tar.gz")]
    sizes = dict(keys)
    for key in sorted(files, key=lambda k: (k.count("/"), k)):
        uri = f"s3://{bucket}/{key}"
        if sizes[key] > MAX_EXPORT_BYTES:
            raise UserError(f"{uri} is {sizes[key]:,} bytes; an AIPerf summary is kilobytes "
                            f"(at most {MAX_EXPORT_BYTES:,} read)")
        body = _s3_call(f"cannot read {uri}", s3.get_object, Bucket=bucket, Key=key)["Body"]
        return uri, parse_export(body.read(MAX_EXPORT_BYTES + 1), uri)
    for key in sorted(archives):
        uri = f"s3://{bucket}/{key}"
        data = _from_archive(_s3_call(f"cannot read {uri}", s3.get_object, Bucket=bucket, Key=key)["Body"], uri)
        if data is not None:
            return f"{uri}:{EXPORT_NAME}", parse_export(data, f"{uri}:{EXPORT_NAME}")
    listed = ", ".join(key.removeprefix(prefix) for key, _ in keys[:5]) or "nothing"
    more = f" and {len(keys) - 5:,} more" if len(keys) > 5 else ""
    raise UserError(f"no {EXPORT_NAME} under s3://{bucket}/{prefix} (found {listed}{more}): the job wrote no AIPerf "
                    "summary; read the job's log (its CloudWatch log stream) for why")
