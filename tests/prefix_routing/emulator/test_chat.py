"""Token limits from the body, checked as vLLM checks them and against the model's context
(prefix_routing.emulator.chat, with the echo and the fleet backends)."""

from __future__ import annotations

import http.client
import json

import pytest

from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.fleet_backend import MODEL_CONTEXT_TOKENS, context_tokens, start_emulator
from prefix_routing.emulator.server import serve_runtime
from prefix_routing.stage.config import load_stage
from prefix_routing.stage.preset_file import PresetFile, to_preset
from prefix_routing.stage.presets import PRESETS, LatencyCoefficients
from tests.prefix_routing.emulator.conftest import client_for


def _chat(content: str = "hi", **limits) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": content}], **limits}).encode()


def _model_error(client, body: bytes, **params) -> dict:
    with pytest.raises(client.exceptions.ModelError) as caught:
        client.invoke_endpoint(EndpointName=params.pop("EndpointName", "ep"), Body=body, **params)
    response = caught.value.response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 424 and response["OriginalStatusCode"] == 400
    original = json.loads(response["OriginalMessage"])
    assert (original["object"], original["type"], original["code"]) == ("error", "BadRequestError", 400)
    return original


def test_max_tokens_1e9_on_the_fleet_model_is_vllms_context_error_at_once():
    config = load_stage()  # Llama 3.1 8B: a 131,072-token context (its config.json)
    server = start_emulator(config, speed=50.0)
    try:
        client = client_for(server)
        # "user: hi" is 8 bytes: 2 tokens at the fleet model's 4 bytes per token.
        body = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":1e9}'
        original = _model_error(client, body, EndpointName=config.endpoint_name,
                                InferenceComponentName=config.component_name)
        assert original["message"] == (
            "This model's maximum context length is 131072 tokens. However, you requested 1000000002 tokens "
            "(2 in the messages, 1000000000 in the completion). Please reduce the length of the messages or "
            "completion.")
        # A prompt alone past the context: 6 + 524,288 bytes = 131,074 tokens.
        original = _model_error(client, _chat("a" * (4 * 131_072)), EndpointName=config.endpoint_name,
                                InferenceComponentName=config.component_name)
        assert original["message"] == ("This model's maximum context length is 131072 tokens. However, you "
                                       "requested 131074 tokens in the messages, Please reduce the length of the "
                                       "messages.")
        server.wait_until_idle()
        assert server.outcome_counts() == {"error": 2}
        assert server.backend.status()["requests"] == 0  # nothing reached the fleet
    finally:
        server.stop()


def test_the_limit_is_the_context_to_the_token():
    # Echo counts words: "user: a b c" is 4 of them; 10 tokens of context leave 6 for the answer.
    with serve_runtime(EchoBackend(context_tokens=10)) as server:
        client = client_for(server)
        answer = json.loads(client.invoke_endpoint(EndpointName="ep", Body=_chat("a b c", max_tokens=6))["Body"].read())
        assert answer["usage"]["completion_tokens"] == 6 and answer["choices"][0]["finish_reason"] == "length"
        original = _model_error(client, _chat("a b c", max_tokens=7))
        assert "requested 11 tokens (4 in the messages, 7 in the completion)" in original["message"]
        # No limit in the body: the default answer (8) is cut where the context ends.
        answer = json.loads(client.invoke_endpoint(EndpointName="ep", Body=_chat("a b c"))["Body"].read())
        assert answer["usage"]["completion_tokens"] == 6 and answer["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("limits, message", [
    (b'"max_tokens": 1.5', "max_tokens: 1.5 is not an integer; allowed: an integer of at least 1"),
    (b'"max_tokens": -1', "max_tokens must be at least 1, got -1."),
    (b'"max_tokens": 0', "max_tokens must be at least 1, got 0."),
    (b'"max_tokens": "10"', 'max_tokens: "10" is not an integer'),
    (b'"max_tokens": true', "max_tokens: true is not an integer"),
    (b'"max_tokens": 1e400', "max_tokens: Infinity is not an integer"),
    (b'"max_completion_tokens": [4]', "max_completion_tokens: [4] is not an integer"),
    (b'"parameters": {"max_new_tokens": -3}', "parameters.max_new_tokens must be at least 1, got -3."),
])
def test_a_limit_that_is_no_positive_integer_is_a_400_naming_it(limits, message):
    with serve_runtime(EchoBackend()) as server:
        body = b'{"messages": [{"role": "user", "content": "hi"}], ' + limits + b"}"
        assert message in _model_error(client_for(server), body)["message"]


def test_precedence_and_integral_floats_as_vllm_reads_them():
    with serve_runtime(EchoBackend()) as server:
        client = client_for(server)

        def completion_tokens(**limits):
            answer = client.invoke_endpoint(EndpointName="ep", Body=_chat("x y", **limits))["Body"].read()
            return json.loads(answer)["usage"]["completion_tokens"]

        assert completion_tokens(max_tokens=5, max_completion_tokens=3) == 3  # max_completion_tokens or max_tokens
        assert completion_tokens(max_tokens=4.0) == 4
        assert completion_tokens(parameters={"max_new_tokens": 2}) == 2


def test_the_openai_path_gets_the_context_error_as_a_400():
    with serve_runtime(EchoBackend(context_tokens=100)) as server:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
        conn.request("POST", "/endpoints/ep/openai/v1/chat/completions", body=_chat("hi", max_tokens=10**9),
                     headers={"Authorization": "Bearer t"})
        response = conn.getresponse()
        error = json.loads(response.read())["error"]
        conn.close()
    assert response.status == 400 and "maximum context length is 100 tokens" in error["message"]


def test_context_tokens_of_the_presets():
    # vLLM's max_model_len: the model's window, capped by what one copy's KV cache holds.
    for preset in PRESETS.values():
        assert context_tokens(preset) == min(MODEL_CONTEXT_TOKENS[preset.model.name], preset.kv_tokens)
    assert context_tokens(PRESETS["g6e.xlarge-llama3.1-8b"]) == 131_072
    assert context_tokens(PRESETS["g6e.12xlarge-llama3.1-70b"]) == PRESETS["g6e.12xlarge-llama3.1-70b"].kv_tokens
    # A preset measured on llama.cpp: one slot's share of -c (4 slots of 8,192 tokens each).
    measured = to_preset(PresetFile(name="local", coefficients=LatencyCoefficients(0.01, 1e-4, 1e-7, 2e-3, 1e-6),
                                    slots=4, context_per_slot=8192, kv_bytes_per_token=4096, model_name="tiny.gguf"))
    assert context_tokens(measured) == 8192
