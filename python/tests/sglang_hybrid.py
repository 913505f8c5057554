"""SGLang 0.5.23's hybrid radix cache, run without torch or a GPU, publishing its own KV events.

SGLang 0.5.23 has no ``SWARadixCache`` or ``MambaRadixCache``: ``mem_cache/registry.py``
(``create_unified_radix_cache``) builds ``UnifiedRadixCache`` for every model with full
attention, with the components FULL, + SWA for a sliding-window hybrid, + MAMBA for a Mamba
hybrid (FULL alone for a model without hybrid parts); ``PureSWARadixCache``, a RadixCache, is
only for models whose every layer slides. ``UnifiedRadixCache`` publishes KV events through its
tree core's ``KVCacheEventRecorder`` (``mem_cache/events.py``), one recorder for all parts.

SGLang's own code here, loaded from the installed wheel (``pip install --no-deps``):

* ``UnifiedRadixCache`` (``mem_cache/unified_radix_cache.py``) with its Python tree core and
  components: ``unified_cache/unified_tree_core.py``, ``unified_tree_core_interface.py``,
  ``components/{base,full,swa,mamba}.py``, ``cache_action.py``, ``component_type.py``,
  ``session_ref_tracker.py``, ``tree_core_registry.py``, and ``session/streaming_session.py``
  (its match_prefix asks it first);
* the KV event recorder (``mem_cache/events.py``), the page hashes (``mem_cache/utils.py``,
  ``cpp_utils/native_hash.py`` and SGLang's C++ ``hash_binding.cpp``, compiled as
  ``engine_apps`` compiles it), the event types and ZMQ publisher
  (``disaggregation/kv_events.py``, ``EventPublisherFactory``), ``cache_init_params.py``,
  ``base_prefix_cache.py``, ``radix_cache.py``, ``evict_policy.py``, ``environ.py``,
  ``utils/rank_consensus_checker.py`` (off, its default), ``utils/poll_timer.py``,
  ``storage_prefetch.py``, ``buffer_mode/storage_existence_cache.py``, ``hicache_storage.py``.

Not SGLang's code:

* The KV pools: slot numbers, no tensors. ``SWATokenToKVPoolAllocator`` below stands in for
  SGLang's class of that name (a full pool and a window pool of pages, the full->window slot
  mapping, ``free_segment`` / ``free_swa_segment`` / ``free_full_segment`` meaning what the
  real ones mean, with strict double-free checks; ``evict_to_free_tokens`` is the real body),
  ``FullPools`` for ``TokenToKVPoolAllocator``, ``HybridReqToTokenPool`` for that class's Mamba
  slot allocator. The tree asks them only for slots, frees and free counts: what it decides
  (nodes, matches, evictions, events) is SGLang's.
* ``Rank.request`` plays the scheduler around the cache (SGLang's ``Req`` and scheduler need
  torch): match_prefix, lock the matched node, evict for the allocation
  (``evict_to_free_tokens``), allocate the request's own pages, insert the way
  ``UnifiedRadixCache.checkpoint_into_tree`` does (``prev_prefix_len`` = the protected
  prefix; the row then rewritten to the tree's indices and the lock moved to the inserted
  node), and release the lock and the slots the tree did not take. A long sliding-window
  request ("long_decode") holds no window slots for its pages more than a window behind its
  end, as ``common.free_swa_out_of_window_slots`` leaves it after chunked prefill / decode, and
  inserts with that ``swa_evicted_seqlen``: its new pages are stored without window KV. A
  Mamba insert stops at the request's last checkpoint (with the extra buffer a multiple of
  ``mamba_checkpoint_grid``; without it, page 1, the end). A match whose full KV reaches past
  its window / Mamba boundary (``swa_branching_seqlen`` / ``mamba_branching_seqlen``)
  checkpoints there first, as SGLang does during the prefill.
* Stubs, for modules imported only for names on paths not taken here (HiCache, storage,
  linkers, metrics, kernels, tensor pools): ``managers.cache_controller``,
  ``managers.schedule_batch``, ``mem_cache.common``, ``allocator.page_interleave``
  (``page_interleave_shard_size`` -> 1, its answer for every allocator but its own),
  ``allocator.swa`` / ``memory_pool`` (the stand-ins above), ``allocator.hisparse``,
  ``allocator.unified_hybrid_swa``, ``buffer_mode.pipeline``,
  ``hybrid_cache.hybrid_cache_controller``, ``swa_memory_pool``,
  ``unified_cache.storage_attachment``, ``unified_cache.unified_cache_linker``,
  ``observability.metrics_collector``; ``runtime_context`` gets ``get_exec`` (the default
  ``mamba_max_states_per_path`` -1 unless a Rank sets another), ``mamba_cache_chunk_size``
  (max(FLA's chunk 64, page_size), or a Rank's) and ``mamba_checkpoint_grid`` (their lcm with
  the page, as the real one); ``torch.distributed`` (names). ``torch`` is the recorder's stub
  (``record_scenarios``), its ``IndexList`` given the tensor methods the tree calls on index
  lists (``numel``, ``to``, ``detach``, ``tolist``, and ``torch.cat``).
* The tree core is SGLang's Python ``UnifiedTreeCore`` (``tree_core_backend="python"``): the
  default Rust core (``rust_tree_core/mem_cache*.so``) links libtorch. SGLang's own unit suite
  runs both cores against the same expectations (``test/kits/unified_radix_cache``).
"""

