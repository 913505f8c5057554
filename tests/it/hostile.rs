//! Hostile and careless peers: one bad publisher must never take the service down, neither while
//! it runs nor at the next start from the persisted registration.

use std::time::Duration;

use serde_json::json;

use crate::support::deliver::handshake;
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::fleet::{BS, MODEL, register};
use crate::support::grpc::register_request;
use crate::support::player::Player;
use crate::support::query::grpc_query;
use crate::support::raw_zmtp::{HostilePub, long_frame_header};
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http};

fn prompt(p: i32) -> Vec<i32> {
    (0..8).map(|i| p * 100 + i).collect()
}

fn store(p: i32) -> Vec<u8> {
    engine::vllm_store_prompt(&vllm_cbor_profile(), &prompt(p), BS, "GPU", 0)
}

async fn register_endpoint(server: &Server, instance: &str, endpoint: &str) {
    let r = Registration::vllm(instance, endpoint)
        .model(MODEL)
        .block_size(BS)
        .json();
    server.register_ok(&r).await;
}

/// Wait until `service` has dropped at least `n` oversized messages; returns its status.
async fn oversized_at_least(server: &Server, service: &str, n: u64) -> serde_json::Value {
    eventually("oversized messages counted", WAIT, || async {
        let st = server.service_status(service).await;
        (st["oversized_messages"].as_u64() >= Some(n)).then_some(st)
    })
    .await
}

