"""The API reference's examples, run as written (only the addresses differ)."""

import pytest

from support import VllmPublisher

pytestmark = pytest.mark.server


def test_quick_start(conductor):
    from mooncake.conductor import ConductorClient, OK

    with ConductorClient() as client:
        rc = client.setup(conductor.addr)  # the reference uses "127.0.0.1:50052"
        if rc != OK:
            raise RuntimeError(f"Conductor setup failed: {rc}")

        result = client.query(
            "my-model",
            block_size=16,
            token_ids=list(range(32)),
        )
        if result["ret"] != OK:
            raise RuntimeError(f"Conductor query failed: {result['ret']}")
        print(result["hits"])  # {} while no engine instances are registered

    assert result == {"ret": OK, "hits": {}}
    assert client.health_check() == 1  # the with block closed the client


def test_registration_example(conductor):
    from mooncake.conductor import ConductorClient, OK

    publisher = VllmPublisher()  # stands in for the engine at "tcp://127.0.0.1:5557"
    try:
        with ConductorClient() as client:
            rc = client.setup(conductor.addr)
            if rc != OK:
                raise RuntimeError(f"Conductor setup failed: {rc}")

            rc = client.register({
                "instance_id": "vllm-0",
                "endpoint": publisher.endpoint,
                "publisher_type": "vLLM",
                "model_name": "my-model",
                "block_size": 16,
                "dp_rank": 0,
                "hash_profile": {
                    "strategy": "vllm_v1",
                    "algorithm": "sha256_cbor",
                    "python_hash_seed": "0",
                    "index_projection": "low64_be",
                },
            })
            if rc != OK:
                raise RuntimeError(f"Publisher registration failed: {rc}")

            services = client.list_services()
            assert services["ret"] == OK and services["count"] == 1
            assert services["services"][0]["InstanceID"] == "vllm-0"
    finally:
        publisher.close()
