"""The service token through the client: read from CONDUCTOR_AUTH_TOKEN at setup() and sent
with every request; without it registration changes give UNAUTHORIZED and reads stay open,
unless the service sets auth_reads."""

import pytest

from mooncake.conductor import (
    HEALTH_OK,
    HEALTH_UNREACHABLE,
    INVALID_PARAMS,
    OK,
    UNAUTHORIZED,
    ConductorClient,
)
from support import VLLM_CBOR_PROFILE, ConductorProcess, free_port

pytestmark = pytest.mark.server

TOKEN_ENV = "CONDUCTOR_AUTH_TOKEN"


def config(instance: str) -> dict:
    return {
        "instance_id": instance,
        "endpoint": f"tcp://127.0.0.1:{free_port()}",
        "publisher_type": "vLLM",
        "model_name": "m",
        "block_size": 16,
        "hash_profile": dict(VLLM_CBOR_PROFILE),
    }


@pytest.fixture
def guarded(conductor_bin, tmp_path):
    server = ConductorProcess(conductor_bin, tmp_path, extra_config={"auth_token": "old-tok,new-tok"})
    yield server
    server.stop()


@pytest.fixture
def guarded_reads(conductor_bin, tmp_path):
    server = ConductorProcess(
        conductor_bin, tmp_path, extra_config={"auth_token": "old-tok", "auth_reads": True}
    )
    yield server
    server.stop()


def connect(server, monkeypatch, token):
    if token is None:
        monkeypatch.delenv(TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(TOKEN_ENV, token)
    client = ConductorClient()
    assert client.setup(server.addr) == OK
    return client


def test_without_the_token_changes_are_refused_and_reads_open(guarded, monkeypatch):
    with connect(guarded, monkeypatch, None) as anonymous:
        assert anonymous.register(config("e0")) == UNAUTHORIZED
        assert anonymous.list_services()["count"] == 0
        with connect(guarded, monkeypatch, "wrong") as wrong:
            assert wrong.register(config("e0")) == UNAUTHORIZED
        with connect(guarded, monkeypatch, "old-tok") as owner:
            assert owner.register(config("e0")) == OK
        # The variable is read at setup(): a later change does not affect this connection.
        assert anonymous.register(config("e1")) == UNAUTHORIZED
        assert anonymous.health_check() == HEALTH_OK
        listing = anonymous.list_services()
        assert (listing["ret"], listing["count"]) == (OK, 1)
        hits = anonymous.query("m", block_size=16, token_ids=list(range(16)))
        assert hits["ret"] == OK and "e0" in hits["hits"], hits
        assert anonymous.unregister("e0") == UNAUTHORIZED
        assert anonymous.list_services()["count"] == 1


def test_during_a_rotation_both_tokens_work(guarded, monkeypatch):
    with connect(guarded, monkeypatch, "new-tok") as new:
        assert new.register(config("e0")) == OK
    # A client sharing the service's list sends its first entry.
    with connect(guarded, monkeypatch, "old-tok,new-tok") as shared:
        assert shared.unregister("e0") == OK
        assert shared.list_services()["count"] == 0


def test_with_auth_reads_reads_need_the_token(guarded_reads, monkeypatch):
    with connect(guarded_reads, monkeypatch, None) as anonymous:
        assert anonymous.list_services() == {"ret": UNAUTHORIZED, "count": 0, "services": []}
        view = anonymous.get_global_view()
        assert (view["ret"], view["context_count"]) == (UNAUTHORIZED, 0)
        hits = anonymous.query("m", block_size=16, token_ids=[1, 2])
        assert hits == {"ret": UNAUTHORIZED, "hits": {}}
        # health_check() probes with a listing, which this client may not read.
        assert anonymous.health_check() == HEALTH_UNREACHABLE
    with connect(guarded_reads, monkeypatch, "old-tok") as owner:
        assert owner.register(config("e0")) == OK
        assert owner.health_check() == HEALTH_OK
        listing = owner.list_services()
        assert (listing["ret"], listing["count"]) == (OK, 1)
        hits = owner.query("m", block_size=16, token_ids=list(range(16)))
        assert hits["ret"] == OK and "e0" in hits["hits"], hits


def test_a_token_that_cannot_travel_is_invalid_params(guarded, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "with space")
    client = ConductorClient()
    assert client.setup(guarded.addr) == INVALID_PARAMS
    assert repr(client) == "<ConductorClient (not connected)>"
