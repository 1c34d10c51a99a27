"""One benchmark job, call by call against botocore's sagemaker, s3 and cloudformation models (Stubber checks
every request and answer against the installed service model): the names, the spec, the role, the upload,
the two creates, the wait with its progress, and one clear line for every way it fails."""

from __future__ import annotations

import json

import pytest

from prefix_routing.benchmark.job import (
    CHANNEL,
    JobPlan,
    check_stage,
    job_name,
    plan_job,
    role_arn_for,
    start_job,
    upload_workload,
    wait_for_job,
    workload_spec,
)
from prefix_routing.rules.errors import UserError
from tests.prefix_routing.benchmark.conftest import (
    BUCKET,
    CONFIG_ARN,
    JOB,
    JOB_ARN,
    LOG_GROUP,
    NOW,
    RESULTS,
    ROLE,
    WORKLOAD_KEY,
    described,
    stage,
)

SPEC = {
    "benchmark": {"type": "aiperf"},
    "parameters": {"custom_dataset_type": "mooncake_trace", "fixed_schedule": True,
                   "prompt_input_tokens_block_size": 512, "streaming": True,
                   "tokenizer": "meta-llama/Llama-3.1-8B-Instruct"},
    "tooling": {"api_standard": "openai"},
}
PLAN = JobPlan(name=JOB, endpoint_name="default-prefix-llm", component_name="default-prefix-llm-ic", bucket=BUCKET,
               workload_key=WORKLOAD_KEY, results_prefix=RESULTS, role_arn=ROLE, spec=SPEC)


@pytest.mark.parametrize(("stage_name", "workload", "expected"), [
    ("default", "shared-prefix", "default-shared-prefix-20261202-120005"),
    ("Llama70B-p5", "long-context", "llama70b-p5-long-context-20261202-120005"),
    ("default", "My Trace.jsonl", "default-my-trace-jsonl-20261202-120005"),
    ("default", "--", "default-trace-20261202-120005"),
    # 63 characters at most: 47 before the stamp's "-" and 15 characters; no hyphen left at the cut
    ("a" * 20, "b" * 40, "a" * 20 + "-" + "b" * 26 + "-20261202-120005"),
    ("a" * 20, "b" * 25 + "-c", "a" * 20 + "-" + "b" * 25 + "-20261202-120005"),
])
def test_job_names_are_lower_case_and_fit(stage_name, workload, expected):
    assert job_name(stage_name, workload, NOW) == expected
    assert len(expected) <= 63


def test_the_workload_spec():
    assert workload_spec("meta-llama/Llama-3.1-8B-Instruct") == SPEC
    secret = "arn:aws:secretsmanager:us-east-1:111122223333:secret:hf-AbCdEf"
    assert workload_spec("t/t", secret) == {**SPEC, "parameters": {**SPEC["parameters"], "tokenizer": "t/t"},
                                            "secrets": {"hf_token": secret}}


def test_the_plan_of_a_stage():
    plan = plan_job(stage(), "shared-prefix", ROLE, NOW)
    assert plan == PLAN
    assert plan.workload_uri == f"s3://{BUCKET}/prefix-routing/workloads/{JOB}.jsonl"
    assert plan.results_uri == f"s3://{BUCKET}/prefix-routing/results/{JOB}/"


def test_a_stage_without_benchmark_or_tokenizer_is_refused():
    from prefix_routing.stage.config import load_stage

    with pytest.raises(UserError) as raised:
        check_stage(load_stage())
    assert str(raised.value) == ('stage default has no [benchmark] s3_uri: set benchmark.s3_uri = '
                                 '"s3://<bucket>/<prefix>/" in its stage file and deploy it (the job\'s role comes '
                                 'with it)')
    from_s3 = stage().model_copy(update={"model": stage().model.model_copy(
        update={"model_id": None, "model_s3_uri": "s3://w/llama/"})})
    with pytest.raises(UserError, match=r"^stage default: benchmark.tokenizer is unset and the model has no model_id"):
        check_stage(from_s3)
    assert check_stage(stage(s3_uri=f"s3://{BUCKET}/x/", tokenizer="org/tok")) == "org/tok"


