"""``preflight``: each check's ✔, ✘ and ? against botocore Stubbers (every request's parameters as
preflight must ask them, every response checked against the installed service models). Expected
figures are hand computations: Lambda's floor of 100 unreserved executions, the quota against
``instances_max``, the bootstrap version against the manifest's requirement."""

from __future__ import annotations

import json
import copy
from types import SimpleNamespace

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError
from botocore.stub import Stubber

from prefix_routing.stage.config import DEFAULT_STAGE_DATA, parse_stage
from prefix_routing.stage.ami import ami_for, ami_runs_image, image_cuda
from prefix_routing.stage.web_adapter import web_adapter_layer_arn
from prefix_routing.verify.preflight import (
    check_alarm_emails,
    check_benchmark,
    check_bootstrap,
    check_concurrency,
    check_image_and_ami,
    check_instance_quota,
    check_model,
    check_web_adapter,
    required_bootstrap,
)
from prefix_routing.verify.report import FAIL, OK, UNKNOWN

REGION = "us-east-1"
LAYER = "arn:aws:lambda:us-east-1:753240598075:layer:LambdaAdapterLayerArm64:30"


def stubbed(service: str):
    client = boto3.client(service, region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    return client, Stubber(client)


# --------------------------------------------------------------------------- Lambda concurrency


@pytest.mark.parametrize(("unreserved", "reservation", "status"), [
    (1000, 50, OK),  # 950 left
    (150, 50, OK),  # exactly 100 left: Lambda's floor holds
    (149, 50, FAIL),  # 99 left
    (100, 50, FAIL),  # a new account's 100 (of 1,000 it may not have yet): 50 left
])
def test_the_reservation_must_leave_one_hundred_unreserved(unreserved, reservation, status):
    client, stub = stubbed("lambda")
    stub.add_response("get_account_settings", {"AccountLimit": {"ConcurrentExecutions": 1000,
                                                                "UnreservedConcurrentExecutions": unreserved}}, {})
    with stub:
        check = check_concurrency(client, reservation)
    assert check.status == status
    assert f"leaving {unreserved - reservation:,}" in check.detail


def test_a_short_account_is_told_the_most_it_can_reserve():
    client, stub = stubbed("lambda")
    stub.add_response("get_account_settings", {"AccountLimit": {"UnreservedConcurrentExecutions": 130}}, {})
    with stub:
        check = check_concurrency(client, 50)
    assert check.fix.startswith("set normalizer.reserved_concurrency to at most 30")  # 130 - 100


def test_a_refused_or_unreachable_call_is_a_question_naming_what_to_grant():
    client, stub = stubbed("lambda")
    stub.add_client_error("get_account_settings", "AccessDeniedException", http_status_code=403)
    with stub:
        refused = check_concurrency(client, 50)
    assert (refused.status, refused.fix) == (UNKNOWN, "grant lambda:GetAccountSettings to whoever runs preflight")

    class Unreachable:
        def get_account_settings(self):
            raise EndpointConnectionError(endpoint_url="https://lambda.us-east-1.amazonaws.com/")

    away = check_concurrency(Unreachable(), 50)
    assert away.status == UNKNOWN and "EndpointConnectionError" in away.detail


# --------------------------------------------------------------------------- instance quota

QUOTA = "ml.g6e.xlarge for endpoint usage"


def quota(name: str, value: float) -> dict:
    return {"ServiceCode": "sagemaker", "QuotaName": name, "QuotaCode": "L-ABCDEF12", "Value": value}


def test_the_quota_is_found_on_a_later_page_and_compared_with_instances_max():
    client, stub = stubbed("service-quotas")
    stub.add_response("list_service_quotas", {"Quotas": [quota("ml.p5.48xlarge for endpoint usage", 0)],
                                              "NextToken": "t1"}, {"ServiceCode": "sagemaker", "MaxResults": 100})
    stub.add_response("list_service_quotas", {"Quotas": [quota(QUOTA, 3.0)]},
                      {"ServiceCode": "sagemaker", "MaxResults": 100, "NextToken": "t1"})
    with stub:
        enough = check_instance_quota(client, "ml.g6e.xlarge", 3, REGION)
    assert enough.status == OK and enough.detail == "3 in us-east-1; the stage asks for up to 3"

    stub.add_response("list_service_quotas", {"Quotas": [quota(QUOTA, 2.0)]}, {"ServiceCode": "sagemaker", "MaxResults": 100})
    with stub:
        short = check_instance_quota(client, "ml.g6e.xlarge", 3, REGION)
    assert short.status == FAIL and "request 3 in Service Quotas" in short.fix and "L-ABCDEF12" in short.fix


def test_an_instance_type_without_an_endpoint_quota_is_not_offered_there():
    client, stub = stubbed("service-quotas")
    stub.add_response("list_service_quotas", {"Quotas": [quota("ml.g5.xlarge for endpoint usage", 4)]},
                      {"ServiceCode": "sagemaker", "MaxResults": 100})
    with stub:
        check = check_instance_quota(client, "ml.p6-b200.48xlarge", 1, REGION)
    assert check.status == FAIL and "not offered for endpoints" in check.detail


# --------------------------------------------------------------------------- CDK bootstrap


def manifest(tmp_path, versions: dict[str, int]):
    artifacts = {name: {"type": "aws:cloudformation:stack", "properties": {
        "requiresBootstrapStackVersion": version, "bootstrapStackVersionSsmParameter": "/cdk-bootstrap/hnb659fds/version"}}
        for name, version in versions.items()}
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"artifacts": {**artifacts, "Tree": {"type": "cdk:tree"}}}))
    return path