import atexit
import functools
import importlib
import math
import sys
import time
import types
from array import array
from typing import List, Optional, Sequence

import engine_apps

rec = engine_apps.rec


# --------------------------------------------------------------------------------------------
# Loading


def _stub_names(name, **attrs):
    """Add names to a stub module (creating it when absent); a name already there is kept, so
    what other tests of the same process installed stays as it was."""
    module = sys.modules.get(name)
    if module is None:
        module = rec._stub(name)
    for key, value in attrs.items():
        if not hasattr(module, key):
            setattr(module, key, value)
    return module


def _names(*names):
    return {n: type(n, (), {}) for n in names}


def _unused(name):
    def call(*args, **kwargs):
        raise AssertionError(f"{name}() is read only with HiCache or a linker, unused here")

    return call


# ``--mamba-max-states-per-path`` (-1: unlimited, the default); set per cache by Rank.
EXEC = types.SimpleNamespace(mamba=types.SimpleNamespace(
    mamba_max_states_per_path=-1, enable_mamba_extra_buffer_lazy=False))
FLA_CHUNK_SIZE = 64  # sglang.kernels.ops.attention.fla.chunk_delta_h.CHUNK_SIZE
_CHUNK = {"size": FLA_CHUNK_SIZE}


def _tensor_methods() -> None:
    """The tensor methods the tree calls on index lists, added to the recorder's IndexList."""
    index_list = rec.IndexList
    extra = {
        "numel": lambda self: len(self),
        "to": lambda self, *args, **kwargs: index_list(self),
        "detach": lambda self: self,
        "tolist": lambda self: list(self),
    }
    for name, method in extra.items():
        if not hasattr(index_list, name):
            setattr(index_list, name, method)
    torch = sys.modules["torch"]
    if not hasattr(torch, "cat"):
        torch.cat = lambda chunks: index_list(x for chunk in chunks for x in chunk)
    if not hasattr(torch, "distributed"):
        torch.distributed = _stub_names("torch.distributed",
                                        **_names("ReduceOp", "ProcessGroup", "Work"))


