"""TLS through the client: with CONDUCTOR_TLS_CA naming the CA, setup() connects to a service
started with `tls` and every call goes over TLS; without it, or with a name the certificate does
not carry (CONDUCTOR_TLS_DOMAIN), setup() fails; an unreadable CA is INVALID_PARAMS."""

import pytest

from mooncake.conductor import INVALID_PARAMS, OK, ConductorClient
from support import VLLM_CBOR_PROFILE, ConductorProcess, free_port, make_certs

pytestmark = pytest.mark.server

CA_ENV = "CONDUCTOR_TLS_CA"
DOMAIN_ENV = "CONDUCTOR_TLS_DOMAIN"


@pytest.fixture
def certs(tmp_path):
    return make_certs(tmp_path / "certs")


@pytest.fixture
def tls_server(conductor_bin, tmp_path, certs):
    tls = {"cert_file": str(certs["cert"]), "key_file": str(certs["key"])}
    server = ConductorProcess(conductor_bin, tmp_path / "server", extra_config={"tls": tls}, tls_ca=certs["ca"])
    yield server
    server.stop()


def test_the_client_speaks_tls_with_the_ca_from_the_environment(tls_server, certs, monkeypatch):
    monkeypatch.delenv(DOMAIN_ENV, raising=False)
    monkeypatch.setenv(CA_ENV, str(certs["ca"]))
    with ConductorClient() as client:
        assert client.setup(tls_server.addr) == OK
        registration = {
            "instance_id": "tls-0",
            "endpoint": f"tcp://127.0.0.1:{free_port()}",
            "publisher_type": "vLLM",
            "model_name": "m",
            "block_size": 16,
            "hash_profile": dict(VLLM_CBOR_PROFILE),
        }
        assert client.register(registration) == OK
        listing = client.list_services()
        assert (listing["ret"], listing["count"]) == (OK, 1)
        hits = client.query("m", block_size=16, token_ids=list(range(16)))
        assert hits["ret"] == OK and "tls-0" in hits["hits"], hits
    # The name checked defaults to the address's host (127.0.0.1 is in the certificate);
    # CONDUCTOR_TLS_DOMAIN replaces it.
    monkeypatch.setenv(DOMAIN_ENV, "localhost")
    with ConductorClient() as client:
        assert client.setup(tls_server.addr) == OK
    monkeypatch.setenv(DOMAIN_ENV, "not-this-server.example")
    with ConductorClient() as client:
        assert client.setup(tls_server.addr) != OK


def test_without_the_ca_the_tls_server_refuses_the_client(tls_server, certs, tmp_path, monkeypatch):
    monkeypatch.delenv(CA_ENV, raising=False)
    monkeypatch.delenv(DOMAIN_ENV, raising=False)
    with ConductorClient() as client:
        assert client.setup(tls_server.addr) != OK
    monkeypatch.setenv(CA_ENV, str(tmp_path / "missing.pem"))
    with ConductorClient() as client:
        assert client.setup(tls_server.addr) == INVALID_PARAMS