def test_the_required_version_is_the_highest_of_the_stages_own_stacks(tmp_path):
    path = manifest(tmp_path, {"PrefixRouting-default-Endpoint": 6, "PrefixRouting-default-Endpoint.assets": 7,
                               "PrefixRouting-other-Endpoint": 21})
    assert required_bootstrap(path, "PrefixRouting-default") == (7, "/cdk-bootstrap/hnb659fds/version")
    assert required_bootstrap(path, "PrefixRouting-missing") is None
    assert required_bootstrap(tmp_path / "absent.json", "PrefixRouting-default") is None


@pytest.mark.parametrize(("value", "status"), [("6", OK), ("28", OK), ("5", FAIL)])
def test_the_bootstrap_version_is_compared_with_what_the_stacks_need(tmp_path, value, status):
    client, stub = stubbed("ssm")
    stub.add_response("get_parameter", {"Parameter": {"Name": "/cdk-bootstrap/hnb659fds/version", "Value": value}},
                      {"Name": "/cdk-bootstrap/hnb659fds/version"})
    with stub:
        check = check_bootstrap(client, manifest(tmp_path, {"PrefixRouting-default-Endpoint": 6}),
                                "PrefixRouting-default", "default")
    assert check.status == status


def test_an_account_never_bootstrapped_or_an_app_never_synthesized(tmp_path):
    client, stub = stubbed("ssm")
    stub.add_client_error("get_parameter", "ParameterNotFound", http_status_code=400)
    with stub:
        missing = check_bootstrap(client, manifest(tmp_path, {"PrefixRouting-default-Endpoint": 6}),
                                  "PrefixRouting-default", "default")
    assert missing.status == FAIL and missing.fix.startswith("npx cdk bootstrap")
    unsynthesized = check_bootstrap(client, tmp_path / "nothing.json", "PrefixRouting-default", "default")
    assert unsynthesized.status == UNKNOWN and "npx cdk synth -c stage=default" in unsynthesized.fix


# --------------------------------------------------------------------------- the model


def stage_with(**sections):
    """The default stage with some sections' values changed, parsed as a stage file would be."""
    data = copy.deepcopy(DEFAULT_STAGE_DATA)
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
        if section == "model" and "model_s3_uri" in values:
            data[section].pop("model_id", None)
    return parse_stage(data, source="test")


def test_weights_in_s3_must_be_under_the_prefix():
    client, stub = stubbed("s3")
    config = stage_with(model={"model_s3_uri": "s3://weights/llama/"})
    stub.add_response("list_objects_v2", {"KeyCount": 1, "Contents": [{"Key": "llama/config.json"}]},
                      {"Bucket": "weights", "Prefix": "llama/", "MaxKeys": 1})
    stub.add_response("list_objects_v2", {"KeyCount": 0}, {"Bucket": "weights", "Prefix": "llama/", "MaxKeys": 1})
    stub.add_client_error("list_objects_v2", "NoSuchBucket", http_status_code=404)
    with stub:
        assert [check_model(client, config).status for _ in range(3)] == [OK, FAIL, FAIL]


