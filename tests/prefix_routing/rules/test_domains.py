"""Trust domains: which domain a tenant's requests go to, the rule's own checks, its environment
form, and where tenants share a cache that salt does not wall off."""

from __future__ import annotations

import pytest

from prefix_routing.rules.domains import SALT_ISOLATES, TrustDomains, first_match, shared_without_salt

ACME = "arn:aws:iam::111122223333:role/acme"
GLOBEX = "arn:aws:iam::111122223333:role/globex"

DOMAINS = TrustDomains(
    components=(("shared", "s-shared-ic"), ("acme", "s-acme-ic"), ("partners", "s-partners-ic")),
    tenants=(("arn:aws:iam::111122223333:role/*", "partners"), (ACME, "acme")),
    default="shared",
)


def test_a_tenants_own_id_wins_over_an_earlier_pattern():
    assert DOMAINS.domain_for(ACME) == "acme"


def test_a_pattern_takes_the_tenants_it_matches():
    assert DOMAINS.domain_for(GLOBEX) == "partners"


def test_a_tenant_no_domain_names_goes_to_the_default_or_is_refused():
    assert DOMAINS.domain_for("arn:aws:iam::999999999999:user/x") == "shared"
    refusing = TrustDomains(components=DOMAINS.components, tenants=DOMAINS.tenants, default=None)
    assert refusing.domain_for("arn:aws:iam::999999999999:user/x") is None
    assert refusing.domain_for(GLOBEX) == "partners"


def test_first_match_reads_patterns_in_the_order_written():
    assert first_match("team-a-1", ["team-*", "team-a-*"]) == 0
    assert first_match("team-a-1", ["x", "team-a-?"]) == 1
    assert first_match("team-a-1", ["team-b-*"]) is None
    assert first_match("a*", ["a*"]) == 0  # an id that looks like a pattern matches itself first


def test_a_component_per_domain():
    assert DOMAINS.component_of("acme") == "s-acme-ic"


def test_the_environment_form_round_trips():
    assert TrustDomains.from_json(DOMAINS.to_json()) == DOMAINS


