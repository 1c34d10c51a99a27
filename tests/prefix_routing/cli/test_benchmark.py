"""``benchmark``: the command from its flags to its output, on botocore Stubbers (no AWS): the JSON of a
stubbed job against a table written by hand, the text, the lab's prediction as ``simulate --stage`` makes
it, and one ``error:`` line (exit status 2, no traceback) for each way it fails."""

from __future__ import annotations

import datetime
import json
import time

import pytest

from prefix_routing.benchmark.results import Figures
from prefix_routing.cli import benchmark as command
from prefix_routing.cli.main import main
from tests.prefix_routing.benchmark.conftest import ACCOUNT, NOW, REGION, Clock, body, described, export, stubbed  # noqa: F401

BUCKET = "acme-bench"
STAGE_TOML = (
    '[model]\nframework = "vllm"\nimage_repository = "vllm"\nimage_tag = "server-sagemaker-cuda-v1"\n'
    'model_id = "meta-llama/Llama-3.1-8B-Instruct"\n'
    '[endpoint]\ninstance_type = "ml.g6e.xlarge"\ninstances_min = 2\ninstances_max = 3\ncopies_min = 2\ncopies_max = 3\n'
    '[routing]\nstrategy = "PREFIX_AWARE"\n'
)
JOB = "bench-trace-20261202-120005"
JOB_ARN = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:ai-benchmark-job/{JOB}"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/bench-benchmark-role"
# Three requests in 512-token blocks; the second shares the first's first block.
TRACE = ('{"timestamp": 0, "input_length": 1000, "output_length": 100, "hash_ids": [7, 8]}\n'
         '{"timestamp": 500, "input_length": 1100, "output_length": 50, "hash_ids": [7, 9, 10]}\n'
         '{"timestamp": 2000, "input_length": 300, "output_length": 20, "hash_ids": [11]}\n')
# What is uploaded: the same requests, their ids numbered from 0 in order of appearance.
UPLOADED = (b'{"timestamp":0,"input_length":1000,"output_length":100,"hash_ids":[0,1]}\n'
            b'{"timestamp":500,"input_length":1100,"output_length":50,"hash_ids":[0,2,3]}\n'
            b'{"timestamp":2000,"input_length":300,"output_length":20,"hash_ids":[4]}\n')
PREDICTED = Figures(ttft_p50_ms=100.0, ttft_p90_ms=250.0, request_throughput_rps=2.0, output_throughput_tok_s=400.0,
                    hit_rate=0.8, requests=1200)
LAB = {"strategy": "PREFIX_AWARE", "fleet": "3 × ml.g6e.xlarge", "autoscaling": None, "replication": "off",
       "notes": []}


@pytest.fixture
def setup(tmp_path, monkeypatch, stubbed):  # noqa: F811 - the fixture of that name
    """A stage `bench` with [benchmark], the trace file, the stubbed clients, a fixed clock and prediction."""
    from prefix_routing import benchmark
    from prefix_routing.lab.traces import read_mooncake
    from prefix_routing.stage import config as stage_config

    real_load = stage_config.load_stage
    monkeypatch.setattr(stage_config, "load_stage", lambda name: real_load(name, config_dir=tmp_path))
    (tmp_path / "bench.toml").write_text(STAGE_TOML + f'[benchmark]\ns3_uri = "s3://{BUCKET}/runs/"\n')
    (tmp_path / "plain.toml").write_text(STAGE_TOML)
    trace = tmp_path / "trace.jsonl"
    trace.write_text(TRACE)
    clients, stubbers = stubbed
    monkeypatch.setattr(benchmark, "clients_for", lambda **_: clients)
    monkeypatch.setattr(command, "_now", lambda: NOW)
    monkeypatch.setattr(command, "predict", lambda args, stage: (read_mooncake(args.workload), PREDICTED, LAB))
    clock = Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    monkeypatch.setattr(time, "sleep", clock.sleep)
    return trace, stubbers, clock


