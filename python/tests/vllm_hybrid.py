"""vLLM 0.33.0's own prefix cache for HYBRID models (several KV-cache groups), without a GPU.

A ``HybridRank`` is one DP rank of a vLLM engine whose model has more than one KV-cache group,
or a group that is not plain full attention: vLLM's KVCacheManager over its
HybridKVCacheCoordinator (or UnitaryKVCacheCoordinator for one group), its per-kind managers
(FullAttentionManager, SlidingWindowManager, MambaManager in "align" mode,
SinkFullAttentionManager) and its BlockPool, with the KV events published by vLLM's own
ZmqEventPublisher. Modules load from the wheel exactly as ``engine_apps`` loads them (the
recorder's stubs in ``tests/fixtures/events/record_scenarios.py``: no torch, no GPU).

What stands in for the rest of the engine, and why it is faithful:

* The scheduler. ``store_many`` runs requests through ``Scheduler.schedule``'s policy (FCFS, a
  budget of ``chunk_tokens`` tokens per step, running requests first, recompute preemption) and
  calls the KVCacheManager as the scheduler does: ``new_step_starts`` at every step (Mamba
  refuses hits on states cached in the same step), ``get_computed_blocks`` on admission (capped
  at ``num_tokens - 1``, with its shared-prefix boundary), ``allocate_slots`` per chunk (which
  frees the blocks that left a sliding window and caches the chunk's full blocks), ``free`` once
  the prompt is computed (nothing is decoded: a store is a prompt's prefill). Each step's events
  are one batch, as ``update_from_output`` publishes ``take_events()``. With a Mamba group in
  "align" mode every chunk end is clipped by the scheduler's own ``_mamba_block_aligned_split``,
  compiled from vLLM's ``v1/core/sched/scheduler.py`` (the Scheduler class itself needs the
  whole engine).
* The worker never runs: the cache manager decides what is cached from token counts alone.

What vLLM itself would reuse for a prompt of T tokens is the coordinator's
``find_longest_cache_hit(block_hashes, (T // B) * B)``: its rule over all groups, without the
scheduler's last-token cap (``get_computed_blocks`` would lower the cap to T - 1).
"""

import ast
import functools
import os
import time
import types
from collections import deque
from typing import Callable, Dict, List, Optional, Sequence

import engine_apps
from engine_apps import rec

# --------------------------------------------------------------------------------------------
# Layouts: a layout is a tuple of group kinds, one per KV-cache group, in group order. A kind is
# "full", "swa:<window in tokens>", "mamba" (align mode) or "sink:<sink length in tokens>".


def describe(layout: Sequence[str]) -> str:
    return "+".join(layout)


def build_spec(v, kind: str, block_size: int):
    """The KVCacheSpec of one group, as a model's layers would declare it (the shapes are
    irrelevant to caching: only the kind, the block size and the window are read)."""
    ki = v.kv_cache_interface
    name, _, arg = kind.partition(":")
    attention = dict(block_size=block_size, num_kv_heads=1, head_size=8, dtype="float16")
    if name == "full":
        return ki.FullAttentionSpec(**attention)
    if name == "swa":
        return ki.SlidingWindowSpec(**attention, sliding_window=int(arg))
    if name == "sink":
        return ki.SinkFullAttentionSpec(**attention, sink_len=int(arg))
    if name == "mamba":
        # Qwen3-Next-like linear attention with prefix caching: vLLM requires
        # mamba_cache_mode="align" for that (MambaManager asserts it). No speculative or
        # prefill-checkpoint blocks (no MTP/EAGLE).
        return ki.MambaSpec(block_size=block_size, shapes=((2, 4), (4,)),
                            dtypes=("float16", "float16"), mamba_cache_mode="align")
    raise ValueError(f"unknown group kind {kind!r}")