def test_a_gated_hub_model_is_refused_and_another_hub_model_is_a_question():
    gated = check_model(None, stage_with(model={"model_id": "meta-llama/Llama-3.1-8B-Instruct"}))
    assert gated.status == FAIL and "model.model_s3_uri" in gated.fix
    other = check_model(None, stage_with(model={"model_id": "Qwen/Qwen2.5-7B-Instruct"}))
    assert other.status == UNKNOWN


# --------------------------------------------------------------------------- the layer


def test_the_web_adapter_layer_arn_per_partition():
    assert web_adapter_layer_arn("us-east-1", "aws") == LAYER
    assert web_adapter_layer_arn("cn-north-1", "aws-cn").startswith("arn:aws-cn:lambda:cn-north-1:")
    # preflight asks in the partition its client is in (botocore's endpoint data)
    china = boto3.client("lambda", region_name="cn-north-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(china) as stub:
        stub.add_response("get_layer_version_by_arn", {"LayerVersionArn": "x"},
                          {"Arn": "arn:aws-cn:lambda:cn-north-1:753240598075:layer:LambdaAdapterLayerArm64:30"})
        assert check_web_adapter(china, "cn-north-1").status == OK


def test_the_layer_exists_in_the_region_or_is_named_missing():
    client, stub = stubbed("lambda")
    stub.add_response("get_layer_version_by_arn", {"LayerVersionArn": LAYER, "Version": 30}, {"Arn": LAYER})
    stub.add_client_error("get_layer_version_by_arn", "ResourceNotFoundException", http_status_code=404)
    with stub:
        assert check_web_adapter(client, REGION).status == OK
        missing = check_web_adapter(client, REGION)
    assert missing.status == FAIL and LAYER in missing.detail


# --------------------------------------------------------------------------- the image and the AMI


def test_the_image_cuda_comes_from_the_table_or_the_tag():
    assert image_cuda("vllm", "server-sagemaker-cuda-v1") == (12, 9)
    assert image_cuda("djl-inference", "0.33.0-lmi15.0.0-cu128") == (12, 8)
    assert image_cuda("vllm", "some-future-tag") is None
    assert image_cuda("djl-inference", "0.33.0-lmi15.0.0") is None


@pytest.mark.parametrize(("ami", "cuda", "runs"), [
    (None, (12, 9), False),  # SageMaker's default AMI: driver 535, CUDA 12.2, compat mounted by the old toolkit
    ("al2-ami-sagemaker-inference-gpu-2", (12, 9), False),
    ("al2-ami-sagemaker-inference-gpu-2-1", (12, 9), True),  # forward compatibility, loaded by the DLC
    ("al2-ami-sagemaker-inference-gpu-3-1", (12, 9), True),  # AWS's deployment page for the vLLM DLC
    ("al2023-ami-sagemaker-inference-gpu-4-1", (12, 9), True),  # CUDA 13.0 natively
    ("al2-ami-sagemaker-inference-gpu-3-1", (13, 0), False),  # forward compatibility stays within a major
    ("al2-ami-sagemaker-inference-gpu-2", (12, 2), True),  # native
    ("al2-ami-sagemaker-inference-neuron-2", (12, 2), False),
])
def test_which_ami_runs_which_cuda(ami, cuda, runs):
    assert ami_runs_image(ami, cuda)[0] is runs


def test_the_stage_check_uses_the_frameworks_default_ami_when_the_stage_sets_none():
    assert ami_for("vllm", None) == "al2-ami-sagemaker-inference-gpu-3-1"
    assert ami_for("vllm", "al2023-ami-sagemaker-inference-gpu-4-1") == "al2023-ami-sagemaker-inference-gpu-4-1"
    assert check_image_and_ami(stage_with()).status == OK
    old = check_image_and_ami(stage_with(endpoint={"inference_ami_version": "al2-ami-sagemaker-inference-gpu-2"}))
    assert old.status == FAIL and 'inference_ami_version = "al2-ami-sagemaker-inference-gpu-3-1"' in old.fix
    assert check_image_and_ami(stage_with(model={"image_tag": "a-new-tag"})).status == UNKNOWN


# --------------------------------------------------------------------------- e-mails, the benchmark


def test_alarm_emails_are_a_question_until_confirmed_and_absent_without_emails():
    assert check_alarm_emails(stage_with(alarms={"emails": []})) is None
    check = check_alarm_emails(stage_with(alarms={"emails": ["ops@example.com"]}))
    assert check.status == UNKNOWN and check.title == "alarm e-mails (1)"


def test_the_benchmark_bucket_and_token_secret_where_the_stage_sets_them():
    s3, s3_stub = stubbed("s3")
    secrets, secrets_stub = stubbed("secretsmanager")
    arn = "arn:aws:secretsmanager:us-east-1:111122223333:secret:hf-AbCdEf"
    config = stage_with(benchmark={"s3_uri": "s3://bench/runs/", "tokenizer": "meta-llama/Llama-3.1-8B-Instruct",
                                   "hf_token_secret_arn": arn})
    s3_stub.add_response("list_objects_v2", {"KeyCount": 0}, {"Bucket": "bench", "Prefix": "runs/", "MaxKeys": 1})
    secrets_stub.add_client_error("describe_secret", "ResourceNotFoundException", http_status_code=400)
    with s3_stub, secrets_stub:
        bucket, secret = check_benchmark(s3, secrets, config)
    assert (bucket.status, secret.status) == (OK, FAIL)
    assert check_benchmark(None, None, stage_with()) == []


# --------------------------------------------------------------------------- no AWS within reach


def test_with_every_endpoint_a_closed_port_preflight_ends_within_a_minute_with_questions(tmp_path):
    """Every AWS call goes to a closed port on 127.0.0.1 (``AWS_ENDPOINT_URL``): each check that asks
    AWS is a ?, the ones settled from the stage alone keep their verdict, and nothing is a traceback."""
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    manifest(tmp_path, {"PrefixRouting-default-Endpoint": 6})
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}",
                   "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "not-a-secret",
                   "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                   "AWS_EC2_METADATA_DISABLED": "true"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "prefix_routing", "preflight", "--stage", "default", "--region",
                           REGION, "--cdk-out", str(tmp_path), "--json"], capture_output=True, text=True, timeout=120,
                          env=environment, cwd=Path(__file__).resolve().parents[3])
    took = time.monotonic() - started
    assert took < 60, took
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    checks = {c["title"]: c["status"] for c in json.loads(done.stdout)["checks"]}
    asked_aws = [title for title in checks if title.startswith(("CDK bootstrap", "Lambda", "quota "))]
    assert len(asked_aws) == 4 and all(checks[title] == UNKNOWN for title in asked_aws), checks
    assert checks["model meta-llama/Llama-3.1-8B-Instruct"] == FAIL  # settled from the stage: a gated model id
    assert done.returncode == 1  # that ✘