@pytest.mark.parametrize("text, words", [
    ("not json", "not JSON"),
    ('{"components": 3}', "list of components"),
    ('{"components": [["a"]]}', "[name, name] pairs"),
    ('{"components": [["a", "c"]], "default": 5}', "default must be"),
    ('{"components": [["a", "c"]], "tenants": [["t", "b"]]}', "names domain 'b'"),
])
def test_a_malformed_environment_value_names_what_is_wrong(text, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        TrustDomains.from_json(text)


def test_the_rule_refuses_a_tenant_in_two_domains_and_an_unknown_default():
    with pytest.raises(ValueError, match="in two domains"):
        TrustDomains(components=(("a", "ca"), ("b", "cb")), tenants=(("t", "a"), ("t", "b")))
    with pytest.raises(ValueError, match="default_domain 'c'"):
        TrustDomains(components=(("a", "ca"),), default="c")
    with pytest.raises(ValueError, match="each named once"):
        TrustDomains(components=(("a", "ca"), ("a", "cb")))
    with pytest.raises(ValueError, match="1 to 8"):
        TrustDomains(components=())


def test_which_engines_isolate_by_salt():
    assert SALT_ISOLATES == {"vllm": True, "djl-lmi": False, "llama.cpp": False}


def test_tenants_together_on_an_engine_without_salt_are_named():
    lines = shared_without_salt("djl-lmi", {"a": [ACME], "b": [GLOBEX, "x"], "c": ["team-*"]}, None, "iam")
    assert len(lines) == 2
    assert "domain 'b'" in lines[0] and GLOBEX in lines[0] and "x" in lines[0]
    assert "domain 'c'" in lines[1] and "team-*" in lines[1]


def test_the_default_domain_takes_unknown_tenants_so_it_is_shared():
    lines = shared_without_salt("llama.cpp", {"a": [ACME], "shared": []}, "shared", "iam")
    assert len(lines) == 1 and "'shared'" in lines[0] and "every tenant no domain names" in lines[0]


def test_no_warning_where_salt_isolates_or_one_tenant_per_domain_or_no_tenancy():
    assert shared_without_salt("vllm", {"b": [GLOBEX, "x"]}, None, "iam") == []
    assert shared_without_salt("djl-lmi", {"a": [ACME], "b": [GLOBEX]}, None, "iam") == []
    assert shared_without_salt("djl-lmi", {}, None, "none") == []


def test_without_domains_every_tenant_shares_one_component():
    lines = shared_without_salt("djl-lmi", {}, None, "header")
    assert len(lines) == 1 and "every tenant shares one component" in lines[0]


# -- exact words and bounds (each message names the field, the value and what is allowed)

def test_the_rules_messages_word_for_word():
    with pytest.raises(ValueError) as raised:
        TrustDomains(components=(("a", "ca"), ("a", "cb")))
    assert str(raised.value) == "domains: 2 domains (a, a); allowed: 1 to 8, each named once"
    with pytest.raises(ValueError) as raised:
        TrustDomains(components=(("a", "ca"),), tenants=(("t", "b"),))
    assert str(raised.value) == "domains: tenant 't' names domain 'b'; the domains: a"
    with pytest.raises(ValueError) as raised:
        TrustDomains(components=(("a", "ca"), ("b", "cb")), tenants=(("t", "a"), ("t", "b")))
    assert str(raised.value) == "domains: tenant 't' is in two domains (a and b); allowed: one domain per tenant"
    with pytest.raises(ValueError) as raised:
        TrustDomains(components=(("a", "ca"),), tenants=(("bad\n", "a"),))
    assert str(raised.value) == "domains.a.tenants: string \"bad\\n\"; allowed: a tenant id or pattern of 1-256 printable characters"


def test_the_rules_bounds_on_both_sides():
    eight = tuple((f"d{i}", f"c{i}") for i in range(8))
    assert len(TrustDomains(components=eight).components) == 8
    with pytest.raises(ValueError, match="9 domains"):
        TrustDomains(components=eight + (("d8", "c8"),))
    sixty_four = tuple((f"t{i}", "d0") for i in range(64))
    assert len(TrustDomains(components=eight, tenants=sixty_four).tenants) == 64
    with pytest.raises(ValueError) as raised:
        TrustDomains(components=eight, tenants=sixty_four + (("t64", "d0"),))
    assert str(raised.value) == "domains: 65 tenant entries; allowed: at most 64"
    assert TrustDomains(components=eight, tenants=(("x" * 256, "d0"),)).domain_for("x" * 256) == "d0"
    for bad in ("x" * 257, "", 7):
        with pytest.raises(ValueError, match="1-256 printable"):
            TrustDomains(components=eight, tenants=((bad, "d0"),))


def test_a_bracket_makes_a_pattern():
    assert first_match("team-b", ["team-[ab]"]) == 0


def test_the_environment_form_is_compact_and_exact():
    rule = TrustDomains(components=(("a", "ca"),), tenants=(("t", "a"),), default=None)
    assert rule.to_json() == '{"components":[["a","ca"]],"tenants":[["t","a"]],"default":null}'


@pytest.mark.parametrize("text, message", [
    ("[]", "DOMAINS: expected an object with a list of components"),
    ('{"components": [["a", "c"]], "default": 5}', "DOMAINS: default must be a domain's name or null, got number 5"),
    ('{"components": "x"}', "DOMAINS: expected an object with a list of components"),
    ('{"components": [["a", 1]]}', "DOMAINS: components must be a list of [name, name] pairs"),
    ('{"components": [["a", "c"]], "tenants": [["t"]]}', "DOMAINS: tenants must be a list of [name, name] pairs"),
])
def test_the_environment_forms_errors_word_for_word(text, message):
    with pytest.raises(ValueError) as raised:
        TrustDomains.from_json(text)
    assert str(raised.value) == message


def test_the_warnings_word_for_word():
    assert shared_without_salt("djl-lmi", {"b": [GLOBEX, "x"]}, None, "iam") == [
        f"domain 'b' puts tenants together ({GLOBEX}, x) on djl-lmi, which ignores cache_salt: they share its "
        "copies' KV cache"]
    assert shared_without_salt("llama.cpp", {"shared": []}, "shared", "iam") == [
        "domain 'shared' puts tenants together (no tenant by name and every tenant no domain names) on llama.cpp, "
        "which ignores cache_salt: they share its copies' KV cache"]
    assert shared_without_salt("djl-lmi", {}, None, "iam") == [
        "every tenant shares one component on djl-lmi, which ignores cache_salt: a tenant can tell from its first "
        "token's time how another's prompts begin; give tenants who must not share a cache their own [domains.<name>]"]


def test_an_engine_not_in_the_table_is_not_trusted_to_isolate():
    assert len(shared_without_salt("some-new-engine", {"b": [ACME, GLOBEX]}, None, "iam")) == 1