@functools.lru_cache(maxsize=None)
def mamba_block_aligned_split():
    """``Scheduler._mamba_block_aligned_split`` from vLLM's own source, compiled alone: it reads
    only the scheduler attributes ``scheduler_view`` provides and two functions of
    ``kv_cache_interface``."""
    v = engine_apps.vllm_modules()
    path = os.path.join(rec.SP, "vllm", "v1", "core", "sched", "scheduler.py")
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    scheduler = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    method = next(n for n in scheduler.body
                  if isinstance(n, ast.FunctionDef) and n.name == "_mamba_block_aligned_split")
    namespace = {
        "Request": rec.Request,
        "get_mamba_prefill_checkpoint_position":
            v.kv_cache_interface.get_mamba_prefill_checkpoint_position,
        "is_mamba_prefill_checkpoint_valid": v.kv_cache_interface.is_mamba_prefill_checkpoint_valid,
    }
    exec(compile(ast.Module(body=[method], type_ignores=[]), path, "exec"), namespace)
    return namespace["_mamba_block_aligned_split"]


def scheduler_view(block_size: int, chunk_tokens: int):
    """The Scheduler attributes ``_mamba_block_aligned_split`` reads, as ``Scheduler.__init__``
    sets them for this set-up: hash_block_size == block_size (so no fine-grained Mamba hits), no
    speculative decoding, no prefill-checkpoint blocks, no long-prefill threshold."""
    return types.SimpleNamespace(
        cache_config=types.SimpleNamespace(block_size=block_size), block_size=block_size,
        hash_block_size=block_size, mamba_partial_cache_hit=False, use_eagle_block_drop=False,
        num_hash_lookahead_tokens=0, mamba_has_prefill_checkpoint_blocks=False,
        mamba_prefill_checkpoint_alignment=None, mamba_shared_prefix_checkpoint=False,
        max_num_scheduled_tokens=chunk_tokens,
        scheduler_config=types.SimpleNamespace(long_prefill_token_threshold=0))


# --------------------------------------------------------------------------------------------
# One rank


class PoolTooSmall(Exception):
    """A request cannot be admitted to an idle engine: the pool cannot hold it."""


