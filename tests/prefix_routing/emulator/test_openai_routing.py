"""The emulator's OpenAI-compatible path routes as SageMaker documents it: on the messages' text
(PrefixLength characters) and the body's prompt_cache_key, not on body bytes and the header."""

import http.client
import json

from prefix_routing.emulator.fleet_backend import start_emulator
from prefix_routing.stage.config import load_stage

SYSTEM = "You are the support agent of a large shop. " * 200  # > PrefixLength characters


def _chat(server, body: bytes) -> tuple:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    conn.request("POST", f"/endpoints/{server.backend_endpoint}/openai/v1/chat/completions", body=body,
                 headers={"Content-Type": "application/json", "Authorization": "Bearer test-token"})
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.status == 200
    server.wait_until_idle(10)
    served = server.backend.served[server.requests[-1].request.request_id]
    return served.instance, served.copy


def _start():
    config = load_stage("llama70b-p5")  # up to 7 instances: room to land apart
    server = start_emulator(config, speed=200.0)
    server.backend_endpoint = config.endpoint_name
    return server


def test_same_text_in_another_json_layout_lands_on_the_same_copy():
    compact = json.dumps({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
                          "max_tokens": 2, "prompt_cache_key": "tenant-a"}, separators=(",", ":")).encode()
    # parameters first, keys reordered, indented: other bytes within PrefixLength, the same text
    shuffled = json.dumps({"prompt_cache_key": "tenant-a", "max_tokens": 2, "temperature": 0.0,
                           "messages": [{"content": SYSTEM, "role": "system"}, {"content": "hi", "role": "user"}]},
                          indent=4).encode()
    assert compact[:4096] != shuffled[:4096]
    server = _start()
    try:
        first = _chat(server, compact)
        for _ in range(3):
            assert _chat(server, shuffled) == first
    finally:
        server.stop()


def test_same_text_with_other_prompt_cache_keys_lands_apart():
    server = _start()
    try:
        places = set()
        for tenant in range(8):
            body = json.dumps({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
                               "max_tokens": 2, "prompt_cache_key": f"tenant-{tenant}"}).encode()
            places.add(_chat(server, body))
        # eight routing ids over seven copies: a key of text alone would put them all on one copy
        assert len(places) >= 3, places
        same = json.dumps({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
                           "max_tokens": 2}).encode()
        assert len({_chat(server, same) for _ in range(4)}) == 1  # no key: the text alone decides
    finally:
        server.stop()
