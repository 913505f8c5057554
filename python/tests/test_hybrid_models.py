"""HYBRID models (several KV-cache groups: full attention, sliding window, Mamba) against vLLM's own
reuse rule.

Each engine here is vLLM 0.33.0's own KVCacheManager / HybridKVCacheCoordinator / BlockPool
(``vllm_hybrid.HybridRank``, no torch, no GPU) publishing its own events with vLLM's own
ZmqEventPublisher to the real service. After the service has applied everything published (the
subscription's ``last_seq`` in ``/services/status`` is the last batch's and nothing is pending
for the context), its answer for a prompt of T tokens (rank 0's ``device`` count) must equal

    coordinator.find_longest_cache_hit(request.block_hashes, (T // B) * B)[1]

on the same pool: the prefix vLLM itself would reuse, over all groups, without the scheduler's
last-token cap.

* ``test_vllm_hybrid_events_*``: what vLLM publishes for hybrids (no service needed).
* ``test_layout_answers_like_vllm``: the four hybrid layouts (window-first, Mamba-first,
  full-first + window, full-first + Mamba) under vLLM's default retention (0: sliding-window and
  Mamba blocks kept only at replay boundaries and junctions) and dense retention, through a
  scripted history with shared prefixes, explicit evictions per group and LRU eviction.
* ``test_sink_full_attention_answers_like_vllm``: a full-attention group published as
  ``sink_full_attention`` beside a window (vLLM 0.33.0 cannot build the sink manager; its reuse
  rule is full attention's).
* ``test_random_hybrids_answer_like_vllm``: a seeded differential over random layouts and
  histories (HYBRID_DIFF_SEED; about 15 000 comparisons in about 15 s).
"""

import json
import os
import random
import threading
import time
import urllib.request
from typing import Dict, List, Optional, Sequence

import pytest

import engine_apps
from vllm_hybrid import HybridRank, PoolTooSmall, describe
from support import wait_until

B = 16


def prompt(n: int, base: int) -> List[int]:
    """`n` tokens no other prompt of the test shares unless built from the same `base`."""
    return [base + 7 * i for i in range(n)]


# --------------------------------------------------------------------------------------------
# An engine rank registered with the service