def test_the_stages_own_role_needs_no_call(stubbed):
    clients, _ = stubbed
    other = "arn:aws:iam::111122223333:role/mine"
    assert role_arn_for(stage(s3_uri=f"s3://{BUCKET}/x/", role_arn=other), clients.cloudformation) == other


def _stack(outputs):
    return {"Stacks": [{"StackName": "PrefixRouting-default-Endpoint", "CreationTime": NOW,
                        "StackStatus": "UPDATE_COMPLETE", "Outputs": outputs}]}


def test_the_role_is_the_endpoint_stacks_output(stubbed):
    clients, stubbers = stubbed
    stubbers["cloudformation"].add_response(
        "describe_stacks", _stack([{"OutputKey": "EndpointName", "OutputValue": "default-prefix-llm"},
                                   {"OutputKey": "BenchmarkRoleArn", "OutputValue": ROLE}]),
        {"StackName": "PrefixRouting-default-Endpoint"})
    assert role_arn_for(stage(), clients.cloudformation) == ROLE


def test_a_stack_deployed_before_benchmark_has_no_role(stubbed):
    clients, stubbers = stubbed
    stubbers["cloudformation"].add_response("describe_stacks", _stack([]), {"StackName": "PrefixRouting-default-Endpoint"})
    with pytest.raises(UserError) as raised:
        role_arn_for(stage(), clients.cloudformation)
    assert str(raised.value) == ("stack PrefixRouting-default-Endpoint has no BenchmarkRoleArn output (deployed before "
                                 "[benchmark] was set): deploy it again (npx cdk deploy --all -c stage=default) or set "
                                 "benchmark.role_arn")


def test_a_stage_not_deployed_is_one_line(stubbed):
    clients, stubbers = stubbed
    stubbers["cloudformation"].add_client_error(
        "describe_stacks", "ValidationError", "Stack with id PrefixRouting-default-Endpoint does not exist", 400)
    with pytest.raises(UserError) as raised:
        role_arn_for(stage(), clients.cloudformation)
    assert str(raised.value) == (
        "stack PrefixRouting-default-Endpoint: cannot read it (ValidationError: Stack with id "
        "PrefixRouting-default-Endpoint does not exist); deploy the stage (npx cdk deploy --all -c stage=default) or "
        "set benchmark.role_arn")


def test_the_workload_goes_to_the_workloads_prefix(stubbed):
    clients, stubbers = stubbed
    stubbers["s3"].add_response("head_bucket", {}, {"Bucket": BUCKET})
    stubbers["s3"].add_response("put_object", {"ETag": '"abc"'}, {
        "Bucket": BUCKET, "Key": WORKLOAD_KEY, "Body": b'{"timestamp":0}\n', "ContentType": "application/jsonl"})
    upload_workload(clients.s3, PLAN, b'{"timestamp":0}\n')


@pytest.mark.parametrize(("code", "status", "expected"), [
    ("404", 404, f"bucket {BUCKET} does not exist (benchmark.s3_uri): create it in the stage's region, or name another "
                 "in the stage file"),
    ("403", 403, f"bucket {BUCKET}: not allowed to use it (403); your credentials need s3:ListBucket and s3:PutObject "
                 "on it"),
    ("SlowDown", 503, f"bucket {BUCKET}: SlowDown: try later"),
])
def test_a_missing_or_forbidden_bucket_is_one_line_and_nothing_is_uploaded(stubbed, code, status, expected):
    clients, stubbers = stubbed
    stubbers["s3"].add_client_error("head_bucket", code, "try later" if status == 503 else "", status,
                                    expected_params={"Bucket": BUCKET})
    with pytest.raises(UserError) as raised:
        upload_workload(clients.s3, PLAN, b"x")
    assert str(raised.value) == expected


def test_an_upload_refused_is_one_line(stubbed):
    clients, stubbers = stubbed
    stubbers["s3"].add_response("head_bucket", {}, {"Bucket": BUCKET})
    stubbers["s3"].add_client_error("put_object", "AccessDenied", "Access Denied", 403)
    with pytest.raises(UserError) as raised:
        upload_workload(clients.s3, PLAN, b"x")
    assert str(raised.value) == f"cannot upload the workload to s3://{BUCKET}/{WORKLOAD_KEY} (AccessDenied: Access Denied)"


