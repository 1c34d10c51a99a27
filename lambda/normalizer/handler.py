"""The normalizer Lambda's entry point. Until the normalizer lands (issue 3) it answers 501."""

from __future__ import annotations

import json


def handler(event: dict, context: object) -> dict:
    return {
        "statusCode": 501,
        "headers": {"content-type": "application/json"},
        "body": json.dumps(
            {"error": "not_implemented", "message": "the normalizer is not deployed in this version yet"}
        ),
    }