class Engine:
    """A HybridRank whose vLLM publisher the service subscribes to (with its replay socket)."""

    def __init__(self, client, conductor, layout: Sequence[str], *, instance: str, model: str,
                 **rank_args) -> None:
        from mooncake.conductor import OK

        self.client, self.conductor = client, conductor
        self.instance, self.model = instance, model
        # Comparisons made, and how many of them a group-blind index would have got wrong.
        self.compared = self.hybrid_only = 0
        base = engine_apps.port_run(2)
        self.rank = HybridRank(layout, block_size=B, endpoint=f"tcp://*:{base}",
                               replay=f"tcp://*:{base + 1}", name=instance, **rank_args)
        config = {
            "instance_id": instance, "endpoint": f"tcp://127.0.0.1:{base}",
            "replay_endpoint": f"tcp://127.0.0.1:{base + 1}", "publisher_type": "vLLM",
            "model_name": model, "block_size": B, "dp_rank": 0,
            "hash_profile": dict(engine_apps.VLLM_PROFILE),
        }
        try:
            assert client.register(config) == OK
            self.service = f"{instance}|default|0"
            self.join()
        except BaseException:
            self.rank.stop()
            raise

    @property
    def layout(self):
        return self.rank.layout

    def status(self) -> Optional[dict]:
        url = f"http://127.0.0.1:{self.conductor.http_port}/services/status"
        with urllib.request.urlopen(url, timeout=5) as r:
            services = json.load(r)["services"]
        return next((s for s in services if s["service"] == self.service), None)

    def join(self, timeout: float = 15.0) -> None:
        """PUB drops what it sends before the service's subscription arrives: publish empty
        batches (no cache change) until one is received. A first batch past seq 0 makes the
        service replay the stream from its start through the replay socket."""

        def received():
            self.rank.publish_empty()
            status = self.status()
            return status is not None and status["last_seq"] is not None

        assert wait_until(received, timeout=timeout, interval=0.05), \
            f"{self.instance}: nothing received: {self.status()}"
        self.sync()

    def applied(self) -> Optional[dict]:
        """The subscription's status once every published batch was received and applied by
        the context (``pending_batches`` counts batches handed to it and not yet applied)."""
        status = self.status()
        if status and status["last_seq"] == self.rank.published - 1 \
                and status["pending_batches"] == 0:
            return status
        return None

    def sync(self, timeout: float = 15.0) -> dict:
        status = wait_until(self.applied, timeout=timeout, interval=0.01)
        assert status, f"{self.instance}: batch {self.rank.published - 1} never applied: " \
                       f"{self.status()}"
        return status

    def answer(self, tokens: Sequence[int]) -> int:
        from mooncake.conductor import OK

        result = self.client.query(self.model, block_size=B, token_ids=list(tokens),
                                   instance_filter=self.instance)
        assert result["ret"] == OK, result
        row = result["hits"].get(self.instance)
        assert row is not None, f"no row for {self.instance}: {result}"
        return row["rank_matches"]["0"]["device"]

    def mismatches(self, queries: Dict[str, Sequence[int]], label: str) -> List[str]:
        """Every query whose answer differs from vLLM's, described for the assertion."""
        out = []
        for name, tokens in queries.items():
            want, got = self.rank.expected(tokens), self.answer(tokens)
            self.compared += 1
            self.hybrid_only += want != self.rank.leading_run(tokens)
            if want != got:
                out.append(f"[{label}] layout {describe(self.layout)} retention "
                           f"{self.rank.retention} chunk {self.rank.chunk_tokens}: {name} "
                           f"(T={len(tokens)}, "
                           f"{preview(tokens)}): vLLM {want}, service {got}; block indexes "
                           f"held per group {self.rank.held(tokens)}")
        return out

    def stop(self) -> None:
        self.rank.stop()


def preview(tokens: Sequence[int]) -> str:
    return f"{list(tokens[:3])}...{list(tokens[-2:])}" if len(tokens) > 5 else str(list(tokens))


def stop_all(engines) -> None:
    """Stop publishers in parallel: each may wait up to 1 s to drain."""
    threads = [threading.Thread(target=e.stop, daemon=True) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)


def queries_for(prompts: Dict[str, Sequence[int]]) -> Dict[str, List[int]]:
    """Each prompt, each of its block-aligned prefixes, one unaligned prefix per block, and the
    prompt with a tail nothing stored."""
    out = {}
    for name, tokens in prompts.items():
        out[name] = list(tokens)
        for n in range(B, len(tokens), B):
            out[f"{name}[:{n}]"] = list(tokens[:n])
            out[f"{name}[:{n + 5}]"] = list(tokens[:n + 5])
        out[f"{name}+tail"] = list(tokens) + prompt(2 * B + 3, 900_000 + 1000 * len(out))
    return out


def removed_groups(rank: HybridRank) -> set:
    return {e.group_idx for b in rank.batches for e in b.events
            if type(e).__name__ == "BlockRemoved"}


# --------------------------------------------------------------------------------------------
# What vLLM publishes for hybrids (no service)

LAYOUTS = {
    # Gemma-like: sliding-window layers in group 0, full attention in group 1.
    "window-first": ("swa:32", "full"),
    # Qwen3-Next-like: Mamba (align mode) in group 0, full attention in group 1.
    "mamba-first": ("mamba", "full"),
    "full-first-window": ("full", "swa:49"),
    "full-first-mamba": ("full", "mamba"),
}
# vLLM's default (0: sparse window/Mamba retention) and dense retention (None).
RETENTIONS = {"retention0": 0, "dense": None}


