//! A context that falls behind slows its source down and shows as pending batches: it never
//! queues without bound.

use std::path::Path;

use mooncake_conductor::index::actor::MAILBOX_CAPACITY;
use serde_json::json;

use crate::support::deliver::handshake;
use crate::support::engine::{self, vllm_cbor_profile};
use crate::support::fleet::{BS, MODEL, register};
use crate::support::player::Player;
use crate::support::query::grpc_query;
use crate::support::server::Server;
use crate::support::{WAIT, http, until};

fn prompt(p: i32) -> Vec<i32> {
    (0..8).map(|i| p * 100 + i).collect()
}

fn store(p: i32) -> Vec<u8> {
    engine::vllm_store_prompt(&vllm_cbor_profile(), &prompt(p), BS, "GPU", 0)
}

const SERVICE: &str = "slow|default|0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_context_holds_its_mailbox_at_most_and_shows_as_pending() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Every batch costs the context 5 ms: 300 batches take it 1.5 s, and the publisher sends
    // them all at once.
    let env = [("CONDUCTOR_TEST_APPLY_DELAY_MS", Path::new("5"))];
    let server = Server::start_in_with_env(dir, json!({}), &env).await;
    let mut player = Player::start(false, 0).await;
    register(&server, "slow", &player).await;
    handshake(&server, &mut player, SERVICE, store(1)).await;
    const BATCHES: i32 = 300;
    for p in 2..2 + BATCHES {
        player.publish(store(p)).await;
    }
    let last = 1 + BATCHES;
    let mut max_pending = 0u64;
    let waits = until(WAIT, async || {
        let status = http::get(server.http_port, "/services/status").await.json();
        let st = status["services"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["service"] == SERVICE).cloned())
            .expect("the subscription's status");
        let pending = st["pending_batches"].as_u64().expect("pending_batches");
        max_pending = max_pending.max(pending);
        let waits = st["backpressure_waits"]
            .as_u64()
            .expect("backpressure_waits");
        let hits = grpc_query(&server, MODEL, prompt(last), BS as i64).await;
        if pending == 0 && hits.hits.get("slow").map(|h| h.device) == Some(8) {
            return Ok(waits);
        }
        Err(format!("waiting for every batch to apply: {st}"))
    })
    .await;
    // The mailbox's batches, and the one being applied (and one a waiting sender may place).
    let bound = MAILBOX_CAPACITY as u64 + 2;
    assert!(
        max_pending <= bound,
        "{max_pending} batches in flight, bound {bound}"
    );
    assert!(
        max_pending >= 16,
        "the context fell behind: {max_pending} at most"
    );
    assert!(waits > 0, "the subscription waited for the context");
    // Every batch applied, none lost to the waiting.
    for p in [2, BATCHES / 2, last] {
        let hits = grpc_query(&server, MODEL, prompt(p), BS as i64).await;
        assert_eq!(
            hits.hits.get("slow").map(|h| h.device),
            Some(8),
            "prompt {p}"
        );
    }
    let metrics = http::get(server.http_port, "/metrics").await.text();
    assert!(
        metrics.contains(&format!(
            "conductor_pending_batches{{service=\"{SERVICE}\"}} 0"
        )),
        "{metrics}"
    );
    assert!(metrics.contains(&format!(
        "conductor_backpressure_waits_total{{service=\"{SERVICE}\"}} {waits}"
    )));
}
