//! Durable state stays exact across crashes: a context its source no longer feeds keeps pace
//! with the source, holders of instances that are gone are reclaimed, and an idle server writes
//! nothing.

use std::time::Duration;

use serde_json::json;

use crate::durability::{adapter_hits, adapter_store, answers, deliver, store};
use crate::e2e_query::handshake;
use crate::ingest::register;
use crate::support::player::Player;
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http};

const FAST: u64 = 50;

fn fast() -> serde_json::Value {
    json!({"checkpoint_interval_ms": FAST})
}

/// Long enough for several checkpoint rounds.
async fn checkpoints_pass() {
    tokio::time::sleep(Duration::from_millis(10 * FAST)).await;
}

async fn sources_dropped(server: &Server) -> serde_json::Value {
    let s = http::get(server.http_port, "/services/status").await.json();
    s["services"][0]["sources_dropped"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_idle_past_the_replay_buffer_keeps_its_source_across_a_crash() {
    let mut server = Server::start_with(fast()).await;
    let mut player = Player::start(true, 0).await;
    register(&server, "e", &player).await;
    // Batch 0 feeds the adapter context, which then receives nothing while the base context
    // gets every later batch.
    handshake(&server, &mut player, "e|default|0", adapter_store(1, "ad")).await;
    for p in 2..10 {
        player.publish(store(p, "GPU")).await;
    }
    deliver(&server, &mut player).await;
    eventually("base prompts indexed", WAIT, || async {
        let a = answers(&server).await;
        (2..10).all(|p| a[p].0 == 8).then_some(())
    })
    .await;
    assert_eq!(adapter_hits(&server, "ad", 1).await, 8);
    // The publisher's buffer keeps its newest batches only: batch 0 is gone from it.
    player.truncate_replay(3);
    checkpoints_pass().await;
    let server = Server::start_in(server.into_dir(), fast()).await;
    player.publish(store(10, "GPU")).await;
    deliver(&server, &mut player).await;
    eventually("the batch after the restart is indexed", WAIT, || async {
        (answers(&server).await[10].0 == 8).then_some(())
    })
    .await;
    assert_eq!(
        sources_dropped(&server).await,
        json!(0),
        "the replay verified the source where it stood:\n{}",
        server.log()
    );
    let a = answers(&server).await;
    assert!((2..10).all(|p| a[p].0 == 8), "base blocks kept: {a:?}");
    assert_eq!(
        adapter_hits(&server, "ad", 1).await,
        8,
        "adapter blocks kept"
    );
}