def kind_of(kind: str):
    """(kv_cache_spec_kind, kv_cache_spec_sliding_window) vLLM stamps on a group's stores."""
    name, _, arg = kind.partition(":")
    return {"full": ("full_attention", None), "swa": ("sliding_window", int(arg or 0)),
            "mamba": ("mamba", None), "sink": ("sink_full_attention", None)}[name]


@pytest.mark.parametrize("retention", RETENTIONS.values(), ids=RETENTIONS.keys())
@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_vllm_hybrid_events_are_per_group_with_full_attention_siblings(layout, retention):
    """Every BlockStored names its group, kind and window; a sliding-window or Mamba group's
    store covers the same tokens under the same parent as the full-attention store of the same
    step, but lists only the blocks that group keeps (under retention 0, often none); every
    BlockRemoved names its group and one hash. (Not shown here: a Mamba state whose hash is
    lost while its request runs is re-keyed by a one-block store of the Mamba group alone, see
    ``scripted_history``.)"""
    rank = HybridRank(layout, block_size=B, num_blocks=24, retention=retention, chunk_tokens=48)
    p = prompt(100, 1000)
    for tokens in (p, p[:64] + prompt(40, 5000), p + prompt(60, 6000),
                   *(prompt(128, 10_000 * k) for k in range(1, 4))):
        rank.store(tokens)
    full = layout.index("full")
    sparse_fewer = False
    for batch in rank.batches:
        stored = [e for e in batch.events if type(e).__name__ == "BlockStored"]
        by_range = {}
        for e in stored:
            assert (e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window) == \
                kind_of(layout[e.group_idx]), e
            assert e.block_size == B and e.medium == "GPU", e
            by_range.setdefault((e.parent_block_hash, tuple(e.token_ids)), {})[e.group_idx] = e
        for (parent, tokens), groups in by_range.items():
            # One store per group per step, all over the same tokens.
            assert sorted(groups) == list(range(len(layout))), (parent, groups)
            sibling = groups[full].block_hashes
            assert len(sibling) * B == len(tokens)
            for g, e in groups.items():
                # The sparse list is a subsequence of the full chain (its positions are not on
                # the wire: a consumer finds them by hashing token_ids from the parent).
                it = iter(sibling)
                assert all(h in it for h in e.block_hashes), (g, e.block_hashes, sibling)
                sparse_fewer |= len(e.block_hashes) < len(sibling)
        for e in batch.events:
            if type(e).__name__ == "BlockRemoved":
                assert e.group_idx in range(len(layout)) and len(e.block_hashes) == 1, e
    assert sparse_fewer == (retention == 0 or "mamba" in layout)
    assert removed_groups(rank) == set(range(len(layout))), "LRU evicted from every group"


# --------------------------------------------------------------------------------------------
# The service against vLLM, scripted


