"""The operator's AWS session for ``verify`` and ``preflight``: boto3's usual credential chain (or a
profile), the region given, else the stage's, else the AWS configuration's; one line, not a
traceback, when there is no such profile or no region."""

from __future__ import annotations

from typing import Any

from prefix_routing.rules.errors import UserError


def operator_session(*, profile: str | None, region: str | None) -> Any:
    import boto3
    from botocore.exceptions import ProfileNotFound

    try:
        session = boto3.Session(profile_name=profile, region_name=region)
    except ProfileNotFound as error:
        raise UserError(str(error)) from None
    if not session.region_name:
        raise UserError("no region: pass --region, or set one in the stage file or your AWS configuration")
    return session