def _until_created(stubbers):
    stubbers["cloudformation"].add_response("describe_stacks", {"Stacks": [{
        "StackName": "PrefixRouting-bench-Endpoint", "CreationTime": NOW, "StackStatus": "CREATE_COMPLETE",
        "Outputs": [{"OutputKey": "BenchmarkRoleArn", "OutputValue": ROLE}]}]}, {"StackName": "PrefixRouting-bench-Endpoint"})
    stubbers["s3"].add_response("head_bucket", {}, {"Bucket": BUCKET})
    stubbers["s3"].add_response("put_object", {}, {"Bucket": BUCKET, "Key": f"runs/workloads/{JOB}.jsonl",
                                                   "Body": UPLOADED, "ContentType": "application/jsonl"})
    stubbers["sagemaker"].add_response(
        "create_ai_workload_config", {"AIWorkloadConfigArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:ai-workload-config/{JOB}"},
        {"AIWorkloadConfigName": JOB, "DatasetConfig": {"InputDataConfig": [{"ChannelName": "mooncake-trace", "DataSource": {
            "S3DataSource": {"S3Uri": f"s3://{BUCKET}/runs/workloads/{JOB}.jsonl"}}}]},
         "AIWorkloadConfigs": {"WorkloadSpec": {"Inline": json.dumps({
             "benchmark": {"type": "aiperf"},
             "parameters": {"custom_dataset_type": "mooncake_trace", "fixed_schedule": True,
                            "prompt_input_tokens_block_size": 512, "streaming": True,
                            "tokenizer": "meta-llama/Llama-3.1-8B-Instruct"},
             "tooling": {"api_standard": "openai"}}, sort_keys=True)}}})
    stubbers["sagemaker"].add_response("create_ai_benchmark_job", {"AIBenchmarkJobArn": JOB_ARN}, {
        "AIBenchmarkJobName": JOB, "AIWorkloadConfigIdentifier": JOB, "RoleArn": ROLE,
        "BenchmarkTarget": {"Endpoint": {"Identifier": "bench-prefix-llm",
                                         "InferenceComponents": [{"Identifier": "bench-prefix-llm-ic"}]}},
        "OutputConfig": {"S3OutputLocation": f"s3://{BUCKET}/runs/results/{JOB}/"}})


def _job(status, **extra):
    answer = described(status, **extra)
    answer.update(AIBenchmarkJobName=JOB, AIBenchmarkJobArn=JOB_ARN, AIWorkloadConfigIdentifier=JOB, RoleArn=ROLE)
    return answer


def _completes(stubbers, results=None):
    stubbers["sagemaker"].add_response("describe_ai_benchmark_job", _job("InProgress"), {"AIBenchmarkJobName": JOB})
    stubbers["sagemaker"].add_response("describe_ai_benchmark_job", _job(
        "Completed", StartTime=NOW, EndTime=NOW + datetime.timedelta(seconds=754)), {"AIBenchmarkJobName": JOB})
    keys = ["bmk-prod-1a2b/profile_export_aiperf.json"] if results is None else results
    stubbers["s3"].add_response("list_objects_v2", {"IsTruncated": False, "Contents": [
        {"Key": f"runs/results/{JOB}/{k}", "Size": 2048} for k in keys]}, {"Bucket": BUCKET, "Prefix": f"runs/results/{JOB}/"})
    if results is None:
        stubbers["s3"].add_response("get_object", {"Body": body(export())},
                                    {"Bucket": BUCKET, "Key": f"runs/results/{JOB}/{keys[0]}"})


