"""Behaviour against the real mooncake_conductor (CONDUCTOR_BIN), with vLLM-style publishers."""

import pytest

from mooncake.conductor import (
    HEALTH_NOT_INITIALIZED,
    HEALTH_OK,
    HEALTH_UNREACHABLE,
    INVALID_PARAMS,
    OK,
    RPC_FAIL,
    SERVICE_NOT_FOUND,
    ConductorClient,
)
from support import VLLM_CBOR_PROFILE, VllmPublisher, cbor_root, wait_until

pytestmark = pytest.mark.server

MODEL, BS = "my-model", 16
PROMPT = list(range(1000, 1040))  # two complete blocks and a partial tail


@pytest.fixture
def publisher():
    pub = VllmPublisher()
    yield pub
    pub.close()


def vllm_config(publisher, **overrides):
    config = {
        "instance_id": "vllm-0",
        "endpoint": publisher.endpoint,
        "publisher_type": "vLLM",
        "model_name": MODEL,
        "block_size": BS,
        "dp_rank": 0,
        "hash_profile": dict(VLLM_CBOR_PROFILE),
    }
    config.update(overrides)
    return config


def publish_until_hit(client, publisher, tokens=PROMPT, instance="vllm-0", expect=32, **query):
    """Publishes the prompt's blocks until the index shows them (the SUB joins asynchronously)."""

    def probe():
        publisher.block_stored(tokens, BS)
        result = client.query(MODEL, block_size=BS, token_ids=tokens, **query)
        hit = result["hits"].get(instance)
        return result if hit and hit["longest_matched"] >= expect else None

    result = wait_until(probe, timeout=15, interval=0.2)
    assert result, f"no hits for {instance} after publishing"
    return result


def test_fresh_server_is_healthy_and_empty(client):
    assert client.health_check() == HEALTH_OK
    assert client.list_services() == {"ret": OK, "count": 0, "services": []}
    assert client.get_global_view() == {"ret": OK, "context_count": 0, "contexts": []}
    assert client.query(MODEL, block_size=BS, token_ids=PROMPT) == {"ret": OK, "hits": {}}


def test_registered_service_is_listed_with_export_keys(client, publisher):
    assert client.register(vllm_config(publisher, tenant_id="")) == OK
    listing = client.list_services()
    assert listing["ret"] == OK and listing["count"] == 1
    assert listing["services"] == [
        {
            "Endpoint": publisher.endpoint,
            "ReplayEndpoint": "",
            "Type": "vLLM",
            "ModelName": MODEL,
            "LoraName": "",
            "TenantID": "default",
            "InstanceID": "vllm-0",
            "BlockSize": BS,
            "DPRank": 0,
            "CacheGroup": None,
            "HashProfile": {**VLLM_CBOR_PROFILE, "root_digest": cbor_root("0").hex()},
        }
    ]


def test_cache_group_zero_is_listed(client, publisher):
    assert client.register(vllm_config(publisher, cache_group=0)) == OK
    assert client.list_services()["services"][0]["CacheGroup"] == 0


def test_duplicate_registration_is_ok_and_changes_nothing(client, publisher):
    assert client.register(vllm_config(publisher)) == OK
    assert client.register(vllm_config(publisher)) == OK
    assert client.list_services()["count"] == 1


def test_global_view_lists_the_context(client, publisher):
    assert client.register(vllm_config(publisher)) == OK
    view = client.get_global_view()
    assert view["ret"] == OK and view["context_count"] == 1
    (context,) = view["contexts"]
    assert context["model_name"] == MODEL and context["lora_name"] == ""
    assert context["block_size"] == BS and context["tenant_id"] == "default"
    assert context["instances"] == {"vllm-0": {0}}
    assert context["hash_profile"] == {**VLLM_CBOR_PROFILE, "root_digest": cbor_root("0").hex()}
    publish_until_hit(client, publisher)
    assert client.get_global_view()["contexts"][0]["prefix_count"] == 2


def test_published_blocks_are_query_hits(client, publisher):
    assert client.register(vllm_config(publisher)) == OK
    result = publish_until_hit(client, publisher)
    assert result["ret"] == OK
    assert result["hits"] == {
        "vllm-0": {
            "longest_matched": 32,
            "dp": {"0": 32},
            "rank_matches": {"0": {"device": 32, "cpu_local": 32, "cpu_share": 32, "disk": 32}},
            "device": 32,
            "cpu_local": 32,
            "cpu_share": 32,
            "disk": 32,
        }
    }