@pytest.mark.parametrize("stage", ["default", "llama70b-p5", "llama8b-g6e", "multi-tenant", "trust-domains"])
def test_every_shipped_stage_gets_every_check_and_no_exception(stage, tmp_path):
    from prefix_routing.stage.config import load_stage
    from prefix_routing.verify.preflight import PreflightClients, preflight_stage

    class Away:
        meta = SimpleNamespace(partition="aws")  # as a botocore client's

        def __getattr__(self, operation):
            def call(**_):
                raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9/")
            return call

    config = load_stage(stage)
    checks = preflight_stage(config, PreflightClients(*(Away() for _ in range(5))), region=REGION,
                             manifest=tmp_path / "manifest.json")
    titles = [check.title for check in checks]
    assert titles[:4] == ["CDK bootstrap", "Lambda concurrency", "Lambda Web Adapter layer",
                          f"quota {config.endpoint.instance_type} for endpoint usage"]
    assert len(titles) == 6 + bool(config.alarms.emails) + (config.benchmark.enabled
                                                            + bool(config.benchmark.hf_token_secret_arn))


@pytest.mark.parametrize(("arguments", "said"), [
    (["--profile", "nosuch", "--region", REGION], "error: The config profile (nosuch) could not be found"),
    ([], "error: no region: pass --region, or set one in the stage file or your AWS configuration"),
])
def test_no_profile_or_no_region_is_one_line_not_a_traceback(tmp_path, arguments, said):
    import subprocess
    import sys
    from pathlib import Path

    environment = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AWS_CONFIG_FILE": str(tmp_path / "none"),
                   "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    done = subprocess.run([sys.executable, "-m", "prefix_routing", "preflight", *arguments], capture_output=True,
                          text=True, timeout=120, env=environment, cwd=Path(__file__).resolve().parents[3])
    assert (done.returncode, done.stderr.strip()) == (2, said)


