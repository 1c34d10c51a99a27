"""llama.cpp's prompt cache as the fleet model's second cache policy (``cache_policy="llamacpp-slots"``).

A vLLM engine caches blocks in one LRU (:mod:`prefix_routing.lab.fleet`); ``llama-server`` does not.
Each of its ``-np`` slots keeps the one sequence it last ran and reuses the longest common prefix of
that sequence with its next prompt; with ``--cache-ram`` it also keeps the states of outgoing
sequences in RAM and can load one back into a slot. Who gets which slot, and what is saved and
loaded, follows the rules below, read from llama.cpp as vendored by ``llama-cpp-python==0.3.36``
(ggml-org/llama.cpp@0c1e57098, per that sdist's CHANGELOG.md); paths are under
``vendor/llama.cpp/``, ``ctx`` is ``tools/server/server-context.cpp``, ``task`` is
``tools/server/server-task.cpp``.

Slots
-----
- A request's prompt is compared with what each slot holds token by token
  (``server_tokens::get_common_prefix``, ``tools/server/server-common.cpp:697``): the longest common
  prefix, LCP, not a longest common substring.
- ``get_available_slot`` (ctx:1528). If ``--slot-prompt-similarity`` is not 0 (ctx:1542): among the
  idle slots (``is_processing()`` is ``state != SLOT_STATE_IDLE``, ctx:437, skipped at ctx:1551)
  that hold something (empty slots are skipped, ctx:1559) the one with the highest ``LCP / prompt
  length`` (ctx:1566; the request's prompt is the denominator) wins if that is strictly greater than
  the threshold (``f_sim_cur > f_sim_best && f_sim_cur > slot_prompt_similarity``, ctx:1571; the
  first slot wins a tie). Else the least recently used idle slot (``t_last_used <= t_last``,
  ctx:1604: on a tie the *last* such slot); ``t_last_used`` is set when a slot is released, i.e.
  when its request ends (ctx:520), -1 before its first use (ctx:226).
- No idle slot: the task is deferred (ctx:2388) in a FIFO (``tools/server/server-queue.cpp:79``)
  and re-run when a slot is released (server-queue.cpp:107), so the choice is made then, among the
  slots idle at that moment.
- Reuse (ctx:3200): ``n_past`` = the LCP of the prompt with the slot's tokens (after any load
  below); if that is the whole prompt, one token is recomputed (``n_past--``, ctx:3384-3386).
- Context: each slot has ``n_ctx_slot = -c / -np`` tokens (``src/llama-context.cpp:295``, both
  rounded up to multiples of 256; ctx:1276, ctx:4008). A prompt of ``n_ctx_slot`` tokens or more is
  refused with "exceeds the available context size" (ctx:3186): nothing is truncated. Generation
  stops at ``n_ctx_slot - 1`` tokens without ``--context-shift`` (off by default, ctx:1867).
- After a request the slot holds its prompt and its generated tokens but the last (the last
  sampled token is never decoded).

The saved states (``--cache-ram``, default 8192 MiB: ``common/common.h:634``, flag at
``common/arg.cpp:1716``; 0 = off, -1 = no byte limit; a cache per server, ctx:1332-1340)
--------------------------------------------------------------------------------------------
- Used when the slot was picked by LRU, or by similarity with ``f_keep = LCP / slot tokens < 0.5``
  (ctx:1579-1587): "about to lose a large portion" of the slot. Then (ctx:1618-1634), after the slot
  choice and before the prompt runs: first the slot's outgoing sequence is saved, then a state is
  looked for, then the limits are enforced.
- Save (``server_prompt_cache::alloc``, task:1711): nothing if the slot is empty (ctx:259), if a saved
  state already contains it (task:1716) or if it alone exceeds the limit (task:1731); saved states
  that it contains are dropped (task:1741); the oldest states go until it fits (task:1752); it is
  appended (task:1779). The list is ordered by saving time: loading does not refresh an entry.
- Load (``server_prompt_cache::load``, task:1793): a state is a candidate if its LCP with the prompt
  is at least a quarter of *the state's* length (``f_keep_cur < 0.25f`` skips, task:1813); the best
  must beat both the slot's own ``f_keep`` (-1 for an empty slot, task:1796) and ``f_sim`` = LCP /
  prompt, strictly, and each later candidate must beat the best so far on both (task:1817). The
  loaded state leaves the list (task:1864).
- Limits (``update``, task:1870): the oldest states go while the bytes exceed the limit (task:1872);
  with no byte limit, while the states' tokens exceed ``n_ctx`` (all slots' context, ctx:1097,
  task:1880-1886). One state is the sequence's KV: tokens × (2 × layers × KV heads × head dim ×
  dtype bytes).
- ``--cache-idle-slots`` (default on, ``common/common.h:630``; needs ``--cache-ram``): after a task
  starts, every idle slot's sequence is saved too (ctx:2417-2424). With ``-np`` given, the KV cache
  is not unified (``common/common.h:575``; only ``-np`` unset means 4 slots and a unified cache,
  ``tools/server/server.cpp:157``), so the slots are not cleared.
- Consequence: one slot with room for ``f`` states keeps ``f`` conversations cycling, not ``f + 1``:
  the outgoing state is saved while the incoming one still takes room.

The model
---------
Traces carry chained block ids of prompts, so a sequence is ``(blocks, prompt tokens, held
tokens)``: an LCP is the leading equal ids × ``block_tokens``, capped at both lengths; the generated
tokens count in a state's bytes and the token limit but match nothing (trace ids do not describe
them; the vLLM policy does not cache them either), and the ``f_keep`` ratios are taken over the
prompt part. The fleet calls ``lookup`` (the decision, nothing committed) then, once the engine has
scheduled the request, ``occupy`` with its engine finish: that commits the slot's new sequence and
the saves, and marks the slot busy until then; a request that times out is never committed (it never
reaches the engine). The choice is made when a slot frees (``max(arrival, previous choice, first
release)``, FCFS), which is the engine model's slot wait: as many slots as its ``max_num_seqs``. A
refused prompt (``>= n_ctx_slot``) gets no cached tokens and leaves its slot as chosen.
"""