@functools.lru_cache(maxsize=None)
def hybrid_modules() -> types.SimpleNamespace:
    """SGLang's UnifiedRadixCache and what drives it, loaded once per process."""
    s = engine_apps.sglang_modules()
    _tensor_methods()
    for pkg in ["sglang.srt.distributed", "sglang.srt.session", "sglang.srt.mem_cache.buffer_mode",
                "sglang.srt.mem_cache.hybrid_cache"]:
        if pkg not in sys.modules:
            rec._package(pkg)
    _stub_names("sglang.srt.managers.cache_controller", CacheOperation=object,
                HICACHE_WRITE_STAGING_POOL_FRACTION=0.0)
    _stub_names("sglang.srt.managers.schedule_batch", **_names("ReqKvInfo"))
    _stub_names("sglang.srt.mem_cache.allocator.page_interleave",
                page_interleave_shard_size=lambda allocator: 1)
    _stub_names("sglang.srt.mem_cache.allocator.swa",
                SWATokenToKVPoolAllocator=SWATokenToKVPoolAllocator)
    _stub_names("sglang.srt.mem_cache.allocator.hisparse",
                **_names("DeepSeekV4HiSparseTokenToKVPoolAllocator"))
    _stub_names("sglang.srt.mem_cache.allocator.unified_hybrid_swa",
                **_names("UnifiedSWAAllocatorBase"))
    _stub_names("sglang.srt.mem_cache.buffer_mode.pipeline",
                **_names("BufferModePipeline"), validate_buffer_only_stack=None)
    _stub_names("sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller",
                **_names("HybridCacheController", "PPPrefetchDecision", "PrefetchOperation"))
    _stub_names("sglang.srt.mem_cache.memory_pool", **_names("MHATokenToKVPool"),
                HybridReqToTokenPool=HybridReqToTokenPool)
    _stub_names("sglang.srt.mem_cache.swa_memory_pool", **_names("SWAKVPool"))
    _stub_names("sglang.srt.mem_cache.common", **_names("RetractionBackup"),
                free_swa_out_of_window_slots=_unused("free_swa_out_of_window_slots"))
    _stub_names("sglang.srt.mem_cache.unified_cache.storage_attachment",
                **_names("StorageAttachment"))
    _stub_names("sglang.srt.mem_cache.unified_cache.unified_cache_linker",
                **_names("UnifiedCacheLinker", "UnifiedCacheLinkerWrapper"))
    _stub_names("sglang.srt.observability.metrics_collector",
                **_names("StorageMetrics", "StorageMetricsCollector"))
    _stub_names("sglang.srt.runtime_context", get_exec=lambda: EXEC,
                mamba_cache_chunk_size=lambda: _CHUNK["size"],
                mamba_checkpoint_grid=lambda page: math.lcm(_CHUNK["size"], page),
                **{n: _unused(n) for n in ("get_disagg", "get_memory", "get_model")})
    _stub_names("sglang.srt.utils.common", is_npu=lambda: False)
    # The swa and memory_pool stubs must hold the classes this module defines: the components
    # check their allocators with isinstance against them.
    assert sys.modules["sglang.srt.mem_cache.allocator.swa"].SWATokenToKVPoolAllocator \
        is SWATokenToKVPoolAllocator
    assert sys.modules["sglang.srt.mem_cache.memory_pool"].HybridReqToTokenPool \
        is HybridReqToTokenPool

    s.unified = importlib.import_module("sglang.srt.mem_cache.unified_radix_cache")
    s.components = importlib.import_module("sglang.srt.mem_cache.unified_cache.components")
    s.ComponentType = s.components.ComponentType
    s.cache_init_params = importlib.import_module("sglang.srt.mem_cache.cache_init_params")
    return s


# --------------------------------------------------------------------------------------------
# The pools (not SGLang's): slot numbers, page-granular, with strict double-free checks.