# --------------------------------------------------------------------------- each line, word for word


def test_the_concurrency_lines_word_for_word():
    client, stub = stubbed("lambda")
    stub.add_response("get_account_settings", {"AccountLimit": {"ConcurrentExecutions": 1000,
                                                                "UnreservedConcurrentExecutions": 1000}}, {})
    stub.add_response("get_account_settings", {"AccountLimit": {"ConcurrentExecutions": 100,
                                                                "UnreservedConcurrentExecutions": 100}}, {})
    stub.add_response("get_account_settings", {"AccountLimit": {}}, {})
    with stub:
        fine, short, empty = (check_concurrency(client, 50) for _ in range(3))
    assert fine.line() == ("✔ Lambda concurrency: 1,000 unreserved of 1,000; the normalizer reserves 50, leaving 950")
    assert short.detail == ("100 unreserved of 100; the normalizer reserves 50, leaving 50, below Lambda's floor of 100: "
                            "cdk deploy would fail")
    assert short.fix == ("the account has no concurrency to reserve, or ask for a higher 'Concurrent executions' quota "
                         "(Service Quotas, AWS Lambda); on a redeploy, the function's current reservation counts as "
                         "unreserved again")
    assert empty.status == FAIL and empty.detail.startswith("0 unreserved of 0;")


def test_the_quota_and_bootstrap_lines_word_for_word(tmp_path):
    client, stub = stubbed("service-quotas")
    stub.add_response("list_service_quotas", {"Quotas": [quota(QUOTA, 1.0)]}, {"ServiceCode": "sagemaker", "MaxResults": 100})
    stub.add_response("list_service_quotas", {"Quotas": []}, {"ServiceCode": "sagemaker", "MaxResults": 100})
    with stub:
        short = check_instance_quota(client, "ml.g6e.xlarge", 3, REGION)
        absent = check_instance_quota(client, "ml.g6e.xlarge", 3, REGION)
    assert short.line() == ("✘ quota ml.g6e.xlarge for endpoint usage: 1 in us-east-1; the stage asks for up to 3 "
                            "(endpoint.instances_max)\n    fix: request 3 in Service Quotas (SageMaker, 'ml.g6e.xlarge "
                            "for endpoint usage', quota code L-ABCDEF12), or lower endpoint.instances_max")
    assert absent.line() == ("✘ quota ml.g6e.xlarge for endpoint usage: no such quota in us-east-1: the type is not "
                             "offered for endpoints there\n    fix: choose another endpoint.instance_type or another region")
    ssm, ssm_stub = stubbed("ssm")
    ssm_stub.add_response("get_parameter", {"Parameter": {"Name": "p", "Value": "5"}},
                          {"Name": "/cdk-bootstrap/hnb659fds/version"})
    ssm_stub.add_response("get_parameter", {"Parameter": {"Name": "p", "Value": "v2"}},
                          {"Name": "/cdk-bootstrap/hnb659fds/version"})
    path = manifest(tmp_path, {"PrefixRouting-default-Endpoint": 6})
    with ssm_stub:
        old = check_bootstrap(ssm, path, "PrefixRouting-default", "default")
        odd = check_bootstrap(ssm, path, "PrefixRouting-default", "default")
    assert old.line() == ("✘ CDK bootstrap: version 5; the stacks need at least 6\n    fix: npx cdk bootstrap "
                          "aws://<account>/<region> to upgrade the bootstrap stack")
    assert (odd.status, odd.detail) == (UNKNOWN, "/cdk-bootstrap/hnb659fds/version holds 'v2', not a version number")


