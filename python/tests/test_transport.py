"""Requests against a scripted gRPC peer: timeouts, status mapping, result conversion, the GIL."""

import threading
import time

import pytest

from mooncake.conductor import (
    HEALTH_OK,
    HEALTH_UNREACHABLE,
    INVALID_PARAMS,
    OK,
    RPC_FAIL,
    RPC_TIMEOUT,
    SERVICE_NOT_FOUND,
    ConductorClient,
)
from support import FakeConductor, pb_bytes, pb_decode, pb_int, pb_map_entry, read_varint

GRPC_CANCELLED, GRPC_INVALID_ARGUMENT, GRPC_DEADLINE_EXCEEDED = 1, 3, 4
GRPC_UNIMPLEMENTED, GRPC_UNAVAILABLE = 12, 14

FAILED_SHAPES = {
    "query": lambda c: c.query("m", block_size=16, token_ids=[1] * 16),
    "global_view": lambda c: c.get_global_view(),
    "services": lambda c: c.list_services(),
}


def failed_shape(kind, code):
    return {
        "query": {"ret": code, "hits": {}},
        "global_view": {"ret": code, "context_count": 0, "contexts": []},
        "services": {"ret": code, "count": 0, "services": []},
    }[kind]


def connected(peer, **timeouts):
    client = ConductorClient()
    assert client.setup(peer.addr, **timeouts) == OK
    return client


def test_request_exceeding_request_timeout_is_rpc_timeout():
    with FakeConductor(then="silent") as peer:  # answers setup's probe only
        client = connected(peer, request_timeout_ms=300)
        start = time.monotonic()
        assert client.unregister("x") == RPC_TIMEOUT
        assert 0.25 <= time.monotonic() - start < 5
        assert client.register({"model_name": "m"}) == RPC_TIMEOUT
        for kind, call in FAILED_SHAPES.items():
            assert call(client) == failed_shape(kind, RPC_TIMEOUT)


def test_health_check_of_an_unresponsive_service_is_unreachable():
    with FakeConductor(then="silent") as peer:
        client = connected(peer, request_timeout_ms=200)
        start = time.monotonic()
        assert client.health_check() == HEALTH_UNREACHABLE
        assert time.monotonic() - start < 5


def test_health_check_probes_by_listing_services():
    with FakeConductor(script=[b"", b""]) as peer:
        client = connected(peer)
        assert client.health_check() == HEALTH_OK
        assert len(peer.requests) == 2 and peer.requests[1] == b""  # ListServicesRequest{}


def test_health_check_with_a_failing_ret_is_unreachable():
    with FakeConductor(script=[b"", pb_int(1, -1)]) as peer:
        assert connected(peer).health_check() == HEALTH_UNREACHABLE


def test_health_check_after_the_server_went_away_is_unreachable():
    peer = FakeConductor()
    client = connected(peer)
    peer.close()
    assert client.health_check() == HEALTH_UNREACHABLE
    assert client.list_services() == failed_shape("services", RPC_FAIL)


@pytest.mark.parametrize(
    "status,code",
    [
        (GRPC_DEADLINE_EXCEEDED, RPC_TIMEOUT),
        (GRPC_CANCELLED, RPC_TIMEOUT),  # what a tonic server answers for an expired grpc-timeout
        (GRPC_UNAVAILABLE, RPC_FAIL),
        (GRPC_INVALID_ARGUMENT, RPC_FAIL),
        (GRPC_UNIMPLEMENTED, RPC_FAIL),
        (2, RPC_FAIL),  # UNKNOWN
        (13, RPC_FAIL),  # INTERNAL
    ],
)
def test_grpc_statuses_map_to_codes(status, code):
    with FakeConductor(script=[b""] + [status] * 5) as peer:
        client = connected(peer)
        assert client.unregister("x") == code
        assert client.register({}) == code
        for kind, call in FAILED_SHAPES.items():
            assert call(client) == failed_shape(kind, code)


def test_setup_accepts_a_server_without_health_method():
    with FakeConductor(script=[GRPC_UNIMPLEMENTED]) as peer:
        assert ConductorClient().setup(peer.addr) == OK


def test_setup_rejects_a_failing_probe():
    with FakeConductor(script=[GRPC_UNAVAILABLE]) as peer:
        client = ConductorClient()
        assert client.setup(peer.addr) == RPC_FAIL
        assert client.list_services()["ret"] != OK


def test_server_result_codes_are_returned_as_is():
    script = [b"", pb_int(1, INVALID_PARAMS), pb_int(1, SERVICE_NOT_FOUND), pb_int(1, -1)]
    with FakeConductor(script=script) as peer:
        client = connected(peer)
        assert client.register({}) == INVALID_PARAMS
        assert client.unregister("nobody") == SERVICE_NOT_FOUND
        assert client.unregister("x") == -1


