"""The canary's run through the emulated runtime (botocore's sagemaker-runtime client, the real
InvokeEndpoint wire) over the echo backend, whose tiny prefix cache honours ``cache_salt`` as vLLM
does: the repeat is cached, the other tenant finds nothing."""

from __future__ import annotations

from prefix_routing.canary.run import check_local_runtime
from prefix_routing.emulator.echo_backend import EchoBackend
from prefix_routing.emulator.server import serve_runtime
from prefix_routing.stage.config import load_stage
from prefix_routing.stage.front_door_env import front_door_environment


def test_a_salted_engine_passes_through_the_runtime_and_each_request_names_the_component():
    config = load_stage()
    backend = EchoBackend(first_chunk_delay=0.0, token_delay=0.0, block_tokens=16, cache_blocks=10_000)
    with serve_runtime(backend, endpoints=[config.endpoint_name]) as runtime:
        (verdict,) = check_local_runtime(runtime.url, front_door_environment(config), prompt_tokens=300,
                                         salted=True, endpoint_name=config.endpoint_name)
        recorded = list(runtime.requests)
    assert (verdict.domain, verdict.component) == ("default", config.component_name)
    assert verdict.first_cached == 0 and verdict.other_cached == 0
    assert verdict.repeat_cached == verdict.prompt_tokens // 16 * 16  # every whole block of the prompt's words
    assert not verdict.isolation_breach and not verdict.cache_cold
    assert len(recorded) == 3
    assert {r.request.headers.inference_component for r in recorded} == {config.component_name}
    first, repeat, other = (r.request.headers.prefix_aware_id for r in recorded)
    assert first == repeat != other
