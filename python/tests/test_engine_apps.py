"""Self-tests of engine_apps (no Conductor): each route's JSON as the engines' own code renders it,
and each rank's events on that rank's advertised endpoint, decoded with the engine's decoder."""

import json
import time
import urllib.error
import urllib.request

import pytest

from engine_apps import SglangEngineApp, VllmEngineApp, decoder
from support import vllm_block_hashes, wait_until

BS = 16
PROMPT = list(range(5000, 5064))  # four complete blocks


def get(url, timeout=5.0):
    """(status, JSON body) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def refused(url):
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except urllib.error.HTTPError:
        return False
    except OSError:
        return True
    return False


def loopback(endpoint):
    """The endpoint a subscriber on this host dials: a wildcard host becomes 127.0.0.1."""
    return endpoint.replace("tcp://*:", "tcp://127.0.0.1:")


class Subscriber:
    """A SUB socket on one rank's endpoint that proves itself joined before a test publishes:
    PUB drops what it sends before the subscription arrives, so fresh sentinel prompts are stored
    on the rank until one is received."""

    def __init__(self, endpoint, rank, decoder, sentinel_base, timeout=10.0):
        import zmq

        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)
        self.decoder = decoder
        deadline = time.monotonic() + timeout
        attempt = 0
        while not self.sock.poll(100):
            assert time.monotonic() < deadline, f"nothing received on {endpoint}"
            rank.store([sentinel_base + attempt * BS + i for i in range(BS)])
            attempt += 1
        self.drain()

    def drain(self):
        while self.sock.poll(200):
            self.sock.recv_multipart()

    def next_batch(self, timeout_ms=5000):
        assert self.sock.poll(timeout_ms), "no batch within the timeout"
        topic, seq, payload = self.sock.recv_multipart()
        return topic, int.from_bytes(seq, "big"), self.decoder.decode(payload)

    def close(self):
        self.sock.close(linger=0)
        self.ctx.term()


@pytest.fixture
def vllm_app():
    with VllmEngineApp(model="vllm-m", ranks=(0, 1), block_size=BS) as app:
        yield app


@pytest.fixture
def sglang_app():
    with SglangEngineApp(model="sglang-m", ranks=(0, 1), page_size=BS) as app:
        yield app


# --------------------------------------------------------------------------------------------
# vLLM


def test_vllm_kv_event_sources_are_kv_events_configs_by_rank(vllm_app):
    status, body = get(vllm_app.url + "/kv_event_sources")
    assert status == 200
    base, replay = vllm_app.base_port, vllm_app.replay_base_port
    assert body == {
        str(r): {"enable_kv_cache_events": True, "publisher": "zmq",
                 "endpoint": f"tcp://*:{base + r}", "replay_endpoint": f"tcp://*:{replay + r}",
                 "buffer_steps": 10000, "hwm": 100000, "max_queue_size": 100000, "topic": ""}
        for r in (0, 1)
    }


def test_vllm_models_load_and_version(vllm_app):
    status, models = get(vllm_app.url + "/v1/models")
    assert status == 200 and models["object"] == "list"
    (card,) = models["data"]
    assert card["id"] == "vllm-m" and card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["root"] == "vllm-m" and card["permission"][0]["object"] == "model_permission"
    assert get(vllm_app.url + "/load") == (200, {"server_load": 0})
    vllm_app.set_load(3)
    assert get(vllm_app.url + "/load") == (200, {"server_load": 3})
    assert get(vllm_app.url + "/version") == (200, {"version": "0.33.0"})


def test_vllm_ranks_come_and_go(vllm_app):
    vllm_app.add_rank(2)
    _, body = get(vllm_app.url + "/kv_event_sources")
    assert sorted(body) == ["0", "1", "2"]
    assert body["2"]["endpoint"] == f"tcp://*:{vllm_app.base_port + 2}"
    vllm_app.remove_rank(1)
    assert sorted(get(vllm_app.url + "/kv_event_sources")[1]) == ["0", "2"]


def test_vllm_without_replay_reports_null():
    with VllmEngineApp(ranks=(0,), replay=False) as app:
        assert get(app.url + "/kv_event_sources")[1]["0"]["replay_endpoint"] is None


def test_description_can_fail_and_stop_while_publishers_go_on(vllm_app):
    vllm_app.fail_description()
    assert get(vllm_app.url + "/kv_event_sources")[0] == 500
    vllm_app.serve_description()
    assert get(vllm_app.url + "/kv_event_sources")[0] == 200
    vllm_app.stop_http()
    assert refused(vllm_app.url + "/kv_event_sources")
    sub = Subscriber(loopback(f"tcp://*:{vllm_app.base_port}"), vllm_app.ranks[0],
                     decoder("vLLM"), 90000)
    sub.close()


def test_vllm_stored_blocks_arrive_on_their_rank(vllm_app):
    _, sources = get(vllm_app.url + "/kv_event_sources")
    vllm_decoder = decoder("vLLM")
    subs = {r: Subscriber(loopback(sources[str(r)]["endpoint"]), vllm_app.ranks[r],
                          vllm_decoder, 70000 + 1000 * r) for r in (0, 1)}
    try:
        vllm_app.ranks[1].store(PROMPT)
        topic, _, batch = subs[1].next_batch()
        assert topic == b"" and batch.data_parallel_rank == 1
        (stored,) = batch.events
        assert type(stored).__name__ == "BlockStored" and stored.token_ids == PROMPT
        assert stored.block_size == BS and stored.medium == "GPU"
        # The published hashes are the recipe VLLM_PROFILE names (sha256_cbor, seed "0").
        assert stored.block_hashes == vllm_block_hashes(PROMPT, BS, seed="0")
        vllm_app.ranks[0].store(PROMPT[:32])
        _, _, batch = subs[0].next_batch()
        assert batch.data_parallel_rank == 0 and batch.events[0].token_ids == PROMPT[:32]
        assert vllm_app.expected(PROMPT) == {"0": 32, "1": 64}
        vllm_app.ranks[1].evict(PROMPT, keep_tokens=16)
        _, _, batch = subs[1].next_batch()
        assert {type(e).__name__ for e in batch.events} == {"BlockRemoved"}
        removed = [h for e in batch.events for h in e.block_hashes]
        assert sorted(removed) == sorted(stored.block_hashes[1:])
        assert vllm_app.expected(PROMPT) == {"0": 32, "1": 16}
        vllm_app.ranks[0].clear()
        _, _, batch = subs[0].next_batch()
        assert [type(e).__name__ for e in batch.events] == ["AllBlocksCleared"]
        assert vllm_app.expected(PROMPT) == {"0": 0, "1": 16}
    finally:
        for sub in subs.values():
            sub.close()


def test_vllm_replay_serves_what_was_published(vllm_app):
    import zmq

    vllm_app.ranks[0].store(PROMPT)
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    try:
        dealer.connect(loopback(f"tcp://*:{vllm_app.replay_base_port}"))
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        assert dealer.poll(5000)
        _, _, seq, payload = dealer.recv_multipart()
        assert int.from_bytes(seq, "big") == 0
        assert decoder("vLLM").decode(payload).events[0].token_ids == PROMPT
    finally:
        dealer.close(linger=0)
        ctx.term()


def test_app_stops_by_itself():
    app = VllmEngineApp(ranks=(0,), lifetime=0.5)
    assert app.closed.wait(10)
    assert refused(app.url + "/load") and app.ranks == {}


# --------------------------------------------------------------------------------------------
# SGLang


def test_sglang_server_info_lists_each_rank(sglang_app):
    status, info = get(sglang_app.url + "/server_info")
    assert status == 200 and info["served_model_name"] == "sglang-m"
    base, replay = sglang_app.base_port, sglang_app.replay_base_port
    assert info["kv_event_sources"] == [
        {"dp_rank": r, "endpoint": f"tcp://127.0.0.1:{base + r}", "topic": "", "block_size": BS,
         "replay_endpoint": f"tcp://127.0.0.1:{replay + r}"}
        for r in (0, 1)
    ]
    assert info["kv_events"] == {"publisher": "zmq", "endpoint_host": "127.0.0.1",
                                 "endpoint_port_base": base, "topic": "", "block_size": BS,
                                 "dp_size": 2, "replay_endpoint_port_base": replay}


def test_sglang_without_grpc_port_has_only_the_descriptor():
    with SglangEngineApp(ranks=(0, 1), grpc_port=False) as app:
        info = get(app.url + "/server_info")[1]
        assert "kv_event_sources" not in info
        assert info["kv_events"]["dp_size"] == 2
        assert info["kv_events"]["endpoint_port_base"] == app.base_port


def test_sglang_loads_per_rank(sglang_app):
    sglang_app.set_load(1, num_running_reqs=2, num_waiting_reqs=5)
    status, body = get(sglang_app.url + "/v1/loads")
    assert status == 200 and body["version"] == "0.5.23" and body["num_accelerators"] == 1
    loads = body["loads"]
    assert [load["dp_rank"] for load in loads] == [0, 1]
    assert (loads[1]["num_running_reqs"], loads[1]["num_waiting_reqs"]) == (2, 5)
    assert all(isinstance(load["token_usage"], float) for load in loads)
    _, only = get(sglang_app.url + "/v1/loads?dp_rank=1")
    assert [load["dp_rank"] for load in only["loads"]] == [1]


def test_sglang_ranks_come_and_go(sglang_app):
    sglang_app.add_rank(2)
    sources = get(sglang_app.url + "/server_info")[1]["kv_event_sources"]
    assert [s["dp_rank"] for s in sources] == [0, 1, 2]
    assert sources[2]["endpoint"] == f"tcp://127.0.0.1:{sglang_app.base_port + 2}"
    sglang_app.remove_rank(1)
    sources = get(sglang_app.url + "/server_info")[1]["kv_event_sources"]
    assert [s["dp_rank"] for s in sources] == [0, 2]


def test_sglang_stored_pages_arrive_on_their_rank(sglang_app):
    sources = get(sglang_app.url + "/server_info")[1]["kv_event_sources"]
    sglang_decoder = decoder("SGLang")
    subs = {s["dp_rank"]: Subscriber(s["endpoint"], sglang_app.ranks[s["dp_rank"]],
                                     sglang_decoder, 80000 + 1000 * s["dp_rank"])
            for s in sources}
    try:
        sglang_app.ranks[1].store(PROMPT)
        _, _, batch = subs[1].next_batch()
        assert batch.attn_dp_rank == 1
        stored = [e for e in batch.events if type(e).__name__ == "BlockStored"]
        assert [t for e in stored for t in e.token_ids] == PROMPT
        assert sum(len(e.block_hashes) for e in stored) == len(PROMPT) // BS
        sglang_app.ranks[0].store(PROMPT[:32])
        _, _, batch = subs[0].next_batch()
        assert batch.attn_dp_rank == 0
        assert sglang_app.expected(PROMPT) == {"0": 32, "1": 64}
        sglang_app.ranks[0].evict(10**6)  # every unlocked leaf, sentinels included
        _, _, batch = subs[0].next_batch()
        assert {type(e).__name__ for e in batch.events} == {"BlockRemoved"}
        assert sglang_app.expected(PROMPT) == {"0": 0, "1": 64}
    finally:
        for sub in subs.values():
            sub.close()