class _PagePool:
    """Pages 1..num_pages (page 0 is the padding sink the real pools reserve)."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.page_size = page_size
        self.size = num_pages * page_size
        self.free_pages = list(range(num_pages, 0, -1))
        self.free_set = set(self.free_pages)
        self.debug_mode = False

    def available_size(self) -> int:
        return len(self.free_pages) * self.page_size

    def alloc_pages(self, n: int) -> Optional[List[int]]:
        if n > len(self.free_pages):
            return None
        pages = [self.free_pages.pop() for _ in range(n)]
        self.free_set.difference_update(pages)
        return pages

    def free_page_ids(self, pages: Sequence[int]) -> None:
        for page in pages:
            assert 0 < page and page not in self.free_set, f"page {page} freed twice"
            self.free_set.add(page)
            self.free_pages.append(page)

    def free_segment(self, indices: Sequence[int], start_pos: int = 0) -> None:
        """Free the pages of a page-aligned run of token slots."""
        assert start_pos % self.page_size == 0 and len(indices) % self.page_size == 0, \
            (start_pos, len(indices))
        self.free_page_ids([indices[i] // self.page_size
                            for i in range(0, len(indices), self.page_size)])

    def tokens(self, pages: Sequence[int]) -> List[int]:
        ps = self.page_size
        return [p * ps + i for p in pages for i in range(ps)]


class SWATokenToKVPoolAllocator:
    """Stands in for sglang.srt.mem_cache.allocator.swa.SWATokenToKVPoolAllocator: a full pool
    and a sliding-window pool of pages, and the full->window slot mapping (0: no window slot).
    The free methods mean what the real ones mean; `evict_to_free_tokens` is the real body."""

    device = "cpu"

    def __init__(self, full_pages: int, swa_pages: int, page_size: int) -> None:
        self.page_size = page_size
        self.full_attn_allocator = _PagePool(full_pages, page_size)
        self.swa_attn_allocator = _PagePool(swa_pages, page_size)
        self.mapping = {}  # full token slot -> window token slot

    # sizes
    @property
    def size_full(self) -> int:
        return self.full_attn_allocator.size

    def full_available_size(self) -> int:
        return self.full_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    def available_size(self) -> int:
        return min(self.full_available_size(), self.swa_available_size())

    def mamba_full_cache_donor(self):
        return None

    def evict_to_free_tokens(self, tree_cache, num_tokens: int,
                             swa_num_tokens: Optional[int] = None) -> None:
        """SWATokenToKVPoolAllocator.evict_to_free_tokens (allocator/swa.py); the window
        tokens needed may be fewer than the full ones (`swa_num_tokens`, a request whose
        out-of-window pages never get window slots, as chunked prefill frees them)."""
        EvictParams = hybrid_modules().base_prefix_cache.EvictParams
        if tree_cache is None or not tree_cache.supports_prefix_sharing():
            return
        if swa_num_tokens is None:
            swa_num_tokens = num_tokens
        full_shortfall = max(0, num_tokens - self.full_available_size())
        swa_shortfall = max(0, swa_num_tokens - self.swa_available_size())
        if full_shortfall or swa_shortfall:
            tree_cache.evict_for_alloc(
                EvictParams(num_tokens=full_shortfall, swa_num_tokens=swa_shortfall))

    # allocation (the scheduler's alloc_extend for one request's pages)
    def alloc(self, num_tokens: int, swa_from: int = 0):
        """Full slots for `num_tokens`, window slots for those from `swa_from` on."""
        ps = self.page_size
        assert num_tokens % ps == 0 and swa_from % ps == 0
        n, n_swa = num_tokens // ps, (num_tokens - swa_from) // ps
        if n > len(self.full_attn_allocator.free_pages) or \
                n_swa > len(self.swa_attn_allocator.free_pages):
            return None
        full = self.full_attn_allocator.tokens(self.full_attn_allocator.alloc_pages(n))
        swa = self.swa_attn_allocator.tokens(self.swa_attn_allocator.alloc_pages(n_swa))
        self.mapping.update(zip(full[swa_from:], swa))
        return rec.IndexList(full)

    # the mapping
    def translate_swa_indices_for_transfer(self, full_indices):
        return rec.IndexList(self.mapping.get(i, 0) for i in full_indices)

    def set_full_to_swa_mapping(self, full_indices, swa_indices) -> None:
        assert len(full_indices) == len(swa_indices)
        for f, w in zip(full_indices, swa_indices):
            if w:
                self.mapping[f] = w
            else:
                self.mapping.pop(f, None)

    def clear_full_to_swa_mapping(self, full_indices) -> None:
        for f in full_indices:
            self.mapping.pop(f, None)

    # frees
    def free_swa_segment(self, free_index, *, start_pos: int) -> None:
        """Release the window pages paired with a page-aligned run of full slots and clear
        their mapping; every page must have its window peer (the real `expect`)."""
        if len(free_index) == 0:
            return
        ps = self.page_size
        assert start_pos % ps == 0 and len(free_index) % ps == 0
        pages = []
        for i in range(0, len(free_index), ps):
            peer = self.mapping.get(free_index[i], 0)
            assert peer > 0, f"full slot {free_index[i]} has no window peer (wants free_full)"
            pages.append(peer // ps)
            self.clear_full_to_swa_mapping(free_index[i:i + ps])
        self.swa_attn_allocator.free_page_ids(pages)

    def free_full_segment(self, free_index, *, start_pos: int) -> None:
        if len(free_index) == 0:
            return
        assert not any(f in self.mapping for f in free_index), \
            "full slots with a window peer (wants free_segment)"
        self.full_attn_allocator.free_segment(free_index, start_pos)

    def free_segment(self, free_index, *, start_pos: int) -> None:
        if len(free_index) == 0:
            return
        self.free_swa_segment(free_index, start_pos=start_pos)
        self.full_attn_allocator.free_segment(free_index, start_pos)

    def release_row(self, row) -> None:
        """Free a request's own slots the tree did not take (page by page, window peer first
        when it still has one)."""
        ps = self.page_size
        for i in range(0, len(row), ps):
            page = row[i:i + ps]
            if self.mapping.get(page[0], 0):
                self.free_segment(page, start_pos=0)
            else:
                self.free_full_segment(page, start_pos=0)

    def used(self):
        return (self.full_attn_allocator.size - self.full_available_size(),
                self.swa_attn_allocator.size - self.swa_available_size())

    def clear(self) -> None:
        ps = self.page_size
        self.full_attn_allocator = _PagePool(self.full_attn_allocator.size // ps, ps)
        self.swa_attn_allocator = _PagePool(self.swa_attn_allocator.size // ps, ps)
        self.mapping = {}


class MambaSlots:
    """HybridReqToTokenPool.mamba_allocator: Mamba state slots 1..n."""

    def __init__(self, n: int) -> None:
        self.size = n
        self.free_slots = list(range(n, 0, -1))
        self.free_set = set(self.free_slots)

    def available_size(self) -> int:
        return len(self.free_slots)

    schedulable_available_size = available_size

    def alloc(self, n: int):
        if n > len(self.free_slots):
            return None
        got = [self.free_slots.pop() for _ in range(n)]
        self.free_set.difference_update(got)
        return rec.IndexList(got)

    def free(self, slots) -> None:
        for slot in slots:
            assert slot not in self.free_set, f"mamba slot {slot} freed twice"
            self.free_set.add(slot)
            self.free_slots.append(slot)


class HybridReqToTokenPool:
    """Stands in for memory_pool.HybridReqToTokenPool: only its Mamba slot allocator."""

    def __init__(self, mamba_slots: int) -> None:
        self.mamba_allocator = MambaSlots(mamba_slots)

    def clear(self) -> None:
        self.mamba_allocator = MambaSlots(self.mamba_allocator.size)


class FullPools:
    """Stands in for TokenToKVPoolAllocator: the full-attention pool of a Mamba hybrid or of
    a model without hybrid parts."""

    device = "cpu"

    def __init__(self, full_pages: int, page_size: int) -> None:
        self.page_size = page_size
        self.pool = _PagePool(full_pages, page_size)

    @property
    def size_full(self) -> int:
        return self.pool.size

    def available_size(self) -> int:
        return self.pool.available_size()

    def mamba_full_cache_donor(self):
        return None

    def evict_to_free_tokens(self, tree_cache, num_tokens: int, swa_num_tokens=None) -> None:
        """TokenToKVPoolAllocator's eviction before an allocation: the full-attention
        shortfall."""
        EvictParams = hybrid_modules().base_prefix_cache.EvictParams
        shortfall = max(0, num_tokens - self.available_size())
        if shortfall:
            tree_cache.evict_for_alloc(EvictParams(num_tokens=shortfall))

    def alloc(self, num_tokens: int, swa_from: int = 0):
        assert num_tokens % self.page_size == 0
        pages = self.pool.alloc_pages(num_tokens // self.page_size)
        return None if pages is None else rec.IndexList(self.pool.tokens(pages))

    def free_segment(self, free_index, *, start_pos: int) -> None:
        if len(free_index):
            self.pool.free_segment(free_index, start_pos)

    def release_row(self, row) -> None:
        self.free_segment(row, start_pos=0)

    def used(self):
        return (self.pool.size - self.available_size(),)

    def clear(self) -> None:
        self.pool = _PagePool(self.pool.size // self.page_size, self.page_size)


# --------------------------------------------------------------------------------------------
# A rank: SGLang's cache with events on, SGLang's publisher, and the scheduler's steps.


class Rank:
    """One SGLang DP rank of a hybrid model: a UnifiedRadixCache with KV events, published by
    SGLang's own ZMQ publisher (EventPublisherFactory, as the scheduler makes it).

    `kind` is "swa" (full attention + sliding window of `window` tokens), "mamba" (full
    attention + Mamba; with the extra buffer, unless page_size is 1, a checkpoint every
    `mamba_chunk` tokens), or "full" (full attention alone: registry.create_unified_radix_cache
    builds UnifiedRadixCache with only the FULL component for a model without hybrid parts)."""

    def __init__(self, kind: str, *, page_size: int, kv_events_config: str, dp_rank: int = 0,
                 full_pages: int = 64, swa_pages: int = 32, window: int = 32,
                 mamba_slots: int = 16, mamba_chunk: int = FLA_CHUNK_SIZE,
                 mamba_extra_buffer: Optional[bool] = None,
                 max_states_per_path: int = -1) -> None:
        s = self.s = hybrid_modules()
        ct = s.ComponentType
        self.kind, self.page_size, self.window = kind, page_size, window
        self.rank = dp_rank
        self.extra_buffer = False
        if kind == "swa":
            self.pools = SWATokenToKVPoolAllocator(full_pages, swa_pages, page_size)
            req_pool, components = None, (ct.FULL, ct.SWA)
            extra = dict(sliding_window_size=window)
        elif kind == "full":  # no hybrid part: what 0.5.23 builds for any other model
            self.pools = FullPools(full_pages, page_size)
            req_pool, components, extra = None, (ct.FULL,), {}
        elif kind == "mamba":
            self.pools = FullPools(full_pages, page_size)
            req_pool, components = HybridReqToTokenPool(mamba_slots), (ct.FULL, ct.MAMBA)
            # Without the extra buffer SGLang keeps only the state at a sequence's end, and
            # asks for page_size 1.
            self.extra_buffer = page_size > 1 if mamba_extra_buffer is None \
                else mamba_extra_buffer
            extra = dict(enable_mamba_extra_buffer=self.extra_buffer)
            _CHUNK["size"] = max(mamba_chunk, page_size)
            EXEC.mamba.mamba_max_states_per_path = max_states_per_path
        else:
            raise ValueError(kind)
        # Where a request's insert stops: its last complete page, or for Mamba with the extra
        # buffer its last checkpoint (mamba_checkpoint_grid).
        self.grid = math.lcm(_CHUNK["size"], page_size) \
            if kind == "mamba" and self.extra_buffer else page_size
        params = s.cache_init_params.CacheInitParams(
            disable=False, req_to_token_pool=req_pool, token_to_kv_pool_allocator=self.pools,
            page_size=page_size, tree_components=components, enable_kv_cache_events=True,
            tree_core_backend="python", **extra)
        self.cache = s.unified.UnifiedRadixCache(params)
        # The components read these at construction only.
        EXEC.mamba.mamba_max_states_per_path = -1
        self.publisher = s.kv_events.EventPublisherFactory.create(kv_events_config, dp_rank)
        self.published = 0
        self.counts = {}  # events published by type, and what the scheduler steps did
        self.step()  # the constructor's reset() queued AllBlocksCleared

    # events
    def step(self) -> int:
        """SchedulerKvEventsPublisher.publish_kv_events: one batch when there are events;
        returns the number of events published."""
        events = self.cache.take_events()
        for e in events:
            self._count(type(e).__name__)
        if events:
            self.publisher.publish(self.s.kv_events.KVEventBatch(
                ts=time.time(), events=events))
            self.published += 1
        return len(events)

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def publish_empty(self) -> None:
        """A batch without events (no cache change): the join handshake, see the test."""
        self.publisher.publish(self.s.kv_events.KVEventBatch(ts=time.time(), events=[]))
        self.published += 1

    def stop(self) -> None:
        self.publisher.shutdown()
        atexit.unregister(self.publisher.shutdown)

    # SGLang's own answers
    def key(self, tokens: Sequence[int]):
        return self.s.radix_cache.RadixKey(array("q", tokens))

    def match(self, tokens: Sequence[int]):
        return self.cache.match_prefix(self.s.base_prefix_cache.MatchPrefixParams(
            key=self.key(tokens)))

    def hit(self, tokens: Sequence[int]) -> int:
        """The prefix SGLang reuses for `tokens`: match_prefix's device_prefix_len. (A match
        may split a node and refresh LRU, as every scheduler match does; it emits no event.)"""
        return self.match(tokens).device_prefix_len

    def full_attention_prefix(self, tokens: Sequence[int]) -> int:
        """Tokens of `tokens` whose full-attention KV is on the device, whatever the window or
        Mamba parts hold (the tree core's read-only full-attention walk)."""
        key = self.key(tokens).page_aligned(self.page_size)
        return self.cache.tree_core.match_full_device_prefix(key)[0]

    # the scheduler
    def request(self, tokens: Sequence[int], *, long_decode: bool = False) -> str:
        """One request through the cache, the scheduler's way; returns what happened."""
        s, cache, ps = self.s, self.cache, self.page_size
        EvictParams = s.base_prefix_cache.EvictParams
        mamba_allocator = getattr(cache.req_to_token_pool, "mamba_allocator", None)
        m = self.match(tokens)
        prefix_len = m.device_prefix_len
        state = types.SimpleNamespace(row=list(cache.path_device_indices(m.last_device_node)),
                                      protected=prefix_len,
                                      lock=cache.lock(m.last_device_node))
        assert len(state.row) == prefix_len, (len(state.row), prefix_len)
        end = len(tokens) // self.grid * self.grid  # where the insert stops
        need = len(tokens) // ps * ps - prefix_len  # the request's own complete pages
        evicted, pre_len = 0, len(tokens) - 1
        if self.kind == "swa" and long_decode and pre_len - self.window >= 1:
            # common.free_swa_out_of_window_slots: the request's own pages more than a window
            # (rounded up to pages) behind its end lose their window slots while it runs
            # (chunked prefill, decode); they never hold them all at once.
            keep = -(-max(self.window, ps) // ps) * ps
            evicted = max(prefix_len, (pre_len - keep) // ps * ps)
        swa_from = max(0, evicted - prefix_len)
        mamba_slots = []
        try:
            if need > 0:
                before = dict(cache.tree_core.component_evictable_size_)
                self.pools.evict_to_free_tokens(cache, need, need - swa_from)
                if cache.tree_core.component_evictable_size_ != before:
                    self._count("evictions to allocate")
                own = self.pools.alloc(need, swa_from=swa_from)
                if own is None:
                    return "no room"
                state.row += own
            if self.kind == "mamba":
                # The request's running state, and one for a branching checkpoint.
                for _ in range(2):
                    slot = mamba_allocator.alloc(1)
                    if slot is None:
                        self._count("evictions to allocate a Mamba slot")
                        cache.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=1))
                        slot = mamba_allocator.alloc(1)
                    if slot is None:
                        return "no mamba slot"
                    mamba_slots.append(slot)
            # A match whose full KV reaches past its window / Mamba boundary: SGLang checkpoints
            # the prefill there, so the next request finds the part it recomputed. (Not for a
            # request freeing out-of-window KV here: its window at that point is gone.)
            branching = (m.mamba_branching_seqlen if self.extra_buffer
                         else m.swa_branching_seqlen if self.kind == "swa" and not evicted
                         else None)
            if branching is not None and prefix_len < branching < end:
                self._checkpoint(state, tokens, branching,
                                 mamba_slots.pop() if mamba_slots else None, evicted)
            if end > state.protected:
                self._checkpoint(state, tokens, end,
                                 mamba_slots.pop() if mamba_slots else None, evicted)
            if evicted:
                self._count("long requests (stored without window KV behind)")
            return "inserted"
        finally:
            # Release: the tree lock, the request's slots the tree did not take, its states.
            cache.unlock(state.lock)
            self.pools.release_row(state.row[state.protected:])
            for slot in mamba_slots:
                mamba_allocator.free(slot)
            self.step()

    def _checkpoint(self, state, tokens, up_to: int, mamba_slot, evicted: int) -> None:
        """UnifiedRadixCache.checkpoint_into_tree for [protected, up_to) of the request."""
        s, cache = self.s, self.cache
        ct = s.ComponentType
        params = s.base_prefix_cache.InsertParams(
            key=self.key(tokens[:up_to]), value=rec.IndexList(state.row[:up_to]),
            prev_prefix_len=state.protected, mamba_value=mamba_slot)
        if evicted:
            params.set_evicted_seqlen(ct.SWA, evicted)
        result = cache.insert(params)
        if mamba_slot is not None and result.mamba_exist:
            cache.req_to_token_pool.mamba_allocator.free(mamba_slot)  # cleanup_after_caching_req
        new_indices = list(cache.path_device_indices(result.last_device_node))
        assert len(new_indices) == up_to, (len(new_indices), up_to)
        state.row[state.protected:up_to] = new_indices[state.protected:]
        cache.unlock(state.lock)
        state.lock = cache.lock(result.last_device_node)
        state.protected = up_to

    def evict(self, num_tokens: int = 0, swa_num_tokens: int = 0, mamba_num: int = 0):
        """cache.evict: `num_tokens` of full attention (whole leaves, BlockRemoved), and/or
        window tokens / Mamba states only (internal nodes lose them without an event)."""
        result = self.cache.evict(self.s.base_prefix_cache.EvictParams(
            num_tokens=num_tokens, swa_num_tokens=swa_num_tokens, mamba_num=mamba_num))
        self.step()
        return result

    def flush(self) -> None:
        """Scheduler.flush_cache: the tree's reset (AllBlocksCleared) and the pools' clear."""
        self.cache.reset()
        self.pools.clear()
        if self.kind == "mamba":
            self.cache.req_to_token_pool.clear()
        self.step()

    def hold(self, tokens: Sequence[int]):
        """A running request's lock on its matched prefix (released by `release`)."""
        return self.cache.lock(self.match(tokens).last_device_node)

    def release(self, lock) -> None:
        self.cache.unlock(lock)
        self.step()

    def sanity_check(self) -> None:
        """SGLang's own tree invariants (UnifiedRadixCache.sanity_check)."""
        self.cache.sanity_check()
