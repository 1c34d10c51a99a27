"""A stage's trust domains: what parses, what each domain's component is called, and the one-line
errors for names, the default domain, tenants in two domains, copies that do not fit, and isolation."""

from __future__ import annotations

import copy

import pytest

from prefix_routing.rules.domains import TrustDomains
from prefix_routing.stage.config import DEFAULT_STAGE_DATA, ConfigError, parse_stage

ACME = "arn:aws:iam::111122223333:role/acme"
GLOBEX = "arn:aws:iam::111122223333:role/globex"


def stage(domains=None, tenancy=None, framework="vllm", **endpoint):
    # The default stage: ml.g6e.xlarge (1 GPU, 1 copy per instance), 2-3 instances, 2-3 copies.
    data = copy.deepcopy(DEFAULT_STAGE_DATA)
    data["model"]["framework"] = framework
    data["endpoint"].update(endpoint)
    if domains is not None:
        data["domains"] = domains
    if tenancy is not None:
        data["tenancy"] = tenancy
    return data


def problems(data) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        parse_stage(data, source="stage.toml")
    return raised.value.problems


TWO = {"default": {"copies_min": 1, "copies_max": 2}, "acme": {"tenants": [ACME], "copies_min": 1, "copies_max": 1}}


def test_two_domains_give_a_component_each_and_the_front_doors_rule():
    config = parse_stage(stage(TWO), source="t")
    assert config.trust_domains() == TrustDomains(
        components=(("default", "default-default-ic"), ("acme", "default-acme-ic")),
        tenants=((ACME, "acme"),), default="default")


def test_no_domains_no_rule():
    assert parse_stage(stage(), source="t").trust_domains() is None


def test_refusing_unknown_tenants_needs_no_default_domain_and_takes_none():
    config = parse_stage(stage({"acme": {"tenants": [ACME], "copies_min": 1}}, {"unknown_tenants": "refuse"}),
                         source="t")
    assert config.trust_domains().default is None
    [line] = problems(stage({"acme": {"tenants": [ACME], "copies_min": 1}},
                            {"unknown_tenants": "refuse", "default_domain": "nowhere"}))
    assert line.endswith('tenancy.default_domain: set while tenancy.unknown_tenants = "refuse", which serves no tenant '
                         'in a default domain; allowed: leave it out, or tenancy.unknown_tenants = "default"')


# ----------------------------------------------------------------------------- entries that never apply


def test_a_catch_all_before_another_domain_takes_its_tenants_and_is_refused():
    shadowing = {"catchall": {"tenants": ["*"], "copies_min": 1},
                 "acme": {"tenants": ["arn:aws:iam::111122223333:role/acme-*", ACME], "copies_min": 1}}
    [line] = problems(stage(shadowing, {"default_domain": "catchall"}))
    assert line.endswith("domains: domains.acme tenant 'arn:aws:iam::111122223333:role/acme-*' never applies: the "
                         "earlier pattern '*' (domains.catchall) takes every tenant it matches; allowed: a pattern "
                         "before the more general ones that would take its tenants, or none")
    # The other way round, or an exact id after the catch-all (a tenant's own id comes first): both apply.
    reordered = {"acme": shadowing["acme"], "catchall": shadowing["catchall"]}
    assert parse_stage(stage(reordered, {"default_domain": "catchall"}), source="t").domains
    exact_after = {"catchall": {"tenants": ["*"], "copies_min": 1}, "acme": {"tenants": [ACME], "copies_min": 1}}
    assert parse_stage(stage(exact_after, {"default_domain": "catchall"}), source="t").domains


def test_a_narrower_pattern_after_a_wider_one_is_named_with_both():
    found = problems(stage({"default": {"copies_min": 1},
                            "a": {"tenants": ["arn:aws:iam::*:role/team-*"], "copies_min": 1},
                            "b": {"tenants": ["arn:aws:iam::111122223333:role/team-?x"], "copies_min": 1}},
                           instances_max=3))
    assert len(found) == 1 and "domains.b tenant 'arn:aws:iam::111122223333:role/team-?x' never applies" in found[0]
    assert "'arn:aws:iam::*:role/team-*' (domains.a)" in found[0]


def test_a_domain_that_names_no_tenant_and_is_not_the_default_serves_no_one():
    [line] = problems(stage({"default": {"copies_min": 1}, "spare": {"copies_min": 1}}))
    assert line.endswith('domains: domains.spare name no tenants and are not the default domain: their copies would '
                         'serve no request; allowed: tenants = [...], or tenancy.default_domain naming it (with '
                         'tenancy.unknown_tenants = "default")')
    # With unknown tenants refused there is no default domain: a domain without tenants serves no one either.
    [line] = problems(stage({"acme": {"tenants": [ACME], "copies_min": 1}, "default": {"copies_min": 1}},
                            {"unknown_tenants": "refuse"}))
    assert "domains.default name no tenants" in line


@pytest.mark.parametrize("tenancy, named", [
    ({"default_domain": "acme"}, "tenancy.default_domain"),
    ({"unknown_tenants": "refuse"}, "tenancy.unknown_tenants"),
    ({"default_domain": "shared", "unknown_tenants": "refuse"}, "tenancy.default_domain, tenancy.unknown_tenants"),
])
def test_tenancy_settings_on_a_stage_without_domains_are_refused(tenancy, named):
    [line] = problems(stage(None, tenancy))
    assert line.endswith(f"{named}: set on a stage without [domains.<name>], where every tenant is served by the one "
                         "component; allowed: leave them out, or add the domains they choose between")
    # require_isolation takes effect without domains (every tenant shares the one component), and the
    # defaults written out change nothing (a stage dumped and read again): allowed
    assert parse_stage(stage(None, {"require_isolation": False, "default_domain": "default",
                                    "unknown_tenants": "default"}), source="t")