def scripted_history(engine: Engine, sparse_group: Optional[int]) -> List[str]:
    """Stores with shared prefixes, explicit evictions in each group, and LRU eviction through
    a pool of 23 usable blocks; the service is compared with vLLM after every step."""
    rank, wrong = engine.rank, []
    p = prompt(100, 1000)  # six complete blocks and four tokens
    prompts = {
        "one-block": prompt(16, 300),
        "P": p,
        "Q=P[:64]+x": p[:64] + prompt(40, 5000),  # shares four blocks with P
        "R=P+y": p + prompt(60, 6000),  # extends P: its admission hits P
        "S=P[:40]+z": p[:40] + prompt(90, 7000),  # diverges inside P's third block
    }
    queries = queries_for(prompts)

    def check(label):
        engine.sync()
        wrong.extend(engine.mismatches(queries, label))

    # A single block first: under retention 0 a window or Mamba group keeps nothing of it, so
    # vLLM reuses nothing although full attention holds the block.
    rank.store(prompts["one-block"])
    check("one block")
    for name in ("P", "Q=P[:64]+x", "R=P+y", "S=P[:40]+z"):
        rank.store(prompts[name])
        check(f"stored {name}")
    # A KV connector reports lost blocks: the last block each group holds of R, then a middle
    # full-attention block of P (full attention then stops there; the window may not).
    for g in range(len(engine.layout)):
        held = rank.cached_block_ids(prompts["R=P+y"], g)
        if held:
            rank.evict(held[-1:])
            check(f"evicted R's last block of group {g}")
    full = next((g for g, kind in enumerate(engine.layout)
                 if kind == "full" or kind.startswith("sink:")), None)
    if full is not None:
        held = rank.cached_block_ids(p, full)
        rank.evict(held[2:3])
        check("evicted P's third full-attention block")
    if sparse_group is not None:
        rank.evict(rank.cached_block_ids(prompts["Q=P[:64]+x"], sparse_group)[:1])
        check(f"evicted Q's first block of group {sparse_group}")

    # Requests arriving together: the same prompt twice (its blocks computed twice, one copy
    # each) and a sibling, sharing the steps' budget.
    prompts["T"] = prompt(70, 8000)
    prompts["U=T[:32]+w"] = prompts["T"][:32] + prompt(50, 9000)
    queries.update(queries_for({k: prompts[k] for k in ("T", "U=T[:32]+w")}))
    rank.store_many([prompts["T"], prompts["T"], prompts["U=T[:32]+w"]])
    check("stored T, T and U together")

    # A KV connector reports lost blocks while a request runs: after each step, whatever the
    # sparse group has cached of it so far. vLLM's Mamba manager re-keys a lost prompt-boundary
    # state in the next step with a BlockStored of that group alone (no full-attention sibling).
    if sparse_group is not None:
        prompts["V"] = prompt(100, 8500)
        queries.update(queries_for({"V": prompts["V"]}))
        rank.store_many([prompts["V"]], between_steps=lambda: rank.evict(
            rank.cached_block_ids(prompts["V"], sparse_group), publish=False))
        check(f"stored V, losing its group {sparse_group} blocks while it ran")

    # LRU: unrelated 8-block prompts push everything older out, window blocks (freed while the
    # prefill moved on) before full-attention ones.
    for k in range(1, 4):
        other = prompt(128 + k, 100_000 * k)
        queries[f"other{k}"] = other
        rank.store(other)
        check(f"stored other{k} (LRU eviction)")
    rank.store(p)
    check("stored P again")
    rank.store(prompts["R=P+y"])
    check("stored R again")
    assert removed_groups(rank) == set(range(len(engine.layout))), \
        "the history did not evict from every group"
    return wrong


@pytest.mark.server
@pytest.mark.parametrize("retention", RETENTIONS.values(), ids=RETENTIONS.keys())
@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_layout_answers_like_vllm(client, conductor, layout, retention):
    engine = Engine(client, conductor, layout, instance="hybrid-0", model="hybrid-model",
                    num_blocks=24, retention=retention, chunk_tokens=48)
    try:
        sparse = next(g for g, kind in enumerate(layout) if kind != "full")
        wrong = scripted_history(engine, sparse)
    finally:
        engine.stop()
    assert not wrong, f"{len(wrong)} answers differ from vLLM's:\n" + "\n".join(wrong[:40])
    # The history must reach answers that only the hybrid rule gets right.
    assert engine.hybrid_only >= 10, (engine.compared, engine.hybrid_only)