CREATE_CONFIG = {
    "AIWorkloadConfigName": JOB,
    "DatasetConfig": {"InputDataConfig": [{"ChannelName": "mooncake-trace", "DataSource": {
        "S3DataSource": {"S3Uri": f"s3://{BUCKET}/{WORKLOAD_KEY}"}}}]},
    "AIWorkloadConfigs": {"WorkloadSpec": {"Inline": json.dumps(SPEC, sort_keys=True)}},
}
CREATE_JOB = {
    "AIBenchmarkJobName": JOB,
    "BenchmarkTarget": {"Endpoint": {"Identifier": "default-prefix-llm",
                                     "InferenceComponents": [{"Identifier": "default-prefix-llm-ic"}]}},
    "OutputConfig": {"S3OutputLocation": f"s3://{BUCKET}/{RESULTS}"},
    "AIWorkloadConfigIdentifier": JOB,
    "RoleArn": ROLE,
}


def test_the_workload_config_and_the_job_are_created_against_the_stages_endpoint(stubbed):
    clients, stubbers = stubbed
    assert CHANNEL == "mooncake-trace"
    stubbers["sagemaker"].add_response("create_ai_workload_config", {"AIWorkloadConfigArn": CONFIG_ARN}, CREATE_CONFIG)
    stubbers["sagemaker"].add_response("create_ai_benchmark_job", {"AIBenchmarkJobArn": JOB_ARN}, CREATE_JOB)
    assert start_job(clients.sagemaker, PLAN) == JOB_ARN


def test_a_workload_config_refused_creates_no_job(stubbed):
    clients, stubbers = stubbed
    stubbers["sagemaker"].add_client_error("create_ai_workload_config", "ResourceLimitExceeded",
                                           "You have reached the limit of AI workload configs", 400)
    with pytest.raises(UserError) as raised:
        start_job(clients.sagemaker, PLAN)
    assert str(raised.value) == (f"cannot create the workload config {JOB} (ResourceLimitExceeded: You have reached "
                                 "the limit of AI workload configs)")


def test_a_job_refused_is_one_line(stubbed):
    clients, stubbers = stubbed
    stubbers["sagemaker"].add_response("create_ai_workload_config", {"AIWorkloadConfigArn": CONFIG_ARN})
    stubbers["sagemaker"].add_client_error("create_ai_benchmark_job", "ResourceNotFound",
                                           "Endpoint default-prefix-llm not found", 400)
    with pytest.raises(UserError) as raised:
        start_job(clients.sagemaker, PLAN)
    assert str(raised.value) == (f"cannot create the benchmark job {JOB} (ResourceNotFound: Endpoint "
                                 "default-prefix-llm not found)")


def _wait(clients, clock, lines, *, timeout_s=7200, poll_s=30):
    return wait_for_job(clients.sagemaker, JOB, timeout_s=timeout_s, poll_s=poll_s, clock=clock, sleep=clock.sleep,
                        report=lines.append)


def test_the_wait_reports_progress_until_the_job_completes(stubbed, clock):
    clients, stubbers = stubbed
    for status in ("InProgress", "InProgress", "Completed"):
        stubbers["sagemaker"].add_response("describe_ai_benchmark_job", described(status), {"AIBenchmarkJobName": JOB})
    lines = []
    assert _wait(clients, clock, lines)["AIBenchmarkJobStatus"] == "Completed"
    assert clock.sleeps == [30, 30]
    assert lines == [f"benchmark job {JOB}: InProgress, 0s of at most 2h00m",
                     f"benchmark job {JOB}: InProgress, 30s of at most 2h00m",
                     f"benchmark job {JOB}: Completed, 1m00s of at most 2h00m"]


