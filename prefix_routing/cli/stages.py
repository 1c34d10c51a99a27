"""The ``--stage`` flag's stage, for the commands that read one (emulate, verify, images, the lab's)."""

from __future__ import annotations

from prefix_routing.rules.errors import UserError


def load_stage_arg(name: str):
    """The stage named on the command line; a broken or unknown stage file is one line, status 2."""
    from prefix_routing.stage.config import ConfigError, load_stage  # pydantic: only when a command needs it

    try:
        return load_stage(name)
    except ConfigError as error:
        raise UserError(str(error).replace("\n", "; ")) from None  # every problem, on one line


def stage_from_args(args):
    """The ``--stage`` stage (None without the flag), loaded once per run."""
    name = getattr(args, "stage", None)
    if not name:
        return None
    cached = getattr(args, "_stage_config", None)
    if cached is None or cached.name != name:
        cached = load_stage_arg(name)
        args._stage_config = cached
    return cached