def test_the_model_layer_and_ami_lines_word_for_word():
    client, stub = stubbed("s3")
    stub.add_response("list_objects_v2", {"KeyCount": 1}, {"Bucket": "weights", "Prefix": "llama/", "MaxKeys": 1})
    stub.add_response("list_objects_v2", {"KeyCount": 0}, {"Bucket": "weights", "Prefix": "llama/", "MaxKeys": 1})
    config = stage_with(model={"model_s3_uri": "s3://weights/llama/"})
    with stub:
        there, empty = check_model(client, config), check_model(client, config)
    assert there.line() == "✔ model weights s3://weights/llama/: objects under the prefix"
    assert empty.line() == ("✘ model weights s3://weights/llama/: no objects under the prefix\n    fix: upload the "
                            "uncompressed weights there (aws s3 sync)")
    other = check_model(None, stage_with(model={"model_id": "Qwen/Qwen2.5-7B-Instruct"}))
    assert other.line() == ("? model Qwen/Qwen2.5-7B-Instruct: the copy downloads it from the Hugging Face Hub at start, "
                            "without a token\n    to settle: make sure it is not gated (its page on huggingface.co), or "
                            "use model.model_s3_uri")
    lam, lam_stub = stubbed("lambda")
    lam_stub.add_client_error("get_layer_version_by_arn", "AccessDeniedException", http_status_code=403)
    lam_stub.add_client_error("get_layer_version_by_arn", "ThrottlingException", http_status_code=429)
    with lam_stub:
        refused, throttled = check_web_adapter(lam, REGION), check_web_adapter(lam, REGION)
    assert refused.status == FAIL and refused.detail == f"{LAYER}: AccessDeniedException"
    assert (throttled.status, throttled.fix) == (UNKNOWN, "grant lambda:GetLayerVersion to whoever runs preflight")
    runs = check_image_and_ami(stage_with())
    assert runs.line() == ("✔ image vllm:server-sagemaker-cuda-v1 on al2-ami-sagemaker-inference-gpu-3-1: "
                           "al2-ami-sagemaker-inference-gpu-3-1 has driver 550 (CUDA 12.4); the image's CUDA 12.9 runs "
                           "through its own forward-compatibility libraries")
    native = check_image_and_ami(stage_with(endpoint={"inference_ami_version": "al2023-ami-sagemaker-inference-gpu-4-1"}))
    assert native.detail == ("al2023-ami-sagemaker-inference-gpu-4-1 has driver 580 (CUDA 13.0), enough for CUDA 12.9")
    unknown_image = check_image_and_ami(stage_with(model={"image_tag": "a-new-tag"}))
    assert unknown_image.fix.startswith("read the image's release notes")


def test_the_benchmark_and_email_lines_word_for_word():
    s3, s3_stub = stubbed("s3")
    secrets, secrets_stub = stubbed("secretsmanager")
    arn = "arn:aws:secretsmanager:us-east-1:111122223333:secret:hf-AbCdEf"
    config = stage_with(benchmark={"s3_uri": "s3://bench/runs/", "tokenizer": "meta-llama/Llama-3.1-8B-Instruct",
                                   "hf_token_secret_arn": arn})
    s3_stub.add_client_error("list_objects_v2", "NoSuchBucket", http_status_code=404)
    secrets_stub.add_response("describe_secret", {"ARN": arn}, {"SecretId": arn})
    with s3_stub, secrets_stub:
        bucket, secret = check_benchmark(s3, secrets, config)
    assert bucket.line() == ("✘ benchmark bucket s3://bench/runs/: no such bucket\n    fix: create it, or set "
                             "benchmark.s3_uri to one that exists")
    assert secret.line() == f"✔ benchmark tokenizer token secret: {arn}"
    emails = check_alarm_emails(stage_with(alarms={"emails": ["a@example.com", "b@example.com"]}))
    assert emails.line() == ("? alarm e-mails (2): SNS asks each address to confirm after deploy; until then alarms "
                             "reach no one\n    to settle: confirm the subscription from each inbox after cdk deploy")
