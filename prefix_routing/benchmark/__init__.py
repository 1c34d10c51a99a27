"""``benchmark``: a SageMaker AI benchmark job (AIPerf, run by AWS) against a deployed stage, beside the
lab's prediction for the same workload and fleet.

The workload is a lab trace written as the Mooncake trace AIPerf replays (:mod:`.workload`); the job
and its workload config are created and awaited (:mod:`.job`); AIPerf's summary is read from the
job's results in S3 (:mod:`.results`) and set beside the lab's figures (:mod:`.report`).

This subpackage imports the rules, the stage and the lab (its trace); the command line runs the lab's
simulation and passes its figures in.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable

from prefix_routing.benchmark.job import (
    Clients,
    JobPlan,
    check_stage,
    clients_for,
    duration_text,
    plan_job,
    role_arn_for,
    start_job,
    upload_workload,
    wait_for_job,
)
from prefix_routing.benchmark.report import HIT_RATE_NOTE, comparison, predicted_figures, render_table
from prefix_routing.benchmark.results import EXPORT_NAME, Figures, parse_export, read_export
from prefix_routing.benchmark.workload import AIPERF_BLOCK_TOKENS, mooncake_jsonl, mooncake_records
from prefix_routing.lab.traces import Trace

__all__ = [
    "AIPERF_BLOCK_TOKENS",
    "EXPORT_NAME",
    "Clients",
    "Figures",
    "JobPlan",
    "check_stage",
    "clients_for",
    "comparison",
    "mooncake_jsonl",
    "mooncake_records",
    "parse_export",
    "predicted_figures",
    "read_export",
    "render_text",
    "run_benchmark",
]


def run_benchmark(config: Any, trace: Trace, workload: str, predicted: Figures, lab: dict, clients: Clients, *,
                  now: datetime, timeout_s: float, poll_s: float, clock: Callable[[], float],
                  sleep: Callable[[float], None], report: Callable[[str], None]) -> dict:
    """Upload ``trace``, run the job, read its results; the result as a JSON-ready dict.

    ``workload`` labels the job (``long-context``, ``shared-prefix``, ``trace``); ``predicted`` and
    ``lab`` (what the lab modelled) come from the lab's simulation of the same trace.
    """
    check_stage(config)
    plan = plan_job(config, workload, role_arn_for(config, clients.cloudformation), now)
    body = mooncake_jsonl(trace)
    report(f"workload: {len(trace):,} requests ({len(body):,} bytes of Mooncake trace) to {plan.workload_uri}")
    upload_workload(clients.s3, plan, body)
    arn = start_job(clients.sagemaker, plan)
    report(f"benchmark job {plan.name}: created; AWS's fleet now sends the workload to endpoint {plan.endpoint_name} "
           f"(stop it: aws sagemaker stop-ai-benchmark-job --ai-benchmark-job-name {plan.name})")
    job = wait_for_job(clients.sagemaker, plan.name, timeout_s=timeout_s, poll_s=poll_s, clock=clock, sleep=sleep,
                       report=report)
    export, measured = read_export(clients.s3, plan.bucket, plan.results_prefix)
    ran = job.get("EndTime") and job.get("StartTime") and (job["EndTime"] - job["StartTime"]).total_seconds()
    return {
        "stage": config.name,
        "endpoint": plan.endpoint_name,
        "inference_component": plan.component_name,
        "workload": {"name": workload, "source": trace.source, "requests": len(trace),
                     "duration_s": trace.duration_s, "uri": plan.workload_uri},
        "job": {"name": plan.name, "arn": arn, "status": job["AIBenchmarkJobStatus"], "role_arn": plan.role_arn,
                "ran_s": ran or None, "results_uri": plan.results_uri, "export": export},
        "lab": lab,
        "figures": comparison(measured, predicted),
        "notes": [HIT_RATE_NOTE],
    }


def render_text(result: dict) -> str:
    """The result for a reader: the job, the workload, the table, the notes."""
    job, workload = result["job"], result["workload"]
    ran = f" in {duration_text(job['ran_s'])}" if job["ran_s"] else ""
    measured = Figures(**{key: row["measured"] for key, row in result["figures"].items()})
    predicted = Figures(**{key: row["predicted"] for key, row in result["figures"].items()})
    lines = [
        f"benchmark job {job['name']}: {job['status']}{ran}; AIPerf's summary: {job['export']}",
        f"workload: {workload['source']}: {workload['requests']:,} requests over {workload['duration_s']:,.0f} s "
        f"({workload['uri']})",
        f"lab: {result['lab'].get('strategy')} on {result['lab'].get('fleet')}",
        "",
        render_table(measured, predicted),
        "",
        *(f"note: {note}" for note in result["notes"]),
    ]
    return "\n".join(lines)