@pytest.mark.parametrize("domains, tenancy, words", [
    ({"Acme": {}}, None, "domains.Acme: the name 'Acme'"),
    ({"a--b": {}}, None, "single hyphens"),
    ({"x" * 60: {}}, None, "has 71 characters; allowed: at most 63"),  # "default-" + 60 + "-ic"
    ({"acme": {"tenants": [ACME]}}, None, "tenancy.default_domain 'default' is not one of the domains (acme)"),
    ({"default": {"tenants": [ACME], "copies_min": 1}, "acme": {"tenants": [ACME], "copies_min": 1}}, None,
     f"tenant '{ACME}' is in both 'default' and 'acme'"),
    ({"default": {"copies_min": 2, "copies_max": 1}}, None, "domains.default: copies_min (2) is above copies_max (1)"),
    ({"default": {"copies_min": 1, "copies_max": 4}}, None, "copies_max (4) exceeds the 3 copies"),
    # Each domain defaults to the endpoint's copies_min (2): two domains need 4 copies, 3 instances hold 3.
    ({"default": {}, "acme": {"tenants": [ACME]}}, None, "their copies_min add up to 4, more than the 3 copies"),
    ({"default": {"tenants": ["has space"]}}, None, "tenant 'has space': allowed"),
])
def test_a_bad_domain_is_one_line_naming_the_field_and_the_rule(domains, tenancy, words):
    found = problems(stage(domains, tenancy))
    assert len(found) == 1 and words in found[0], found


def test_a_domain_may_not_set_an_unknown_field():
    assert any("domains.default.copies" in p for p in problems(stage({"default": {"copies": 1}})))


def test_tenants_together_on_an_engine_without_salt_warn():
    config = parse_stage(stage({"default": {"tenants": [ACME, GLOBEX], "copies_min": 1}}, framework="djl-lmi"),
                         source="t")
    [warning] = [w for w in config.warnings if w.startswith("tenancy:")]
    assert "domain 'default'" in warning and ACME in warning and GLOBEX in warning and "djl-lmi" in warning


def test_require_isolation_refuses_what_would_warn():
    found = problems(stage({"default": {"tenants": [ACME, GLOBEX], "copies_min": 1}}, {"require_isolation": True},
                           framework="djl-lmi"))
    assert len(found) == 1 and "tenancy.require_isolation" in found[0] and "domain 'default'" in found[0]


def test_one_tenant_per_domain_on_any_engine_is_isolated():
    config = parse_stage(stage({"a": {"tenants": [ACME], "copies_min": 1}, "b": {"tenants": [GLOBEX], "copies_min": 1}},
                               {"unknown_tenants": "refuse", "require_isolation": True}, framework="djl-lmi"),
                         source="t")
    assert not [w for w in config.warnings if w.startswith("tenancy:")]


def test_the_default_stage_on_vllm_is_not_warned():
    assert not [w for w in parse_stage(stage(), source="t").warnings if w.startswith("tenancy:")]


def test_the_front_doors_environment_carries_the_domains():
    from prefix_routing.stage.front_door_env import front_door_environment

    config = parse_stage(stage(TWO), source="t")
    assert TrustDomains.from_json(front_door_environment(config)["DOMAINS"]) == config.trust_domains()
    assert "DOMAINS" not in front_door_environment(parse_stage(stage(), source="t"))


def test_the_stages_domain_messages_word_for_word():
    [line] = problems(stage({"acme": {"tenants": [ACME]}}))
    assert line.endswith("tenancy.default_domain 'default' is not one of the domains (acme); name one, or set "
                         'tenancy.unknown_tenants = "refuse"')
    [line] = problems(stage({"default": {"tenants": ["t"], "copies_min": 1}, "acme": {"tenants": ["t"], "copies_min": 1}}))
    assert line.endswith("domains: tenant 't' is in both 'default' and 'acme'; allowed: one domain per tenant")
    [line] = problems(stage({"default": {}, "acme": {"tenants": [ACME]}}))
    assert line.endswith("domains: their copies_min add up to 4, more than the 3 copies the endpoint's instances_max "
                         "instances hold; lower the domains' copies_min")


def test_a_component_name_of_63_characters_is_allowed_64_is_not():
    name63 = "d" * (63 - len("default-") - len("-ic"))  # "default-" + 52 + "-ic" = 63
    assert parse_stage(stage({name63: {"copies_min": 1}}, {"default_domain": name63}), source="t").domains
    [line] = problems(stage({name63 + "e": {"copies_min": 1}}, {"default_domain": name63 + "e"}))
    assert "has 64 characters; allowed: at most 63" in line


def test_at_most_64_tenant_entries_in_all_domains():
    sixty_four = {"default": {"tenants": [f"t{i}" for i in range(40)], "copies_min": 1},
                  "other": {"tenants": [f"u{i}" for i in range(24)], "copies_min": 1}}
    assert parse_stage(stage(sixty_four), source="t").domains
    sixty_four["other"]["tenants"].append("u24")
    [line] = problems(stage(sixty_four))
    assert line.endswith("domains: 65 tenant ids or patterns in all; allowed: at most 64")
