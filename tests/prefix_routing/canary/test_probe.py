"""The canary's verdicts and the requests it sends, against a recording fake of the runtime; the
thresholds from the module's rule (the repeat at least half its prompt, the other tenant at most 32)."""

from __future__ import annotations

import json

import pytest

from prefix_routing.canary.probe import (TENANTS, Answer, DomainVerdict, answer_of, canary_body, canary_prompt,
                                         check_domain)
from prefix_routing.canary.run import domains_of, emf_document, run_canary
from prefix_routing.frontdoor.config import InvokeConfig
from prefix_routing.rules.domains import TrustDomains
from prefix_routing.rules.identity import routing_identity
from prefix_routing.rules.settings import NormalizerSettings

KEY = b"k" * 32


class Runtime:
    """Answers in turn from ``answers``; records (component, prefix_aware_id, body) of each call."""

    def __init__(self, *answers: Answer) -> None:
        self.answers, self.calls = list(answers), []

    def __call__(self, component: str, prefix_aware_id: str, body: bytes) -> Answer:
        self.calls.append((component, prefix_aware_id, body))
        return self.answers.pop(0)


@pytest.mark.parametrize(("repeat", "cold"), [(500, False), (499, True), (None, True), (1000, False)])
def test_the_repeat_must_find_half_its_prompt_cached(repeat, cold):
    assert DomainVerdict("d", "c", 1000, 0, repeat, 0).cache_cold is cold


@pytest.mark.parametrize(("other", "breach"), [(32, False), (33, True), (0, False), (None, False)])
def test_the_other_tenant_may_find_the_templates_tokens_only(other, breach):
    assert DomainVerdict("d", "c", 1000, 0, 1000, other).isolation_breach is breach


def test_one_domain_is_three_requests_a_a_b_with_the_front_doors_ids_and_salts():
    runtime = Runtime(Answer(800, 0), Answer(800, 790), Answer(800, 790))
    verdict = check_domain(runtime, domain="d", component="ic-d", key=KEY, settings=NormalizerSettings(),
                           prompt_tokens=300, nonce="n1")
    assert (verdict.first_cached, verdict.repeat_cached, verdict.other_cached) == (0, 790, 790)
    assert verdict.isolation_breach and not verdict.cache_cold
    (c1, id1, b1), (c2, id2, b2), (c3, id3, b3) = runtime.calls
    a, b = (routing_identity(tenant, None, KEY) for tenant in TENANTS)
    assert (c1, c2, c3) == ("ic-d",) * 3 and (id1, id2, id3) == (a.prefix_aware_id, a.prefix_aware_id, b.prefix_aware_id)
    assert b1 == b2 != b3
    assert json.loads(b1)["cache_salt"] == a.cache_salt and json.loads(b3)["cache_salt"] == b.cache_salt
    assert json.loads(b1)["messages"] == json.loads(b3)["messages"]  # the identical prompt
    assert b1.startswith(b'{"cache_salt":')  # first, as the front door puts it


def test_the_prompt_starts_with_its_nonce_and_differs_by_run_and_domain():
    assert canary_prompt(300, "abc").startswith("abc: canary.")
    runtime = Runtime(*[Answer(10, 0)] * 6)
    for domain in ("x", "y"):
        check_domain(runtime, domain=domain, component="c", key=KEY, settings=NormalizerSettings(), prompt_tokens=300,
                     nonce="run")
    first_x, first_y = (json.loads(runtime.calls[i][2])["messages"][0]["content"] for i in (0, 3))
    assert first_x[:16] != first_y[:16]


def _config(domains: TrustDomains | None) -> InvokeConfig:
    return InvokeConfig(endpoint_name="ep", component_name="ep-ic", domains=domains)


def test_with_salts_the_other_tenant_shares_the_domain_without_them_it_is_the_next_domains():
    domains = TrustDomains(components=(("a", "ic-a"), ("b", "ic-b")), default="b")
    assert domains_of(_config(domains)) == [("a", "ic-a"), ("b", "ic-b")]
    assert domains_of(_config(None)) == [("default", "ep-ic")]
    salted = Runtime(*[Answer(100, 60)] * 6)
    run_canary(salted, _config(domains), KEY, prompt_tokens=300, salted=True, nonce="n")
    assert [call[0] for call in salted.calls] == ["ic-a", "ic-a", "ic-a", "ic-b", "ic-b", "ic-b"]
    walled = Runtime(*[Answer(100, 60)] * 6)
    run_canary(walled, _config(domains), KEY, prompt_tokens=300, salted=False, nonce="n")
    assert [call[0] for call in walled.calls] == ["ic-a", "ic-a", "ic-b", "ic-b", "ic-b", "ic-a"]
    alone = Runtime(*[Answer(100, 60)] * 3)
    run_canary(alone, _config(None), KEY, prompt_tokens=300, salted=False, nonce="n")
    assert [call[0] for call in alone.calls] == ["ep-ic"] * 3  # one domain, no salts: its tenants share it


