"""The ``--stage`` flag's stage, for the commands that read one (emulate, verify, images)."""

from __future__ import annotations

from prefix_routing.rules.errors import UserError


def load_stage_arg(name: str):
    """The stage named on the command line; a broken or unknown stage file is one line, status 2."""
    from prefix_routing.stage.config import ConfigError, load_stage  # pydantic: only when a command needs it

    try:
        return load_stage(name)
    except ConfigError as error:
        raise UserError(str(error).replace("\n", "; ")) from None  # every problem, on one line
