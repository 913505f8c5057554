"""How sure an answer is (`include_status`), KV-cache groups and `hybrid_parts`: the client's wire
encoding against a scripted peer, then the real mooncake_conductor (CONDUCTOR_BIN) over gRPC and
HTTP (JSON and msgpack), with vLLM-style publishers of single-group and hybrid layouts."""

import json
import time
import urllib.error
import urllib.request

import pytest

from mooncake.conductor import CONDUCTOR_UNAVAILABLE, INVALID_PARAMS, OK, ConductorClient
from support import (
    VLLM_CBOR_PROFILE,
    FakeConductor,
    VllmPublisher,
    pb_bytes,
    pb_decode,
    pb_int,
    pb_map_entry,
    vllm_block_hashes,
    wait_until,
)

MODEL, BS = "my-model", 16
PROMPT = list(range(1000, 1040))  # two complete blocks and a partial tail
WINDOW = 32  # tokens: a boundary needs cdiv(31, 16) = 2 cached blocks before it
SGLANG_PROFILE = {"strategy": "sglang", "algorithm": "sha256_raw", "index_projection": "first64_be"}
SGLANG_HYBRID_REASON = "SGLang hybrid model: window and Mamba state are evicted without events"
ONE_GROUP_REASON = "the registration's cache_group indexes one KV-cache group only"

# Full attention in group 1, a sliding window in group 0 (Gemma's order: its first layer slides).
SLIDING_LAYOUT = [
    {"group_idx": 0, "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": WINDOW},
    {"group_idx": 1, "kv_cache_spec_kind": "full_attention"},
]
CHUNKED_LAYOUT = [
    {"group_idx": 0, "kv_cache_spec_kind": "full_attention"},
    {"group_idx": 1, "kv_cache_spec_kind": "chunked_local_attention"},
]
FULL_FIRST_LAYOUT = [
    {"group_idx": 0, "kv_cache_spec_kind": "full_attention"},
    {"group_idx": 1, "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": WINDOW},
]


# --------------------------------------------------------------------------------------------
# The client alone: what include_status sends and how the reply is converted.


def query_response_with_status() -> bytes:
    """A QueryResponse: one instance with hits, and its status with one hybrid rank."""
    hits = pb_int(1, 32) + pb_int(4, 32) + pb_int(7, 32)  # longest_matched, device, disk
    full = pb_int(1, 1) + pb_bytes(2, "full_attention")
    window = pb_bytes(2, "sliding_window") + pb_int(3, WINDOW)  # group 0: the default, absent
    rank = (
        pb_bytes(1, "upper_bound")
        + pb_bytes(2, "a rank reason")
        + pb_bytes(3, "live")
        + pb_int(4, 7)
        + pb_bytes(5, full)
        + pb_bytes(5, window)
    )
    bare_rank = pb_bytes(1, "exact")  # no state, no lag, no groups
    instance = (
        pb_bytes(1, "upper_bound")
        + pb_bytes(2, "an instance reason")
        + pb_map_entry(3, "0", pb_bytes(2, rank))
        + pb_map_entry(3, "1", pb_bytes(2, bare_rank))
    )
    return pb_map_entry(3, "i", pb_bytes(2, hits)) + pb_map_entry(5, "i", pb_bytes(2, instance))


EXPECTED_STATUS = {
    "i": {
        "status": "upper_bound",
        "reason": "an instance reason",
        "ranks": {
            "0": {
                "status": "upper_bound",
                "reason": "a rank reason",
                "state": "live",
                "lag_ms": 7,
                "groups": [
                    {"group": 1, "kind": "full_attention", "sliding_window": None},
                    {"group": 0, "kind": "sliding_window", "sliding_window": WINDOW},
                ],
            },
            "1": {"status": "exact", "reason": "", "state": "", "lag_ms": None, "groups": []},
        },
    }
}


