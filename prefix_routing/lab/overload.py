"""Whether the modelled fleet can serve the trace at all, said before anyone reads its hit rates.

Two ways a simulation's figures stop meaning what they seem to:

- **Overload.** Requests queue for a copy (TTFT far above the engine's own prefill time) or time
  out: the hit rate then describes a fleet that could not keep up. A request *waited* when its TTFT
  is more than :data:`WAIT_S` above what its own prefill (of its uncached tokens) and the request
  overheads take on an idle copy; a timed-out request waited by definition. The fleet is
  *overloaded* when any request timed out (SageMaker fails it) or at least :data:`OVERLOADED_SHARE`
  of them waited: the median request's TTFT is then far above its own prefill time.
- **Prompts beyond an engine's context** (``--cache-policy llamacpp-slots``): llama-server refuses a
  prompt of its slot's context or more, so nothing of it is cached (a small engine measured with
  ``calibrate`` against a workload of long prompts caches nothing).
"""

from __future__ import annotations

from collections.abc import Sequence

WAIT_S = 1.0
OVERLOADED_SHARE = 0.5


def is_overloaded(waited_share: float, timeouts: int) -> bool:
    return timeouts > 0 or waited_share >= OVERLOADED_SHARE


def overload_text(waited_share: float, timeouts: int, requests: int, timeout_s: float | None) -> str | None:
    """The line that says so (None when the fleet keeps up)."""
    if not is_overloaded(waited_share, timeouts):
        return None
    failed = (f"; {timeouts:,} of {requests:,} timed out after {timeout_s:g} s" if timeouts and timeout_s
              else f"; {timeouts:,} of {requests:,} failed" if timeouts else "")
    return (f"the modelled fleet is overloaded: {waited_share:.0%} of requests waited more than {WAIT_S:g} s for a "
            f"copy beyond their own prefill{failed}; add copies or instances, or lower the load, before reading "
            "hit rates")


def prompts_beyond_context(prompt_tokens: Sequence[float], slot_tokens: float) -> int:
    """Prompts llama-server refuses: a slot's context or more (no truncation, nothing cached)."""
    return sum(1 for p in prompt_tokens if p >= slot_tokens)


def context_text(prompt_tokens: Sequence[float], slot_tokens: float, preset_name: str) -> str | None:
    """The warning for ``--cache-policy llamacpp-slots`` when prompts exceed a slot's context."""
    n = prompts_beyond_context(prompt_tokens, slot_tokens)
    if not n:
        return None
    total = len(prompt_tokens)
    longest = max(prompt_tokens)
    return (f"{n:,} of {total:,} prompts ({n / total:.0%}; the longest {longest:,.0f} tokens) are at least the context "
            f"of one slot of {preset_name} ({slot_tokens:,.0f} tokens): llama-server refuses them and caches nothing "
            "of them; give the engine more context per slot (llama-server -c, fewer -np slots, then calibrate "
            "again) or replay a trace with shorter prompts")