from __future__ import annotations

import math
from itertools import takewhile
from operator import eq
from typing import Hashable, Sequence

VLLM_BLOCKS = "vllm-blocks"
LLAMACPP_SLOTS = "llamacpp-slots"
CACHE_POLICIES = (VLLM_BLOCKS, LLAMACPP_SLOTS)
SLOT_PROMPT_SIMILARITY = 0.10  # common/common.h:697
CACHE_RAM_MIB = 8192.0  # common/common.h:634; 0 = off, -1 = no byte limit
MIB = 1024 * 1024  # tools/server/server-task.h:614

_EMPTY = ((), 0, 0)  # (block ids, prompt tokens, held tokens)


def common_tokens(seq: tuple, blocks: Sequence[Hashable], prompt: float, block_tokens: float) -> float:
    """The LCP in tokens of a held sequence with a prompt: leading equal ids × block size, capped."""
    held = seq[0]
    if not held or not blocks or held[0] != blocks[0]:
        return 0
    lcp = sum(takewhile(bool, map(eq, held, blocks))) * block_tokens
    return min(lcp, seq[1], prompt)


def slot_caches(config, copies: int, slots: int) -> "SlotCache | None":
    """The slots of a fleet's ``copies`` llama-servers of ``slots`` slots each (``config``: its
    ``FleetConfig``); None when its engines keep vLLM's LRU of blocks."""
    if config.cache_policy == VLLM_BLOCKS:
        return None
    return SlotCache(copies, slots=slots, context_tokens=config.capacity_tokens, block_tokens=config.block_tokens,
                     similarity=config.slot_prompt_similarity, cache_ram_mib=config.cache_ram_mib,
                     bytes_per_token=config.preset.model.kv_bytes_per_token)


