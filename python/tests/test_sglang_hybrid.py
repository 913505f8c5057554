"""SGLang HYBRID models (full attention + sliding window, full attention + Mamba) against
SGLang's own reuse rule: the service's answer is an upper bound, never below SGLang's hit.

SGLang 0.5.23 serves every hybrid model from ``UnifiedRadixCache`` (it has no ``SWARadixCache``
or ``MambaRadixCache``). Its KV events carry no group or kind: a BlockStored per page when a
node is created, a BlockRemoved when a node's full-attention KV leaves; a node's window KV or
Mamba state leaves without an event, and a request can store pages whose window KV it already
freed. ``match_prefix`` reuses a node only if every part allows it (the window:
``sliding_window_size`` tokens of live window KV ending at the node; Mamba: a state on the
node). A registration with ``hybrid_parts`` says so, and the service answers the full-attention
prefix the events show, with status ``upper_bound``.

Each hybrid engine here is SGLang's own ``UnifiedRadixCache`` with its Python tree core and its
FULL + SWA or FULL + MAMBA components (``sglang_hybrid.Rank``; which code is SGLang's and what
stands in for its KV pools, its scheduler and torch is listed in that module's docstring),
publishing the cache's own events with SGLang's own ZMQ publisher to the real service
(CONDUCTOR_BIN). After the service applied every batch (``/services/status``: the
subscription's ``last_seq`` is the last one published and nothing is pending), for each query
prompt of T tokens:

* the service's answer (rank 0's ``device`` tokens, ``query(..., include_status=True)``) must
  be >= ``match_prefix(T tokens).device_prefix_len`` on the same cache, the prefix SGLang
  reuses (matched on the whole prompt, so also >= what its scheduler reuses, which keeps the
  last token out of the match), and the instance and its rank must say ``upper_bound`` with a
  non-empty reason;
* it must also equal the full-attention prefix the events describe (the tree core's
  ``match_full_device_prefix``), the bound the service is built to give: SGLang's hit is a
  prefix of it, and anything else means the index does not follow the events.

SGLang registered without ``hybrid_parts`` (UnifiedRadixCache with the FULL component alone,
what 0.5.23 builds for a model without hybrid parts, and SGLang's RadixCache) answers exactly
SGLang's hit with status ``exact``.

* ``test_sliding_window_scripted`` / ``test_mamba_scripted``: a short history per part whose
  out-of-window stores, branching checkpoints and window-only / Mamba-only evictions put the
  answer strictly above SGLang's hit, then LRU eviction by allocation.
* ``test_random_sglang_hybrids``: a seeded randomized history (SGLANG_HYBRID_SEED; about 15 000
  comparisons, 10-30 s) over random page sizes (1, 4, 16, 32, 64), windows, pool sizes, Mamba
  checkpoint modes (extra buffer or not), chunk sizes and per-path state caps: requests with
  shared prefixes and multi-turn extensions, long requests without window KV behind,
  window-only and Mamba-only evictions, full-attention evictions, LRU eviction by allocation
  past capacity, prefixes held locked by running requests, flush_cache. Engines of one model
  share its hash space; hybrid and non-hybrid instances are asked in one query.
* ``test_plain_sglang_registration_is_exact``.
* ``test_the_comparison_catches_a_lost_store``: the comparison is not vacuous.
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
from sglang_hybrid import Rank, hybrid_modules
from support import wait_until

SGLANG_PROFILE = dict(engine_apps.SGLANG_PROFILE)
SEED = int(os.environ.get("SGLANG_HYBRID_SEED", "20261208"))
WALL_BUDGET_S = 30.0  # no round starts later: the test stays well under a minute
ROUNDS = 200
QUERIES_PER_ROUND = 12


@pytest.fixture(scope="module", autouse=True)
def sglang_loaded():
    """Load SGLang's modules (and compile its page hash) once, before any service starts."""
    hybrid_modules()


def prompt(n: int, base: int) -> List[int]:
    """`n` tokens no other prompt of the test shares unless built from the same `base`."""
    return [base + 7 * i for i in range(n)]


# --------------------------------------------------------------------------------------------
# An engine rank registered with the service


