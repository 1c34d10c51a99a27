import json
import os
import subprocess
import sys
import stat
from pathlib import Path

from prefix_routing.frontdoor.config import InvokeConfig
from prefix_routing.stage.config import load_stage
from stacks.constructs.normalizer_function import LWA_LAYER_NAME, LWA_LAYER_VERSION, ROOT
from tests.test_architecture import imports_of, module_name, subpackage_of


def _policy_statements(template):
    return [
        statement
        for policy in template.find_resources("AWS::IAM::Policy").values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_function_runtime_architecture_and_limits(default_templates):
    config = load_stage()
    template = default_templates["normalizer"]
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Runtime": "python3.14",
            "Architectures": ["arm64"],
            "ReservedConcurrentExecutions": config.normalizer.reserved_concurrency,
            "Environment": {
                "Variables": {
                    "ENDPOINT_NAME": config.endpoint_name,
                    "INFERENCE_COMPONENT_NAME": config.component_name,
                    "PREFIX_LENGTH": str(config.routing.prefix_length),
                }
            },
        },
    )
    template.has_resource_properties("AWS::Lambda::Url", {"AuthType": "AWS_IAM"})
    template.has_resource_properties("AWS::Logs::LogGroup", {"RetentionInDays": config.normalizer.log_retention_days})


