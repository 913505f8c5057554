"""register_engine() / unregister_engine() against the real mooncake_conductor (CONDUCTOR_BIN):
the Conductor reads an engine's own description over HTTP and subscribes to each DP rank. The
engines are engine_apps' vLLM 0.33.0 and SGLang 0.5.23: their own routes, publishers and prefix
caches, so each rank's expected prefix is what that rank's cache holds."""

import pytest

from engine_apps import SglangEngineApp, VllmEngineApp
from mooncake.conductor import OK, SERVICE_NOT_FOUND
from support import wait_until

pytestmark = pytest.mark.server

BS = 16
PROMPT = list(range(20000, 20080))  # five complete blocks
TIERS = ("device", "cpu_local", "cpu_share", "disk")


def reported(app):
    """The ranks register_engine should answer for `app`: the advertised endpoints with their
    host made reachable (a wildcard, or SGLang's loopback report, becomes the URL's host)."""
    return [
        {"dp_rank": r, "endpoint": f"tcp://127.0.0.1:{app.base_port + r}",
         "replay_endpoint": f"tcp://127.0.0.1:{app.replay_base_port + r}", "topic": "",
         "block_size": BS}
        for r in sorted(app.ranks)
    ]


def row(client, model, instance, tokens):
    result = client.query(model, block_size=BS, token_ids=tokens, instance_filter=instance)
    assert result["ret"] == OK, result
    return result["hits"].get(instance)


def wait_live(client, app, model, instance, ranks=None, timeout=20.0):
    """Per rank, store fresh one-block sentinel prompts until the index shows one on that rank.
    The subscriptions join asynchronously and PUB drops what it sends before; once one batch
    arrived, later ones arrive in order. Sentinels share no block with the test prompts."""
    for rank in sorted(app.ranks) if ranks is None else ranks:
        sentinels = []

        def joined():
            sentinels.append([900000 + 10000 * rank + BS * len(sentinels) + i for i in range(BS)])
            app.ranks[rank].store(sentinels[-1])
            for tokens in sentinels[-2:]:  # the previous one had an interval to be applied
                hit = row(client, model, instance, tokens)
                if hit and hit["rank_matches"].get(str(rank), {}).get("device") == BS:
                    return True
            return False

        assert wait_until(joined, timeout=timeout, interval=0.2), f"rank {rank} never joined"


def wait_for_ranks(client, model, instance, tokens, expected, timeout=15.0):
    """The query row once each rank's device count equals the engine's own `expected`."""

    def matches():
        hit = row(client, model, instance, tokens)
        got = hit and {r: m["device"] for r, m in hit["rank_matches"].items()}
        return hit if got == expected else None

    hit = wait_until(matches, timeout=timeout, interval=0.1)
    assert hit, f"ranks never matched {expected}: {row(client, model, instance, tokens)}"
    return hit


def services_of(client, instance):
    listing = client.list_services()
    assert listing["ret"] == OK, listing
    return sorted((s for s in listing["services"] if s["InstanceID"] == instance),
                  key=lambda s: s["DPRank"])


def check_answer(hit, expected):
    """Every rank listed with its own prefix in every tier; the instance's figures are the
    maxima over its ranks."""
    best = max(expected.values())
    assert hit["dp"] == expected
    assert hit["rank_matches"] == {r: {t: n for t in TIERS} for r, n in expected.items()}
    assert [hit[t] for t in TIERS] == [best] * 4 and hit["longest_matched"] == best


def test_vllm_engine_is_registered_rank_by_rank(client):
    model = "vllm-engine-model"
    with VllmEngineApp(model=model, ranks=(0, 1), block_size=BS) as app:
        got = client.register_engine(app.url, "vLLM", instance_id="vllm-a", model_name=model,
                                     block_size=BS, hash_profile=dict(app.hash_profile))
        assert got["ret"] == OK, got
        assert (got["instance_id"], got["model_name"]) == ("vllm-a", model)
        assert got["ranks"] == reported(app)
        services = services_of(client, "vllm-a")
        assert [(s["DPRank"], s["Endpoint"], s["ReplayEndpoint"], s["Type"], s["ModelName"])
                for s in services] == [
            (r["dp_rank"], r["endpoint"], r["replay_endpoint"], "vLLM", model)
            for r in reported(app)]

        wait_live(client, app, model, "vllm-a")
        app.ranks[0].store(PROMPT)
        app.ranks[1].store(PROMPT[:32])
        expected = app.expected(PROMPT)
        assert expected == {"0": 80, "1": 32}  # the engine's own pools say so
        check_answer(wait_for_ranks(client, model, "vllm-a", PROMPT, expected), expected)

        app.ranks[0].evict(PROMPT, keep_tokens=48)  # vLLM's BlockPool evicts blocks 3 and 4
        expected = app.expected(PROMPT)
        assert expected == {"0": 48, "1": 32}
        check_answer(wait_for_ranks(client, model, "vllm-a", PROMPT, expected), expected)