def test_the_json_of_a_stubbed_job_is_the_hand_written_table(setup, capsys):
    trace, stubbers, clock = setup
    _until_created(stubbers)
    _completes(stubbers)
    assert main(["benchmark", "--stage", "bench", "--workload", str(trace), "--json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    # conftest.export(): TTFT P50 120.5 ms, P90 310.25 ms, 1.96 requests/s, 392.4 output tokens/s, 1,169 requests.
    # Differences by hand: (120.5 - 100) / 100 = +0.205; (310.25 - 250) / 250 = +0.241; (1.96 - 2) / 2 = -0.02;
    # (392.4 - 400) / 400 = -0.019; (1169 - 1200) / 1200 = -31 / 1200 = -0.0258333...
    expected = {
        "ttft_p50_ms": (120.5, 100.0, 0.205),
        "ttft_p90_ms": (310.25, 250.0, 0.241),
        "request_throughput_rps": (1.96, 2.0, -0.02),
        "output_throughput_tok_s": (392.4, 400.0, -0.019),
        "hit_rate": (None, 0.8, None),
        "requests": (1169, 1200, -31 / 1200),
    }
    assert list(result["figures"]) == list(expected)
    for key, (measured, predicted, change) in expected.items():
        row = result["figures"][key]
        assert (row["measured"], row["predicted"]) == (measured, predicted), key
        assert row["difference"] == (None if change is None else pytest.approx(change, abs=1e-12)), key
    del result["figures"]
    assert result == {
        "stage": "bench", "endpoint": "bench-prefix-llm", "inference_component": "bench-prefix-llm-ic",
        "workload": {"name": "trace", "source": str(trace), "requests": 3, "duration_s": 2.0,
                     "uri": f"s3://{BUCKET}/runs/workloads/{JOB}.jsonl"},
        "job": {"name": JOB, "arn": JOB_ARN, "status": "Completed", "role_arn": ROLE, "ran_s": 754.0,
                "results_uri": f"s3://{BUCKET}/runs/results/{JOB}/",
                "export": f"s3://{BUCKET}/runs/results/{JOB}/bmk-prod-1a2b/profile_export_aiperf.json"},
        "lab": LAB,
        "notes": ["AIPerf measures no KV-cache hit rate; the endpoint's own is the engine's prefix-cache metrics "
                  "(detailed observability) or, through the front door, the dashboard's hit rate"],
    }
    # Progress on stderr: the upload, the job, each status; one poll interval (30 s) between statuses.
    assert clock.sleeps == [30]
    assert err.splitlines() == [
        f"workload: 3 requests ({len(UPLOADED)} bytes of Mooncake trace) to s3://{BUCKET}/runs/workloads/{JOB}.jsonl",
        f"benchmark job {JOB}: created; AWS's fleet now sends the workload to endpoint bench-prefix-llm (stop it: "
        f"aws sagemaker stop-ai-benchmark-job --ai-benchmark-job-name {JOB})",
        f"benchmark job {JOB}: InProgress, 0s of at most 1h00m",  # the default: the trace's 2 s and an hour
        f"benchmark job {JOB}: Completed, 30s of at most 1h00m",
    ]


def test_the_text_puts_the_benchmark_beside_the_lab(setup, capsys):
    trace, stubbers, _ = setup
    _until_created(stubbers)
    _completes(stubbers)
    assert main(["benchmark", "--stage", "bench", "--workload", str(trace), "--poll", "10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"benchmark job {JOB}: Completed in 12m34s; AIPerf's summary: "
                        f"s3://{BUCKET}/runs/results/{JOB}/bmk-prod-1a2b/profile_export_aiperf.json")
    assert lines[4:11] == [
        "                      measured (AIPerf)  predicted (lab)  difference",
        "TTFT P50 (ms)                       120              100      +20.5%",
        "TTFT P90 (ms)                       310              250      +24.1%",
        "requests/s                         1.96             2.00       -2.0%",
        "output tokens/s                     392              400       -1.9%",
        "hit rate (tokens)                   n/a            80.0%",
        "requests                          1,169            1,200       -2.6%",
    ]


def _error(capsys, argv) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    return line


def test_a_stage_without_benchmark_is_refused_before_any_call(setup, capsys):
    trace, _, _ = setup
    assert _error(capsys, ["benchmark", "--stage", "plain", "--workload", str(trace)]) == (
        'error: stage plain has no [benchmark] s3_uri: set benchmark.s3_uri = "s3://<bucket>/<prefix>/" in its stage '
        "file and deploy it (the job's role comes with it)")


def test_a_missing_bucket(setup, capsys):
    trace, stubbers, _ = setup
    stubbers["cloudformation"].add_response("describe_stacks", {"Stacks": [{
        "StackName": "PrefixRouting-bench-Endpoint", "CreationTime": NOW, "StackStatus": "CREATE_COMPLETE",
        "Outputs": [{"OutputKey": "BenchmarkRoleArn", "OutputValue": ROLE}]}]})
    stubbers["s3"].add_client_error("head_bucket", "404", "", 404)
    assert _error(capsys, ["benchmark", "--stage", "bench", "--workload", str(trace)]) == (
        f"error: bucket {BUCKET} does not exist (benchmark.s3_uri): create it in the stage's region, or name another "
        "in the stage file")


def test_a_failed_job(setup, capsys):
    trace, stubbers, _ = setup
    _until_created(stubbers)
    stubbers["sagemaker"].add_response("describe_ai_benchmark_job", _job(
        "Failed", FailureReason="AlgorithmError: the tokenizer meta-llama/Llama-3.1-8B-Instruct is gated"))
    assert _error(capsys, ["benchmark", "--stage", "bench", "--workload", str(trace)]) == (
        f"error: benchmark job {JOB} failed: AlgorithmError: the tokenizer meta-llama/Llama-3.1-8B-Instruct is gated")


def test_results_missing(setup, capsys):
    trace, stubbers, _ = setup
    _until_created(stubbers)
    _completes(stubbers, results=["bmk-prod-1a2b/aiperf.log"])
    assert _error(capsys, ["benchmark", "--stage", "bench", "--workload", str(trace)]) == (
        f"error: no profile_export_aiperf.json under s3://{BUCKET}/runs/results/{JOB}/ (found bmk-prod-1a2b/aiperf.log): "
        "the job wrote no AIPerf summary; read the job's log (its CloudWatch log stream) for why")


def test_a_timeout_stops_the_job(setup, capsys):
    trace, stubbers, clock = setup
    _until_created(stubbers)
    for _ in range(3):
        stubbers["sagemaker"].add_response("describe_ai_benchmark_job", _job("InProgress"))
    stubbers["sagemaker"].add_response("stop_ai_benchmark_job", {"AIBenchmarkJobArn": JOB_ARN}, {"AIBenchmarkJobName": JOB})
    assert _error(capsys, ["benchmark", "--stage", "bench", "--workload", str(trace), "--timeout", "60"]) == (
        f"error: benchmark job {JOB} is still InProgress after 1m00s (--timeout 60): stopped it, so that it costs no "
        "more; give a longer --timeout, or a shorter workload (--limit)")
    assert clock.sleeps == [30, 30]


def test_a_workload_longer_than_the_timeout_is_refused_before_any_call(setup, capsys, monkeypatch):
    from prefix_routing.lab.workloads import shared_prefix_workload

    _, _, _ = setup
    monkeypatch.setattr(command, "predict", lambda args, stage: (shared_prefix_workload(), PREDICTED, LAB))
    assert _error(capsys, ["benchmark", "--stage", "bench", "--workload", "shared-prefix", "--timeout", "300"]) == (
        "error: the workload lasts 599 s and --timeout 300 would stop the job before it has sent it: give a longer "
        "--timeout (the duration and some minutes of start-up), or fewer requests (--limit)")


@pytest.mark.parametrize(("argv", "expected"), [
    (["--workload", "cloudwatch:/aws/lambda/x"], "error: --workload cloudwatch:/aws/lambda/x: a benchmark replays a "
     "Mooncake trace file or a lab workload (long-context, shared-prefix), not a CloudWatch log"),
    (["--workload", "no-such-file.jsonl"], "error: --workload no-such-file.jsonl: no such file; allowed: long-context, "
     "shared-prefix, or a Mooncake-format trace file"),
    (["--workload", "noisy-tenant"], "error: --workload noisy-tenant: no such file; allowed: long-context, "
     "shared-prefix, or a Mooncake-format trace file"),
])
def test_a_workload_that_is_no_trace_is_one_line(tmp_path, monkeypatch, capsys, argv, expected):
    from prefix_routing.stage import config as stage_config

    real_load = stage_config.load_stage
    monkeypatch.setattr(stage_config, "load_stage", lambda name: real_load(name, config_dir=tmp_path))
    (tmp_path / "bench.toml").write_text(STAGE_TOML + f'[benchmark]\ns3_uri = "s3://{BUCKET}/runs/"\n')
    assert _error(capsys, ["benchmark", "--stage", "bench", *argv]) == expected


def test_the_prediction_is_simulate_on_the_stages_fleet_at_its_strategy(tmp_path, monkeypatch, capsys):
    """The figures `predict` gives are those `simulate --stage` prints for the same workload, with the front
    door's replication and limits off (the job calls the endpoint directly)."""
    from argparse import Namespace

    from prefix_routing.stage import config as stage_config

    real_load = stage_config.load_stage
    monkeypatch.setattr(stage_config, "load_stage", lambda name: real_load(name, config_dir=tmp_path))
    (tmp_path / "bench.toml").write_text(STAGE_TOML + f'[benchmark]\ns3_uri = "s3://{BUCKET}/runs/"\n'
                                         "[normalizer.replication]\nenabled = true\n")
    stage = stage_config.load_stage("bench")
    args = Namespace(workload="shared-prefix", limit=300, seed=4)
    trace, predicted, modelled = command.predict(args, stage)
    assert len(trace) == 300
    assert main(["simulate", "--workload", "shared-prefix", "--stage", "bench", "--strategy", "PREFIX_AWARE",
                 "--replication", "off", "--limit", "300", "--seed", "4", "--no-plots", "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert predicted == Figures(ttft_p50_ms=result["ttft_p50_s"] * 1000, ttft_p90_ms=result["ttft_p90_s"] * 1000,
                                request_throughput_rps=result["throughput_req_s"],
                                output_throughput_tok_s=result["throughput_tok_s"], hit_rate=result["hit_rate"],
                                requests=300)
    assert modelled["strategy"] == "PREFIX_AWARE"
    assert modelled["fleet"].startswith("3 × ml.g6e.xlarge, Llama 3.1 8B TP1, 1 copy each")
    assert modelled["autoscaling"] == "copies 2 to 3"


def test_the_simulation_is_the_stages_without_the_front_doors_replication_and_limits(tmp_path):
    """The job calls the endpoint itself: no PrefixAwareId replicas, no per-tenant limits in front of it."""
    from argparse import Namespace

    from prefix_routing.lab.routing import Strategy
    from prefix_routing.stage.config import load_stage

    stage = load_stage("llama70b-p5")
    sim = command.simulate_args(Namespace(workload="long-context", limit=None, seed=2), stage)
    assert (sim.stage, sim.strategy, sim.replication, sim.limits) == ("llama70b-p5", [Strategy.PREFIX_AWARE], "off", "off")
    assert (sim.workload, sim.trace, sim.limit, sim.seed, sim.no_plots) == ("long-context", None, None, 2, True)
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    sim = command.simulate_args(Namespace(workload=str(trace), limit=2, seed=0), stage)
    assert (sim.workload, sim.trace, sim.format, sim.limit) == (None, str(trace), "mooncake", 2)
