"""``advise``: the advisor on a saved request log, with the stage's fleet and routing settings."""

from __future__ import annotations

import json

import pytest

from prefix_routing.cli.advise import parse_age
from prefix_routing.cli.main import main
from prefix_routing.rules.errors import UserError
from tests.conftest import MOONCAKE_SLICE

STAGE = (
    '[model]\nframework = "vllm"\nimage_repository = "vllm"\nimage_tag = "v1"\n'
    'model_id = "meta-llama/Llama-3.1-70B-Instruct"\ntensor_parallel_degree = 8\naccelerators_per_copy = 8\n'
    'memory_per_copy_mb = 921600\n'
    '[endpoint]\ninstance_type = "ml.p5.48xlarge"\ninstances_min = 4\ninstances_max = 4\ncopies_min = 4\n'
    'copies_max = 4\n[routing]\nstrategy = "PREFIX_AWARE"\nprefix_length = PL\nconcurrency_threshold = 1024\n'
)


@pytest.fixture
def stages(tmp_path, monkeypatch):
    from prefix_routing.stage import config as stage_config

    real_load = stage_config.load_stage
    monkeypatch.setattr(stage_config, "load_stage", lambda name: real_load(name, config_dir=tmp_path))
    for pl in (1024, 8192):
        (tmp_path / f"pl{pl}.toml").write_text(STAGE.replace("PL", str(pl)))
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(line + "\n" for line in MOONCAKE_SLICE.read_text().splitlines()[:300]))
    # The request log the front door writes for it, at PrefixLength 1024 (the `log` command).
    assert main(["log", "--trace", str(trace), "--out", str(tmp_path / "log.jsonl"), "--stage", "pl1024"]) == 0
    return tmp_path


def test_advise_on_a_saved_log_recommends_leaving_the_shared_block(stages, capsys):
    code = main(["advise", "--stage", "pl1024", "--log-file", str(stages / "log.jsonl"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    advice = json.loads(out)
    assert advice["current"] == {**advice["current"], "prefix_length": 1024, "concurrency_threshold": 1024}
    assert advice["best"]["prefix_length"] > 2048 and advice["better"] is True
    assert advice["window"]["requests"] == 300
    code = main(["advise", "--stage", "pl1024", "--log-file", str(stages / "log.jsonl")])
    out, _ = capsys.readouterr()
    assert code == 0 and "change the stage file" in out and "[routing]" in out
    code = main(["advise", "--stage", "pl8192", "--log-file", str(stages / "log.jsonl"), "--json"])
    out, _ = capsys.readouterr()
    assert code == 0 and json.loads(out)["better"] is False


def test_advise_asked_to_sample_a_small_window_advises_on_the_whole_of_it(stages, capsys):
    # 300 lines on 4 instances at 10 %: no miniature of 8 instances, so the whole window, as without --sample.
    assert main(["advise", "--stage", "pl1024", "--log-file", str(stages / "log.jsonl"), "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main(["advise", "--stage", "pl1024", "--log-file", str(stages / "log.jsonl"), "--sample", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "sample: --sample 0.1: ran the whole trace instead: 4 instances at rate 0.1 leave 1" in out
    assert f"predicted hit rate {whole['current']['predicted_hit_rate']:.1%}, P50 TTFT" in out


def test_the_log_group_comes_from_the_normalizer_stacks_output():
    import boto3
    from botocore.stub import Stubber

    from prefix_routing.advisor.function import request_log_group
    from prefix_routing.stage.config import load_stage

    stage = load_stage()
    client = boto3.client("cloudformation", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stub:
        stub.add_response("describe_stacks", {"Stacks": [{
            "StackName": f"{stage.stack_prefix}-Normalizer", "CreationTime": 0, "StackStatus": "CREATE_COMPLETE",
            "Outputs": [{"OutputKey": "RequestLogGroupName", "OutputValue": "PrefixRouting-default-Normalizer-Logs1"}]}]},
            {"StackName": f"{stage.stack_prefix}-Normalizer"})
        stack = f"{stage.stack_prefix}-Normalizer"
        assert request_log_group(stack, cloudformation=client) == "PrefixRouting-default-Normalizer-Logs1"
        stub.add_client_error("describe_stacks", "ValidationError", "Stack with id x does not exist")
        with pytest.raises(UserError, match="deploy it, or give --log-group or --log-file"):
            request_log_group(stack, cloudformation=client)


def test_advise_needs_two_sources_at_most_and_a_known_stage(stages, capsys):
    with pytest.raises(SystemExit) as exited:  # argparse's own usage error
        main(["advise", "--stage", "pl1024", "--log-file", "a", "--log-group", "b"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["advise", "--stage", "nope", "--log-file", str(stages / "log.jsonl")]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "seconds"), [("30m", 1800), ("1h", 3600), ("2d", 172800), ("90s", 90), ("1.5h", 5400)])
def test_since_ages(text, seconds):
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["", "1", "h", "-1h", "0m", "1w"])
def test_bad_since_ages_say_what_is_expected(text):
    with pytest.raises(UserError, match="expected a positive age such as 30m, 1h or 2d"):
        parse_age(text)


def test_a_set_rate_on_a_log_group_reads_only_the_sample(stages, capsys, monkeypatch):
    import boto3
    import moto

    from prefix_routing.rules.telemetry import LogField

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    # The log at PrefixLength 8192: a key per conversation (at 1024 they share one).
    assert main(["log", "--trace", str(stages / "trace.jsonl"), "--out", str(stages / "log8k.jsonl"),
                 "--stage", "pl8192"]) == 0
    capsys.readouterr()
    lines = [json.loads(line) for line in (stages / "log8k.jsonl").read_text().splitlines()]
    patterns = []
    with moto.mock_aws():
        logs = boto3.client("logs", region_name="us-east-1")
        logs.create_log_group(logGroupName="g")
        logs.create_log_stream(logGroupName="g", logStreamName="s")
        now = int(__import__("time").time() * 1000)
        logs.put_log_events(logGroupName="g", logStreamName="s", logEvents=[
            {"timestamp": now - 60_000, "message": json.dumps(line)} for line in lines])
        boto3.DEFAULT_SESSION = None
        real_client = boto3.client

        def client(service, **kwargs):
            made = real_client(service, **kwargs)
            made.meta.events.register("provide-client-params.logs.FilterLogEvents",
                                      lambda params, **_: patterns.append(params.get("filterPattern")))
            return made

        monkeypatch.setattr(boto3, "client", client)
        code = main(["advise", "--stage", "pl8192", "--log-group", "g", "--region", "us-east-1", "--sample", "0.5",
                     "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    window = json.loads(out)["window"]
    assert patterns and all("$.sample_bucket < 5000" in p for p in patterns)
    in_sample = sum(line[LogField.SAMPLE_BUCKET] < 5000 for line in lines)
    assert 0 < in_sample < len(lines)
    assert window["requests"] == window["sample"]["requests"] == in_sample and window["sample"]["at_source"] is True
