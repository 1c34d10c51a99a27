"""Prefix-aware routing for LLM inference on Amazon SageMaker.

One subpackage per capability, split by what runs where. Each subpackage imports only the subpackages below it
(``tests/test_architecture.py`` checks every arrow; ``docs/architecture.md`` draws them)::

    cli ──► verify ──► loadtest ──► emulator ──► lab ──► stage ──► rules
     │                                                              ▲
     └──────────────────────────────────► frontdoor ────────────────┘      stacks/ ──► stage, rules.telemetry

- ``rules``      what runs everywhere, standard library only: the canonical body, text and freeze
                 rules, tenant identity, fingerprints and block hashes, and ``telemetry`` (the metric
                 and log-field contract). ``from prefix_routing.rules import normalize_body``.
- ``frontdoor``  the Lambda's logic (the rules, and a boto3 client passed in): request parsing and
                 validation, tenancy, the upstream call with retries, the stream reader, error
                 classes, the request record with its log line and EMF document.
- ``stage``      the typed stage configuration (pydantic) and the instance and model tables that the
                 stacks and the lab read.
- ``lab``        trace readers, the fleet model (pure computation), analyze, simulate, tune,
                 workloads, plots. Never imports the emulator or the load tester.
- ``emulator``   the SageMaker runtime's wire protocol on 127.0.0.1, faults, the server, backends.
- ``loadtest``   work items, stream parsing, targets, the runner, reports.
- ``verify``     a live deployment against its stage file (boto3, read-only but ``--invoke``).
- ``benchmark``  a SageMaker AI benchmark job against a deployed stage, beside the lab's prediction
                 for the same workload (boto3; the lab's traces).
- ``cli``        ``python -m prefix_routing <command>``: one thin module per command. Nothing
                 imports it.

The Lambda asset carries ``rules/`` and ``frontdoor/`` only (and this file).
"""
