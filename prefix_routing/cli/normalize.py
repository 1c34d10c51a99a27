"""``python -m prefix_routing normalize``: write the canonical body of a request to standard output.

The output is exactly the bytes to send as the request body: no newline is added at the end (a
newline would change the body's length and block hashes, and ``sha256sum`` of the output would no
longer match the fingerprint). With ``--explain``, a summary goes to standard error. Malformed input,
a missing file or bad settings: exit status 2, one line ``error: ...`` on standard error, nothing on
standard output.
"""

from __future__ import annotations

import argparse
import sys

from prefix_routing.rules.body import normalize_body
from prefix_routing.rules.constants import PREFIX_LENGTH_MAX, PREFIX_LENGTH_MIN
from prefix_routing.rules.errors import NormalizationError, SettingsError, UserError
from prefix_routing.rules.settings import NormalizerSettings

HELP = "write the canonical (prefix-stable) form of a request body to standard output"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", nargs="?", default="-", metavar="FILE|-",
        help="the request body (JSON); '-' or nothing reads standard input",
    )
    parser.add_argument(
        "--prefix-length", type=int, metavar="N",
        help=f"the endpoint's PrefixLength in bytes ({PREFIX_LENGTH_MIN}..{PREFIX_LENGTH_MAX}); "
             "overrides the configuration file; default 4096",
    )
    parser.add_argument(
        "--config", metavar="FILE",
        help="normalizer settings as a JSON object: prefix_length, block_bytes, freeze_rules "
             '([{"name": ..., "pattern": ...}]), max_body_bytes, max_depth, freeze_placement',
    )
    parser.add_argument(
        "--explain", action="store_true",
        help="print what was changed, the prefix fingerprint and the block hashes to standard error",
    )


def load_settings(config_path: str | None, prefix_length: int | None) -> NormalizerSettings:
    """The normalizer settings of a command line: a JSON config file, then ``--prefix-length`` over it."""
    try:
        settings = NormalizerSettings.load(config_path) if config_path else NormalizerSettings()
        if prefix_length is not None:
            data = {name: getattr(settings, name) for name in settings.__dataclass_fields__}
            data["prefix_length"] = prefix_length
            settings = NormalizerSettings.from_mapping(data, source="--prefix-length")
    except SettingsError as error:
        raise UserError(str(error)) from None
    return settings


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise UserError(f"{path}: cannot read: {error.strerror or error}") from None


def run(args: argparse.Namespace) -> int:
    settings = load_settings(args.config, args.prefix_length)
    body = _read(args.file)
    try:
        result = normalize_body(body, settings)
    except NormalizationError as error:
        source = "standard input" if args.file == "-" else args.file
        raise UserError(f"{source}: {error}") from None
    if args.explain:
        lines = [
            f"kind: {result.kind}",
            f"bytes: {len(body)} in, {len(result.body)} out",
            f"prefix_fingerprint: {result.prefix_fingerprint} (first {settings.prefix_length} bytes)",
            f"block_hashes: {len(result.block_hashes)} full blocks of {settings.block_bytes} bytes"
            + (f": {' '.join(result.block_hashes[:8])}{' …' if len(result.block_hashes) > 8 else ''}"
               if result.block_hashes else ""),
            "changes:" if result.changes else "changes: none (the body was already canonical)",
            *(f"  - {change}" for change in result.changes),
        ]
        sys.stderr.write("\n".join(lines) + "\n")
        sys.stderr.flush()
    sys.stdout.buffer.write(result.body)
    sys.stdout.buffer.flush()
    return 0