def test_a_lost_batch_is_replayed_from_a_pyzmq_router(client, conductor):
    # vLLM serves replay from a libzmq ROUTER: the Conductor's DEALER must speak to it.
    import json
    import urllib.request

    publisher = VllmPublisher(with_replay=True)
    try:
        config = vllm_config(publisher, replay_endpoint=publisher.replay_endpoint)
        assert client.register(config) == OK
        publish_until_hit(client, publisher)
        lost, later = list(range(2000, 2032)), list(range(3000, 3032))
        publisher.block_stored(lost, BS, lost=True)
        publisher.block_stored(later, BS)

        def hits(tokens):
            row = client.query(MODEL, block_size=BS, token_ids=tokens)["hits"].get("vllm-0")
            return row["device"] if row else 0

        assert wait_until(lambda: hits(lost) == 32 and hits(later) == 32, timeout=15, interval=0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{conductor.http_port}/services/status", timeout=5) as r:
            (status,) = json.load(r)["services"]
        assert status["replays_ok"] >= 1 and status["sources_dropped"] == 0, status
    finally:
        publisher.close()


def test_hits_stop_at_the_first_different_block(client, publisher):
    assert client.register(vllm_config(publisher)) == OK
    publish_until_hit(client, publisher)
    diverged = PROMPT[:BS] + [7] * BS
    hits = client.query(MODEL, block_size=BS, token_ids=diverged)["hits"]
    assert hits["vllm-0"]["longest_matched"] == BS
    assert client.query(MODEL, block_size=BS, token_ids=PROMPT[:BS - 1])["hits"]["vllm-0"]["device"] == 0


def test_query_filters_and_tenant_normalization(client, publisher):
    assert client.register(vllm_config(publisher)) == OK
    publish_until_hit(client, publisher)
    only = client.query(MODEL, block_size=BS, token_ids=PROMPT, instance_filter="vllm-0")
    assert list(only["hits"]) == ["vllm-0"]
    assert client.query(MODEL, block_size=BS, token_ids=PROMPT, instance_filter="other")["hits"] == {}
    default = client.query(MODEL, block_size=BS, token_ids=PROMPT)
    assert client.query(MODEL, block_size=BS, token_ids=PROMPT, tenant_id="") == default
    assert client.query(MODEL, block_size=BS, token_ids=PROMPT, tenant_id="other")["hits"] == {}
    assert client.query(MODEL, lora_name="adapter", block_size=BS, token_ids=PROMPT)["hits"] == {}
    salted = client.query(MODEL, block_size=BS, token_ids=PROMPT, cache_salt="s")
    assert salted["ret"] == OK and all(h["longest_matched"] == 0 for h in salted["hits"].values())


def test_unregister(client, publisher):
    assert client.register(vllm_config(publisher)) == OK
    publish_until_hit(client, publisher)
    assert client.unregister("vllm-0", "default", 1) == SERVICE_NOT_FOUND
    assert client.unregister("vllm-0") == OK
    assert client.unregister("vllm-0") == SERVICE_NOT_FOUND
    assert client.list_services() == {"ret": OK, "count": 0, "services": []}
    hits = client.query(MODEL, block_size=BS, token_ids=PROMPT)["hits"]
    assert "vllm-0" not in hits


def test_unregister_with_empty_tenant_normalizes(client, publisher):
    assert client.register(vllm_config(publisher)) == OK
    assert client.unregister("vllm-0", "", 0) == OK


REQUIRED = ["endpoint", "model_name", "block_size", "hash_profile", "instance_id"]


@pytest.mark.parametrize("missing", REQUIRED)
def test_missing_required_field_is_invalid_params_from_the_server(client, publisher, missing):
    config = vllm_config(publisher)
    del config[missing]
    assert client.register(config) == INVALID_PARAMS
    assert client.list_services()["count"] == 0


@pytest.mark.parametrize(
    "overrides",
    [
        {"model_name": ""},
        {"endpoint": ""},
        {"block_size": 0},
        {"block_size": -16},
        {"dp_rank": -1},
        {"cache_group": 64},
        {"cache_group": -1},
        {"hash_profile": {**VLLM_CBOR_PROFILE, "strategy": "xxh3"}},
        {"hash_profile": {**VLLM_CBOR_PROFILE, "algorithm": "md5"}},
        {"hash_profile": {**VLLM_CBOR_PROFILE, "index_projection": "first64_be"}},
        {"hash_profile": {**VLLM_CBOR_PROFILE, "python_hash_seed": "-1"}},
        {"hash_profile": {**VLLM_CBOR_PROFILE, "python_hash_seed": "4294967296"}},
        {"hash_profile": {}},
    ],
    ids=lambda o: ",".join(f"{k}={v!r}"[:40] for k, v in o.items()),
)
def test_invalid_values_are_invalid_params_from_the_server(client, publisher, overrides):
    assert client.register(vllm_config(publisher, **overrides)) == INVALID_PARAMS
    assert client.list_services()["count"] == 0


def test_sglang_profile_seed_is_optional_and_normalized(client, publisher):
    profile = {"strategy": "sglang", "algorithm": "sha256_raw", "index_projection": "first64_be"}
    config = vllm_config(publisher, publisher_type="SGLang", hash_profile=profile)
    assert client.register(config) == OK
    (service,) = client.list_services()["services"]
    assert service["Type"] == "SGLang"
    assert service["HashProfile"]["python_hash_seed"] == "0"
    assert set(service["HashProfile"]) == {"strategy", "algorithm", "python_hash_seed", "root_digest", "index_projection"}


def test_invalid_queries(client):
    assert client.query("", block_size=BS, token_ids=PROMPT) == {"ret": INVALID_PARAMS, "hits": {}}
    assert client.query(MODEL, block_size=0, token_ids=PROMPT) == {"ret": INVALID_PARAMS, "hits": {}}
    assert client.query(MODEL, block_size=BS, token_ids=[2**31]) == {"ret": INVALID_PARAMS, "hits": {}}


def test_close_does_not_unregister(conductor, publisher):
    client = ConductorClient()
    assert client.setup(conductor.addr) == OK
    assert client.register(vllm_config(publisher)) == OK
    assert client.close() == OK
    assert client.health_check() == HEALTH_NOT_INITIALIZED
    assert client.setup(conductor.addr) == OK
    assert client.list_services()["count"] == 1


def test_with_block_closes_a_connected_client(conductor):
    with pytest.raises(KeyError):
        with ConductorClient() as client:
            assert client.setup(conductor.addr) == OK
            assert client.health_check() == HEALTH_OK
            raise KeyError("body failed")
    assert client.health_check() == HEALTH_NOT_INITIALIZED


def test_two_clients_see_the_same_state(conductor, publisher):
    a, b = ConductorClient(), ConductorClient()
    assert a.setup(conductor.addr) == OK and b.setup(conductor.addr) == OK
    assert a.register(vllm_config(publisher)) == OK
    assert b.list_services()["count"] == 1


def test_stopped_server_is_unreachable(conductor):
    client = ConductorClient()
    assert client.setup(conductor.addr, connect_timeout_ms=500, request_timeout_ms=1000) == OK
    conductor.stop()
    assert client.health_check() == HEALTH_UNREACHABLE
    assert client.query(MODEL, block_size=BS, token_ids=PROMPT) == {"ret": RPC_FAIL, "hits": {}}
    assert client.setup(conductor.addr, connect_timeout_ms=500) == RPC_FAIL
    assert client.health_check() == HEALTH_NOT_INITIALIZED


def test_client_reconnects_after_the_server_restarts(conductor, publisher):
    client = ConductorClient()
    assert client.setup(conductor.addr, connect_timeout_ms=1000, request_timeout_ms=2000) == OK
    assert client.register(vllm_config(publisher)) == OK
    conductor.restart()
    # The same client object reaches the restarted server without a new setup(), and the
    # registration survived the restart.
    assert wait_until(lambda: client.health_check() == HEALTH_OK)
    assert client.list_services()["count"] == 1
    client.close()


def test_an_idle_client_lets_the_server_stop_and_reconnects_on_its_first_call(conductor):
    client = ConductorClient()
    assert client.setup(conductor.addr, connect_timeout_ms=1000, request_timeout_ms=2000) == OK
    assert client.list_services()["ret"] == OK
    # The connection stays open and unused. A graceful HTTP/2 shutdown waits for the client to
    # answer a ping: the server must exit by itself (0), not be killed after the wait (-9).
    conductor.stop()
    assert conductor.proc.returncode == 0
    conductor.restart()
    # The client has seen its connection end, so its first call reconnects instead of failing.
    assert client.list_services()["ret"] == OK
    client.close()