def test_include_status_is_sent_and_the_status_converted():
    reply = query_response_with_status()
    with FakeConductor(script=[b"", reply, reply]) as peer:
        client = ConductorClient()
        assert client.setup(peer.addr) == OK
        with_status = client.query(MODEL, block_size=BS, token_ids=[1, 2], include_status=True)
        without = client.query(MODEL, block_size=BS, token_ids=[1, 2])
        sent_with, sent_without = (dict(pb_decode(r)) for r in peer.requests[-2:])
        client.close()
    assert sent_with[9] == 1 and 8 not in sent_with  # include_status, not include_load
    assert 9 not in sent_without  # false is proto3's default: not on the wire
    assert with_status["ret"] == OK and with_status["status"] == EXPECTED_STATUS
    assert with_status["hits"]["i"]["longest_matched"] == 32
    # Without the flag the result is the one it always was, whatever the reply carries.
    assert set(without) == {"ret", "hits"} and without["hits"] == with_status["hits"]


def test_status_is_empty_on_failure_and_combines_with_loads():
    refused = pb_int(1, INVALID_PARAMS)
    with FakeConductor(script=[b"", refused, b""]) as peer:
        client = ConductorClient()
        assert client.setup(peer.addr) == OK
        result = client.query(MODEL, block_size=BS, token_ids=[1], include_status=True)
        assert result == {"ret": INVALID_PARAMS, "hits": {}, "status": {}}
        both = client.query(MODEL, block_size=BS, token_ids=[1], include_status=True, include_load=True)
        assert both == {"ret": OK, "hits": {}, "loads": {}, "status": {}}
        assert dict(pb_decode(peer.requests[-1]))[8] == 1
        client.close()
    unconnected = ConductorClient().query(MODEL, block_size=BS, token_ids=[1], include_status=True)
    assert unconnected == {"ret": CONDUCTOR_UNAVAILABLE, "hits": {}, "status": {}}
    out_of_range = ConductorClient().query(MODEL, block_size=BS, token_ids=[2**31], include_status=True)
    assert out_of_range == {"ret": INVALID_PARAMS, "hits": {}, "status": {}}


# --------------------------------------------------------------------------------------------
# The real server.


class GroupPublisher(VllmPublisher):
    """A VllmPublisher that also publishes one batch of a hybrid layout: one BlockStored per
    KV-cache group, with the same hashes (vLLM hashes a block once per request)."""

    def hybrid_stored(self, tokens, block_size, layout, dp_rank=0):
        import msgpack

        n = len(tokens) // block_size
        hashes = vllm_block_hashes(tokens, block_size)
        events = [
            {
                "type": "BlockStored",
                "block_hashes": hashes,
                "parent_block_hash": None,
                "token_ids": list(tokens[: n * block_size]),
                "block_size": block_size,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
                "extra_keys": [None] * n,
                **group,
            }
            for group in layout
        ]
        payload = msgpack.packb([time.time(), events, dp_rank])
        with self._lock:
            self._buffer.append((self._seq, payload))
        self._sock.send_multipart([b"", self._seq.to_bytes(8, "big"), payload])
        self._seq += 1


@pytest.fixture
def publisher():
    pub = GroupPublisher()
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


def sglang_config(publisher, **overrides):
    return vllm_config(publisher, instance_id="sglang-0", publisher_type="SGLang",
                       hash_profile=dict(SGLANG_PROFILE), **overrides)


def publish_until(client, publish, instance, expect=32, groups=0, timeout=15):
    """Publishes until `instance` shows `expect` tokens and its rank's status has settled with
    `groups` KV-cache groups (the SUB joins asynchronously, state and lag come with the first
    batch, and the status is read just before the hits); returns the last include_status
    answer."""

    def probe():
        publish()
        result = client.query(MODEL, block_size=BS, token_ids=PROMPT, include_status=True)
        hit = result["hits"].get(instance)
        rank = result.get("status", {}).get(instance, {}).get("ranks", {}).get("0", {})
        settled = rank.get("state") == "live" and rank.get("lag_ms") is not None
        settled = settled and len(rank.get("groups", [])) == groups
        return result if hit and hit["longest_matched"] >= expect and settled else None

    result = wait_until(probe, timeout=timeout, interval=0.2)
    assert result, f"{instance} did not show {expect} tokens with a live status"
    return result