def test_sglang_engine_is_registered_with_what_it_describes(client):
    model = "sglang-engine-model"
    with SglangEngineApp(model=model, ranks=(0, 1), page_size=BS) as app:
        # No model name and no block size: SGLang's /server_info says both.
        got = client.register_engine(app.url, "SGLang", instance_id="sglang-a",
                                     hash_profile=dict(app.hash_profile))
        assert got["ret"] == OK, got
        assert (got["instance_id"], got["model_name"]) == ("sglang-a", model)
        assert got["ranks"] == reported(app)
        assert [s["DPRank"] for s in services_of(client, "sglang-a")] == [0, 1]

        wait_live(client, app, model, "sglang-a")
        app.ranks[0].store(PROMPT[:48])
        app.ranks[1].store(PROMPT)
        expected = app.expected(PROMPT)
        assert expected == {"0": 48, "1": 80}  # the engine's own radix trees say so
        check_answer(wait_for_ranks(client, model, "sglang-a", PROMPT, expected), expected)


def test_unregistered_engine_leaves_the_index(client):
    model = "vllm-gone-model"
    with VllmEngineApp(model=model, ranks=(0, 1), block_size=BS) as app:
        profile = dict(app.hash_profile)
        got = client.register_engine(app.url, "vLLM", instance_id="vllm-gone", model_name=model,
                                     block_size=BS, hash_profile=profile)
        assert got["ret"] == OK, got
        wait_live(client, app, model, "vllm-gone")
        app.ranks[1].store(PROMPT)
        wait_for_ranks(client, model, "vllm-gone", PROMPT, app.expected(PROMPT))

        assert client.unregister_engine("vllm-gone") == OK
        assert services_of(client, "vllm-gone") == []
        result = client.query(model, block_size=BS, token_ids=PROMPT)
        assert result["ret"] == OK and "vllm-gone" not in result["hits"], result

        # The engine goes on publishing. A witness subscribed to rank 0 shows when the
        # Conductor has taken in what rank 0 sent; the unregistered engine must not come back.
        witness = {"instance_id": "witness", "endpoint": got["ranks"][0]["endpoint"],
                   "publisher_type": "vLLM", "model_name": model, "block_size": BS,
                   "dp_rank": 0, "hash_profile": profile}
        assert client.register(witness) == OK
        wait_live(client, app, model, "witness", ranks=[0])
        app.ranks[0].store(PROMPT)
        wait_for_ranks(client, model, "witness", PROMPT, {"0": 80})
        result = client.query(model, block_size=BS, token_ids=PROMPT)
        assert result["ret"] == OK and set(result["hits"]) == {"witness"}, result
        assert client.unregister_engine("vllm-gone") == SERVICE_NOT_FOUND


def test_sglang_without_a_source_list_is_registered_from_its_publisher_descriptor(client):
    # Without --grpc-port SGLang's /server_info has only its `kv_events` descriptor.
    model = "sglang-descriptor-model"
    with SglangEngineApp(model=model, ranks=(0, 1), page_size=BS, grpc_port=False) as app:
        got = client.register_engine(app.url, "SGLang", instance_id="sglang-d",
                                     hash_profile=dict(app.hash_profile))
        assert got["ret"] == OK, got
        assert got["ranks"] == reported(app)
        wait_live(client, app, model, "sglang-d")
        app.ranks[1].store(PROMPT[:64])
        expected = app.expected(PROMPT)
        assert expected == {"0": 0, "1": 64}
        check_answer(wait_for_ranks(client, model, "sglang-d", PROMPT, expected), expected)


def test_include_load_answers_sglang_figures_from_its_own_loads_route(client):
    model = "sglang-load-model"
    with SglangEngineApp(model=model, ranks=(0, 1), page_size=BS) as app:
        app.set_load(1, num_running_reqs=4, num_waiting_reqs=3)
        got = client.register_engine(app.url, "SGLang", instance_id="sglang-l",
                                     hash_profile=dict(app.hash_profile))
        assert got["ret"] == OK, got
        plain = client.query(model, block_size=BS, token_ids=PROMPT)
        assert plain["ret"] == OK and "loads" not in plain, plain
        result = client.query(model, block_size=BS, token_ids=PROMPT, include_load=True)
        assert result["ret"] == OK, result
        assert result["hits"] == plain["hits"]
        load = result["loads"]["sglang-l"]
        assert load["ranks"]["1"]["num_running_reqs"] == 4, load
        assert load["ranks"]["1"]["num_waiting_reqs"] == 3, load
        assert set(load["ranks"]) == {"0", "1"} and 0 <= load["age_ms"] < 60_000, load
        assert "server_load" not in load