def test_sagemaker_actions_only_on_this_endpoint_and_component(default_templates):
    config = load_stage()
    sagemaker = [s for s in _policy_statements(default_templates["normalizer"]) if "sagemaker" in str(s["Action"])]
    actions = {a for s in sagemaker for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    # the two invoke calls, and reading the component's copy counts: nothing else of SageMaker
    assert actions == {"sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream",
                       "sagemaker:DescribeInferenceComponent"}
    statements = [s for s in sagemaker if "sagemaker:InvokeEndpoint" in s["Action"]]
    (statement,) = statements
    assert sorted(statement["Action"]) == ["sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream"]
    resources = statement["Resource"]
    assert "*" not in resources and len(resources) == 2
    joined = [str(r) for r in resources]
    assert any(f":endpoint/{config.endpoint_name}" in r for r in joined)
    assert any(f":inference-component/{config.component_name}" in r for r in joined)
    assert not any(r.rstrip("']}\"").endswith("*") for r in joined)


def test_the_function_reads_only_its_components_description(default_templates):
    config = load_stage()
    statements = [s for s in _policy_statements(default_templates["normalizer"])
                  if s["Action"] == "sagemaker:DescribeInferenceComponent"]
    (statement,) = statements
    (resource,) = [str(statement["Resource"])]
    assert f":inference-component/{config.component_name}" in resource and "*" not in resource


def test_no_wildcard_action_anywhere(default_templates):
    for statement in _policy_statements(default_templates["normalizer"]):
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert all("*" not in action for action in actions), statement


def test_asset_carries_the_handler_and_the_stdlib_library(default_stage):
    stacks, _ = default_stage

    asset_dirs = [p for p in Path(stacks.normalizer.node.root.outdir).glob("asset.*") if (p / "run.sh").is_file()]
    assert asset_dirs
    contents = {p.relative_to(asset_dirs[0]).as_posix() for p in asset_dirs[0].rglob("*.py")}
    assert "handler.py" in contents
    assert "server.py" in contents
    assert "prefix_routing/rules/telemetry.py" in contents
    assert "prefix_routing/frontdoor/invoker.py" in contents and "prefix_routing/rules/body.py" in contents
    assert not any(c.startswith("prefix_routing/stage/") for c in contents)  # pydantic-based, synth only
    for subpackage in ("lab", "emulator", "loadtest", "cli"):
        assert not any(c.startswith(f"prefix_routing/{subpackage}/") for c in contents), subpackage
    # Only the subpackages the Lambda runs (tests/test_architecture.py): the rules and the front door.
    library = sorted(c for c in contents if c.startswith("prefix_routing/"))
    subpackages = {c: subpackage_of(module_name(Path(c))) for c in library}
    assert set(subpackages.values()) <= {"rules", "frontdoor", "package"}, subpackages
    # ... and everything they import of ours is there too.
    shipped = {module_name(Path(c)) for c in library}
    for c in library + ["handler.py", "server.py"]:
        needed = {m for m in imports_of((asset_dirs[0] / c).read_text()) if m.startswith("prefix_routing")}
        assert needed <= shipped, (c, needed - shipped)
    assert any(c.startswith("aws_lambda_powertools/metrics/provider/cloudwatch_emf/") for c in contents)
    run = asset_dirs[0] / "run.sh"
    assert run.is_file() and os.stat(run).st_mode & stat.S_IXUSR  # Lambda executes the handler
    assert "server.py" in run.read_text()


def test_no_powertools_service_name_that_would_add_a_dimension(default_templates):
    # Powertools adds a "service" dimension when POWERTOOLS_SERVICE_NAME is set; the alarms watch
    # metrics with exactly one dimension, InferenceComponent.
    (function,) = default_templates["normalizer"].find_resources("AWS::Lambda::Function").values()
    assert "POWERTOOLS_SERVICE_NAME" not in function["Properties"]["Environment"]["Variables"]


def _function(template):
    (function,) = template.find_resources("AWS::Lambda::Function").values()
    return function["Properties"]


def test_function_runs_the_web_adapter_and_streams(default_templates):
    template = default_templates["normalizer"]
    properties = _function(template)
    assert properties["Handler"] == "run.sh"
    (layer,) = properties["Layers"]
    joined = "".join(part if isinstance(part, str) else "" for part in layer["Fn::Join"][1])
    assert joined.endswith(f":753240598075:layer:{LWA_LAYER_NAME}:{LWA_LAYER_VERSION}")
    assert LWA_LAYER_NAME.endswith("Arm64") and properties["Architectures"] == ["arm64"]
    env = properties["Environment"]["Variables"]
    assert env["AWS_LAMBDA_EXEC_WRAPPER"] == "/opt/bootstrap"
    assert env["AWS_LWA_INVOKE_MODE"] == "response_stream"
    assert env["AWS_LWA_PORT"] == "8080"
    assert env["AWS_LWA_READINESS_CHECK_PATH"] == "/healthz"
    assert env["AWS_LWA_PASS_THROUGH_PATH"] == "/events"
    template.has_resource_properties("AWS::Lambda::Url", {"AuthType": "AWS_IAM", "InvokeMode": "RESPONSE_STREAM"})
    assert int(env["REQUEST_TIMEOUT_S"]) < properties["Timeout"]
    assert int(env["UPSTREAM_READ_TIMEOUT_S"]) <= int(env["REQUEST_TIMEOUT_S"])


def test_environment_is_what_the_handler_reads(default_templates):
    env = _function(default_templates["normalizer"])["Environment"]["Variables"]
    resolved = {name: value if isinstance(value, str) else "token" for name, value in env.items()}
    config = InvokeConfig.from_env(resolved)
    stage = load_stage()
    assert (config.endpoint_name, config.component_name) == (stage.endpoint_name, stage.component_name)
    assert config.settings.prefix_length == stage.routing.prefix_length
    assert config.settings.block_bytes == stage.normalizer.block_bytes
    assert config.tenancy == stage.normalizer.tenancy


def test_tenant_key_is_a_generated_secret_only_the_function_reads(default_templates):
    template = default_templates["normalizer"]
    secrets = template.find_resources("AWS::SecretsManager::Secret")
    assert len(secrets) == 1
    ((secret_id, secret),) = secrets.items()
    assert "GenerateSecretString" in secret["Properties"] and "SecretString" not in secret["Properties"]
    assert secret["Properties"]["GenerateSecretString"]["PasswordLength"] >= 32
    env = _function(template)["Environment"]["Variables"]
    assert env["TENANT_KEY_SECRET_ARN"] == {"Ref": secret_id}  # where the key is, never the key
    assert "resolve:secretsmanager" not in str(template.to_json())
    statements = [s for s in _policy_statements(template) if "secretsmanager" in str(s["Action"])]
    assert statements == [{"Action": "secretsmanager:GetSecretValue", "Effect": "Allow",
                           "Resource": {"Ref": secret_id}}]


_ISOLATED_CHECK = """
import json, sys
sys.path.insert(0, sys.argv[1])
import botocore, boto3
from botocore.session import get_session
model = get_session().get_service_model("sagemaker-runtime")
members = {name: sorted(model.operation_model(name).input_shape.members)
           for name in ("InvokeEndpoint", "InvokeEndpointWithResponseStream")}
import handler
print(json.dumps({"botocore": botocore.__file__, "boto3": boto3.__file__, "version": botocore.__version__,
                  "members": members, "handler": handler.__file__, "path": sys.path}))
"""


def _run_isolated(asset: Path) -> subprocess.CompletedProcess:
    # -I: no PYTHONPATH, no user site; -S: no site-packages at all, so only the asset and the
    # standard library can answer an import (as on a Lambda runtime whose bundled SDK is older);
    # -B: the asset stays as synthesized.
    return subprocess.run([sys.executable, "-I", "-S", "-B", "-c", _ISOLATED_CHECK, str(asset)], capture_output=True,
                          text=True, timeout=120, cwd=asset, env={"AWS_DEFAULT_REGION": "us-east-1"})


def test_the_asset_carries_its_own_sdk_that_knows_prefix_aware_id(default_stage):
    stacks, _ = default_stage
    (asset,) = [p for p in Path(stacks.normalizer.node.root.outdir).glob("asset.*") if (p / "run.sh").is_file()]
    # Only bytecode for the function's runtime (python3.14) is shipped: this machine's Python's would be
    # for another interpreter (tests/stacks/test_normalizer_bytecode.py checks the files themselves).
    assert {p.name.split(".")[-2] for p in asset.rglob("*.pyc")} == {"cpython-314"}
    result = _run_isolated(asset)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    for module in ("botocore", "boto3", "handler"):
        assert Path(found[module]).resolve().is_relative_to(asset.resolve()), (module, found[module])
    assert found["version"] == _pinned("botocore")
    for operation, members in found["members"].items():
        assert {"PrefixAwareId", "InferenceComponentName", "EndpointName", "Body"} <= set(members), operation


def _pinned(package: str) -> str:
    """The version requirements-dev.txt pins; the Lambda's requirements must pin the same."""
    def pins(path: Path) -> dict[str, str]:
        lines = [l.split("#")[0].strip() for l in path.read_text().splitlines()]
        return dict(l.split("==", 1) for l in lines if "==" in l)
    dev, lam = pins(ROOT / "requirements-dev.txt"), pins(ROOT / "lambda" / "normalizer" / "requirements.txt")
    assert lam[package] == dev[package], (package, lam[package], dev[package])
    return dev[package]


def test_run_sh_puts_the_asset_first_then_the_adapter_example_path():
    run = (ROOT / "lambda" / "normalizer" / "run.sh").read_text()
    (line,) = [l for l in run.splitlines() if l.startswith("export PYTHONPATH=")]
    assert line == 'export PYTHONPATH="${LAMBDA_TASK_ROOT}:/opt/python:${LAMBDA_RUNTIME_DIR}${PYTHONPATH:+:${PYTHONPATH}}"'


def test_the_function_gets_replication_off_and_the_copy_bounds(default_templates):
    env = _function(default_templates["normalizer"])["Environment"]["Variables"]
    stage = load_stage()
    assert {name: env[name] for name in (
        "REPLICATION_ENABLED", "REPLICATION_MAX_REPLICAS", "REPLICATION_TARGET_SHARE_FACTOR",
        "REPLICATION_HALF_LIFE_S", "REPLICATION_MIN_REQUESTS", "REPLICATION_STEERING", "COPIES_MIN", "COPIES_MAX",
    )} == {"REPLICATION_ENABLED": "false", "REPLICATION_MAX_REPLICAS": "32", "REPLICATION_TARGET_SHARE_FACTOR": "0.05",
           "REPLICATION_HALF_LIFE_S": "300.0", "REPLICATION_MIN_REQUESTS": "12.0", "REPLICATION_STEERING": "true",
           "COPIES_MIN": str(stage.endpoint.copies_min), "COPIES_MAX": str(stage.endpoint.copies_max)}
    config = InvokeConfig.from_env({name: value if isinstance(value, str) else "token" for name, value in env.items()})
    assert config.replication.enabled is False
    assert (config.copies_min, config.copies_max) == (stage.endpoint.copies_min, stage.endpoint.copies_max)


def test_tenants_get_a_policy_for_the_url_and_invoke_only_through_it(default_templates):
    template = default_templates["normalizer"]
    (policy,) = template.find_resources("AWS::IAM::ManagedPolicy").values()
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    (function_id,) = [k for k, f in template.find_resources("AWS::Lambda::Function").items()
                      if f["Properties"]["Handler"] == "run.sh"]
    function_arn = {"Fn::GetAtt": [function_id, "Arn"]}
    assert sorted((s["Action"], json.dumps(s["Condition"], sort_keys=True)) for s in statements) == [
        ("lambda:InvokeFunction", '{"Bool": {"lambda:InvokedViaFunctionUrl": "true"}}'),
        ("lambda:InvokeFunctionUrl", '{"StringEquals": {"lambda:FunctionUrlAuthType": "AWS_IAM"}}'),
    ]
    assert all(s["Resource"] == function_arn and s["Effect"] == "Allow" for s in statements)
    outputs = template.find_outputs("TenantInvokePolicy")
    assert len(outputs) == 1
    # By default direct invocations are refused and no other account is named in the resource policy.
    assert _function(template)["Environment"]["Variables"]["ALLOW_DIRECT_INVOKE"] == "false"
    assert not template.find_resources("AWS::Lambda::Permission")