class PlainRank(engine_apps.SglangRank):
    """engine_apps' SGLang rank over SGLang's RadixCache, counting the batches it publishes."""

    def __init__(self, *args, **kwargs) -> None:
        self.published = 0
        super().__init__(*args, **kwargs)

    def step(self) -> None:
        events = self.tree.take_events()
        if events:
            self.publisher.publish(self.s.kv_events.KVEventBatch(ts=time.time(), events=events))
            self.published += 1

    def publish_empty(self) -> None:
        self.publisher.publish(self.s.kv_events.KVEventBatch(ts=time.time(), events=[]))
        self.published += 1

    def request(self, tokens: Sequence[int], **_) -> str:
        self.store(tokens)
        return "inserted"

    def hit(self, tokens: Sequence[int]) -> int:
        return self.cached_tokens(tokens)

    full_attention_prefix = hit


class Engine:
    """A rank whose SGLang publisher (with its replay socket) the service subscribes to."""

    def __init__(self, client, conductor, kind: str, *, instance: str, model: str,
                 page_size: int, hybrid_parts=None, **rank_args) -> None:
        from mooncake.conductor import OK

        self.client, self.conductor = client, conductor
        self.kind, self.instance, self.model, self.page_size = kind, instance, model, page_size
        self.args = dict(rank_args, page_size=page_size)
        base = engine_apps.port_run(2)
        endpoint, replay = f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 1}"
        # The --kv-events-config text SGLang's scheduler is given ("bind": its own option).
        kv_events_config = json.dumps({"publisher": "zmq", "endpoint": endpoint, "bind": True,
                                       "replay_endpoint": replay})
        if kind == "radix":
            self.rank = PlainRank(hybrid_modules(), 0, kv_events_config, page_size)
        else:
            self.rank = Rank(kind, kv_events_config=kv_events_config, **self.args)
        config = {"instance_id": instance, "endpoint": endpoint, "replay_endpoint": replay,
                  "publisher_type": "SGLang", "model_name": model, "block_size": page_size,
                  "dp_rank": 0, "hash_profile": dict(SGLANG_PROFILE)}
        if hybrid_parts is not None:
            config["hybrid_parts"] = hybrid_parts
        try:
            assert client.register(config) == OK
            self.service = f"{instance}|default|0"
            self.join()
        except BaseException:
            self.rank.stop()
            raise

    def status(self) -> Optional[dict]:
        url = f"http://127.0.0.1:{self.conductor.http_port}/services/status"
        with urllib.request.urlopen(url, timeout=5) as r:
            services = json.load(r)["services"]
        return next((s for s in services if s["service"] == self.service), None)

    def join(self, timeout: float = 15.0) -> None:
        """PUB drops what it sends before the service's subscription arrives: publish batches
        without events (no cache change) until one is received. A first batch past seq 0
        makes the service replay the stream from its start through the replay socket."""

        def received():
            self.rank.publish_empty()
            status = self.status()
            return status is not None and status["last_seq"] is not None

        assert wait_until(received, timeout=timeout, interval=0.05), \
            f"{self.instance}: nothing received: {self.status()}"
        self.sync()

    def applied(self) -> Optional[dict]:
        status = self.status()
        if status and status["last_seq"] == self.rank.published - 1 \
                and status["pending_batches"] == 0:
            return status
        return None

    def sync(self, timeout: float = 15.0) -> dict:
        """Wait until every published batch was received and applied."""
        status = wait_until(self.applied, timeout=timeout, interval=0.01)
        assert status, f"{self.instance}: batch {self.rank.published - 1} never applied: " \
                       f"{self.status()}"
        return status

    def query(self, tokens: Sequence[int], only_this: bool = True) -> dict:
        """The service's include_status answer for `tokens` in this engine's model: for this
        instance only, or (`only_this` False) for every instance of the model."""
        from mooncake.conductor import OK

        result = self.client.query(self.model, block_size=self.page_size,
                                   token_ids=list(tokens),
                                   instance_filter=self.instance if only_this else "",
                                   include_status=True)
        assert result["ret"] == OK, result
        return result

    def answer(self, result: dict):
        """(device tokens of rank 0, the instance's status) in a query result."""
        row = result["hits"].get(self.instance)
        assert row is not None, f"no row for {self.instance}: {result}"
        return row["rank_matches"]["0"]["device"], result["status"].get(self.instance)

    @property
    def hybrid(self) -> bool:
        return self.kind in ("swa", "mamba")

    def stop(self) -> None:
        self.rank.stop()


def stop_all(engines) -> None:
    """Stop publishers in parallel: each may wait up to 1 s to drain."""
    threads = [threading.Thread(target=e.stop, daemon=True) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)