def http(conductor, path, body=None, fmt="json"):
    """(status, raw body) of a GET (body None) or a POST in `fmt` ("json" or "msgpack")."""
    url = f"http://127.0.0.1:{conductor.http_port}{path}"
    if body is None:
        request = urllib.request.Request(url)
    elif fmt == "json":
        request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    else:
        import msgpack

        request = urllib.request.Request(url, msgpack.packb(body), {"Content-Type": "application/msgpack"})
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def decode(raw, fmt):
    if fmt == "json":
        return json.loads(raw)
    import msgpack

    return msgpack.unpackb(raw)


def query_body(**extra):
    return {"model": MODEL, "block_size": BS, "token_ids": PROMPT, **extra}


def assert_live_exact_rank(rank):
    assert rank["status"] == "exact" and rank["reason"] == ""
    assert rank["state"] == "live"
    assert type(rank["lag_ms"]) is int and 0 <= rank["lag_ms"] < 60_000
    assert rank["groups"] == []


@pytest.mark.server
def test_single_group_status_over_grpc(client, publisher):
    assert client.register(vllm_config(publisher)) == OK
    result = publish_until(client, lambda: publisher.block_stored(PROMPT, BS), "vllm-0")
    assert result["ret"] == OK and set(result) == {"ret", "hits", "status"}
    assert result["hits"]["vllm-0"]["longest_matched"] == 32
    (instance,) = result["status"].values()
    assert list(result["status"]) == ["vllm-0"]
    assert instance["status"] == "exact" and instance["reason"] == ""
    assert list(instance["ranks"]) == ["0"]
    assert_live_exact_rank(instance["ranks"]["0"])
    # The flag changes nothing else, and without it there is no "status".
    plain = client.query(MODEL, block_size=BS, token_ids=PROMPT)
    assert plain == {"ret": OK, "hits": result["hits"]}
    assert client.query(MODEL, block_size=BS, token_ids=PROMPT, include_status=False) == plain
    # An unknown context has no instances and no status; a filter selects one instance.
    other = client.query("other-model", block_size=BS, token_ids=PROMPT, include_status=True)
    assert other == {"ret": OK, "hits": {}, "status": {}}
    none = client.query(MODEL, block_size=BS, token_ids=PROMPT, instance_filter="x", include_status=True)
    assert none == {"ret": OK, "hits": {}, "status": {}}


@pytest.mark.server
@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_single_group_status_over_http(client, conductor, publisher, fmt):
    assert client.register(vllm_config(publisher)) == OK
    grpc = publish_until(client, lambda: publisher.block_stored(PROMPT, BS), "vllm-0")
    # Publishing has stopped: the answer is settled, so equal requests give equal bytes.
    status, without = http(conductor, "/query", query_body(), fmt)
    assert status == 200
    assert http(conductor, "/query", query_body(include_status=False), fmt) == (200, without)
    assert http(conductor, "/query", query_body(include_status=None), fmt) == (200, without)
    plain = decode(without, fmt)
    assert list(plain) == ["instances"] and plain["instances"] == grpc["hits"]

    status, raw = http(conductor, "/query", query_body(include_status=True), fmt)
    assert status == 200
    answer = decode(raw, fmt)
    assert list(answer) == ["instances", "status"]
    assert answer["instances"] == plain["instances"]
    if fmt == "json":  # the hits are written as before, with "status" after them
        assert raw.startswith(without[:-1] + b',"status":')
    assert list(answer["status"]) == ["vllm-0"]
    instance = answer["status"]["vllm-0"]
    assert set(instance) == {"status", "reason", "ranks"}
    assert instance["status"] == "exact" and instance["reason"] == ""
    rank = instance["ranks"]["0"]
    assert set(rank) == {"status", "reason", "state", "lag_ms", "groups"}
    assert_live_exact_rank(rank)
    # The gRPC status is the same apart from the lag, which grows.
    expected = {k: v for k, v in grpc["status"]["vllm-0"]["ranks"]["0"].items() if k != "lag_ms"}
    assert {k: v for k, v in rank.items() if k != "lag_ms"} == expected

    status, raw = http(conductor, "/query", query_body(include_status="yes"), fmt)
    assert status == 400
    error = decode(raw, fmt)
    assert error["reason"] == "invalid_type" and error["field"] == "include_status"


