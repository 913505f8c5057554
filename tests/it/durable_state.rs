//! Durable state stays exact across crashes: a context its source no longer feeds keeps pace
//! with the source, holders of instances that are gone are reclaimed, and an idle server writes
//! nothing.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::deliver::{deliver, handshake};
use crate::support::fleet::{BS, MODEL, adapter_store, prompt, register, store};
use crate::support::player::Player;
use crate::support::query::{adapter_hits, answers, grpc_query};
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http};

const FAST: u64 = 50;

fn fast() -> serde_json::Value {
    json!({"checkpoint_interval_ms": FAST})
}

/// Wait until the checkpointer has written what the server holds: the store's files stay the
/// same size for ten checkpoint rounds. A round that writes only sources' positions logs nothing
/// and counts nowhere, so the files are the witness; ten rounds are the margin for a round that
/// is still to come.
async fn checkpointed(server: &Server) {
    let settle = Duration::from_millis(10 * FAST);
    let mut last = (store_bytes(server), Instant::now());
    eventually("the store to stop changing", WAIT, || {
        let now = store_bytes(server);
        if now != last.0 {
            last = (now, Instant::now());
        }
        std::future::ready((last.1.elapsed() >= settle).then_some(()))
    })
    .await;
}

async fn sources_dropped(server: &Server) -> serde_json::Value {
    let s = http::get(server.http_port, "/services/status").await.json();
    s["services"][0]["sources_dropped"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_idle_past_the_replay_buffer_keeps_its_source_across_a_crash() {
    let server = Server::start_with(fast()).await;
    let mut player = Player::start(true, 0).await;
    register(&server, "e", &player).await;
    // Batch 0 feeds the adapter context, which then receives nothing while the base context
    // gets every later batch.
    handshake(&server, &mut player, "e|default|0", adapter_store(1, "ad")).await;
    for p in 2..10 {
        player.publish(store(p, "GPU")).await;
    }
    deliver(&server, &mut player, "e|default|0").await;
    eventually("base prompts indexed", WAIT, || async {
        let a = answers(&server).await;
        (2..10).all(|p| a[p].0 == 8).then_some(())
    })
    .await;
    assert_eq!(adapter_hits(&server, "ad", 1).await, 8);
    // The publisher's buffer keeps its newest batches only: batch 0 is gone from it.
    player.truncate_replay(3);
    checkpointed(&server).await;
    let server = Server::start_in(server.into_dir(), fast()).await;
    player.publish(store(10, "GPU")).await;
    deliver(&server, &mut player, "e|default|0").await;
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

/// The `conductor_index_holders` gauge.
async fn holders(server: &Server) -> u64 {
    let text = http::get(server.http_port, "/metrics").await.text();
    text.lines()
        .find_map(|l| l.strip_prefix("conductor_index_holders "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no holder gauge in:\n{text}"))
}

/// Bytes of the store's files (RocksDB's own info log aside).
fn store_bytes(server: &Server) -> u64 {
    std::fs::read_dir(server.dir.path().join("data"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| !e.file_name().to_string_lossy().starts_with("LOG"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_of_instances_gone_are_reclaimed_and_an_idle_server_writes_nothing() {
    let server = Server::start_with(fast()).await;
    let mut keep = Player::start(true, 0).await;
    register(&server, "e", &keep).await;
    handshake(&server, &mut keep, "e|default|0", store(1, "GPU")).await;
    // Instances registered, fed and unregistered in turn, each with a fresh id.
    for i in 0..4 {
        let name = format!("c{i}");
        let mut player = Player::start(true, 0).await;
        register(&server, &name, &player).await;
        handshake(
            &server,
            &mut player,
            &format!("{name}|default|0"),
            store(2, "GPU"),
        )
        .await;
        eventually("the instance's blocks are indexed", WAIT, || async {
            let r = grpc_query(&server, MODEL, prompt(2), BS as i64).await;
            (r.hits.get(&name).map(|h| h.device) == Some(8)).then_some(())
        })
        .await;
        server.unregister_ok(&name).await;
    }
    assert_eq!(
        holders(&server).await,
        1,
        "only the registered instance's holder is left"
    );
    checkpointed(&server).await;
    let before = store_bytes(&server);
    // Not synchronisation: the window in which idle rounds must write nothing.
    tokio::time::sleep(Duration::from_millis(20 * FAST)).await;
    assert_eq!(
        store_bytes(&server),
        before,
        "idle checkpoints write nothing"
    );
    // A crash changes neither an answer nor the holders.
    let answered = answers(&server).await;
    assert_eq!(answered[1].0, 8);
    let server = Server::start_in(server.into_dir(), fast()).await;
    assert_eq!(answers(&server).await, answered);
    assert_eq!(holders(&server).await, 1);
    let r = grpc_query(&server, MODEL, prompt(2), BS as i64).await;
    assert_eq!(
        r.hits.keys().collect::<Vec<_>>(),
        ["e"],
        "gone instances stay gone"
    );
}
