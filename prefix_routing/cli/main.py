"""``python -m prefix_routing <command>``: one subcommand per capability, each a module of ``cli/``.

A command module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Modules are imported only when their command runs, so ``normalize`` stays fast and free of the
lab's plotting dependencies.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from prefix_routing.rules.errors import UserError

# command name -> module under prefix_routing.cli
COMMANDS: dict[str, str] = {
    "normalize": "normalize",
    "analyze": "analyze",
    "simulate": "simulate",
    "tune": "tune",
    "advise": "advise",
    "usage": "usage",
    "log": "log",
    "emulate": "emulate",
    "loadtest": "loadtest",
    "demo": "demo",
    "preflight": "preflight",
    "canary": "canary",
    "verify": "verify",
    "benchmark": "benchmark",
    "images": "images",
    "engines": "engines",
    "calibrate": "calibrate",
}


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad flags already; keep its message to one line."""

    def error(self, message: str) -> None:  # noqa: D102 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


class _DefaultsFormatter(argparse.HelpFormatter):
    """Every option's default in its help: as the help words it, else argparse's value of it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or not action.option_strings or action.default in (None, "", argparse.SUPPRESS):
            return text  # (an option without a value of its own says what its absence means)
        if action.nargs == 0 and isinstance(action.default, bool):  # store_true and its kin
            return f"{text} (default: {'on' if action.default else 'off'})"
        return f"{text} (default: %(default)s)"


def _load(name: str):
    return importlib.import_module(f"prefix_routing.cli.{COMMANDS[name]}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _Parser(
        prog="python -m prefix_routing",
        description="Prefix-aware routing for LLM inference on Amazon SageMaker: normalize requests, "
        "analyze and simulate traces, emulate an endpoint, load-test one.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    # A command imports only its own module (normalize stays fast); the overview imports them all.
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name in COMMANDS:
        if chosen is None or name == chosen:
            module = _load(name)
            command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP,
                                            formatter_class=_DefaultsFormatter)
            module.add_arguments(command_parser)
            command_parser.set_defaults(_run=module.run)
        else:
            sub.add_parser(name)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._run(args) or 0)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `... | head` is not an error
        return 0