@pytest.mark.server
def test_query_by_hash_over_http_has_the_same_status(client, conductor, publisher):
    assert client.register(vllm_config(publisher)) == OK
    publish_until(client, lambda: publisher.block_stored(PROMPT, BS), "vllm-0")
    body = {"model": MODEL, "block_size": BS, "block_hashes": vllm_block_hashes(PROMPT, BS)}
    status, without = http(conductor, "/query_by_hash", body)
    assert status == 200 and "status" not in json.loads(without)
    assert http(conductor, "/query_by_hash", {**body, "include_status": False}) == (200, without)
    status, raw = http(conductor, "/query_by_hash", {**body, "include_status": True})
    answer = json.loads(raw)
    assert status == 200 and answer["instances"] == json.loads(without)["instances"]
    assert answer["instances"]["vllm-0"]["longest_matched"] == 32
    assert_live_exact_rank(answer["status"]["vllm-0"]["ranks"]["0"])


@pytest.mark.server
def test_a_hybrid_whose_recipe_is_not_the_registered_one_is_a_lower_bound(client, conductor, publisher):
    # The publisher hashes with seed "0"; registered with seed "7", the hash check finds the
    # recipe wrong: a window store without a full-attention sibling would be unfindable.
    profile = dict(VLLM_CBOR_PROFILE, python_hash_seed="7")
    assert client.register(vllm_config(publisher, instance_id="gemma", hash_profile=profile)) == OK
    publish_until(client, lambda: publisher.hybrid_stored(PROMPT, BS, SLIDING_LAYOUT), "gemma", groups=2)

    def settled():
        status, raw = http(conductor, "/services/status")
        (service,) = json.loads(raw)["services"]
        return service["hash_check"] == "mismatch"

    wait_until(settled, timeout=15)
    result = client.query(MODEL, block_size=BS, token_ids=PROMPT, include_status=True)
    rank = result["status"]["gemma"]["ranks"]["0"]
    assert rank["status"] == "lower_bound" and "hash_profile" in rank["reason"], rank
    assert result["hits"]["gemma"]["longest_matched"] == 32, "the tokens still key the blocks"


