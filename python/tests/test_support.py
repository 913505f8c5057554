"""The helpers the server tests rely on reproduce the reference hash vectors."""

import pytest

from support import cbor_root, pb_bytes, pb_decode, pb_int, vllm_block_hashes

cbor2 = pytest.importorskip("cbor2")


def test_cbor_roots_match_reference_vectors():
    assert cbor_root("0").hex() == "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
    assert cbor_root("00").hex() == "8d912e4e62b3cc377b1d1c7a14ef61dffbdaa0990237035c05401c29414c4172"
    assert cbor_root("random").hex() == "78d6ac7e28de859e492449dcea03e3807377d69998c5af819fed33a6df490cad"


def test_block_hashes_match_reference_vectors():
    tokens = list(range(1, 9))
    assert vllm_block_hashes(tokens, 4) == [2164874634404590027, 17270480062156288726]
    salted = vllm_block_hashes(tokens, 4, lora_name="adapter-A", cache_salt="tenant-salt")
    assert salted == [17539136676481425472, 3818960430654273638]


def test_partial_tail_is_not_hashed():
    assert len(vllm_block_hashes(list(range(35)), 16)) == 2
    assert vllm_block_hashes(list(range(15)), 16) == []


def test_protobuf_helpers_round_trip():
    data = pb_int(1, -600) + pb_bytes(2, "x") + pb_int(3, 2**64 - 1)
    assert pb_decode(data) == [(1, 2**64 - 600), (2, b"x"), (3, 2**64 - 1)]