def tiers(device, cpu_local, cpu_share, disk):
    return pb_int(1, device) + pb_int(2, cpu_local) + pb_int(3, cpu_share) + pb_int(4, disk)


def instance_hits():
    rank0 = tiers(32, 48, 48, 64)
    rank1 = tiers(16, 16, 32, 32)
    return (
        pb_int(1, 64)
        + pb_map_entry(2, "0", pb_int(2, 32))
        + pb_map_entry(2, "1", pb_int(2, 16))
        + pb_map_entry(3, "0", pb_bytes(2, rank0))
        + pb_map_entry(3, "1", pb_bytes(2, rank1))
        + pb_int(4, 32)
        + pb_int(5, 48)
        + pb_int(6, 48)
        + pb_int(7, 64)
    )


def test_query_result_shape():
    response = pb_map_entry(3, "vllm-0", pb_bytes(2, instance_hits())) + pb_map_entry(3, "idle", pb_bytes(2, b""))
    with FakeConductor(script=[b"", response]) as peer:
        result = connected(peer).query("my-model", block_size=16, token_ids=list(range(64)))
    assert result == {
        "ret": OK,
        "hits": {
            "vllm-0": {
                "longest_matched": 64,
                "dp": {"0": 32, "1": 16},
                "rank_matches": {
                    "0": {"device": 32, "cpu_local": 48, "cpu_share": 48, "disk": 64},
                    "1": {"device": 16, "cpu_local": 16, "cpu_share": 32, "disk": 32},
                },
                "device": 32,
                "cpu_local": 48,
                "cpu_share": 48,
                "disk": 64,
            },
            # an instance without matches is listed with zero counts
            "idle": {
                "longest_matched": 0,
                "dp": {},
                "rank_matches": {},
                "device": 0,
                "cpu_local": 0,
                "cpu_share": 0,
                "disk": 0,
            },
        },
    }
    entry = result["hits"]["vllm-0"]
    assert all(type(v) is int for v in entry["dp"].values())
    assert list(entry) == ["longest_matched", "dp", "rank_matches", "device", "cpu_local", "cpu_share", "disk"]


def test_query_with_failing_ret_has_empty_hits():
    response = pb_int(1, INVALID_PARAMS) + pb_map_entry(3, "vllm-0", pb_bytes(2, instance_hits()))
    with FakeConductor(script=[b"", response]) as peer:
        assert connected(peer).query("", block_size=16, token_ids=[]) == {"ret": INVALID_PARAMS, "hits": {}}


def test_query_request_fields():
    with FakeConductor() as peer:
        client = connected(peer)
        client.query(
            "my-model",
            lora_name="adapter",
            block_size=16,
            tenant_id="t",
            token_ids=[0, 1, -1, 2**31 - 1, -(2**31)],
            cache_salt="salt",
            instance_filter="vllm-0",
        )
        fields = dict(pb_decode(peer.requests[-1]))
        client.query("m", block_size=4, token_ids=[5])
        defaults = dict(pb_decode(peer.requests[-1]))
    assert fields[1] == b"my-model" and fields[2] == b"adapter" and fields[3] == 16
    assert fields[4] == b"t" and fields[6] == b"salt" and fields[7] == b"vllm-0"
    packed, tokens, i = fields[5], [], 0
    while i < len(packed):
        value, i = read_varint(packed, i)
        tokens.append(value - (1 << 64) if value >= 1 << 63 else value)
    assert tokens == [0, 1, -1, 2**31 - 1, -(2**31)]
    assert defaults[4] == b"default"  # tenant default
    assert 2 not in defaults and 6 not in defaults and 7 not in defaults  # "" is proto3's default


@pytest.mark.parametrize("bad", [[2**31], [-(2**31) - 1], [0, 2**64], (1, 2**40), [2**200]])
def test_token_ids_outside_int32_are_invalid_params_and_not_sent(bad):
    with FakeConductor() as peer:
        client = connected(peer)
        sent = len(peer.requests)
        assert client.query("m", block_size=16, token_ids=bad) == {"ret": INVALID_PARAMS, "hits": {}}
        assert len(peer.requests) == sent


@pytest.mark.parametrize("bad", ["abc", None, [1.5], [1, "2"], [None], 7])
def test_token_ids_of_the_wrong_type_raise_type_error(bad):
    with pytest.raises(TypeError):
        ConductorClient().query("m", block_size=16, token_ids=bad)


def test_token_ids_accept_other_int_sequences():
    import array

    with FakeConductor() as peer:
        client = connected(peer)
        for tokens in ([1, 2, 3], (1, 2, 3), array.array("i", [1, 2, 3]), range(1, 4), iter([1, 2, 3])):
            assert client.query("m", block_size=16, token_ids=tokens)["ret"] == OK
            assert dict(pb_decode(peer.requests[-1]))[5] == b"\x01\x02\x03"


