"""register(): the client-side ValueError cases, and what is left to the server."""

import collections

import pytest

from mooncake.conductor import CONDUCTOR_UNAVAILABLE, OK, ConductorClient
from support import FakeConductor, pb_decode

PROFILE = {
    "strategy": "vllm_v1",
    "algorithm": "sha256_cbor",
    "python_hash_seed": "0",
    "index_projection": "low64_be",
}
BASE = {
    "instance_id": "vllm-0",
    "endpoint": "tcp://127.0.0.1:5557",
    "publisher_type": "vLLM",
    "model_name": "my-model",
    "block_size": 16,
    "dp_rank": 0,
    "hash_profile": PROFILE,
}


def with_field(key, value):
    config = dict(BASE)
    config[key] = value
    return config


def with_profile(**changes):
    profile = dict(PROFILE)
    for k, v in changes.items():
        if v is ...:
            del profile[k]
        else:
            profile[k] = v
    return with_field("hash_profile", profile)


NOT_A_DICT = [None, [], [("model_name", "m")], "model_name=m", 16, (("a", 1),), object()]

BAD_CONFIGS = {
    # unknown keys, including the HTTP spellings and server-derived fields
    "http_modelname": {**BASE, "modelname": "my-model"},
    "http_type": {**BASE, "type": "vLLM"},
    "unknown_key": {**BASE, "colour": "blue"},
    "root_digest_top_level": {**BASE, "root_digest": "00"},
    "case_sensitive_key": {**BASE, "Model_Name": "m"},
    # non-string keys
    "int_key": {**BASE, 1: "x"},
    "bytes_key": {**BASE, b"model_name": "m"},
    "tuple_key": {**BASE, ("model_name",): "m"},
    # string fields with other types
    "instance_id_int": with_field("instance_id", 7),
    "instance_id_none": with_field("instance_id", None),
    "endpoint_bytes": with_field("endpoint", b"tcp://127.0.0.1:5557"),
    "replay_endpoint_none": with_field("replay_endpoint", None),
    "model_name_list": with_field("model_name", ["m"]),
    "lora_name_int": with_field("lora_name", 0),
    "tenant_id_none": with_field("tenant_id", None),
    "publisher_type_int": with_field("publisher_type", 1),
    # integer fields: wrong types, booleans, overflow
    "block_size_str": with_field("block_size", "16"),
    "block_size_float": with_field("block_size", 16.0),
    "block_size_bool": with_field("block_size", True),
    "block_size_none": with_field("block_size", None),
    "dp_rank_bool": with_field("dp_rank", False),
    "dp_rank_str": with_field("dp_rank", "0"),
    "dp_rank_none": with_field("dp_rank", None),
    "cache_group_bool": with_field("cache_group", False),
    "cache_group_str": with_field("cache_group", "0"),
    "cache_group_float": with_field("cache_group", 0.0),
    "block_size_overflow": with_field("block_size", 2**63),
    "block_size_underflow": with_field("block_size", -(2**63) - 1),
    "dp_rank_overflow": with_field("dp_rank", 2**64),
    "cache_group_overflow": with_field("cache_group", 2**100),
    # hybrid_parts: a str, a list or tuple of str, or None
    "hybrid_parts_int": with_field("hybrid_parts", 1),
    "hybrid_parts_bytes": with_field("hybrid_parts", b"mamba"),
    "hybrid_parts_set": with_field("hybrid_parts", {"mamba"}),
    "hybrid_parts_dict": with_field("hybrid_parts", {"mamba": True}),
    "hybrid_parts_generator": with_field("hybrid_parts", (p for p in ["mamba"])),
    "hybrid_parts_list_of_int": with_field("hybrid_parts", ["mamba", 2]),
    "hybrid_parts_list_of_none": with_field("hybrid_parts", [None]),
    "hybrid_parts_nested": with_field("hybrid_parts", [["mamba"]]),
    # publisher types are case-sensitive
    "publisher_vllm_lower": with_field("publisher_type", "vllm"),
    "publisher_sglang_lower": with_field("publisher_type", "sglang"),
    "publisher_mooncake_upper": with_field("publisher_type", "MOONCAKE"),
    "publisher_empty": with_field("publisher_type", ""),
    "publisher_unknown": with_field("publisher_type", "TensorRT-LLM"),
    # hash_profile: the same key/type rules
    "profile_none": with_field("hash_profile", None),
    "profile_str": with_field("hash_profile", "vllm_v1"),
    "profile_list": with_field("hash_profile", list(PROFILE.items())),
    "profile_unknown_key": with_profile(seed="0"),
    "profile_root_digest": with_profile(root_digest="4e1195df"),
    "profile_int_key": with_field("hash_profile", {**PROFILE, 1: "x"}),
    "profile_int_value": with_profile(python_hash_seed=0),
    "profile_none_value": with_profile(strategy=None),
    "profile_bytes_value": with_profile(algorithm=b"sha256"),
    "profile_case_sensitive_key": with_field("hash_profile", {"Strategy": "vllm_v1"}),
}


@pytest.fixture(params=["unconnected", "connected"])
def any_client(request):
    """ValueError comes before any connection check and before anything is sent."""
    if request.param == "unconnected":
        yield ConductorClient(), None
        return
    with FakeConductor() as peer:
        client = ConductorClient()
        assert client.setup(peer.addr) == OK
        yield client, peer


@pytest.mark.parametrize("config", NOT_A_DICT, ids=lambda c: type(c).__name__)
def test_non_dict_config_raises(any_client, config):
    client, _ = any_client
    with pytest.raises(ValueError, match="dict"):
        client.register(config)


