//! A replica whose bootstrap fails for good starts empty and says so: `/health` (and gRPC
//! `Health`) degraded with the failed bootstrap, its last error and its usual cause, and
//! `conductor_replica_incomplete` 1, until every subscription has replayed what its publisher
//! buffers; then it answers like its peer and reports ready. The peer is a real replica with
//! the documented defaults (no `auth_token`, `snapshot_export` "auth"), which exports to no one.

use mooncake_conductor::gateway::pb;
use serde_json::{Value, json};

use crate::support::deliver::publish_to_all;
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::player::Player;
use crate::support::query::grpc_query;
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http};

const SERVICE: &str = "v0|default|0";

/// The tokens of batch `n`: two blocks of 4, distinct from every other batch.
fn prompt(n: usize) -> Vec<i32> {
    let base = (n * 100 + 1) as i32;
    (base..base + 8).collect()
}

async fn publish(servers: &[&Server], player: &mut Player, n: usize) {
    let payload = engine::vllm_store_prompt(&vllm_cbor_profile(), &prompt(n), 4, "GPU", 0);
    publish_to_all(servers, player, SERVICE, payload).await;
}

async fn health(server: &Server) -> (u16, Value) {
    let r = http::get(server.http_port, "/health").await;
    (r.status, r.json())
}

async fn incomplete(server: &Server) -> Option<String> {
    let text = http::get(server.http_port, "/metrics").await.text();
    text.lines()
        .find(|l| l.starts_with("conductor_replica_incomplete "))
        .map(str::to_owned)
}

/// The device tokens `server` answers for each of the first `n` batches' prompts.
async fn answers(server: &Server, n: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let r = grpc_query(server, "m", prompt(i), 4).await;
        out.push(r.hits.get("v0").map_or(0, |h| h.device));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_start_after_a_refused_bootstrap_is_degraded_until_caught_up() {
    let peer = Server::start().await;
    let mut player = Player::start(true, 0).await;
    let reg = Registration::vllm("v0", &player.endpoint)
        .replay(player.replay_endpoint.as_deref())
        .json();
    let r = http::post_json(
        peer.http_port,
        "/register",
        &engine::http_registration(&reg),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    for n in 0..3 {
        publish(&[&peer], &mut player, n).await;
    }
    assert_eq!(answers(&peer, 3).await, [8, 8, 8]);

    let from = format!("http://127.0.0.1:{}", peer.rpc_port);
    let replica =
        Server::start_with(json!({"bootstrap_from": from, "bootstrap_attempts": 2})).await;
    let log = replica.log();
    for part in [
        "bootstrap failed, starting empty",
        "snapshot export is disabled",
        "set the same auth_token on every replica",
    ] {
        assert!(log.contains(part), "{part} in {log}");
    }
    // Ready, serving, and saying what it lacks.
    let (status, body) = health(&replica).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "degraded", "{body}");
    let reason = body["reason"].as_str().unwrap_or_default().to_owned();
    for part in [
        format!("the bootstrap from {from} failed (2 attempts"),
        "PermissionDenied: snapshot export is disabled".to_owned(),
        "set the same auth_token on every replica".to_owned(),
        "no registration yet".to_owned(),
    ] {
        assert!(reason.contains(&part), "{part} in {reason}");
    }
    assert_eq!(
        incomplete(&replica).await.as_deref(),
        Some("conductor_replica_incomplete 1")
    );
    let grpc = replica
        .grpc()
        .await
        .health(pb::HealthRequest {})
        .await
        .expect("Health")
        .into_inner();
    assert!(
        grpc.ready && grpc.status.starts_with("degraded: "),
        "{grpc:?}"
    );
    assert_eq!(answers(&replica, 3).await, [0, 0, 0]);

    // Registered, its subscription waits for the publisher's next batch (an idle publisher
    // is not asked for its buffer): still incomplete.
    let r = http::post_json(
        replica.http_port,
        "/register",
        &engine::http_registration(&reg),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    eventually(
        "the replica to wait for its one subscription",
        WAIT,
        || async {
            let (_, body) = health(&replica).await;
            let reason = body["reason"].as_str().unwrap_or_default().to_owned();
            reason
                .contains("0 of 1 subscriptions have replayed")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        incomplete(&replica).await.as_deref(),
        Some("conductor_replica_incomplete 1")
    );

    // The next batch has it replay the publisher's buffer from the stream start: caught up.
    publish(&[&peer, &replica], &mut player, 3).await;
    eventually(
        "the replica to report ready, not degraded",
        WAIT,
        || async {
            let (status, body) = health(&replica).await;
            (status == 200 && body["status"] == "ready").then_some(())
        },
    )
    .await;
    assert_eq!(
        incomplete(&replica).await.as_deref(),
        Some("conductor_replica_incomplete 0")
    );
    assert_eq!(answers(&replica, 4).await, answers(&peer, 4).await);
    assert_eq!(answers(&replica, 4).await, [8, 8, 8, 8]);
    let log = replica.log();
    assert!(log.contains("caught up after the empty start"), "{log}");
}