def test_converting_a_2k_token_list_costs_microseconds():
    tokens = list(range(100_000, 102_000))
    client = ConductorClient()  # unconnected: conversion happens, nothing is sent
    client.query("m", block_size=16, token_ids=tokens)
    rounds = 2000
    start = time.perf_counter()
    for _ in range(rounds):
        client.query("m", block_size=16, token_ids=tokens)
    per_call = (time.perf_counter() - start) / rounds
    assert per_call < 200e-6, f"{per_call * 1e6:.1f} us per 2k-token query"


def hash_profile(strategy="vllm_v1"):
    return (
        pb_bytes(1, strategy)
        + pb_bytes(2, "sha256_cbor")
        + pb_bytes(3, "0")
        + pb_bytes(4, "4e11")
        + pb_bytes(5, "low64_be")
    )


def test_global_view_shape():
    context = (
        pb_bytes(1, "my-model")
        + pb_bytes(2, "")
        + pb_int(3, 16)
        + pb_bytes(4, "default")
        + pb_int(5, 2)
        + pb_bytes(6, hash_profile())
        + pb_map_entry(7, "vllm-0", pb_bytes(2, pb_bytes(1, bytes([0, 1]))))
        + pb_map_entry(7, "vllm-1", pb_bytes(2, b""))
    )
    response = pb_int(3, 1) + pb_bytes(4, context)
    with FakeConductor(script=[b"", response]) as peer:
        view = connected(peer).get_global_view()
    assert view == {
        "ret": OK,
        "context_count": 1,
        "contexts": [
            {
                "model_name": "my-model",
                "lora_name": "",
                "block_size": 16,
                "tenant_id": "default",
                "prefix_count": 2,
                "hash_profile": {
                    "strategy": "vllm_v1",
                    "algorithm": "sha256_cbor",
                    "python_hash_seed": "0",
                    "root_digest": "4e11",
                    "index_projection": "low64_be",
                },
                "instances": {"vllm-0": {0, 1}, "vllm-1": set()},
            }
        ],
    }


def test_global_view_with_failing_ret_is_empty():
    response = pb_int(1, -1) + pb_int(3, 1) + pb_bytes(4, pb_bytes(1, "m"))
    with FakeConductor(script=[b"", response]) as peer:
        assert connected(peer).get_global_view() == failed_shape("global_view", -1)


def service(cache_group=None):
    body = (
        pb_bytes(1, "tcp://127.0.0.1:5557")
        + pb_bytes(2, "")
        + pb_bytes(3, "vLLM")
        + pb_bytes(4, "my-model")
        + pb_bytes(6, "default")
        + pb_bytes(7, "vllm-0")
        + pb_int(8, 16)
        + pb_int(9, 1)
        + (pb_int(10, cache_group) if cache_group is not None else b"")
        + pb_bytes(11, hash_profile())
    )
    return pb_bytes(4, body)


def test_list_services_shape():
    response = pb_int(3, 2) + service() + service(cache_group=0)
    with FakeConductor(script=[b"", response]) as peer:
        listing = connected(peer).list_services()
    assert listing["ret"] == OK and listing["count"] == 2
    first, second = listing["services"]
    assert first == {
        "Endpoint": "tcp://127.0.0.1:5557",
        "ReplayEndpoint": "",
        "Type": "vLLM",
        "ModelName": "my-model",
        "LoraName": "",
        "TenantID": "default",
        "InstanceID": "vllm-0",
        "BlockSize": 16,
        "DPRank": 1,
        "CacheGroup": None,
        "HashProfile": {
            "strategy": "vllm_v1",
            "algorithm": "sha256_cbor",
            "python_hash_seed": "0",
            "root_digest": "4e11",
            "index_projection": "low64_be",
        },
    }
    assert second["CacheGroup"] == 0


def test_list_services_with_failing_ret_is_empty():
    with FakeConductor(script=[b"", pb_int(1, -1) + pb_int(3, 1) + service()]) as peer:
        assert connected(peer).list_services() == failed_shape("services", -1)


def test_the_gil_is_released_while_waiting_on_the_network():
    with FakeConductor(then="silent") as peer:
        client = connected(peer, request_timeout_ms=1000)
        ticks = []
        done = threading.Event()

        def spin():
            while not done.is_set():
                ticks.append(1)
                time.sleep(0.001)

        t = threading.Thread(target=spin)
        t.start()
        try:
            assert client.list_services()["ret"] == RPC_TIMEOUT
        finally:
            done.set()
            t.join()
        assert len(ticks) > 50, "another Python thread must run while a request waits"


def test_concurrent_requests_from_threads_share_one_client():
    with FakeConductor() as peer:
        client = connected(peer)
        results = []

        def worker():
            for _ in range(20):
                results.append(client.query("m", block_size=16, token_ids=[1] * 16)["ret"])

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == [OK] * 80
