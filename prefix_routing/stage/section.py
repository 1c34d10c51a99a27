"""What every section of a stage file shares: strict types, no unknown keys, and the reference's
"allowed" text for fields whose rule is a validator."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # Unknown keys are typos; strict types: "4096" is not 4096; inf and nan are no numbers
    # (CloudFormation's JSON has neither: synth would crash).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def allowed(text: str, **extra: Any) -> dict[str, Any]:
    """``json_schema_extra`` for a field whose rule is a validator: the reference's "allowed" text."""
    return {"allowed": text, **extra}