def test_include_load_answers_vllm_server_load(client):
    model = "vllm-load-model"
    with VllmEngineApp(model=model, ranks=(0,), block_size=BS) as app:
        app.set_load(5)
        got = client.register_engine(app.url, "vLLM", instance_id="vllm-l", model_name=model,
                                     block_size=BS, hash_profile=dict(app.hash_profile))
        assert got["ret"] == OK, got
        result = client.query(model, block_size=BS, token_ids=PROMPT, include_load=True)
        assert result["ret"] == OK, result
        assert result["loads"]["vllm-l"]["server_load"] == 5, result["loads"]
        assert result["loads"]["vllm-l"]["ranks"] == {}


@pytest.fixture
def fast_client(conductor_bin, tmp_path):
    """A conductor that reads engine descriptions every 200 ms and drops an engine unreadable
    for 1 s, with a client connected to it."""
    from mooncake.conductor import ConductorClient

    from support import ConductorProcess

    server = ConductorProcess(conductor_bin, tmp_path, extra_config={
        "engine_refresh_ms": 200, "engine_unreadable_grace_ms": 1000})
    c = ConductorClient()
    assert c.setup(server.addr) == OK
    yield c
    c.close()
    server.stop()


def test_ranks_that_appear_and_go_are_followed_and_a_gone_engine_stops_answering(fast_client):
    client, model = fast_client, "vllm-scaling-model"
    with VllmEngineApp(model=model, ranks=(0, 1), block_size=BS) as app:
        got = client.register_engine(app.url, "vLLM", instance_id="vllm-s", model_name=model,
                                     block_size=BS, hash_profile=dict(app.hash_profile))
        assert got["ret"] == OK, got

        def ranks():
            return [s["DPRank"] for s in services_of(client, "vllm-s")]

        app.add_rank(2)  # scale-up: vLLM's description now names rank 2
        assert wait_until(lambda: ranks() == [0, 1, 2], timeout=10), ranks()
        app.remove_rank(1)  # scale-down
        assert wait_until(lambda: ranks() == [0, 2], timeout=10), ranks()
        wait_live(client, app, model, "vllm-s", ranks=[2])
        app.ranks[2].store(PROMPT)
        expected = app.expected(PROMPT)
        assert expected == {"0": 0, "2": 80}
        check_answer(wait_for_ranks(client, model, "vllm-s", PROMPT, expected), expected)

        # The engine's HTTP server goes away (its publishers too would, with the pod): after the
        # grace its ranks are unregistered and its blocks stop answering.
        app.stop_http()
        assert wait_until(lambda: ranks() == [], timeout=10), ranks()
        result = client.query(model, block_size=BS, token_ids=PROMPT)
        assert result["ret"] == OK and "vllm-s" not in result["hits"], result


def test_post_engines_over_http_with_the_apps_url(conductor, client):
    """The HTTP route, as an operator's curl uses it: the vLLM app's URL and nothing else the
    engine says itself, then exact answers on both ranks."""
    import json
    import urllib.request

    model = "vllm-http-model"
    with VllmEngineApp(model=model, ranks=(0, 1), block_size=BS) as app:
        body = json.dumps({"url": app.url, "type": "vLLM", "instance_id": "vllm-h",
                           "block_size": BS, "hash_profile": dict(app.hash_profile)}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{conductor.http_port}/engines", data=body,
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as r:
            reply = json.loads(r.read())
        assert reply["model_name"] == model, reply  # from vLLM's own /v1/models
        assert reply["ranks"] == reported(app)
        wait_live(client, app, model, "vllm-h")
        app.ranks[0].store(PROMPT[:16])
        app.ranks[1].store(PROMPT)
        expected = app.expected(PROMPT)
        assert expected == {"0": 16, "1": 80}
        check_answer(wait_for_ranks(client, model, "vllm-h", PROMPT, expected), expected)
        with urllib.request.urlopen(f"http://127.0.0.1:{conductor.http_port}/engines",
                                    timeout=10) as r:
            listed = json.loads(r.read())
        assert [(e["instance_id"], e["state"], e["ranks_found"], e["ranks_registered"])
                for e in listed["engines"]] == [("vllm-h", "ok", 2, 2)]