def preview(tokens: Sequence[int]) -> str:
    return f"{list(tokens[:3])}...{list(tokens[-2:])}" if len(tokens) > 5 else str(list(tokens))


class Checker:
    """Compares the service with SGLang; collects what is wrong and counts what was seen."""

    def __init__(self, expect_status: str) -> None:
        self.expect_status = expect_status
        self.below: List[str] = []  # the promise broken: the service under SGLang's hit
        self.other: List[str] = []  # a wrong status, or not the events' full-attention prefix
        self.compared = self.strictly_above = self.hits = 0

    def check(self, engine: Engine, tokens: Sequence[int], label: str, history,
              result: Optional[dict] = None) -> None:
        """Compare the service's answer for `tokens` (`result`, else a query for this
        instance) with SGLang's hit and the full-attention prefix on the engine's cache."""
        if result is None:
            result = engine.query(tokens)
        hit = engine.rank.hit(tokens)
        full = engine.rank.full_attention_prefix(tokens)
        got, status = engine.answer(result)
        self.compared += 1
        self.strictly_above += got > hit
        self.hits += hit > 0
        where = (f"[{label}] {engine.instance} {engine.kind} {engine.args}: T={len(tokens)} "
                 f"{preview(tokens)}: service {got}, SGLang hit {hit}, full-attention prefix "
                 f"{full}")
        if got < hit:
            self.below.append(f"{where}\n  history (last 12 of {len(history)}): "
                              + "; ".join(history[-12:]))
        elif got != full:
            self.other.append(f"{where}: not the full-attention prefix")
        if self.expect_status == "upper_bound":
            rank = (status or {}).get("ranks", {}).get("0", {})
            ok = status and status["status"] == "upper_bound" and status["reason"] \
                and rank.get("status") == "upper_bound" and rank.get("reason")
        else:
            ok = status and status["status"] == "exact" \
                and status["ranks"]["0"]["status"] == "exact"
        if not ok:
            self.other.append(f"{where}: status {status}")

    def assert_clean(self) -> None:
        assert not self.below, (f"{len(self.below)} answers BELOW SGLang's own hit:\n"
                                + "\n".join(self.below[:20]))
        assert not self.other, f"{len(self.other)} wrong answers:\n" + "\n".join(self.other[:30])


def queries_for(tokens: Sequence[int], page: int, base: int) -> Dict[str, List[int]]:
    """The prompt, its page-aligned prefixes and an unaligned one per page, and the prompt with
    a tail nothing stored."""
    out = {"p": list(tokens), "p+tail": list(tokens) + prompt(2 * page + 3, base)}
    for n in range(page, len(tokens), page):
        out[f"p[:{n}]"] = list(tokens[:n])
        out[f"p[:{n}+1]"] = list(tokens[:n + 1])
    return out


# --------------------------------------------------------------------------------------------
# Scripted: the gap the upper bound covers


@pytest.mark.server
def test_sliding_window_scripted(client, conductor):
    """Full attention + a 32-token window, pages of 16, a window pool of 10 pages. A long
    request frees its out-of-window window KV before its insert; window-only evictions strip
    internal nodes; a full-attention eviction and LRU eviction by allocation remove leaves."""
    ps = 16
    engine = Engine(client, conductor, "swa", instance="swa-script", model="swa-model",
                    page_size=ps, hybrid_parts="sliding_window", window=32, full_pages=30,
                    swa_pages=10)
    rank, checker, history = engine.rank, Checker("upper_bound"), []
    base = prompt(64, 1000)  # a shared system prompt of four pages
    prompts = {"A": base + prompt(40, 2000), "B": base + prompt(70, 3000),
               "long": base + prompt(150, 4000)}
    try:
        def step(label, action):
            action()
            history.append(label)
            rank.sanity_check()
            engine.sync()
            for name, tokens in prompts.items():
                for qname, q in queries_for(tokens, ps, 900_000).items():
                    checker.check(engine, q, f"{label}: {name} {qname}", history)

        step("A", lambda: rank.request(prompts["A"]))
        step("B", lambda: rank.request(prompts["B"]))
        assert rank.hit(prompts["B"]) == 128  # B's own window is live
        step("long, out-of-window KV freed", lambda: rank.request(prompts["long"],
                                                                  long_decode=True))
        assert rank.hit(prompts["long"][:128]) < rank.full_attention_prefix(
            prompts["long"][:128]), "the long request stored pages without window KV"
        step("window-only eviction", lambda: rank.evict(swa_num_tokens=48))
        step("extend A (multi-turn)", lambda: rank.request(prompts["A"] + prompt(50, 5000)))
        step("full-attention eviction", lambda: rank.evict(num_tokens=32))
        for k in range(4):  # past the full pool: LRU eviction by allocation
            step(f"filler {k}", lambda k=k: rank.request(prompt(120, 10_000 * (k + 1))))
    finally:
        engine.stop()
    checker.assert_clean()
    assert checker.strictly_above >= 10, (checker.compared, checker.strictly_above)


