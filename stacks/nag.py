"""cdk-nag acknowledgements, each with its reason and, for wildcard findings, the exact evidence
(so a new wildcard elsewhere in the same policy still fails synth)."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Validations
from constructs import IConstruct

PACK = "AwsSolutions"


def acknowledge(scope: IConstruct, rule: str, reason: str, *evidence: str) -> None:
    """``rule`` like "IAM5"; ``evidence`` like "Resource::*" or "Action::kms:ReEncrypt*"."""
    ids = [f"{PACK}::{PACK}-{rule}[{item}]" for item in evidence] or [f"{PACK}-{rule}"]
    Validations.of(scope).acknowledge(*(Acknowledgment(id=rule_id, reason=reason) for rule_id in ids))