@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_invalid_config_raises_value_error(any_client, name):
    client, peer = any_client
    sent_before = len(peer.requests) if peer else 0
    with pytest.raises(ValueError):
        client.register(BAD_CONFIGS[name])
    if peer:
        assert len(peer.requests) == sent_before, "nothing may be sent for an invalid config"


def test_messages_name_the_problem():
    client = ConductorClient()
    with pytest.raises(ValueError, match="modelname"):
        client.register(BAD_CONFIGS["http_modelname"])
    with pytest.raises(ValueError, match="block_size"):
        client.register(BAD_CONFIGS["block_size_bool"])
    with pytest.raises(ValueError, match="publisher_type"):
        client.register(BAD_CONFIGS["publisher_vllm_lower"])
    with pytest.raises(ValueError, match="root_digest"):
        client.register(BAD_CONFIGS["profile_root_digest"])
    with pytest.raises(ValueError, match="hybrid_parts"):
        client.register(BAD_CONFIGS["hybrid_parts_int"])
    with pytest.raises(ValueError, match="hybrid_parts"):
        client.register(BAD_CONFIGS["hybrid_parts_list_of_int"])


ACCEPTED = {
    "spec_example": BASE,
    "empty": {},  # missing required fields are the server's to reject
    "missing_hash_profile": {k: v for k, v in BASE.items() if k != "hash_profile"},
    "empty_hash_profile": with_field("hash_profile", {}),
    "partial_hash_profile": with_profile(python_hash_seed=...),
    "cache_group_none": with_field("cache_group", None),
    "cache_group_zero": with_field("cache_group", 0),
    "cache_group_other": with_field("cache_group", 63),
    "cache_group_out_of_range": with_field("cache_group", 64),  # the server's to judge
    "hybrid_parts_str": with_field("hybrid_parts", "sliding_window,mamba"),
    "hybrid_parts_list": with_field("hybrid_parts", ["sliding_window", "mamba"]),
    "hybrid_parts_tuple": with_field("hybrid_parts", ("mamba",)),
    "hybrid_parts_none": with_field("hybrid_parts", None),
    "hybrid_parts_empty_list": with_field("hybrid_parts", []),
    "hybrid_parts_unknown_name": with_field("hybrid_parts", "linear"),  # the server's to judge
    "int64_max": with_field("block_size", 2**63 - 1),
    "int64_min": with_field("dp_rank", -(2**63)),
    "negative_rank": with_field("dp_rank", -1),  # a value problem: the server's to judge
    "empty_strings": with_field("model_name", ""),
    "sglang": with_field("publisher_type", "SGLang"),
    "mooncake": with_field("publisher_type", "Mooncake"),
    "all_optional_fields": {
        **BASE,
        "replay_endpoint": "tcp://127.0.0.1:5558",
        "lora_name": "adapter",
        "tenant_id": "",
        "cache_group": 0,
    },
    "dict_subclass": collections.OrderedDict(BASE),
    "int_subclass": with_field("block_size", type("MyInt", (int,), {})(16)),
    "str_subclass": with_field("model_name", type("MyStr", (str,), {})("m")),
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_valid_types_are_not_rejected_locally(name):
    # Unconnected: anything that passes the local checks reaches the connection check.
    assert ConductorClient().register(ACCEPTED[name]) == CONDUCTOR_UNAVAILABLE


def register_fields(config):
    """Sends `config` to a fake server and returns the RegisterRequest fields it received."""
    with FakeConductor() as peer:
        client = ConductorClient()
        assert client.setup(peer.addr) == OK
        assert client.register(config) == OK
        fields = pb_decode(peer.requests[-1])
    return fields


def test_absent_fields_stay_absent_on_the_wire():
    assert register_fields({}) == []  # no defaults filled in, no has_hash_profile


def test_all_fields_travel_with_their_numbers():
    fields = register_fields(
        {
            "instance_id": "i",
            "endpoint": "tcp://e:1",
            "replay_endpoint": "tcp://e:2",
            "publisher_type": "Mooncake",
            "model_name": "m",
            "lora_name": "l",
            "tenant_id": "",
            "block_size": 16,
            "dp_rank": 0,
            "cache_group": 0,
            "hash_profile": {"strategy": "sglang"},
        }
    )
    by_number = dict(fields)
    assert by_number[1] == b"i" and by_number[2] == b"tcp://e:1" and by_number[3] == b"tcp://e:2"
    assert by_number[4] == b"Mooncake" and by_number[5] == b"m" and by_number[6] == b"l"
    assert by_number[7] == b""  # explicitly empty tenant: sent, for the server to normalize
    assert by_number[8] == 16 and by_number[9] == 0 and by_number[10] == 0
    assert pb_decode(by_number[11]) == [(1, b"strategy"), (2, b"sglang")]
    assert by_number[12] == 1  # has_hash_profile


def test_empty_hash_profile_is_distinguished_from_none():
    assert register_fields({"hash_profile": {}}) == [(12, 1)]
    assert (12, 1) not in register_fields({"model_name": "m"})


def test_cache_group_none_is_absent():
    assert register_fields({"cache_group": None}) == []


@pytest.mark.parametrize(
    "parts,sent",
    [
        ("mamba", b"mamba"),
        ("sliding_window, mamba", b"sliding_window, mamba"),  # a str is sent as written
        (["sliding_window", "mamba"], b"sliding_window,mamba"),
        (("mamba",), b"mamba"),
        ([], b""),
        ("", b""),
    ],
)
def test_hybrid_parts_travel_as_one_comma_separated_string(parts, sent):
    assert register_fields({"hybrid_parts": parts}) == [(13, sent)]


def test_hybrid_parts_none_is_absent():
    assert register_fields({"hybrid_parts": None}) == []