class HybridRank:
    """One vLLM DP rank with a hybrid KV-cache layout, publishing its events.

    ``retention`` is ``KVCacheConfig.prefix_cache_retention_interval`` (vLLM's
    ``--prefix-cache-retention-interval``): 0, vLLM's default, keeps sliding-window and Mamba
    blocks only at the replay boundary (``T - 1`` rounded down to a block) and at shared-prefix
    junctions; ``None`` keeps them densely; a positive multiple of the block size keeps one
    per interval as well. ``endpoint``: None records events (``self.batches``) without a
    publisher."""

    def __init__(self, layout: Sequence[str], *, block_size: int = 16, num_blocks: int = 256,
                 retention: Optional[int] = 0, chunk_tokens: int = 2048,
                 max_model_len: int = 4096, endpoint: Optional[str] = None,
                 replay: Optional[str] = None, rank: int = 0, name: str = "hybrid",
                 kind_names: Optional[Dict[int, str]] = None) -> None:
        # A step must have room for a block: Mamba chunks end on block boundaries.
        assert chunk_tokens >= block_size, (chunk_tokens, block_size)
        v = engine_apps.vllm_modules()
        ki = v.kv_cache_interface
        self.v, self.layout, self.block_size = v, tuple(layout), block_size
        # group index -> the kv_cache_spec_kind its stores are published with, replacing the one
        # take_events() wrote (a spec whose manager this vLLM cannot build, see the sink test).
        self.kind_names = dict(kind_names or {})
        self.retention = retention
        self.chunk_tokens, self.name, self.rank = chunk_tokens, name, rank
        groups = [ki.KVCacheGroupSpec([f"layer.{i}"], build_spec(v, kind, block_size))
                  for i, kind in enumerate(self.layout)]
        config = ki.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                  kv_cache_groups=groups,
                                  prefix_cache_retention_interval=retention)
        self.manager = v.kv_cache_manager.KVCacheManager(
            config, max_model_len=max_model_len, scheduler_block_size=block_size,
            hash_block_size=block_size, enable_caching=True, enable_kv_cache_events=True)
        self.coordinator = self.manager.coordinator
        self.block_pool = self.manager.block_pool
        self.hasher = v.kv_cache_utils.get_request_block_hasher(block_size, v.hash_fn)
        self.has_mamba = any(kind == "mamba" for kind in self.layout)
        self.publisher = None
        if endpoint is not None:
            self.publisher = v.Publisher(data_parallel_rank=rank, endpoint=endpoint,
                                         replay_endpoint=replay)
        self.published = 0  # batches handed to the publisher: the last one has seq published-1
        self.batches: List = []  # every KVEventBatch published (for checks of the events)
        self.count = 0

    # ---------------------------------------------------------------------- the engine's steps

    def request(self, tokens: Sequence[int]):
        self.count += 1
        return rec.Request(f"{self.name}-req{self.count}", tokens, self.hasher)

    def store(self, tokens: Sequence[int]) -> None:
        """Prefill `tokens` as one request and finish it (see ``store_many``)."""
        self.store_many([tokens])

    def store_many(self, prompts: Sequence[Sequence[int]],
                   between_steps: Optional[Callable[[], None]] = None) -> None:
        """Requests for `prompts` arriving together, run to the end of their prefill by the
        scheduler's policy (``Scheduler.schedule``, FCFS), one published batch per step:

        * a step has ``chunk_tokens`` tokens to give; running requests get theirs first, in
          order; one whose chunk finds no room preempts the last running request (its blocks
          are freed, it is recomputed later), itself if it is the last;
        * without a preemption in the step, waiting requests are admitted in order: prefix
          lookup (capped at ``num_tokens - 1``; a request admitted later in the same step may
          hit blocks an earlier one just cached, except Mamba states), then their first chunk;
          the first that cannot be admitted stops the admissions;
        * with a Mamba group, every chunk end is clipped by ``_mamba_block_aligned_split``;
        * a request whose prompt is computed finishes (``free``) after the step;
        * `between_steps` runs after each step but the last (say, a KV connector reporting
          lost blocks, some of them held by running requests): its events go out with the next
          step's.
        """
        waiting = deque(self.request(t) for t in prompts)
        running: List = []
        while waiting or running:
            self.manager.new_step_starts()
            budget, preempted, scheduled = self.chunk_tokens, False, []
            for r in list(running):
                if r not in running or budget == 0:
                    continue  # preempted earlier in this step, or no budget left
                num_new = self._chunk(r, r.num_computed_tokens, budget)
                if num_new == 0:
                    continue  # no room for a block-aligned chunk: the next one comes first
                while self.manager.allocate_slots(r, num_new) is None:
                    victim = running.pop()
                    self._preempt(victim, waiting)
                    preempted = True
                    if victim is r:
                        break
                else:
                    r.num_computed_tokens += num_new
                    budget -= num_new
                    scheduled.append(r)
            while waiting and not preempted and budget > 0:
                r = waiting[0]
                blocks, hit, r.shared_prefix_boundary = self.manager.get_computed_blocks(r)
                num_new = self._chunk(r, hit, budget, hit)
                if num_new == 0 or self.manager.allocate_slots(r, num_new, hit, blocks) is None:
                    break
                waiting.popleft()
                r.status = rec.RequestStatus.RUNNING
                r.num_computed_tokens = hit + num_new
                budget -= num_new
                running.append(r)
                scheduled.append(r)
            self.step()
            if not scheduled:
                for r in running:
                    self.manager.free(r)
                raise PoolTooSmall(f"{describe(self.layout)}: a request of "
                                   f"{waiting[0].num_tokens} tokens cannot be admitted to an "
                                   f"idle engine of {self.block_pool.num_gpu_blocks} blocks")
            for r in [r for r in running if r.num_computed_tokens == r.num_tokens]:
                running.remove(r)
                self.manager.free(r)
            if between_steps is not None and (waiting or running):
                between_steps()

    def _chunk(self, r, computed: int, budget: int, hit: int = 0) -> int:
        """The tokens `r` is scheduled this step, from `computed` on (the scheduler's
        ``num_new_tokens``, Mamba-aligned)."""
        num_new = min(r.num_tokens - computed, budget)
        if self.has_mamba and num_new > 0:
            view = scheduler_view(self.block_size, self.chunk_tokens)
            num_new = mamba_block_aligned_split()(view, r, num_new, hit, 0)
        return num_new

    def _preempt(self, r, waiting) -> None:
        """``Scheduler._preempt_request``: free the blocks, recompute from the start later."""
        self.manager.free(r)
        r.status = rec.RequestStatus.PREEMPTED
        r.num_computed_tokens = 0
        r.num_preemptions += 1
        waiting.appendleft(r)

    def evict(self, block_ids: Sequence[int], publish: bool = True) -> None:
        """``KVCacheManager.evict_blocks`` (a KV connector's report of lost blocks): their
        hashes leave the prefix cache, blocks a request still uses stay with it."""
        self.manager.evict_blocks(set(block_ids))
        if publish:
            self.step()

    def clear(self) -> None:
        assert self.manager.reset_prefix_cache()
        self.step()

    def step(self) -> None:
        """The scheduler's publish: this step's events as one batch, none when there are none."""
        events = self.manager.take_events()
        if not events:
            return
        for event in events:
            name = self.kind_names.get(getattr(event, "group_idx", None))
            if name is not None and getattr(event, "kv_cache_spec_kind", None) is not None:
                event.kv_cache_spec_kind = name
        # As Scheduler.update_from_output builds it; the publisher stamps its DP rank.
        batch = self.v.kv_events.KVEventBatch(ts=time.time(), events=events)
        self.batches.append(batch)
        if self.publisher is not None:
            self.publisher.publish(batch)
        self.published += 1

    def publish_empty(self) -> None:
        """An empty batch: moves the stream on without touching the cache (used to let a
        subscriber join: PUB drops what it sends before the subscription arrives)."""
        self.publisher.publish(self.v.kv_events.KVEventBatch(ts=time.time(), events=[]))
        self.published += 1

    def stop(self) -> None:
        if self.publisher is not None:
            self.publisher.shutdown()

    # ----------------------------------------------------------------------- vLLM's own answer

    def probe(self, tokens: Sequence[int]):
        return rec.Request("probe", tokens, self.hasher)

    def expected(self, tokens: Sequence[int]) -> int:
        """The prefix vLLM itself would reuse: its coordinator's fixed point over every group,
        up to the prompt's last complete block (no last-token cap)."""
        cap = len(tokens) // self.block_size * self.block_size
        return self.coordinator.find_longest_cache_hit(self.probe(tokens).block_hashes, cap)[1]

    def leading_run(self, tokens: Sequence[int]) -> int:
        """What an index blind to the groups would answer: the leading run of blocks every
        full-attention group holds (every group, without one). Where this differs from
        ``expected``, only the hybrid rule gives vLLM's answer."""
        full = [g for g, kind in enumerate(self.layout)
                if kind == "full" or kind.startswith("sink:")]
        groups = full or list(range(len(self.layout)))
        run = 0
        for h in self.probe(tokens).block_hashes[:len(tokens) // self.block_size]:
            if not self.block_pool.get_cached_block(h, groups):
                break
            run += self.block_size
        return run

    def group_of(self, block) -> int:
        """The group a cached block's hash belongs to."""
        return self.v.kv_cache_utils.get_group_id(block.block_hash)

    def held(self, tokens: Sequence[int]) -> Dict[int, List[int]]:
        """Per group, the block indexes of `tokens` the pool holds (its prefix-cache map)."""
        hashes = self.probe(tokens).block_hashes
        return {g: [i for i, h in enumerate(hashes) if self.block_pool.get_cached_block(h, [g])]
                for g in range(len(self.layout))}

    def cached_block_ids(self, tokens: Sequence[int], group: int) -> List[int]:
        """The physical block ids caching `tokens`' blocks in `group`, in block order."""
        out = []
        for h in self.probe(tokens).block_hashes:
            blocks = self.block_pool.get_cached_block(h, [group])
            if blocks:
                out.append(blocks[0].block_id)
        return out
