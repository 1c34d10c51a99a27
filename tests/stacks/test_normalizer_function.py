from prefix_routing.config import load_stage


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
    statements = [s for s in _policy_statements(default_templates["normalizer"]) if "sagemaker" in str(s["Action"])]
    assert len(statements) == 1
    (statement,) = statements
    assert sorted(statement["Action"]) == ["sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream"]
    resources = statement["Resource"]
    assert "*" not in resources and len(resources) == 2
    joined = [str(r) for r in resources]
    assert any(f":endpoint/{config.endpoint_name}" in r for r in joined)
    assert any(f":inference-component/{config.component_name}" in r for r in joined)
    assert not any(r.rstrip("']}\"").endswith("*") for r in joined)


def test_no_wildcard_action_anywhere(default_templates):
    for statement in _policy_statements(default_templates["normalizer"]):
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert all("*" not in action for action in actions), statement


def test_asset_carries_the_handler_and_the_stdlib_library(default_stage):
    stacks, _ = default_stage
    from pathlib import Path

    asset_dirs = [p for p in Path(stacks.normalizer.node.root.outdir).glob("asset.*") if p.is_dir()]
    assert asset_dirs
    contents = {p.relative_to(asset_dirs[0]).as_posix() for p in asset_dirs[0].rglob("*.py")}
    assert "handler.py" in contents
    assert "prefix_routing/telemetry.py" in contents
    assert "prefix_routing/config.py" not in contents  # pydantic-based, synth only
    assert any(c.startswith("aws_lambda_powertools/") for c in contents)