@pytest.mark.server
def test_mamba_scripted(client, conductor):
    """Full attention + Mamba with the extra buffer: pages of 16, a Mamba checkpoint every 64
    tokens, 6 state slots. A request whose full KV reaches past the last state checkpoints at
    the branching point; Mamba-only evictions strip internal states; LRU evicts leaves."""
    ps = 16
    engine = Engine(client, conductor, "mamba", instance="mamba-script", model="mamba-model",
                    page_size=ps, hybrid_parts=["mamba"], mamba_slots=6, full_pages=40)
    rank, checker, history = engine.rank, Checker("upper_bound"), []
    base = prompt(128, 1000)
    prompts = {"A": base + prompt(70, 2000), "B": base[:96] + prompt(100, 3000),
               "C": base + prompt(140, 4000)}
    try:
        def step(label, action):
            action()
            history.append(label)
            rank.sanity_check()
            engine.sync()
            for name, tokens in prompts.items():
                for qname, q in queries_for(tokens, ps, 900_000).items():
                    checker.check(engine, q, f"{label}: {name} {qname}", history)

        step("A", lambda: rank.request(prompts["A"]))
        assert rank.hit(prompts["A"]) == 192 and rank.hit(base) == 0  # one state, at 192
        step("B (branches inside A's first state's span)", lambda: rank.request(prompts["B"]))
        step("C (checkpoints at A's branching point 128)", lambda: rank.request(prompts["C"]))
        assert rank.hit(base) == 128
        step("Mamba-only eviction", lambda: rank.evict(mamba_num=2))
        step("extend C (multi-turn)", lambda: rank.request(prompts["C"] + prompt(90, 5000)))
        for k in range(4):  # past the pools: LRU eviction by allocation
            step(f"filler {k}", lambda k=k: rank.request(prompt(200, 10_000 * (k + 1))))
        step("Mamba-only eviction", lambda: rank.evict(mamba_num=3))
    finally:
        engine.stop()
    checker.assert_clean()
    assert checker.strictly_above >= 10, (checker.compared, checker.strictly_above)


# --------------------------------------------------------------------------------------------
# Randomized


class Family:
    """Prompts of one engine: a few shared system prompts, each extended by random tails, and
    later turns that extend an earlier prompt."""

    def __init__(self, rng: random.Random, base: int, page: int) -> None:
        self.rng, self.base, self.page = rng, base, page
        unit = max(page, 8)
        self.roots = [prompt(rng.randint(0, 8) * unit + rng.choice([0, rng.randint(1, unit)]),
                             base + 1000 * k) for k in range(3)]
        self.known: List[List[int]] = []
        self.count = 0

    def tail(self, n: int) -> List[int]:
        self.count += 1
        return prompt(n, self.base + 100_000 + 1000 * self.count)

    def new(self) -> List[int]:
        unit = max(self.page, 8)
        earlier = [t for t in self.known if len(t) <= 10 * unit]
        if earlier and self.rng.random() < 0.25:  # the next turn of a conversation
            tokens = self.rng.choice(earlier) + self.tail(self.rng.randint(1, 6 * unit))
        else:
            tokens = self.rng.choice(self.roots) + self.tail(self.rng.randint(1, 10 * unit))
        self.known.append(tokens)
        return tokens

    def query(self) -> List[int]:
        pick = self.rng.random()
        if pick < 0.45 and self.known:
            tokens = self.rng.choice(self.known)
            return tokens[:self.rng.randint(1, len(tokens))]
        if pick < 0.75 and self.known:
            return list(self.rng.choice(self.known))
        if pick < 0.9 and self.known:
            return self.rng.choice(self.known) + self.tail(self.rng.randint(1, 3 * self.page))
        return self.rng.choice(self.roots) + self.tail(self.rng.randint(1, 4 * self.page))


