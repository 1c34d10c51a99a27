"""Several inference components on one emulated endpoint (a stage's trust domains): each request
reaches its own component's copies, an unknown component is SageMaker's ValidationError."""

from __future__ import annotations

import copy
import json
import urllib.request

import boto3
import pytest
from botocore.config import Config

from prefix_routing.emulator.fleet_backend import start_emulator
from prefix_routing.stage.config import DEFAULT_STAGE_DATA, parse_stage


@pytest.fixture(scope="module")
def two_domains():
    data = copy.deepcopy(DEFAULT_STAGE_DATA)  # ml.g6e.xlarge: one copy per instance, 3 instances at most
    data["domains"] = {"default": {"copies_min": 1, "copies_max": 1}, "acme": {"tenants": ["acme"], "copies_min": 2,
                                                                                "copies_max": 2}}
    config = parse_stage(data, source="t")
    server = start_emulator(config, speed=1000.0)
    yield config, server
    server.stop()


def client(server):
    return boto3.client("sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1",
                        aws_access_key_id="t", aws_secret_access_key="t", config=Config(retries={"total_max_attempts": 1}))


BODY = json.dumps({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}).encode()


def test_each_component_has_its_own_copies(two_domains):
    config, server = two_domains
    runtime = client(server)
    for component, times in (("default-acme-ic", 3), ("default-default-ic", 1)):
        for _ in range(times):
            runtime.invoke_endpoint(EndpointName=config.endpoint_name, InferenceComponentName=component, Body=BODY,
                                    ContentType="application/json")
    components = json.loads(urllib.request.urlopen(f"{server.url}/status").read())["backend"]["components"]
    assert set(components) == {"default-default-ic", "default-acme-ic"}
    assert len(components["default-acme-ic"]["instances"]) == 2  # acme's own two copies
    assert sum(i["requests"] for i in components["default-acme-ic"]["instances"]) == 3
    assert sum(i["requests"] for i in components["default-default-ic"]["instances"]) == 1


def test_a_component_the_endpoint_does_not_host_is_a_validation_error(two_domains):
    config, server = two_domains
    with pytest.raises(client(server).exceptions.ValidationError, match="Inference Component nope-ic does not exist"):
        client(server).invoke_endpoint(EndpointName=config.endpoint_name, InferenceComponentName="nope-ic", Body=BODY,
                                       ContentType="application/json")


def test_components_need_one_backend_and_close_every_one():
    from prefix_routing.emulator.components import ComponentBackends

    with pytest.raises(ValueError, match="at least one component"):
        ComponentBackends({})
    closed = []

    class Closing:
        def __init__(self, name):
            self.name = name

        def handle(self, request):
            return None

        def close(self):
            closed.append(self.name)

    class Silent:  # neither status nor close
        def handle(self, request):
            return None

    backends = ComponentBackends({"a": Closing("a"), "b": Silent(), "c": Closing("c")})
    assert backends.primary == "a"
    backends.close()
    assert closed == ["a", "c"]
    assert backends.status() == {"components": {"a": {}, "b": {}, "c": {}}}