@pytest.mark.server
def test_sink_full_attention_answers_like_vllm(client, conductor):
    """``sink_full_attention`` (vLLM 0.34's SinkFullAttentionSpec) is full attention for reuse:
    its manager subclasses FullAttentionManager and keeps its ``find_longest_cache_hit``. vLLM
    0.33.0 cannot build that manager (its coordinator passes ``needs_kv_cache_zeroing`` to every
    manager and ``SinkFullAttentionManager.__init__`` does not take it), so the group is vLLM's
    own full-attention group beside a window, its stores published with the kind 0.34's
    ``take_events`` writes for a sink group; the expected answers are the coordinator's."""
    try:
        HybridRank(("sink:16",), block_size=B)
        layout, kind_names = ("sink:16",), {}
    except TypeError:
        layout, kind_names = ("full", "swa:32"), {0: "sink_full_attention"}
    engine = Engine(client, conductor, layout, instance="sink-0", model="sink-model",
                    num_blocks=24, chunk_tokens=48, kind_names=kind_names)
    try:
        wrong = scripted_history(engine, 1 if kind_names else None)
        kinds = {getattr(e, "kv_cache_spec_kind", None)
                 for batch in engine.rank.batches for e in batch.events}
        assert "sink_full_attention" in kinds, kinds
        status = client.query("sink-model", block_size=B, token_ids=prompt(100, 1000),
                              include_status=True)["status"]["sink-0"]["ranks"]["0"]
        assert status["status"] == "exact", status
        if kind_names:
            assert status["groups"][0] == {"group": 0, "kind": "full_attention",
                                           "sliding_window": None}, status
    finally:
        engine.stop()
    assert not wrong, f"{len(wrong)} answers differ from vLLM's:\n" + "\n".join(wrong[:40])


# --------------------------------------------------------------------------------------------
# The service against vLLM, randomized

SEED = int(os.environ.get("HYBRID_DIFF_SEED", "20261207"))
LAYOUT_PAIRS = 12  # layouts; each served by two engines (instances) of one model
ROUNDS = 40
QUERIES_PER_ROUND = 16
WALL_BUDGET_S = 45.0  # no round starts later: the test stays under a minute on a loaded box


def random_kind(rng: random.Random) -> str:
    kind = rng.choices(["full", "swa", "mamba"], weights=[4, 4, 3])[0]
    if kind != "swa":
        return kind
    window = rng.choice([B, B + 1, 2 * B, 2 * B + 1, 3 * B + 1, rng.randint(2, 6 * B)])
    return f"swa:{window}"


def random_layout(rng: random.Random):
    layout = tuple(random_kind(rng) for _ in range(rng.randint(1, 4)))
    sparse = any(kind != "full" for kind in layout)
    # vLLM refuses a positive interval without a window or Mamba group.
    retention = rng.choice([0, 0, None, B * rng.randint(1, 4)] if sparse else [0, None])
    return layout, retention


class Family:
    """Prompts of one engine pair: a few shared bases, each extended by random tails."""

    def __init__(self, rng: random.Random, base: int) -> None:
        self.rng, self.base = rng, base
        self.roots = [prompt(rng.randint(0, 6) * B + rng.choice([0, 0, rng.randint(1, B - 1)]),
                             base + 1000 * k) for k in range(3)]
        self.count = 0

    def new(self) -> List[int]:
        self.count += 1
        root = self.rng.choice(self.roots)
        tail = self.rng.randint(0, 6) * B + self.rng.randint(0, B - 1)
        tokens = root + prompt(tail, self.base + 100_000 + 1000 * self.count)
        return tokens or prompt(B, self.base + 500_000 + self.count)


def lose_blocks(rng: random.Random, rank: HybridRank):
    """Between two steps, a KV connector reports two cached blocks of one group lost, some of
    them possibly held by the running requests (their hashes go, the blocks stay in use)."""
    group = rng.randrange(len(rank.layout))

    def lose():
        cached = [b.block_id for b in rank.block_pool.blocks
                  if b.block_hash is not None and rank.group_of(b) == group]
        rank.evict(rng.sample(cached, min(len(cached), 2)), publish=False)

    return lose


