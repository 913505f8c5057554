"""Lifecycle without a server: unconnected calls, close(), `with`, setup() argument checks,
unreachable and silent peers, and the documented failure shapes."""

import socket
import time

import pytest

from mooncake.conductor import (
    CONDUCTOR_UNAVAILABLE,
    HEALTH_NOT_INITIALIZED,
    HEALTH_OK,
    INVALID_PARAMS,
    OK,
    RPC_FAIL,
    ConductorClient,
)

VALID_CONFIG = {
    "instance_id": "vllm-0",
    "endpoint": "tcp://127.0.0.1:5557",
    "model_name": "my-model",
    "block_size": 16,
    "hash_profile": {
        "strategy": "vllm_v1",
        "algorithm": "sha256_cbor",
        "python_hash_seed": "0",
        "index_projection": "low64_be",
    },
}


def assert_unavailable(client: ConductorClient) -> None:
    """Every request of an uninitialized client answers CONDUCTOR_UNAVAILABLE in its own shape."""
    assert client.health_check() == HEALTH_NOT_INITIALIZED
    assert client.query("my-model", block_size=16, token_ids=list(range(32))) == {
        "ret": CONDUCTOR_UNAVAILABLE,
        "hits": {},
    }
    assert client.register(dict(VALID_CONFIG)) == CONDUCTOR_UNAVAILABLE
    assert client.unregister("vllm-0") == CONDUCTOR_UNAVAILABLE
    assert client.unregister("vllm-0", "tenant", 3) == CONDUCTOR_UNAVAILABLE
    assert client.get_global_view() == {"ret": CONDUCTOR_UNAVAILABLE, "context_count": 0, "contexts": []}
    assert client.list_services() == {"ret": CONDUCTOR_UNAVAILABLE, "count": 0, "services": []}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_requests_before_setup_are_unavailable():
    assert_unavailable(ConductorClient())


def test_close_is_ok_repeatable_and_safe_before_setup():
    client = ConductorClient()
    assert client.close() == OK
    assert client.close() == OK
    assert_unavailable(client)


def test_requests_after_close_are_unavailable(fake_conductor):
    client = ConductorClient()
    assert client.setup(fake_conductor.addr) == OK
    assert client.health_check() == HEALTH_OK
    assert client.close() == OK
    assert_unavailable(client)
    assert client.close() == OK


def test_setup_works_again_after_close(fake_conductor):
    client = ConductorClient()
    for _ in range(3):
        assert client.setup(fake_conductor.addr) == OK
        assert client.health_check() == HEALTH_OK
        assert client.close() == OK
        assert client.health_check() == HEALTH_NOT_INITIALIZED


def test_with_returns_the_client_without_setup():
    client = ConductorClient()
    with client as entered:
        assert entered is client
        assert entered.health_check() == HEALTH_NOT_INITIALIZED


def test_with_exit_closes_the_client(fake_conductor):
    with ConductorClient() as client:
        assert client.setup(fake_conductor.addr) == OK
        assert client.health_check() == HEALTH_OK
    assert client.health_check() == HEALTH_NOT_INITIALIZED


def test_with_exit_closes_and_propagates_an_exception(fake_conductor):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with ConductorClient() as client:
            assert client.setup(fake_conductor.addr) == OK
            raise Boom()
    assert client.health_check() == HEALTH_NOT_INITIALIZED


def test_exit_returns_false_so_exceptions_are_not_swallowed():
    client = ConductorClient()
    assert client.__exit__(ValueError, ValueError("x"), None) is False
    assert client.__exit__(None, None, None) is False


@pytest.mark.parametrize(
    "addr",
    [
        "127.0.0.1",
        "localhost",
        "",
        ":50052",
        "127.0.0.1:",
        "127.0.0.1:port",
        "127.0.0.1:+80",
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "http://127.0.0.1:50052",
        "127.0.0.1:50052/path",
        "::1:50052",
        "[]:50052",
    ],
)
def test_setup_rejects_malformed_addresses(addr):
    client = ConductorClient()
    assert client.setup(addr) == INVALID_PARAMS
    assert client.health_check() == HEALTH_NOT_INITIALIZED


@pytest.mark.parametrize("timeouts", [(0, 3000), (-1, 3000), (1000, 0), (1000, -5)])
def test_setup_rejects_non_positive_timeouts(timeouts, fake_conductor):
    client = ConductorClient()
    assert client.setup(fake_conductor.addr, *timeouts) == INVALID_PARAMS
    assert client.health_check() == HEALTH_NOT_INITIALIZED


def test_setup_accepts_keyword_timeouts(fake_conductor):
    client = ConductorClient()
    rc = client.setup(conductor_addr=fake_conductor.addr, connect_timeout_ms=2000, request_timeout_ms=500)
    assert rc == OK


def test_setup_to_a_closed_port_fails_and_leaves_the_client_uninitialized():
    client = ConductorClient()
    start = time.monotonic()
    assert client.setup(f"127.0.0.1:{closed_port()}") == RPC_FAIL
    assert time.monotonic() - start < 5
    assert_unavailable(client)


def test_failed_setup_drops_the_previous_connection(fake_conductor):
    client = ConductorClient()
    assert client.setup(fake_conductor.addr) == OK
    assert client.setup(f"127.0.0.1:{closed_port()}") == RPC_FAIL
    assert_unavailable(client)
    assert client.setup(fake_conductor.addr) == OK
    assert client.setup("no-port") == INVALID_PARAMS
    assert client.health_check() == HEALTH_NOT_INITIALIZED


def test_setup_replaces_the_previous_connection(fake_conductor):
    from support import FakeConductor

    with FakeConductor() as other:
        client = ConductorClient()
        assert client.setup(fake_conductor.addr) == OK
        assert client.setup(other.addr) == OK
        before = (len(fake_conductor.requests), len(other.requests))
        assert client.list_services()["ret"] == OK
        assert len(fake_conductor.requests) == before[0]
        assert len(other.requests) == before[1] + 1


def test_setup_to_a_silent_peer_fails_within_the_connect_timeout(silent_peer):
    """A peer that accepts TCP but never speaks gRPC is not a Conductor: RPC_FAIL, in time."""
    client = ConductorClient()
    start = time.monotonic()
    rc = client.setup(silent_peer.addr, connect_timeout_ms=500)
    elapsed = time.monotonic() - start
    assert rc == RPC_FAIL
    assert 0.4 <= elapsed < 5
    assert client.health_check() == HEALTH_NOT_INITIALIZED


def test_setup_to_a_peer_that_never_answers_the_probe_fails_in_time():
    from support import FakeConductor

    with FakeConductor(script=[None], then="silent") as peer:
        client = ConductorClient()
        start = time.monotonic()
        assert client.setup(peer.addr, connect_timeout_ms=400) == RPC_FAIL
        assert 0.3 <= time.monotonic() - start < 5
        assert client.health_check() == HEALTH_NOT_INITIALIZED


def test_bracketed_ipv6_address_is_well_formed():
    client = ConductorClient()
    assert client.setup(f"[::1]:{closed_port()}", connect_timeout_ms=500) == RPC_FAIL
    assert client.health_check() == HEALTH_NOT_INITIALIZED


def test_setup_resolves_host_names(fake_conductor):
    client = ConductorClient()
    assert client.setup(f"localhost:{fake_conductor.port}") == OK


def test_repr_says_whether_connected(fake_conductor):
    client = ConductorClient()
    assert "not connected" in repr(client)
    client.setup(fake_conductor.addr)
    assert fake_conductor.addr in repr(client)
