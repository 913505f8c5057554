//! Ingestion over real sockets: in-order apply, gaps healed by replay, gaps that cannot be
//! healed, publisher restarts, late joins, malformed input, unregister.

use mooncake_conductor::gateway::pb;
use serde_json::json;

use crate::support::deliver::handshake;
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::fleet::{BS, MODEL, prompt, register};
use crate::support::player::Player;
use crate::support::query::grpc_query;
use crate::support::server::Server;
use crate::support::{WAIT, eventually};

fn store(p: i32) -> Vec<u8> {
    engine::vllm_store_prompt(&vllm_cbor_profile(), &prompt(p), BS, "GPU", 0)
}

async fn device_hits(server: &Server, instance: &str, p: i32) -> i64 {
    let r = grpc_query(server, MODEL, prompt(p), BS as i64).await;
    r.hits.get(instance).map_or(-1, |h| h.device)
}

/// Wait until the device hits of every prompt equal `expected[p]`.
async fn expect_hits(server: &Server, instance: &str, expected: &[(i32, i64)]) {
    eventually("expected hits", WAIT, || async {
        for (p, want) in expected {
            if device_hits(server, instance, *p).await != *want {
                return None;
            }
        }
        Some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_is_healed_by_replay() {
    let server = Server::start().await;
    let mut player = Player::start(true, 0).await;
    register(&server, "a", &player).await;
    handshake(&server, &mut player, "a|default|0", store(1)).await;
    player.publish_lost(store(2));
    player.publish_lost(store(3));
    player.publish(store(4)).await;
    expect_hits(&server, "a", &[(1, 8), (2, 8), (3, 8), (4, 8)]).await;
    let st = server.service_status("a|default|0").await;
    assert_eq!(
        (
            st["gaps"].as_u64(),
            st["replays_ok"].as_u64(),
            st["sources_dropped"].as_u64()
        ),
        (Some(1), Some(1), Some(0)),
        "{st}"
    );
    assert_eq!(st["last_seq"], json!(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_the_buffer_cannot_cover_drops_only_that_source() {
    let server = Server::start().await;
    let mut a = Player::start(true, 0).await;
    let mut b = Player::start(false, 0).await;
    register(&server, "a", &a).await;
    register(&server, "b", &b).await;
    handshake(&server, &mut a, "a|default|0", store(1)).await;
    handshake(&server, &mut b, "b|default|0", store(1)).await;
    a.publish_lost(store(2));
    a.truncate_replay(0);
    a.publish(store(3)).await;
    // a's state is unknown after the lost batch: its old blocks go, the new batch applies.
    expect_hits(&server, "a", &[(1, 0), (2, 0), (3, 8)]).await;
    assert_eq!(
        device_hits(&server, "b", 1).await,
        8,
        "another source is untouched"
    );
    let st = server.service_status("a|default|0").await;
    assert_eq!(st["replays_failed"], json!(1), "{st}");
    assert!(st["sources_dropped"].as_u64() >= Some(1), "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_without_replay_drops_the_source() {
    let server = Server::start().await;
    let mut a = Player::start(false, 0).await;
    register(&server, "a", &a).await;
    handshake(&server, &mut a, "a|default|0", store(1)).await;
    a.publish_lost(store(2));
    a.publish(store(3)).await;
    expect_hits(&server, "a", &[(1, 0), (2, 0), (3, 8)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_restart_removes_its_old_blocks() {
    let server = Server::start().await;
    let mut a = Player::start(false, 0).await;
    register(&server, "a", &a).await;
    handshake(&server, &mut a, "a|default|0", store(1)).await;
    a.publish(store(2)).await;
    a.publish(store(3)).await;
    expect_hits(&server, "a", &[(1, 8), (2, 8), (3, 8)]).await;
    a.restart(0);
    a.publish(store(4)).await;
    expect_hits(&server, "a", &[(1, 0), (2, 0), (3, 0), (4, 8)]).await;
    assert_eq!(
        server.service_status("a|default|0").await["restarts"],
        json!(1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_join_catches_up_through_replay() {
    let server = Server::start().await;
    let mut a = Player::start(true, 0).await;
    // Published before the Conductor subscribed: only the replay buffer has them.
    a.publish_lost(store(1));
    a.publish_lost(store(2));
    register(&server, "a", &a).await;
    handshake(&server, &mut a, "a|default|0", store(3)).await;
    expect_hits(&server, "a", &[(1, 8), (2, 8), (3, 8)]).await;
    assert_eq!(
        server.service_status("a|default|0").await["replays_ok"],
        json!(1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_and_payloads_are_counted_and_good_state_is_kept() {
    use bytes::Bytes;
    let server = Server::start().await;
    let mut a = Player::start(false, 0).await;
    register(&server, "a", &a).await;
    handshake(&server, &mut a, "a|default|0", store(1)).await;
    // Wrong frame counts and a short seq.
    a.send_raw(vec![Bytes::from_static(b"only-one")]).await;
    a.send_raw(vec![
        Bytes::new(),
        Bytes::from_static(b"\x00\x01"),
        Bytes::from_static(b"x"),
    ])
    .await;
    a.send_raw(vec![
        Bytes::new(),
        Bytes::from_static(&[0; 8]),
        Bytes::from_static(b"x"),
        Bytes::new(),
    ])
    .await;
    // Random bytes, truncated msgpack and wrong types, each with a proper seq.
    let good = store(2);
    let bad_payloads: Vec<Vec<u8>> = vec![
        vec![0xc1, 0xff, 0x00, 0x13],
        good[..good.len() / 2].to_vec(),
        engine::batch(vec![rmpv::Value::from("not an event")], 0),
        rmp_serde::to_vec(&json!({"ts": "yesterday", "events": 3})).unwrap(),
    ];
    for payload in bad_payloads {
        a.publish(payload).await;
    }
    a.publish(good).await;
    expect_hits(&server, "a", &[(1, 8), (2, 8)]).await;
    let st = server.service_status("a|default|0").await;
    assert_eq!(st["frame_errors"], json!(3), "{st}");
    assert!(
        st["decode_errors"].as_u64().unwrap_or(0) + st["invalid_events"].as_u64().unwrap_or(0) >= 4,
        "{st}"
    );
    assert_eq!(st["sources_dropped"], json!(0), "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregister_stops_consumption_and_removes_the_source() {
    let server = Server::start().await;
    let mut a = Player::start(false, 0).await;
    register(&server, "a", &a).await;
    handshake(&server, &mut a, "a|default|0", store(1)).await;
    expect_hits(&server, "a", &[(1, 8)]).await;
    let mut client = server.grpc().await;
    let req = pb::UnregisterRequest {
        instance_id: "a".into(),
        tenant_id: String::new(),
        dp_rank: 0,
    };
    assert_eq!(
        client
            .unregister(req.clone())
            .await
            .unwrap()
            .into_inner()
            .ret,
        0
    );
    let r = grpc_query(&server, MODEL, prompt(1), BS as i64).await;
    assert!(r.hits.is_empty(), "no instance left: {:?}", r.hits);
    assert_eq!(
        client.unregister(req).await.unwrap().into_inner().ret,
        -2001
    );
    // Nothing published after unregistering reaches the index.
    a.publish(store(2)).await;
    let view = client
        .get_global_view(pb::GetGlobalViewRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        view.context_count, 0,
        "the context went with its last registration and blocks"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_seed_shows_a_hash_check_mismatch_and_a_right_one_ok() {
    let server = Server::start().await;
    let mut right = Player::start(false, 0).await;
    let mut wrong = Player::start(false, 0).await;
    register(&server, "right", &right).await;
    let mut profile = vllm_cbor_profile();
    profile["python_hash_seed"] = json!("1");
    let r = Registration::vllm("wrong", &wrong.endpoint)
        .model("other-model")
        .block_size(BS)
        .profile(profile)
        .json();
    assert_eq!(server.register(&r).await.ret, 0);
    // Both engines really use seed "0".
    handshake(&server, &mut right, "right|default|0", store(0)).await;
    handshake(&server, &mut wrong, "wrong|default|0", store(0)).await;
    for p in 1..20 {
        right.publish(store(p)).await;
        wrong.publish(store(p)).await;
    }
    eventually("hash check verdicts", WAIT, || async {
        let (r, w) = (
            server.service_status("right|default|0").await,
            server.service_status("wrong|default|0").await,
        );
        (r["hash_check"] == "ok" && w["hash_check"] == "mismatch").then_some(())
    })
    .await;
    // The check names the recipe the engine really uses, and the index translates: the wrongly
    // registered context answers exactly what the engine holds.
    let (r, w) = (
        server.service_status("right|default|0").await,
        server.service_status("wrong|default|0").await,
    );
    assert_eq!(r["engine_recipe"], "vllm_v1/sha256_cbor/seed=0/low64_be");
    assert_eq!(w["engine_recipe"], "vllm_v1/sha256_cbor/seed=0/low64_be");
    assert_eq!(
        (r["translating"].clone(), w["translating"].clone()),
        (json!(false), json!(true))
    );
    // Stores reach the index after the check saw them: wait for the last one.
    eventually("the wrongly registered context answers", WAIT, || async {
        let mut all = true;
        for p in [0, 7, 19] {
            let hits = grpc_query(&server, "other-model", prompt(p), BS as i64).await;
            all &= hits.hits.get("wrong").map(|h| h.device) == Some(prompt(p).len() as i64);
        }
        all.then_some(())
    })
    .await;
}
