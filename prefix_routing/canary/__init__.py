"""The isolation canary: proof, run after run, that each trust domain's cache works and that tenants
stay apart in it (:mod:`.probe`), for the scheduled function (``lambda/canary/``) and
``python -m prefix_routing canary`` alike.

This subpackage imports the rules and the front door (its configuration: the same components, salts
and normalization the front door uses).
"""

from __future__ import annotations

from prefix_routing.canary.probe import (TEMPLATE_TOKENS, Answer, DomainVerdict, answer_of, check_domain,
                                         runtime_invoke)
from prefix_routing.canary.run import domains_of, emf_document, run_canary

__all__ = ["TEMPLATE_TOKENS", "Answer", "DomainVerdict", "answer_of", "check_domain", "domains_of", "emf_document",
           "run_canary", "runtime_invoke"]