class SlotCache:
    """The slots and saved states of ``copies`` llama.cpp engines: ``lookup`` decides, ``occupy`` commits."""

    __slots__ = ("seqs", "until", "ready", "states", "_bt", "_sim", "_slot_ctx", "_ctx", "_ram", "_limit",
                 "_bpt", "_pending")

    def __init__(self, copies: int, *, slots: int, context_tokens: float, block_tokens: float,
                 similarity: float = SLOT_PROMPT_SIMILARITY, cache_ram_mib: float = CACHE_RAM_MIB,
                 bytes_per_token: float = 1.0) -> None:
        self.seqs = [[_EMPTY] * slots for _ in range(copies)]  # what each slot holds
        self.until = [[-math.inf] * slots for _ in range(copies)]  # busy until / last released
        self.ready = [-math.inf] * copies  # the previous choice (the deferred queue is FIFO)
        self.states: list[list[tuple]] = [[] for _ in range(copies)]  # saved states, oldest first
        self._bt = block_tokens
        self._sim = similarity
        self._ctx = context_tokens  # -c: all slots; the saved states' token limit without a byte limit
        self._slot_ctx = context_tokens / slots
        self._ram = cache_ram_mib != 0
        self._limit = 0.0 if cache_ram_mib < 0 else cache_ram_mib * MIB  # 0: no byte limit
        self._bpt = bytes_per_token
        self._pending: tuple | None = None

    def lookup(self, g: int, blocks: Sequence[Hashable], prompt: float, output: float, now: float) -> float:
        """Cached tokens of a request arriving at ``now`` on copy ``g``; ``occupy`` then commits it."""
        seqs, until, bt = self.seqs[g], self.until[g], self._bt
        t = self.ready[g] if self.ready[g] > now else now
        free = min(until)
        if free > t:  # every slot busy: deferred until the first is released
            t = free
        i, update = self._choose(seqs, until, t, blocks, prompt)
        seq, states = seqs[i], None
        if update and self._ram:  # ctx:1618-1634: save the outgoing sequence, then look for a state
            states = list(self.states[g])
            self._save(states, seq)
            k = self._better(states, seq, blocks, prompt)
            if k is not None:
                seq = states.pop(k)
            self._trim(states)
        if 0 < prompt < self._slot_ctx:
            cached = common_tokens(seq, blocks, prompt, bt)
            if cached >= prompt:  # ctx:3384: at least one token is evaluated
                cached = prompt - 1
            held = prompt + output - 1 if output > 1 else prompt
            if held > self._slot_ctx - 1:
                held = self._slot_ctx - 1
            seq = (tuple(blocks), prompt, held)
        else:  # empty, or refused: "exceeds the available context size" (ctx:3186)
            cached = 0
        self._pending = (g, i, seq, states, t)
        return cached

    def occupy(self, g: int, until: float) -> None:
        """Commit the last ``lookup`` on copy ``g``: its slot holds the request until ``until``."""
        pending, self._pending = self._pending, None
        if pending is None or pending[0] != g:
            raise RuntimeError(f"occupy({g}) without a lookup on that copy")
        _, i, seq, states, t = pending
        seqs, busy = self.seqs[g], self.until[g]
        seqs[i], busy[i], self.ready[g] = seq, until, t
        if states is not None:
            self.states[g] = states
        if self._ram and len(seqs) > 1:  # --cache-idle-slots (ctx:2417): save the idle slots too
            states = self.states[g]
            for j, other in enumerate(seqs):
                if other[1] and j != i and busy[j] <= t and other not in states and self._save(states, other):
                    self._trim(states)

    def held_prefix_blocks(self, g: int, blocks: Sequence[Hashable]) -> int:
        """The most leading blocks of ``blocks`` that a slot or a saved state of copy ``g`` holds."""
        best = 0
        for seq in (*self.seqs[g], *self.states[g]):
            held = seq[0]
            if held and blocks and held[0] == blocks[0]:
                best = max(best, sum(takewhile(bool, map(eq, held, blocks))))
        return best

    def probes(self, blocks: Sequence[Hashable]) -> list[set]:
        """Per copy, the blocks of ``blocks`` it holds as a set (KV_AWARE's cache probe)."""
        return [set(blocks[: self.held_prefix_blocks(g, blocks)]) for g in range(len(self.seqs))]

    def blocks_held(self, g: int) -> int:
        return sum(len(seq[0]) for seq in (*self.seqs[g], *self.states[g]))

    # ------------------------------------------------------------------ the engine's rules

    def _choose(self, seqs, until, t, blocks, prompt) -> tuple[int, bool]:
        """(slot, whether the saved states are used): ``get_available_slot`` (ctx:1528)."""
        chosen = -1
        if self._sim != 0.0 and prompt > 0:  # an empty prompt's similarity is 0/0: never chosen
            best, best_lcp = 0.0, 0
            for i, seq in enumerate(seqs):
                if until[i] > t or not seq[1]:  # busy, or empty
                    continue
                lcp = common_tokens(seq, blocks, prompt, self._bt)
                f = lcp / prompt
                if f > best and f > self._sim:
                    best, best_lcp, chosen = f, lcp, i
            if chosen >= 0:
                return chosen, best_lcp / seqs[chosen][1] < 0.5
        last = math.inf
        for i, u in enumerate(until):  # the least recently used idle slot; ties: the last
            if u <= t and (chosen < 0 or u <= last):
                chosen, last = i, u
        return chosen, True

    def _between(self, a: tuple, b: tuple) -> float:
        return common_tokens(a, b[0], b[1], self._bt)

    def _save(self, states: list, seq: tuple) -> bool:
        """``server_prompt_cache::alloc`` (task:1711); True if ``seq`` was appended."""
        if not seq[1]:
            return False
        for s in states:
            if self._between(s, seq) >= seq[1]:  # already contained in a saved state
                return False
        size, limit, bpt = seq[2] * self._bpt, self._limit, self._bpt
        if limit and size > limit:
            return False
        states[:] = [s for s in states if self._between(s, seq) < s[1]]  # drop what it contains
        if limit:
            total = sum(s[2] for s in states) * bpt
            while states and total + size > limit:
                total -= states.pop(0)[2] * bpt
        states.append(seq)
        return True

    def _better(self, states: list, seq: tuple, blocks, prompt) -> int | None:
        """``server_prompt_cache::load`` (task:1793): the saved state to load into the slot, if any."""
        if prompt <= 0:
            return None
        lcp = common_tokens(seq, blocks, prompt, self._bt)
        keep_best = lcp / seq[1] if seq[1] else -1.0
        sim_best = lcp / prompt
        best = None
        for k, s in enumerate(states):
            lcp = common_tokens(s, blocks, prompt, self._bt)
            keep, sim = lcp / s[1], lcp / prompt
            if keep < 0.25:  # "don't trash large prompts"
                continue
            if keep_best < keep and sim_best < sim:
                keep_best, sim_best, best = keep, sim, k
        return best

    def _trim(self, states: list) -> None:
        """``server_prompt_cache::update`` (task:1870): the byte limit, then the token limit."""
        limit, bpt = self._limit, self._bpt
        tokens = sum(s[2] for s in states)
        if limit:
            while states and tokens * bpt > limit:
                tokens -= states.pop(0)[2]
        per_token = max(1.0, tokens * bpt / max(1, tokens))
        limit_tokens = max(self._ctx, limit / per_token) if limit else self._ctx
        while states and tokens > limit_tokens:
            tokens -= states.pop(0)[2]
