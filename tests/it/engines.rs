//! Engines registered by their URL: the binary reads an engine's description over HTTP
//! (`support::engine_http`, the engines' own shapes), registers one subscription per DP rank,
//! keeps them in step, and refuses hostile descriptions with the field named.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::deliver::handshake;
use crate::support::engine::{self, vllm_cbor_profile};
use crate::support::engine_http::{EngineHttp, Mode, wildcard};
use crate::support::player::Player;
use crate::support::query::grpc_query;
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http, until};

/// Services registered, by key.
async fn services(server: &Server) -> Vec<String> {
    let listing = http::get(server.http_port, "/services").await.json();
    let mut keys: Vec<String> = listing["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let (i, t, r) = (&s["InstanceID"], &s["TenantID"], &s["DPRank"]);
            format!("{}|{}|{}", i.as_str().unwrap(), t.as_str().unwrap(), r)
        })
        .collect();
    keys.sort();
    keys
}

/// `n` publishers on free loopback ports, one per rank.
async fn players(n: usize) -> Vec<Player> {
    let mut players = Vec::new();
    for _ in 0..n {
        players.push(Player::start(false, 0).await);
    }
    players
}

async fn engines(server: &Server) -> Value {
    http::get(server.http_port, "/engines").await.json()
}

fn register_body(url: &str) -> Value {
    json!({"url": url, "type": "vLLM", "instance_id": "e1", "block_size": 4,
           "hash_profile": vllm_cbor_profile()})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_engine_registered_by_url_answers_exactly_on_both_ranks() {
    let server = Server::start().await;
    let (mut rank0, mut rank1) = (Player::start(false, 0).await, Player::start(false, 0).await);
    let engine = EngineHttp::start().await;
    engine.vllm(
        &[
            (0, wildcard(&rank0.endpoint)),
            (1, wildcard(&rank1.endpoint)),
        ],
        "m",
    );

    let r = http::post_json(server.http_port, "/engines", &register_body(&engine.url)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let reply = r.json();
    assert_eq!(reply["instance_id"], "e1");
    assert_eq!(reply["model_name"], "m", "the engine's served model");
    let ranks = reply["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    // The wildcard bind becomes the engine's host.
    assert_eq!(ranks[0]["endpoint"], rank0.endpoint.as_str());
    assert_eq!(ranks[1]["endpoint"], rank1.endpoint.as_str());
    assert_eq!(services(&server).await, ["e1|default|0", "e1|default|1"]);

    // Different prefixes on the two ranks: each rank answers its own, exactly.
    let tokens: Vec<i32> = (1..=12).collect();
    let profile = vllm_cbor_profile();
    let on0 = engine::vllm_store_prompt(&profile, &tokens, 4, "GPU", 0);
    let on1 = engine::vllm_store_prompt(&profile, &tokens[..4], 4, "GPU", 1);
    handshake(&server, &mut rank0, "e1|default|0", on0).await;
    handshake(&server, &mut rank1, "e1|default|1", on1).await;
    let hits = eventually("both ranks' hits", WAIT, || async {
        let r = grpc_query(&server, "m", tokens.clone(), 4).await;
        let row = r.hits.get("e1")?.clone();
        (row.dp.get("0") == Some(&12) && row.dp.get("1") == Some(&4)).then_some(row)
    })
    .await;
    assert_eq!(hits.device, 12);

    let listed = engines(&server).await;
    assert_eq!(listed["count"], 1);
    let row = &listed["engines"][0];
    assert_eq!(
        (row["state"].as_str(), row["ranks_found"].as_u64()),
        (Some("ok"), Some(2))
    );
    assert_eq!(row["ranks_registered"], 2);
    assert!(row["description_age_ms"].is_u64(), "{row}");

    // Removing the engine removes every rank, and its blocks stop answering.
    let r = http::request(server.http_port, "DELETE", "/engines/e1", &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["ranks_removed"], 2);
    assert!(services(&server).await.is_empty());
    let r = grpc_query(&server, "m", tokens.clone(), 4).await;
    assert!(!r.hits.contains_key("e1"), "{:?}", r.hits);
    let r = http::request(server.http_port, "DELETE", "/engines/e1", &[], b"").await;
    assert_eq!(r.status, 404, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_that_appear_and_go_are_followed_and_a_gone_engine_is_dropped_after_the_grace() {
    let server = Server::start_with(json!({
        "engine_refresh_ms": 200, "engine_unreadable_grace_ms": 1000,
    }))
    .await;
    let players = players(3).await;
    let at = |r: usize| (r as u32, wildcard(&players[r].endpoint));
    let engine = EngineHttp::start().await;
    engine.vllm(&[at(0), at(1)], "m");
    let r = http::post_json(server.http_port, "/engines", &register_body(&engine.url)).await;
    assert_eq!(r.status, 200, "{}", r.text());

    // A rank added, then a rank removed, each followed by the next refresh.
    engine.vllm(&[at(0), at(1), at(2)], "m");
    eventually("rank 2 registered", WAIT, || async {
        (services(&server).await.len() == 3).then_some(())
    })
    .await;
    engine.vllm(&[at(0), at(2)], "m");
    eventually("rank 1 unregistered", WAIT, || async {
        (services(&server).await == ["e1|default|0", "e1|default|2"]).then_some(())
    })
    .await;
    // A changed endpoint is registered again.
    engine.vllm(&[at(0), (2, wildcard(&players[1].endpoint))], "m");
    eventually("rank 2 moved", WAIT, || async {
        let listing = http::get(server.http_port, "/services").await.json();
        let moved = listing["services"].as_array()?.iter().any(|s| {
            s["DPRank"] == 2 && s["Endpoint"].as_str() == Some(players[1].endpoint.as_str())
        });
        moved.then_some(())
    })
    .await;

    // The description disappears: the ranks are kept (unreadable), then dropped after the grace.
    engine.mode(Mode::Fail(500));
    let row = eventually("engine unreadable", WAIT, || async {
        let row = engines(&server).await["engines"][0].clone();
        (row["state"] == "unreadable").then_some(row)
    })
    .await;
    // Its class, not its answer (the status it answered is not the caller's to learn).
    assert!(
        row["last_error"]
            .as_str()
            .unwrap()
            .contains("could not be read"),
        "{row}"
    );
    eventually("engine dropped", WAIT, || async {
        let row = engines(&server).await["engines"][0].clone();
        (row["state"] == "dropped").then_some(())
    })
    .await;
    assert!(services(&server).await.is_empty());
    // It comes back: its ranks are registered again.
    engine.mode(Mode::Serve);
    eventually("engine back", WAIT, || async {
        (services(&server).await.len() == 2).then_some(())
    })
    .await;
    let metrics = http::get(server.http_port, "/metrics").await.text();
    assert!(
        metrics.contains(
            "conductor_engine_ranks{instance_id=\"e1\",tenant_id=\"default\",kind=\"registered\"} 2"
        ),
        "{metrics}"
    );
    assert!(
        !metrics.contains("conductor_engine_discovery_errors_total 0\n"),
        "errors were counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_descriptions_are_bounded_and_refused_with_the_field_named() {
    let server = Server::start_with(json!({
        "engine_read_timeout_ms": 300, "max_description_bytes": 65536,
        "max_ranks_per_engine": 8, "allowed_endpoint_hosts": ["127.0.0.1"],
    }))
    .await;
    let engine = EngineHttp::start().await;
    let refused = async |body: &Value| {
        let r = http::post_json(server.http_port, "/engines", body).await;
        assert_eq!(r.status, 400, "{}", r.text());
        r.json()
    };
    let body = register_body(&engine.url);

    engine.mode(Mode::Huge(1 << 20));
    let e = refused(&body).await;
    assert_eq!(e["field"], "url");
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("max_description_bytes"),
        "{e}"
    );

    // A slow engine and a huge answer get the same class: no timing, no port state.
    engine.mode(Mode::Slow(Duration::from_secs(3)));
    let slow = refused(&body).await;
    assert_eq!(slow["error"], e["error"], "{slow}");

    engine.mode(Mode::Serve);
    let many: Vec<(u32, String)> = (0..100)
        .map(|r| (r, format!("tcp://*:{}", 20000 + r)))
        .collect();
    engine.vllm(&many, "m");
    let e = refused(&body).await;
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("max_ranks_per_engine"),
        "{e}"
    );

    // An endpoint on a host the policy does not allow: the registration's own refusal.
    engine.vllm(&[(0, "tcp://10.9.9.9:5557".into())], "m");
    let e = refused(&body).await;
    assert_eq!(
        (e["field"].as_str(), e["reason"].as_str()),
        (Some("endpoint"), Some("not_allowed"))
    );

    // Not a socket another host can subscribe to.
    engine.vllm(&[(0, "ipc:///tmp/kv".into())], "m");
    let e = refused(&body).await;
    assert!(e["error"].as_str().unwrap().contains("tcp://"), "{e}");

    // The URL's own host must be allowed too.
    let e = refused(&register_body("http://localhost:1")).await;
    assert_eq!(
        (e["field"].as_str(), e["reason"].as_str()),
        (Some("url"), Some("not_allowed"))
    );
    // Nothing was registered or followed by any of these.
    assert!(services(&server).await.is_empty());
    assert_eq!(engines(&server).await["count"], 0);
    assert!(http::get(server.http_port, "/health").await.status == 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_descriptions_and_a_request_that_contradicts_the_engine() {
    let server = Server::start().await;
    let (rank0, rank1) = (Player::start(false, 0).await, Player::start(false, 0).await);
    let engine = EngineHttp::start().await;
    // SGLang reports a wildcard bind as its loopback address.
    engine.sglang(
        &[(0, rank0.endpoint.clone()), (1, rank1.endpoint.clone())],
        "qwen",
        64,
    );
    let mut body =
        json!({"url": engine.url, "type": "SGLang", "instance_id": "s1", "block_size": 16});
    let r = http::post_json(server.http_port, "/engines", &body).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["field"], "block_size");
    body["block_size"] = json!(null);
    body["model_name"] = json!("llama");
    let r = http::post_json(server.http_port, "/engines", &body).await;
    assert_eq!(
        (r.status, r.json()["field"].as_str()),
        (400, Some("model_name"))
    );
    body["model_name"] = json!(null);
    let r = http::post_json(server.http_port, "/engines", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let reply = r.json();
    assert_eq!(reply["model_name"], "qwen");
    assert_eq!(reply["ranks"][1]["block_size"], 64);
    assert_eq!(services(&server).await, ["s1|default|0", "s1|default|1"]);
    let listing = http::get(server.http_port, "/services").await.json();
    assert_eq!(listing["services"][0]["Type"], "SGLang");
    assert_eq!(listing["services"][0]["HashProfile"]["strategy"], "sglang");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_is_followed_across_a_restart_and_config_engines_register_themselves() {
    let players = players(3).await;
    let at = |r: usize| (r as u32, wildcard(&players[r].endpoint));
    let engine = EngineHttp::start().await;
    engine.vllm(&[at(0), at(1)], "m");
    let from_config = EngineHttp::start().await;
    from_config.vllm(&[(0, wildcard(&players[2].endpoint))], "m");
    let config = json!({
        "engine_refresh_ms": 200,
        "engines": [{"url": from_config.url, "instance_id": "c1", "block_size": 4,
                     "hash_profile": vllm_cbor_profile()}],
    });
    let mut server = Server::start_with(config.clone()).await;
    let r = http::post_json(server.http_port, "/engines", &register_body(&engine.url)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    until(WAIT, async || match services(&server).await.len() {
        3 => Ok(()),
        _ => Err(format!(
            "the config's engine not registered: {}",
            engines(&server).await
        )),
    })
    .await;
    server.terminate();

    // While the service is down, the engine loses rank 1.
    engine.vllm(&[at(0)], "m");
    let server = Server::start_in(server.into_dir(), config).await;
    eventually("rank 1 gone after the restart", WAIT, || async {
        (services(&server).await == ["c1|default|0", "e1|default|0"]).then_some(())
    })
    .await;
    let listed = engines(&server).await;
    assert_eq!(listed["count"], 2, "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn include_load_answers_the_engines_figures_and_their_age_and_nothing_changes_without_it() {
    let server = Server::start().await;
    let (mut v0, s0) = (Player::start(false, 0).await, Player::start(false, 0).await);
    let vllm = EngineHttp::start().await;
    vllm.vllm(&[(0, wildcard(&v0.endpoint))], "m");
    vllm.set("/load", json!({"server_load": 3}));
    let r = http::post_json(server.http_port, "/engines", &register_body(&vllm.url)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let sglang = EngineHttp::start().await;
    sglang.sglang(&[(0, s0.endpoint.clone())], "m", 4);
    sglang.set(
        "/v1/loads",
        json!({"loads": [{"dp_rank": 0, "num_running_reqs": 5, "num_waiting_reqs": 2, "token_usage": 0.25}]}),
    );
    // Registered as a vLLM-format engine of the same context would conflict on the recipe: the
    // SGLang engine gets its own tenant.
    let body = json!({"url": sglang.url, "type": "SGLang", "instance_id": "s1", "tenant_id": "t2"});
    let r = http::post_json(server.http_port, "/engines", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());

    let tokens: Vec<i32> = (1..=8).collect();
    let store = engine::vllm_store_prompt(&vllm_cbor_profile(), &tokens, 4, "GPU", 0);
    handshake(&server, &mut v0, "e1|default|0", store).await;
    let query = json!({"model_name": "m", "block_size": 4, "token_ids": tokens});
    let plain = eventually("hits", WAIT, || async {
        let body = http::post_json(server.http_port, "/query", &query)
            .await
            .json();
        (body["instances"]["e1"]["device"] == 8).then_some(body)
    })
    .await;
    // Without include_load the answer is the seed's shape, byte for byte.
    assert_eq!(plain.as_object().unwrap().len(), 1, "{plain}");

    let mut with_load = query.clone();
    with_load["include_load"] = json!(true);
    let body = http::post_json(server.http_port, "/query", &with_load)
        .await
        .json();
    assert_eq!(body["instances"], plain["instances"]);
    let load = &body["loads"]["e1"];
    assert_eq!(load["server_load"], 3, "{body}");
    assert!(load["age_ms"].as_u64().unwrap() < 60_000, "{load}");
    let msgpack = http::request(
        server.http_port,
        "POST",
        "/query",
        &[
            ("Content-Type", "application/json"),
            ("Accept", "application/msgpack"),
        ],
        with_load.to_string().as_bytes(),
    )
    .await
    .msgpack();
    assert_eq!(msgpack["loads"]["e1"]["server_load"], 3, "{msgpack}");
    let r = http::post_json(
        server.http_port,
        "/query",
        &json!({"model_name": "m", "block_size": 4, "token_ids": [1], "include_load": 1}),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["field"].as_str()),
        (400, Some("include_load"))
    );

    // gRPC, and SGLang's per-rank figures.
    let mut client = server.grpc().await;
    let request = mooncake_conductor::gateway::pb::QueryRequest {
        model_name: "m".into(),
        block_size: 4,
        tenant_id: "t2".into(),
        token_ids: tokens.clone(),
        include_load: true,
        ..Default::default()
    };
    let answer = client.query(request.clone()).await.unwrap().into_inner();
    let rank = &answer.loads["s1"].ranks["0"];
    assert_eq!(
        (
            rank.num_running_reqs,
            rank.num_waiting_reqs,
            rank.token_usage
        ),
        (5, 2, 0.25)
    );
    assert_eq!(answer.loads["s1"].server_load, None);
    let request = mooncake_conductor::gateway::pb::QueryRequest {
        include_load: false,
        ..request
    };
    assert!(
        client
            .query(request)
            .await
            .unwrap()
            .into_inner()
            .loads
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_address_of_a_name_is_an_engine() {
    let player = Player::start(false, 0).await;
    let engine = EngineHttp::start().await;
    engine.vllm(&[(0, wildcard(&player.endpoint))], "m");
    let port = engine.url.rsplit(':').next().unwrap().to_owned();
    let mut server = Server::start_with(json!({
        "engines_dns": {"name": format!("localhost:{port}"), "type": "vLLM", "block_size": 4,
                        "refresh_ms": 200},
        "engine_refresh_ms": 200,
    }))
    .await;
    // localhost names 127.0.0.1 (the engine) and, where it resolves, ::1 (nothing listens).
    let key = format!("127.0.0.1:{port}|default|0");
    until(WAIT, async || {
        match services(&server).await.contains(&key) {
            true => Ok(()),
            false => Err(format!("{key} not registered: {}", engines(&server).await)),
        }
    })
    .await;
    let row = engines(&server).await["engines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["instance_id"] == format!("127.0.0.1:{port}"))
        .cloned()
        .unwrap();
    assert_eq!(
        (row["origin"].as_str(), row["state"].as_str()),
        (Some("dns"), Some("ok"))
    );

    // The configuration is the source of truth for what it declares: started again without
    // `engines_dns`, the addresses the name resolved to are followed no more, and their ranks
    // are unregistered.
    assert_eq!(server.terminate(), Some(0));
    let server = Server::start_in(server.into_dir(), json!({"engine_refresh_ms": 200})).await;
    until(WAIT, async || {
        let listed = engines(&server).await;
        match (services(&server).await.is_empty(), listed["count"] == 0) {
            (true, true) => Ok(()),
            _ => Err(format!("still followed: {listed}")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_every_replica_follows_an_engine_registered_on_one() {
    let etcd = crate::support::etcd::Etcd::start().await;
    let config = json!({"registry": etcd.registry("/eng/"), "engine_refresh_ms": 200});
    let a = Server::start_with(config.clone()).await;
    let b = Server::start_with(config).await;
    let players = players(2).await;
    let at = |r: usize| (r as u32, wildcard(&players[r].endpoint));
    let engine = EngineHttp::start().await;
    engine.vllm(&[at(0)], "m");
    let r = http::post_json(a.http_port, "/engines", &register_body(&engine.url)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // The other replica follows it: it lists the engine, and brings a new rank in itself.
    until(WAIT, async || match engines(&b).await["count"].as_u64() {
        Some(1) => Ok(()),
        _ => Err(format!(
            "b does not follow the engine: {}",
            engines(&b).await
        )),
    })
    .await;
    engine.vllm(&[at(0), at(1)], "m");
    for server in [&a, &b] {
        eventually("rank 1 on both replicas", WAIT, || async {
            (services(server).await == ["e1|default|0", "e1|default|1"]).then_some(())
        })
        .await;
    }
    // Removed on b: gone from both, with its ranks.
    let r = http::request(b.http_port, "DELETE", "/engines/e1", &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    for server in [&a, &b] {
        eventually("engine gone on both replicas", WAIT, || async {
            let gone = services(server).await.is_empty()
                && engines(server).await["count"].as_u64() == Some(0);
            gone.then_some(())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_is_read_on_its_own_interval() {
    // Descriptions every minute, loads every 200 ms: a new load shows well before a description
    // is read again.
    let server = Server::start_with(json!({
        "engine_refresh_ms": 60_000, "engine_load_refresh_ms": 200,
    }))
    .await;
    let player = Player::start(false, 0).await;
    let engine = EngineHttp::start().await;
    engine.vllm(&[(0, wildcard(&player.endpoint))], "m");
    engine.set("/load", json!({"server_load": 1}));
    let r = http::post_json(server.http_port, "/engines", &register_body(&engine.url)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let query = json!({"model_name": "m", "block_size": 4, "token_ids": [1, 2, 3, 4], "include_load": true});
    let loads = http::post_json(server.http_port, "/query", &query)
        .await
        .json()["loads"]
        .clone();
    assert_eq!(loads["e1"]["server_load"], 1, "{loads}");
    engine.set("/load", json!({"server_load": 9}));
    eventually("the new load", WAIT, || async {
        let body = http::post_json(server.http_port, "/query", &query)
            .await
            .json();
        (body["loads"]["e1"]["server_load"] == 9).then_some(())
    })
    .await;
}

/// A refused POST /engines undoes only what it did: a rank registered by hand before, which the
/// engine's description names exactly as it is registered, keeps its registration and its
/// blocks when another rank of the request is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_engine_request_leaves_a_prior_hand_registration_and_its_hits() {
    // Room for one subscription: the engine's second rank is refused.
    let server = Server::start_with(json!({"max_subscriptions": 1})).await;
    let (mut rank0, rank1) = (Player::start(false, 0).await, Player::start(false, 0).await);
    let hand = engine::Registration::vllm("e1", &rank0.endpoint).json();
    server.register_ok(&hand).await;
    let tokens: Vec<i32> = (1..=12).collect();
    let stored = engine::vllm_store_prompt(&vllm_cbor_profile(), &tokens, 4, "GPU", 0);
    handshake(&server, &mut rank0, "e1|default|0", stored).await;
    let held = || async {
        let r = grpc_query(&server, "m", tokens.clone(), 4).await;
        r.hits.get("e1").map(|row| row.device)
    };
    eventually("the hand registration's hits", WAIT, || async {
        (held().await == Some(12)).then_some(())
    })
    .await;

    let engine = EngineHttp::start().await;
    engine.vllm(
        &[
            (0, wildcard(&rank0.endpoint)),
            (1, wildcard(&rank1.endpoint)),
        ],
        "m",
    );
    let r = http::post_json(server.http_port, "/engines", &register_body(&engine.url)).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("max_subscriptions"), "{}", r.text());
    assert_eq!(services(&server).await, ["e1|default|0"]);
    assert_eq!(
        held().await,
        Some(12),
        "the hand registration's blocks stay"
    );
    assert_eq!(
        engines(&server).await["count"],
        0,
        "the engine is not followed"
    );
}

/// One policy at every entrance: an engine of the configuration, and one registered by request
/// before `allowed_endpoint_hosts` was tightened (restored from the store), are checked before
/// every read: outside the policy they are reported and never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_outside_allowed_endpoint_hosts_are_never_read_whatever_their_origin() {
    let player = Player::start(false, 0).await;
    let (configured, requested) = (EngineHttp::start().await, EngineHttp::start().await);
    for engine in [&configured, &requested] {
        engine.vllm(&[(0, wildcard(&player.endpoint))], "m");
    }
    // Registered by request while every host is allowed.
    let mut server = Server::start_with(json!({"engine_refresh_ms": 200})).await;
    let r = http::post_json(server.http_port, "/engines", &register_body(&requested.url)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(server.terminate(), Some(0));

    let policy = json!({
        "allowed_endpoint_hosts": ["10.0.0.0/8"],
        "engine_refresh_ms": 200,
        "engine_load_refresh_ms": 200,
        "engines": [{"url": configured.url, "type": "vLLM", "instance_id": "c1", "block_size": 4,
                     "hash_profile": vllm_cbor_profile()}],
    });
    let before = requested.requests();
    let server = Server::start_in(server.into_dir(), policy).await;
    let refused = |row: &Value| {
        row["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("allowed_endpoint_hosts"))
    };
    until(WAIT, async || {
        let listed = engines(&server).await;
        let rows = listed["engines"].as_array().cloned().unwrap_or_default();
        match rows.len() == 2 && rows.iter().all(refused) {
            true => Ok(()),
            false => Err(format!("not both reported as refused: {listed}")),
        }
    })
    .await;
    assert_eq!(configured.requests(), 0, "the configured engine was read");
    assert_eq!(
        requested.requests(),
        before,
        "the stored engine was read again"
    );
}

/// No head-of-line blocking: 48 engines that accept and never answer do not hold up a healthy
/// one. Its load keeps being read about every interval (age at most three intervals), and a
/// rank it adds is registered within three description intervals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_engines_do_not_hold_up_a_healthy_one() {
    let slow = EngineHttp::start().await;
    slow.mode(Mode::Slow(Duration::from_secs(600)));
    let entries: Vec<Value> = (0..48)
        .map(|i| {
            json!({"url": slow.url, "type": "vLLM", "instance_id": format!("slow{i}"),
                        "block_size": 4, "hash_profile": vllm_cbor_profile()})
        })
        .collect();
    let server = Server::start_with(json!({
        "engines": entries, "engine_refresh_ms": 1000, "engine_load_refresh_ms": 1000,
    }))
    .await;
    let (rank0, rank1) = (Player::start(false, 0).await, Player::start(false, 0).await);
    let engine = EngineHttp::start().await;
    engine.vllm(&[(0, wildcard(&rank0.endpoint))], "m");
    engine.set("/load", json!({"server_load": 1}));
    let r = http::post_json(server.http_port, "/engines", &register_body(&engine.url)).await;
    assert_eq!(r.status, 200, "{}", r.text());

    // Load ages over six intervals, sampled every 100 ms.
    let query = json!({"model_name": "m", "block_size": 4, "token_ids": [1, 2, 3, 4], "include_load": true});
    let started = std::time::Instant::now();
    let mut oldest = 0;
    while started.elapsed() < Duration::from_secs(6) {
        let body = http::post_json(server.http_port, "/query", &query)
            .await
            .json();
        let age = body["loads"]["e1"]["age_ms"].as_u64().expect("e1's load");
        oldest = oldest.max(age);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        oldest <= 3000,
        "e1's load was {oldest} ms old with 48 slow engines"
    );

    // A new rank is registered within three description intervals.
    engine.vllm(
        &[
            (0, wildcard(&rank0.endpoint)),
            (1, wildcard(&rank1.endpoint)),
        ],
        "m",
    );
    let asked = std::time::Instant::now();
    until(Duration::from_secs(10), async || {
        match services(&server).await.contains(&"e1|default|1".to_owned()) {
            true => Ok(()),
            false => Err("rank 1 not registered".to_owned()),
        }
    })
    .await;
    let took = asked.elapsed();
    assert!(
        took <= Duration::from_secs(3),
        "rank 1 took {took:?} with 48 slow engines"
    );
}

/// Safe by default: an engine URL on a loopback or link-local address is refused unless
/// `allow_local_engine_addresses` allows it, without a request sent; and whatever an engine
/// answers, the errors name a class, never the answer (a key, an endpoint, a model list).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_reads_are_not_a_proxy_and_never_echo_an_answer() {
    let engine = EngineHttp::start().await;
    engine.vllm(&[(0, "tcp://*:5557".into())], "m");
    let strict = Server::start_with(json!({"allow_local_engine_addresses": false})).await;
    for url in [engine.url.clone(), "http://169.254.169.254:80".to_owned()] {
        let r = http::post_json(strict.http_port, "/engines", &register_body(&url)).await;
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(
            r.text().contains("allow_local_engine_addresses"),
            "{}",
            r.text()
        );
    }
    assert_eq!(
        engine.requests(),
        0,
        "a refused address is never connected to"
    );

    // Allowed (the tests' default): a hostile engine that answers secrets at every route.
    let server = Server::start().await;
    let no_secret = |text: &str| assert!(!text.contains("SECRET"), "echoed: {text}");
    let answers = [
        // A key that is not a rank.
        (
            json!({"SECRET-key": {"endpoint": "tcp://*:5557"}}),
            json!({"data": [{"id": "m"}]}),
        ),
        // An endpoint nobody can subscribe to.
        (
            json!({"0": {"endpoint": "tcp://SECRET-host:0"}}),
            json!({"data": [{"id": "m"}]}),
        ),
        // Models other than the one asked for.
        (
            json!({"0": {"endpoint": "tcp://*:5557"}}),
            json!({"data": [{"id": "SECRET-model"}]}),
        ),
        // Not JSON at all.
        (json!("SECRET-text"), json!("SECRET-text")),
    ];
    for (sources, models) in answers {
        engine.set("/kv_event_sources", sources);
        engine.set("/v1/models", models);
        let mut body = register_body(&engine.url);
        body["model_name"] = json!("m");
        let r = http::post_json(server.http_port, "/engines", &body).await;
        assert_eq!(r.status, 400, "{}", r.text());
        no_secret(&r.text());
    }
    no_secret(&http::get(server.http_port, "/engines").await.text());
    no_secret(&http::get(server.http_port, "/services/status").await.text());
}
