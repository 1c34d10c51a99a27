"""The front door with trust domains: each tenant's requests go to its domain's component, with its
own routing id inside it; a tenant no domain names goes to the default domain or gets a 403."""

from __future__ import annotations

import pytest

from prefix_routing import frontdoor
from prefix_routing.rules.domains import TrustDomains
from prefix_routing.rules.identity import routing_identity
from tests.prefix_routing.frontdoor.conftest import KEY, ROLE_TENANT, FakeRuntime, config, url_event

OTHER_ARN = "arn:aws:sts::444455556666:assumed-role/Partner/session-9"
OTHER_TENANT = "arn:aws:iam::444455556666:role/Partner"


def domains(default="shared"):
    return TrustDomains(components=(("shared", "s-shared-ic"), ("chat", "s-chat-ic")),
                        tenants=((ROLE_TENANT, "chat"),), default=default)


def call(user_arn, domain_rule, lines):
    runtime = FakeRuntime()
    invoker = frontdoor.Invoker(runtime, config(domains=domain_rule), KEY, emit=lines)
    answer = invoker.buffered(frontdoor.request_from_event(url_event(user_arn=user_arn)))
    return answer, runtime


def test_a_named_tenant_goes_to_its_domains_component_with_its_own_routing_id(lines):
    answer, runtime = call("arn:aws:sts::111122223333:assumed-role/ChatApp/session-1", domains(), lines)
    assert answer.status == 200
    (params,) = runtime.calls
    assert params["InferenceComponentName"] == "s-chat-ic"
    assert params["PrefixAwareId"] == routing_identity(ROLE_TENANT, None, KEY).prefix_aware_id
    log = lines.requests[-1]
    assert (log["domain"], log["inference_component"]) == ("chat", "s-chat-ic")
    assert lines.emf[-1]["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["InferenceComponent"]]
    assert lines.emf[-1]["InferenceComponent"] == "s-chat-ic"  # the domain's metrics are its own


def test_an_unnamed_tenant_goes_to_the_default_domain(lines):
    answer, runtime = call(OTHER_ARN, domains(), lines)
    assert answer.status == 200 and runtime.calls[0]["InferenceComponentName"] == "s-shared-ic"
    assert lines.requests[-1]["domain"] == "shared"


def test_an_unnamed_tenant_is_refused_when_the_stage_says_so(lines):
    answer, runtime = call(OTHER_ARN, domains(default=None), lines)
    assert answer.status == 403 and answer.body["error"]["code"] == "unknown_tenant"
    assert runtime.calls == []  # never reaches the endpoint
    assert lines.requests[-1]["status"] == 403


def test_without_domains_the_log_line_has_no_domain(lines):
    answer, runtime = call(OTHER_ARN, None, lines)
    assert answer.status == 200 and runtime.calls[0]["InferenceComponentName"] == "test-prefix-llm-ic"
    assert "domain" not in lines.requests[-1]


def test_the_environment_carries_the_domains():
    env = {"ENDPOINT_NAME": "ep", "DOMAINS": domains().to_json()}
    assert frontdoor.InvokeConfig.from_env(env).domains == domains()
    with pytest.raises(frontdoor.ConfigurationError, match="DOMAINS is not JSON"):
        frontdoor.InvokeConfig.from_env({"ENDPOINT_NAME": "ep", "DOMAINS": "{"})