@pytest.mark.server
def test_a_sliding_window_layout_is_exact_and_lists_its_groups(client, conductor, publisher):
    assert client.register(vllm_config(publisher, instance_id="gemma")) == OK
    result = publish_until(client, lambda: publisher.hybrid_stored(PROMPT, BS, SLIDING_LAYOUT), "gemma", groups=2)
    assert result["hits"]["gemma"]["longest_matched"] == 32
    instance = result["status"]["gemma"]
    assert instance["status"] == "exact" and instance["reason"] == ""
    rank = instance["ranks"]["0"]
    assert rank["status"] == "exact" and rank["state"] == "live"
    # Full attention first, then by group index: the order vLLM checks them in.
    assert rank["groups"] == [
        {"group": 1, "kind": "full_attention", "sliding_window": None},
        {"group": 0, "kind": "sliding_window", "sliding_window": WINDOW},
    ]
    status, raw = http(conductor, "/query", query_body(include_status=True))
    assert status == 200 and json.loads(raw)["status"]["gemma"]["ranks"]["0"]["groups"] == rank["groups"]

    # /services/status lists the rank's groups with their kinds and block counts.
    status, raw = http(conductor, "/services/status")
    assert status == 200
    body = json.loads(raw)
    (service,) = body["services"]
    (context,) = body["cache_groups"]
    assert (context["model_name"], context["lora_name"]) == (MODEL, "")
    assert (context["tenant_id"], context["block_size"]) == ("default", BS)
    groups = [{k: g[k] for k in ("group", "kind", "sliding_window", "blocks")} for g in context["groups"]]
    assert groups == [
        {"group": 0, "kind": "sliding_window", "sliding_window": WINDOW, "blocks": 2},
        {"group": 1, "kind": "full_attention", "sliding_window": None, "blocks": 2},
    ]
    for g in context["groups"]:
        assert (g["service"], g["instance_id"], g["dp_rank"]) == (service["service"], "gemma", 0)


@pytest.mark.server
def test_a_single_group_rank_is_not_in_cache_groups(client, conductor, publisher):
    assert client.register(vllm_config(publisher)) == OK
    publish_until(client, lambda: publisher.block_stored(PROMPT, BS), "vllm-0")
    status, raw = http(conductor, "/services/status")
    assert status == 200 and json.loads(raw)["cache_groups"] == []


@pytest.mark.server
def test_a_chunked_local_attention_group_makes_an_upper_bound(client, publisher):
    assert client.register(vllm_config(publisher, instance_id="llama4")) == OK
    result = publish_until(client, lambda: publisher.hybrid_stored(PROMPT, BS, CHUNKED_LAYOUT), "llama4", groups=2)
    # The chunked group cannot lower the answer: it is full attention's, and at least the truth.
    assert result["hits"]["llama4"]["longest_matched"] == 32
    instance = result["status"]["llama4"]
    rank = instance["ranks"]["0"]
    assert rank["status"] == instance["status"] == "upper_bound"
    assert "chunked local attention" in rank["reason"] and instance["reason"] == rank["reason"]
    assert rank["groups"] == [
        {"group": 0, "kind": "full_attention", "sliding_window": None},
        {"group": 1, "kind": "chunked_local_attention", "sliding_window": None},
    ]


@pytest.mark.server
def test_cache_group_keeps_one_group_and_says_so(client, conductor, publisher):
    assert client.register(vllm_config(publisher, instance_id="gemma", cache_group=1)) == OK
    assert client.list_services()["services"][0]["CacheGroup"] == 1
    result = publish_until(client, lambda: publisher.hybrid_stored(PROMPT, BS, SLIDING_LAYOUT), "gemma", groups=1)
    rank = result["status"]["gemma"]["ranks"]["0"]
    assert rank["status"] == "upper_bound" and rank["reason"] == ONE_GROUP_REASON
    assert rank["groups"] == [{"group": 1, "kind": "full_attention", "sliding_window": None}]
    status, raw = http(conductor, "/services/status")
    (service,) = json.loads(raw)["services"]
    assert service["ignored"].get("other_cache_group", 0) >= 1  # group 0's stores


@pytest.mark.server
# The other groups' events are dropped before their kinds are noted: the subscription's
# `other_cache_group` count is what says the layout is a hybrid.
def test_cache_group_zero_of_a_hybrid_layout_is_a_bound(client, publisher):
    assert client.register(vllm_config(publisher, instance_id="hybrid", cache_group=0)) == OK
    result = publish_until(client, lambda: publisher.hybrid_stored(PROMPT, BS, FULL_FIRST_LAYOUT), "hybrid")
    assert result["status"]["hybrid"]["ranks"]["0"]["status"] == "upper_bound"


