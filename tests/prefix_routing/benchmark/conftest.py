"""A stage with [benchmark], botocore Stubbers for the three clients a benchmark uses, AIPerf exports as the
job leaves them, and a clock that only moves when the code under test sleeps."""

from __future__ import annotations

import copy
import datetime
import io
import json
import tarfile

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from prefix_routing.benchmark import Clients
from prefix_routing.stage.config import DEFAULT_STAGE_DATA, parse_stage

REGION, ACCOUNT = "us-east-1", "111122223333"
BUCKET = "acme-bench"
NOW = datetime.datetime(2026, 12, 2, 12, 0, 5, tzinfo=datetime.timezone.utc)
JOB = "default-shared-prefix-20261202-120005"
JOB_ARN = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:ai-benchmark-job/{JOB}"
CONFIG_ARN = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:ai-workload-config/{JOB}"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/PrefixRouting-default-Endpoi-BenchmarkRoleAEFE338D-AbCdEf"
WORKLOAD_KEY = f"prefix-routing/workloads/{JOB}.jsonl"
RESULTS = f"prefix-routing/results/{JOB}/"
LOG_GROUP = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/AIBenchmarkJobs"


def stage(**benchmark):
    data = copy.deepcopy(DEFAULT_STAGE_DATA)
    data["benchmark"] = benchmark or {"s3_uri": f"s3://{BUCKET}/prefix-routing/"}
    return parse_stage(data, source="test")


def export(**overrides) -> bytes:
    """AIPerf's profile_export_aiperf.json, in the shape of aiperf/common/models/export_models.py."""
    document = {
        "request_throughput": {"unit": "requests/sec", "avg": 1.96},
        "request_count": {"unit": "requests", "avg": 1169.0},
        "time_to_first_token": {"unit": "ms", "avg": 150.2, "p50": 120.5, "p90": 310.25, "p99": 480.0,
                                "min": 40.1, "max": 900.0, "std": 80.0},
        "output_token_throughput": {"unit": "tokens/sec", "avg": 392.4},
        "input_config": {"endpoint": {"model_names": ["llama"]}},
        "was_cancelled": False,
    }
    document.update(overrides)
    return json.dumps(document).encode()


def tar_gz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def body(data: bytes) -> StreamingBody:
    return StreamingBody(io.BytesIO(data), len(data))


def described(status: str, **extra) -> dict:
    """A DescribeAIBenchmarkJob answer for the test job."""
    return {
        "AIBenchmarkJobName": JOB, "AIBenchmarkJobArn": JOB_ARN, "AIBenchmarkJobStatus": status,
        "BenchmarkTarget": {"Endpoint": {"Identifier": "default-prefix-llm",
                                         "InferenceComponents": [{"Identifier": "default-prefix-llm-ic"}]}},
        "OutputConfig": {"S3OutputLocation": f"s3://{BUCKET}/{RESULTS}"},
        "AIWorkloadConfigIdentifier": JOB, "RoleArn": ROLE, "CreationTime": NOW, **extra,
    }


class Clock:
    """time.monotonic and time.sleep for the code under test: time passes only in sleep."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def stubbed():
    """(Clients, {"sagemaker"|"s3"|"cloudformation": Stubber}); every queued answer must be used."""
    session = boto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name=REGION)
    clients = Clients(session.client("sagemaker"), session.client("s3"), session.client("cloudformation"))
    stubbers = {name: Stubber(getattr(clients, name)) for name in ("sagemaker", "s3", "cloudformation")}
    for stubber in stubbers.values():
        stubber.activate()
    yield clients, stubbers
    for stubber in stubbers.values():
        stubber.assert_no_pending_responses()
        stubber.deactivate()


@pytest.fixture
def clock():
    return Clock()