async fn device_hits(server: &Server, instance: &str, p: i32) -> i64 {
    let r = grpc_query(server, MODEL, prompt(p), BS as i64).await;
    r.hits.get(instance).map_or(-1, |h| h.device)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2_pow_62_frame_header_drops_that_connection_and_nothing_else() {
    // A small bound, so the test also shows the limit is the configured one.
    let config = json!({ "max_publisher_message_bytes": 1 << 20 });
    let server = Server::start_with(config.clone()).await;
    let mut good = Player::start(false, 0).await;
    register(&server, "good", &good).await;
    handshake(&server, &mut good, "good|default|0", store(1)).await;

    let evil = HostilePub::start(long_frame_header(1 << 62)).await;
    register_endpoint(&server, "evil", &evil.endpoint).await;
    let st = oversized_at_least(&server, "evil|default|0", 1).await;
    assert_eq!(st["last_seq"], json!(null), "nothing was applied: {st}");
    assert_eq!(
        http::get(server.http_port, "/health").await.status,
        200,
        "the service is alive:\n{}",
        server.log()
    );
    // The subscription reconnects (with backoff) and drops the next connection the same way.
    eventually("a reconnect", WAIT, || async {
        (evil.handshakes() >= 2).then_some(())
    })
    .await;
    oversized_at_least(&server, "evil|default|0", 2).await;
    let log = server.log();
    let warnings = log
        .lines()
        .filter(|l| l.contains("publisher connection dropped") && l.contains("evil|default|0"))
        .count();
    assert_eq!(warnings, 1, "one warning per interval:\n{log}");
    let metrics = http::get(server.http_port, "/metrics").await.text();
    assert!(
        metrics.lines().any(|l| l
            .starts_with("conductor_oversized_messages_total{service=\"evil|default|0\"}")
            && !l.ends_with(" 0")),
        "{metrics}"
    );

    // The good publisher on the same service is unaffected.
    good.publish(store(2)).await;
    eventually("the good publisher's next batch", WAIT, || async {
        (device_hits(&server, "good", 2).await == 8).then_some(())
    })
    .await;
    assert_eq!(device_hits(&server, "good", 1).await, 8);

    // Restart with the hostile registration persisted: the service comes up and serves.
    let mut server = server;
    assert_eq!(server.terminate(), Some(0));
    let dir = server.into_dir();
    let before = evil.handshakes();
    let server = Server::start_in(dir, config).await;
    let services = http::get(server.http_port, "/services").await.json();
    assert!(
        services.to_string().contains(&evil.endpoint),
        "the hostile registration is still there: {services}"
    );
    oversized_at_least(&server, "evil|default|0", 1).await;
    assert!(evil.handshakes() > before);
    eventually("recovered good blocks", WAIT, || async {
        (device_hits(&server, "good", 2).await == 8).then_some(())
    })
    .await;
    // Serving on while the hostile publisher is reconnected and dropped again.
    oversized_at_least(&server, "evil|default|0", 2).await;
    assert_eq!(http::get(server.http_port, "/health").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_replay_answer_fails_that_replay_only() {
    let server = Server::start_with(json!({ "max_publisher_message_bytes": 1 << 20 })).await;
    let mut live = Player::start(false, 0).await;
    let replay = HostilePub::start_as("ROUTER", long_frame_header(1 << 62)).await;
    let r = Registration::vllm("a", &live.endpoint)
        .replay(Some(&replay.endpoint))
        .model(MODEL)
        .block_size(BS)
        .json();
    let reply = server.grpc().await.register(register_request(&r)).await;
    assert_eq!(reply.expect("register").into_inner().ret, 0);
    handshake(&server, &mut live, "a|default|0", store(1)).await;
    live.publish_lost(store(2));
    live.publish(store(3)).await;
    // The gap asks the replay socket, whose answer announces 2^62 bytes: the replay fails, the
    // source is resynchronised from the live stream, and the service carries on.
    let st = oversized_at_least(&server, "a|default|0", 1).await;
    assert!(replay.handshakes() >= 1);
    assert_eq!(st["replays_failed"], json!(1), "{st}");
    eventually("the live batch after the gap", WAIT, || async {
        (device_hits(&server, "a", 3).await == 8).then_some(())
    })
    .await;
    assert_eq!(http::get(server.http_port, "/health").await.status, 200);
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_unregister_removes_a_registration_from_a_stopped_service() {
    let mut server = Server::start().await;
    let mut a = Player::start(false, 0).await;
    register(&server, "a", &a).await;
    handshake(&server, &mut a, "a|default|0", store(1)).await;
    let b = Player::start(false, 0).await;
    let mut r = Registration::vllm("b", &b.endpoint)
        .model(MODEL)
        .block_size(BS)
        .rank(1)
        .json();
    r["tenant_id"] = json!("t1");
    let reply = server.grpc().await.register(register_request(&r)).await;
    assert_eq!(reply.expect("register").into_inner().ret, 0);

    let out = server.offline(&["unregister", "a"]);
    assert!(
        !out.status.success() && text(&out).contains("still running"),
        "RocksDB allows one process: {}",
        text(&out)
    );
    assert_eq!(server.terminate(), Some(0));

    let out = server.offline(&["unregister", "a"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"{"unregistered":"a|default|0"}"#
    );
    let out = server.offline(&["unregister", "a"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("no registration a|default|0") && text(&out).contains("b|t1|1"),
        "{}",
        text(&out)
    );
    let out = server.offline(&["unregister", "b", "--tenant", "t1"]);
    assert!(!out.status.success(), "rank 0 is not b's: {}", text(&out));
    let out = server.offline(&["unregister"]);
    assert!(
        !out.status.success() && text(&out).contains("usage"),
        "{}",
        text(&out)
    );
    let out = server.offline(&["unregister", "b", "--tenant", "t1", "--dp-rank", "1"]);
    assert!(out.status.success(), "{}", text(&out));

    // Started again, the service has neither registration, and a's blocks are gone.
    let server = Server::start_in(server.into_dir(), json!({})).await;
    let services = http::get(server.http_port, "/services").await.json();
    assert_eq!(services["count"], json!(0), "{services}");
    assert_eq!(device_hits(&server, "a", 1).await, -1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_repeating_bad_batches_gets_one_warning_per_interval_with_a_suppressed_count() {
    let server = Server::start_with(json!({ "warning_interval_ms": 2000 })).await;
    let mut player = Player::start(false, 0).await;
    register(&server, "a", &player).await;
    handshake(&server, &mut player, "a|default|0", store(1)).await;
    let undecodable = |log: &str| {
        log.lines()
            .filter(|l| l.contains("undecodable batch dropped"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let decode_errors = |n: u64| {
        let server = &server;
        async move {
            let st = server.service_status("a|default|0").await;
            (st["decode_errors"].as_u64() == Some(n)).then_some(())
        }
    };
    for _ in 0..30 {
        player.publish(b"\xc1 not msgpack".to_vec()).await;
    }
    eventually("30 counted decode errors", WAIT, || decode_errors(30)).await;
    let lines = undecodable(&server.log());
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("suppressed=0"), "{}", lines[0]);

    // Not synchronisation: the scenario lets the 2 s warning interval pass, which nothing the
    // service reports marks, so that the next bad batch is warned about again.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    player.publish(b"\xc1 still not msgpack".to_vec()).await;
    eventually("31 counted decode errors", WAIT, || decode_errors(31)).await;
    let lines = undecodable(&server.log());
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines[1].contains("suppressed=29"), "{}", lines[1]);
    // Counting is not rate-limited, and good batches still apply.
    player.publish(store(2)).await;
    eventually("the next good batch", WAIT, || async {
        (device_hits(&server, "a", 2).await == 8).then_some(())
    })
    .await;
}