@pytest.mark.parametrize("out_of_range", [64, -1, 2**40])
@pytest.mark.server
def test_cache_group_outside_0_to_63_is_refused(client, publisher, out_of_range):
    assert client.register(vllm_config(publisher, cache_group=out_of_range)) == INVALID_PARAMS
    assert client.register(vllm_config(publisher, cache_group=63)) == OK


@pytest.mark.server
@pytest.mark.parametrize("parts", ["mamba", ["mamba"], ("sliding_window", "mamba"), "mamba, sliding_window"])
def test_an_sglang_hybrid_is_an_upper_bound(client, conductor, publisher, parts):
    assert client.register(sglang_config(publisher, hybrid_parts=parts)) == OK
    # Every registered rank is listed, also before its first event.
    result = client.query(MODEL, block_size=BS, token_ids=PROMPT, include_status=True)
    assert result["ret"] == OK and "sglang-0" in result["hits"]
    instance = result["status"]["sglang-0"]
    assert instance["status"] == "upper_bound" and instance["reason"] == SGLANG_HYBRID_REASON
    rank = instance["ranks"]["0"]
    assert rank["status"] == "upper_bound" and rank["reason"] == SGLANG_HYBRID_REASON
    assert rank["groups"] == [] and isinstance(rank["state"], str) and rank["state"]
    status, raw = http(conductor, "/query", query_body(include_status=True), "msgpack")
    assert status == 200
    assert decode(raw, "msgpack")["status"]["sglang-0"]["reason"] == SGLANG_HYBRID_REASON


@pytest.mark.server
@pytest.mark.parametrize("parts", [None, "", []])
def test_no_hybrid_parts_is_an_ordinary_sglang_registration(client, publisher, parts):
    assert client.register(sglang_config(publisher, hybrid_parts=parts)) == OK
    result = client.query(MODEL, block_size=BS, token_ids=PROMPT, include_status=True)
    assert result["status"]["sglang-0"]["status"] == "exact"


@pytest.mark.server
@pytest.mark.parametrize(
    "config",
    [
        lambda p: vllm_config(p, hybrid_parts="sliding_window"),
        lambda p: vllm_config(p, instance_id="store", publisher_type="Mooncake", hybrid_parts=["mamba"]),
        lambda p: sglang_config(p, hybrid_parts="linear_attention"),
        lambda p: sglang_config(p, hybrid_parts="mamba,mamba"),
        lambda p: sglang_config(p, hybrid_parts="mamba,"),
        lambda p: sglang_config(p, hybrid_parts=["Mamba"]),
    ],
    ids=["vllm", "mooncake", "unknown_part", "twice", "empty_entry", "case_sensitive"],
)
def test_refused_hybrid_parts(client, publisher, config):
    refused = config(publisher)
    assert client.register(refused) == INVALID_PARAMS
    assert client.list_services()["count"] == 0
    # The same registration without hybrid_parts is accepted: the refusal is hybrid_parts'.
    del refused["hybrid_parts"]
    assert client.register(refused) == OK


@pytest.mark.server
def test_hybrid_parts_over_http(conductor, publisher):
    base = {
        "instance_id": "sglang-0",
        "endpoint": publisher.endpoint,
        "type": "SGLang",
        "modelname": MODEL,
        "block_size": BS,
        "dp_rank": 0,
        "hash_profile": dict(SGLANG_PROFILE),
    }
    status, raw = http(conductor, "/register", {**base, "type": "vLLM", "hash_profile": dict(VLLM_CBOR_PROFILE),
                                                  "hybrid_parts": "mamba"})
    error = json.loads(raw)
    assert status == 400 and error["field"] == "hybrid_parts" and "SGLang" in error["error"]
    status, raw = http(conductor, "/register", {**base, "hybrid_parts": "mamba"})
    assert status == 200, raw
    status, raw = http(conductor, "/query", query_body(include_status=True))
    assert status == 200
    assert json.loads(raw)["status"]["sglang-0"]["status"] == "upper_bound"