def random_engine_args(rng: random.Random, kind: str) -> dict:
    """A random configuration: pools hold a few of the longest prompts (about 14 units)."""
    if kind == "swa":
        page = rng.choice([1, 4, 16, 16, 64])
        unit = max(page, 8)
        window = rng.choice([page, 2 * page, 3 * page + 1, rng.randint(2, 6 * unit),
                             4 * unit])
        longest = -(-(16 * unit) // page)  # pages of the longest prompt
        full_pages = rng.randint(2, 5) * longest
        # The window pool: smaller, but room for a request's pages and more than a window.
        swa_pages = rng.randint(longest + 2, full_pages)
        return dict(page_size=page, window=window, full_pages=full_pages, swa_pages=swa_pages)
    page = rng.choice([1, 16, 16, 32, 64])
    unit = max(page, 8)
    longest = -(-(16 * unit) // page)
    return dict(page_size=page, full_pages=rng.randint(2, 5) * longest,
                mamba_slots=rng.randint(4, 12), mamba_chunk=rng.choice([64, 64, 128]),
                max_states_per_path=rng.choice([-1, -1, 1, 2]))


# Engines of one model share its hash space (and prompts). An SGLang engine without hybrid
# parts ("full": UnifiedRadixCache with the FULL component alone, what 0.5.23 builds for such a
# model; "radix": SGLang's RadixCache) shares a model with hybrid engines, so one answer holds
# exact and upper-bound instances.
RANDOM_MODELS = [("swa", "swa", "full"), ("swa",), ("mamba", "mamba", "radix"), ("mamba",)]


@pytest.mark.server
def test_random_sglang_hybrids(client, conductor):
    """A seeded randomized history (SGLANG_HYBRID_SEED): four models of random configurations,
    served by three full + sliding window engines, three full + Mamba engines and one plain
    SGLang engine. After each round every engine is synced, and each model is asked random
    prompts of its family once for all its instances."""
    rng = random.Random(SEED)
    started = time.monotonic()
    engines, groups = [], []
    hybrid, plain = Checker("upper_bound"), Checker("exact")
    histories: Dict[str, List[str]] = {}
    outcomes: Dict[str, int] = {}
    rounds_run = 0
    try:
        for m, kinds in enumerate(RANDOM_MODELS):
            args = random_engine_args(rng, kinds[0])
            family = Family(rng, 1_000_000 * (m + 1), args["page_size"])
            group = []
            for j, kind in enumerate(kinds):
                parts = {"swa": rng.choice(["sliding_window", ["sliding_window"],
                                            "sliding_window,mamba"]),
                         "mamba": rng.choice(["mamba", ("mamba",), "mamba, sliding_window"]),
                         }.get(kind)
                engine_args = {"page_size": args["page_size"]} if kind == "radix" else \
                    {"page_size": args["page_size"], "full_pages": args["full_pages"]} \
                    if kind == "full" else args
                engine = Engine(client, conductor, kind, instance=f"rand-{m}-{j}-{kind}",
                                model=f"rand-model-{m}", hybrid_parts=parts, **engine_args)
                engines.append(engine)
                group.append(engine)
                histories[engine.instance] = [f"config {engine_args} hybrid_parts={parts!r}"]
            groups.append((family, group))

        for round_no in range(ROUNDS):
            if time.monotonic() - started > WALL_BUDGET_S:
                break
            rounds_run += 1
            for family, group in groups:
                for engine in group:
                    random_steps(rng, engine, family, histories[engine.instance], outcomes)
            for engine in engines:
                engine.sync()
            for family, group in groups:
                for q in range(QUERIES_PER_ROUND):
                    tokens = family.query()
                    result = group[0].query(tokens, only_this=False)
                    for engine in group:
                        checker = hybrid if engine.hybrid else plain
                        checker.check(engine, tokens, f"round {round_no} query {q}",
                                      histories[engine.instance], result)
    finally:
        stop_all(engines)
    print(f"seed {SEED}: {rounds_run} rounds in {time.monotonic() - started:.1f} s, "
          f"{hybrid.compared} hybrid comparisons ({hybrid.strictly_above} strictly above "
          f"SGLang's hit, {hybrid.hits} SGLang hits), {plain.compared} plain "
          f"({plain.hits} hits), requests {outcomes}")
    for engine in engines:
        print(f"  {engine.instance}: {histories[engine.instance][0]}: "
              f"{getattr(engine.rank, 'counts', '')}")
    hybrid.assert_clean()
    plain.assert_clean()
    assert rounds_run >= 5, rounds_run
    assert hybrid.strictly_above >= 20, (hybrid.compared, hybrid.strictly_above)
    assert plain.strictly_above == 0 and plain.hits > 0, (plain.compared, plain.hits)


def random_steps(rng: random.Random, engine: Engine, family: Family, history: List[str],
                 outcomes: Dict[str, int]) -> None:
    """One to four random operations on one engine."""
    rank, held = engine.rank, []
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        if not engine.hybrid and 0.6 <= op < 0.8:
            op = 0.85  # no window or Mamba part: a full-attention eviction instead
        if engine.kind == "radix" and op >= 0.9:
            op = 0.0  # engine_apps' RadixCache rank: requests and evictions only
        if op < 0.6 or not family.known:
            tokens = family.new() if rng.random() < 0.8 or not family.known \
                else rng.choice(family.known)
            long_decode = engine.kind == "swa" and rng.random() < 0.3
            what = rank.request(tokens, long_decode=long_decode)
            outcomes[what] = outcomes.get(what, 0) + 1
            history.append(f"request T={len(tokens)} {preview(tokens)}"
                           f"{' long' if long_decode else ''}: {what}")
        elif op < 0.8:
            if engine.kind == "swa":
                n = rng.randint(1, 4 * rank.window + rank.page_size)
                rank.evict(swa_num_tokens=n)
                history.append(f"window-only eviction of {n} tokens")
            else:
                n = rng.randint(1, 3)
                rank.evict(mamba_num=n)
                history.append(f"Mamba-only eviction of {n} states")
        elif op < 0.9:
            n = rng.randint(1, 8 * rank.page_size)
            rank.evict(num_tokens=n)
            history.append(f"full-attention eviction of {n} tokens")
        elif op < 0.91 and not held:
            rank.flush()
            history.append("flush_cache")
        else:
            tokens = rng.choice(family.known)
            held.append(rank.hold(tokens))
            history.append(f"hold {preview(tokens)}")
    for lock in held:
        rank.release(lock)
        history.append("release hold")
    if engine.kind != "radix":
        rank.sanity_check()


@pytest.mark.server
def test_the_comparison_catches_a_lost_store(client, conductor):
    """The harness itself: a request whose events never reach the service leaves the service
    below SGLang's hit, and the comparison reports it (so a pass above is not vacuous)."""
    ps = 16
    engine = Engine(client, conductor, "swa", instance="lost-0", model="lost-model",
                    page_size=ps, hybrid_parts="sliding_window", window=32)
    rank, checker = engine.rank, Checker("upper_bound")
    a, b = prompt(80, 1000), prompt(48, 1000) + prompt(80, 2000)
    try:
        rank.request(a)
        publish = rank.step
        rank.step = lambda: len(rank.cache.take_events())  # b's events are lost
        try:
            rank.request(b)
        finally:
            rank.step = publish
        engine.sync()
        checker.check(engine, b, "lost store", ["a", "b (events lost)"])
    finally:
        engine.stop()
    assert rank.hit(b) == 128 and len(checker.below) == 1, (checker.below, checker.other)
    assert "service 48, SGLang hit 128" in checker.below[0], checker.below[0]


@pytest.mark.server
@pytest.mark.parametrize("kind", ["full", "radix"])
def test_plain_sglang_registration_is_exact(client, conductor, kind):
    """SGLang without hybrid parts, registered without hybrid_parts: UnifiedRadixCache with the
    FULL component alone ("full", what 0.5.23 builds for such a model) and RadixCache
    ("radix"). Status exact, and the answer is SGLang's own hit."""
    ps = 16
    engine = Engine(client, conductor, kind, instance="plain-0", model="plain-model",
                    page_size=ps)
    checker, history = Checker("exact"), []
    p = prompt(100, 1000)
    try:
        for tokens in (p, p[:48] + prompt(60, 2000)):
            engine.rank.request(tokens)
            history.append(preview(tokens))
        engine.rank.evict(ps)
        engine.sync()
        for q in queries_for(p, ps, 900_000).values():
            checker.check(engine, q, "plain", history)
    finally:
        engine.stop()
    checker.assert_clean()
    assert checker.compared > 10