def test_the_answers_usage_and_the_metrics_line():
    usage = {"usage": {"prompt_tokens": 900, "prompt_tokens_details": {"cached_tokens": 850}}}
    assert answer_of(json.dumps(usage).encode()) == Answer(900, 850)
    assert answer_of(b'{"usage": {"prompt_tokens": 9}}') == Answer(9, None)
    with pytest.raises(ValueError, match="no usage.prompt_tokens"):
        answer_of(b'{"choices": []}')
    line = json.loads(emf_document(DomainVerdict("a", "ic-a", 1000, 0, 400, 900), 1_700_000_000_000))
    assert line["CanaryIsolationBreach"] == 1 and line["CanaryCacheCold"] == 1 and line["InferenceComponent"] == "ic-a"
    assert line["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["InferenceComponent"]]
    assert [m["Name"] for m in line["_aws"]["CloudWatchMetrics"][0]["Metrics"]] == ["CanaryIsolationBreach",
                                                                                    "CanaryCacheCold"]


def test_each_verdicts_line_word_for_word():
    assert DomainVerdict("a", "ic-a", 1000, 0, 990, 0).line() == \
        "✔ domain a (ic-a): repeat 990 of 1,000 cached; the other tenant 0"
    assert DomainVerdict("a", "ic-a", 1000, 0, 990, None).line() == \
        "✔ domain a (ic-a): repeat 990 of 1,000 cached; the other tenant no count"
    assert DomainVerdict("a", "ic-a", 1200, 0, 100, 1100).line() == (
        "✘ domain a (ic-a): isolation breach: the other tenant found 1,100 of 1,200 prompt tokens cached (at most 32 "
        "allowed); cache cold: the repeat found 100 of 1,200 cached")
    assert DomainVerdict("a", "ic-a", 1200, 0, None, 0).line() == \
        "✘ domain a (ic-a): cache cold: the repeat found no cached-token count of 1,200 cached"
    assert DomainVerdict("a", "ic-a", 1000, 3, 990, 40).as_dict() == {
        "domain": "a", "component": "ic-a", "prompt_tokens": 1000, "first_cached": 3, "repeat_cached": 990,
        "other_cached": 40, "isolation_breach": True, "cache_cold": False}


def test_the_prompt_and_body_word_for_word():
    prompt = canary_prompt(20, "n0nce")
    # 20 - 16 = 4 words after the fixed sentence, drawn from the word list by (i * 7 + len(nonce)) % 16
    assert prompt == "n0nce: canary. Repeat nothing; answer with one word. copper tundra meadow ember"  # 5, 12, 3, 10
    assert canary_prompt(1, "x").endswith("word. " + "harbour")  # at least one word
    prefix_aware_id, body = canary_body("hello", TENANTS[0], KEY, NormalizerSettings())
    data = json.loads(body)
    assert prefix_aware_id == routing_identity(TENANTS[0], None, KEY).prefix_aware_id
    assert (data["max_tokens"], data["temperature"], data["messages"]) == (1, 0, [{"role": "user", "content": "hello"}])


def test_a_negative_or_odd_cached_count_is_no_count_and_the_metrics_line_carries_the_figures():
    odd = {"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": -1}}}
    assert answer_of(json.dumps(odd).encode()) == Answer(9, None)
    assert answer_of(b'{"usage": {"prompt_tokens": 9, "prompt_tokens_details": []}}') == Answer(9, None)
    with pytest.raises(ValueError):
        answer_of(b"[1]")
    line = json.loads(emf_document(DomainVerdict("a", "ic-a", 1000, 0, 990, 0), 1_700_000_000_000))
    assert (line["CanaryIsolationBreach"], line["CanaryCacheCold"]) == (0, 0)
    assert (line["domain"], line["prompt_tokens"], line["repeat_cached"], line["other_cached"]) == ("a", 1000, 990, 0)
    assert line["_aws"]["Timestamp"] == 1_700_000_000_000 and line["_aws"]["CloudWatchMetrics"][0]["Namespace"] == \
        "PrefixRouting"
    assert [m["Unit"] for m in line["_aws"]["CloudWatchMetrics"][0]["Metrics"]] == ["Count", "Count"]
