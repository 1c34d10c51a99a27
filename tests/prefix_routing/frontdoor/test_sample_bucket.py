"""The sample bucket and the hot flag in the front door's log line, and what a sampled reader makes of them.

Expected buckets are computed here from the rule's statement (BLAKE2b, 8 bytes, little-endian, mod
10,000 over ``<PrefixAwareId>\\0<fingerprint>``); hot flags from the replication rule by hand, as in
test_replicas.py: with n requests of one prefix and nothing else its share is n / 32, and on 4
copies with factor 0.1 it is hot (k > 1) from the first request on.
"""

from __future__ import annotations

import hashlib
import json

from prefix_routing import frontdoor
from prefix_routing.lab import traces
from prefix_routing.rules import sampling
from prefix_routing.rules.replication import ReplicationSettings
from prefix_routing.rules.telemetry import LogField as F
from tests.prefix_routing.frontdoor.conftest import CHAT, KEY, FakeRuntime, config, url_event
from tests.prefix_routing.frontdoor.test_replicas import TENANT_ID
from tests.prefix_routing.rules.test_sampling import matches


def _bucket(routing_id: str, fingerprint: str) -> int:
    digest = hashlib.blake2b(f"{routing_id}\0{fingerprint}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 10_000


def _body(i: int) -> bytes:
    return json.dumps(dict(CHAT, messages=[{"role": "user", "content": f"question number {i} about something"}])).encode()


def _hot_config(enabled: bool, factor: float = 0.1):
    settings = ReplicationSettings(enabled=enabled, max_replicas=4, target_share_factor=factor, half_life_s=60.0,
                                   min_requests=1.0)
    return config(replication=settings, copies_min=4, copies_max=4)


def send(invoker, body: bytes) -> None:
    assert invoker.buffered(frontdoor.request_from_event(url_event(body=body))).status == 200


def test_every_sent_line_carries_its_keys_bucket(lines):
    invoker = frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=lines)
    for i in (1, 2, 1):
        send(invoker, _body(i))
    logged = lines.requests
    assert [line[F.SAMPLE_BUCKET] for line in logged] == [
        _bucket(TENANT_ID, line[F.PREFIX_FINGERPRINT]) for line in logged]
    assert logged[0][F.SAMPLE_BUCKET] == logged[2][F.SAMPLE_BUCKET]  # one key, one bucket
    assert [line[F.SAMPLE_HOT] for line in logged] == [False] * 3  # no replication rule configured hot


def test_a_rejected_request_has_no_bucket(lines):
    invoker = frontdoor.Invoker(FakeRuntime(), config(), KEY, emit=lines)
    assert invoker.buffered(frontdoor.request_from_event(url_event(body=b"{not json"))).status == 400
    (line,) = lines.requests
    assert line[F.SAMPLE_BUCKET] is None and line[F.SAMPLE_HOT] is False


def test_a_hot_prefix_is_flagged_with_replication_on_and_off(lines):
    for enabled in (True, False):
        lines.lines.clear()
        invoker = frontdoor.Invoker(FakeRuntime(), _hot_config(enabled), KEY, emit=lines)
        for _ in range(3):
            send(invoker, _body(0))
        assert [line[F.SAMPLE_HOT] for line in lines.requests] == [True] * 3, enabled
    # Factor 1000 on 4 copies: hot above 250 times the whole traffic: never.
    lines.lines.clear()
    cold = frontdoor.Invoker(FakeRuntime(), _hot_config(False, factor=1000.0), KEY, emit=lines)
    send(cold, _body(0))
    assert lines.requests[0][F.SAMPLE_HOT] is False


def test_a_hot_prefix_is_never_sampled_away(lines, tmp_path):
    # One prompt in every other request, the rest a prompt each; a rule that calls a prefix hot once it
    # has more than a quarter of the traffic on 4 copies (factor 1: share x 4 > 1). The prompt's key
    # is outside the sample, so without its flag the sample would lose it.
    invoker = frontdoor.Invoker(FakeRuntime(), _hot_config(False, factor=1.0), KEY, emit=lines)
    hot_body = _body(-1)
    for i in range(200):
        send(invoker, _body(i))
        send(invoker, hot_body)
    logged = lines.requests
    hot_fingerprint = logged[1][F.PREFIX_FINGERPRINT]
    hot_lines = [line for line in logged if line[F.PREFIX_FINGERPRINT] == hot_fingerprint]
    flagged = sum(line[F.SAMPLE_HOT] for line in hot_lines)
    # Shares count against at least 32 requests: the 9th request of the prompt is its first hot one
    # (9/32 x 4 = 1.125); from then on it keeps about half of the traffic.
    assert len(hot_lines) == 200 and [line[F.SAMPLE_HOT] for line in hot_lines[7:10]] == [False, True, True]
    bucket = hot_lines[0][F.SAMPLE_BUCKET]
    assert bucket > 0  # (fixed inputs: this key's bucket)
    rate = bucket / 10_000  # the largest sample the prompt's key is outside of
    assert sampling.bucket_limit(rate) == bucket
    pattern = sampling.filter_pattern(rate)
    # What FilterLogEvents returns (CloudWatch's rule), and what our reader keeps of it.
    returned = [line for line in logged if matches(pattern, line)]
    assert sum(line[F.PREFIX_FINGERPRINT] == hot_fingerprint for line in returned) == flagged
    path = tmp_path / "window.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in returned))
    window = traces.read_request_log(path, sample_rate=rate)
    every = round(1 / rate)
    kept_hot = -(-flagged // every)  # one in `every` of the flagged lines, the first always
    in_sample = sum(line[F.SAMPLE_BUCKET] < sampling.bucket_limit(rate) for line in logged)
    assert len(window) == in_sample + kept_hot and kept_hot >= 1
    # Without the flag the prompt is gone from the same sample.
    unflagged = [dict(line, **{F.SAMPLE_HOT: False}) for line in logged]
    assert not any(matches(pattern, line) and line[F.PREFIX_FINGERPRINT] == hot_fingerprint for line in unflagged)