@pytest.mark.server
def test_random_hybrids_answer_like_vllm(client, conductor):
    """A seeded differential (HYBRID_DIFF_SEED): random layouts of 1-4 groups (full attention,
    sliding windows of random sizes, Mamba), random retention, chunk sizes and pool sizes;
    random stores of prompts sharing prefixes, explicit evictions of random blocks of random
    groups (also while requests run), LRU eviction, preemption, and prefix-cache resets. After
    each round every engine is synced and asked random prompts; every answer must be vLLM's.
    Two engines of each layout serve one model, so their groups share the context's keys."""
    rng = random.Random(SEED)
    started = time.monotonic()
    engines, families, layouts = [], [], []
    try:
        for i in range(LAYOUT_PAIRS):
            layout, retention = random_layout(rng)
            chunk = rng.choice([2 * B, 3 * B, 4 * B, 6 * B, 10 * B, 2048])
            longest = 13 * B  # Family.new's longest prompt
            # Room for one request in every group, plus a little: LRU eviction after a few.
            num_blocks = len(layout) * (longest // B + 1) + 2 + rng.randint(0, 8)
            family = Family(rng, 1_000_000 * (i + 1))
            for j in range(2):
                engines.append(Engine(client, conductor, layout, instance=f"rand-{i}-{j}",
                                      model=f"rand-model-{i}", num_blocks=num_blocks,
                                      retention=retention, chunk_tokens=chunk))
                families.append(family)
            layouts.append(f"{describe(layout)} retention={retention} chunk={chunk} "
                           f"blocks={num_blocks}")

        known: List[List[List[int]]] = [[] for _ in engines]
        wrong, compared, rounds_run = [], 0, 0
        for round_no in range(ROUNDS):
            if time.monotonic() - started > WALL_BUDGET_S:
                break
            rounds_run += 1
            for e, engine in enumerate(engines):
                rank, family = engine.rank, families[e]
                for _ in range(rng.randint(1, 3)):
                    op = rng.random()
                    if op < 0.70 or not known[e]:
                        # One request, or several arriving together (same-step hits, the
                        # same blocks computed twice, preemption).
                        batch = [family.new() if rng.random() < 0.6 or not known[e]
                                 else rng.choice(known[e])
                                 for _ in range(rng.choice([1, 1, 1, 2, 3]))]
                        if len(batch) > 1 and rng.random() < 0.3:
                            batch.append(batch[0])
                        lost = lose_blocks(rng, rank) if rng.random() < 0.15 else None
                        try:
                            rank.store_many(batch, between_steps=lost)
                        except PoolTooSmall:
                            continue  # published what it cached before; vLLM would wait
                        known[e].extend(batch)
                    elif op < 0.97:
                        group = rng.randrange(len(engine.layout))
                        held = rank.cached_block_ids(rng.choice(known[e]), group)
                        if held:
                            rank.evict(rng.sample(held, rng.randint(1, len(held))))
                    else:
                        rank.clear()
            for engine in engines:
                engine.sync()
            for e, engine in enumerate(engines):
                asked = {}
                for q in range(QUERIES_PER_ROUND):
                    pick = rng.random()
                    if pick < 0.5 and known[e]:
                        tokens = rng.choice(known[e])
                        tokens = tokens[:rng.randint(1, len(tokens))]
                    elif pick < 0.8 and known[e]:
                        tokens = rng.choice(known[e])
                    else:
                        tokens = families[e].new()
                    asked[f"round {round_no} query {q}"] = tokens
                compared += len(asked)
                wrong.extend(engine.mismatches(asked, f"seed {SEED}"))
    finally:
        stop_all(engines)
    hybrid_only = sum(e.hybrid_only for e in engines)
    summary = (f"seed {SEED} (rerun with HYBRID_DIFF_SEED={SEED}): {rounds_run} rounds, "
               f"{compared} comparisons "
               f"({hybrid_only} where a group-blind index would be wrong), {len(wrong)} "
               f"mismatches; layouts: " + "; ".join(layouts))
    print(summary)
    assert compared >= 2000 and hybrid_only >= compared // 20, summary
    assert not wrong, summary + "\n" + "\n".join(wrong[:40])