def test_a_failed_job_says_its_reason_and_where_its_log_is(stubbed, clock):
    clients, stubbers = stubbed
    stubbers["sagemaker"].add_response("describe_ai_benchmark_job", described(
        "Failed", FailureReason="ClientError: endpoint default-prefix-llm returned 424 for 12 of 20 warm-up requests",
        OutputConfig={"S3OutputLocation": f"s3://{BUCKET}/{RESULTS}",
                      "CloudWatchLogs": [{"LogGroupArn": LOG_GROUP, "LogStreamName": f"{JOB}/aiperf"}]}))
    with pytest.raises(UserError) as raised:
        _wait(clients, clock, [])
    assert str(raised.value) == (f"benchmark job {JOB} failed: ClientError: endpoint default-prefix-llm returned 424 for "
                                 f"12 of 20 warm-up requests; its log: {LOG_GROUP} {JOB}/aiperf")


def test_a_failed_job_without_a_reason(stubbed, clock):
    clients, stubbers = stubbed
    stubbers["sagemaker"].add_response("describe_ai_benchmark_job", described("Failed"))
    with pytest.raises(UserError) as raised:
        _wait(clients, clock, [])
    assert str(raised.value) == f"benchmark job {JOB} failed: no reason given"


def test_a_stopped_job_is_an_error(stubbed, clock):
    clients, stubbers = stubbed
    stubbers["sagemaker"].add_response("describe_ai_benchmark_job", described("Stopping"))
    stubbers["sagemaker"].add_response("describe_ai_benchmark_job", described("Stopped"))
    with pytest.raises(UserError) as raised:
        _wait(clients, clock, [])
    assert str(raised.value) == f"benchmark job {JOB} was stopped before it completed"


def test_at_the_timeout_the_job_is_stopped_so_that_it_costs_no_more(stubbed, clock):
    clients, stubbers = stubbed
    for _ in range(3):  # at 0, 40 and 60 s: the last sleep ends at the deadline
        stubbers["sagemaker"].add_response("describe_ai_benchmark_job", described("InProgress"))
    stubbers["sagemaker"].add_response("stop_ai_benchmark_job", {"AIBenchmarkJobArn": JOB_ARN}, {"AIBenchmarkJobName": JOB})
    lines = []
    with pytest.raises(UserError) as raised:
        _wait(clients, clock, lines, timeout_s=60, poll_s=40)
    assert clock.sleeps == [40, 20]
    assert len(lines) == 3
    assert str(raised.value) == (f"benchmark job {JOB} is still InProgress after 1m00s (--timeout 60): stopped it, so "
                                 "that it costs no more; give a longer --timeout, or a shorter workload (--limit)")


def test_a_job_that_cannot_be_stopped_says_how_to_stop_it(stubbed, clock):
    clients, stubbers = stubbed
    stubbers["sagemaker"].add_response("describe_ai_benchmark_job", described("InProgress"))
    stubbers["sagemaker"].add_client_error("stop_ai_benchmark_job", "ThrottlingException", "Rate exceeded", 400)
    with pytest.raises(UserError) as raised:
        _wait(clients, clock, [], timeout_s=0, poll_s=30)
    assert str(raised.value) == (
        f"benchmark job {JOB} is still InProgress after 0s (--timeout 0): could not stop it (ThrottlingException): "
        f"stop it yourself: aws sagemaker stop-ai-benchmark-job --ai-benchmark-job-name {JOB}; give a longer --timeout, "
        "or a shorter workload (--limit)")


def test_a_job_that_cannot_be_read_may_still_run(stubbed, clock):
    clients, stubbers = stubbed
    stubbers["sagemaker"].add_client_error("describe_ai_benchmark_job", "ResourceNotFound", "not found", 400)
    with pytest.raises(UserError) as raised:
        _wait(clients, clock, [])
    assert str(raised.value) == (f"cannot read benchmark job {JOB} (ResourceNotFound: not found); it may still be "
                                 f"running: aws sagemaker stop-ai-benchmark-job --ai-benchmark-job-name {JOB}")


def test_no_network_is_one_line():
    from types import SimpleNamespace

    from botocore.exceptions import EndpointConnectionError

    def refuse(**_):
        raise EndpointConnectionError(endpoint_url="https://s3.amazonaws.com")

    with pytest.raises(UserError) as raised:
        upload_workload(SimpleNamespace(head_bucket=refuse), PLAN, b"x")
    assert str(raised.value) == 'cannot reach AWS: Could not connect to the endpoint URL: "https://s3.amazonaws.com"'
