//! A window-first hybrid model (Gemma-like: group 0 a sliding window, group 1 full attention)
//! through the real binary: its groups are indexed apart, answered with the engine's rule over
//! both, and carried exactly across a graceful restart and across a crash that the publisher's
//! replay makes good.

use mooncake_conductor::gateway::pb;
use serde_json::json;

use crate::support::deliver::{deliver, handshake};
use crate::support::engine::{self, vllm_cbor_profile};
use crate::support::fleet::{BS, MODEL, register};
use crate::support::player::Player;
use crate::support::query::grpc_query;
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http};

/// A window of 5 tokens: a boundary needs the one block before it in the window group.
const WINDOW: u32 = 5;
const PROMPTS: i32 = 6;

fn prompt(p: i32) -> Vec<i32> {
    (0..8).map(|i| p * 100 + i).collect()
}

/// `prompt(p)` with its second block changed: only the first block is shared.
fn diverging(p: i32) -> Vec<i32> {
    let mut tokens = prompt(p);
    tokens[4..].iter_mut().for_each(|t| *t += 50);
    tokens
}

/// Prompt `p` stored by both groups; the window group keeps its last block only.
fn store(p: i32) -> Vec<u8> {
    engine::vllm_store_prompt_window_first(&vllm_cbor_profile(), &prompt(p), BS, WINDOW, 1)
}

/// Block `block` of prompt `p` evicted from KV-cache group `group`.
fn remove(p: i32, block: usize, group: u32) -> Vec<u8> {
    let keys = engine::block_keys(&vllm_cbor_profile(), &prompt(p), BS, "");
    let event = engine::vllm_removed(&keys[block..block + 1], "GPU");
    let event = engine::with_field(event, "group_idx", group.into());
    engine::batch(vec![event], 0)
}

async fn device(server: &Server, tokens: Vec<i32>) -> i64 {
    let r: pb::QueryResponse = grpc_query(server, MODEL, tokens, BS as i64).await;
    r.hits.get("e").map_or(-1, |h| h.device)
}

/// Per prompt: (whole prompt, diverging after its first block).
async fn answers(server: &Server) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for p in 0..PROMPTS {
        out.push((
            device(server, prompt(p)).await,
            device(server, diverging(p)).await,
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_first_model_is_exact_and_survives_a_restart_and_a_crash() {
    let mut server = Server::start().await;
    let mut player = Player::start(true, 0).await;
    register(&server, "e", &player).await;
    handshake(&server, &mut player, "e|default|0", store(0)).await;
    for p in 1..PROMPTS {
        player.publish(store(p)).await;
    }
    deliver(&server, &mut player, "e|default|0").await;
    // Full attention alone would reuse the shared first block of a diverging prompt (4 tokens);
    // the window group does not hold it, so the engine reuses nothing.
    let expected: Vec<(i64, i64)> = (0..PROMPTS).map(|_| (8, 0)).collect();
    eventually("every prompt indexed", WAIT, || async {
        (answers(&server).await == expected).then_some(())
    })
    .await;
    // The window group loses prompt 1's last block: no boundary has its window any more.
    player.publish(remove(1, 1, 0)).await;
    deliver(&server, &mut player, "e|default|0").await;
    eventually("the window block's removal applied", WAIT, || async {
        (answers(&server).await[1] == (0, 0)).then_some(())
    })
    .await;
    let before = answers(&server).await;
    let status = http::post_json(
        server.http_port,
        "/query",
        &json!({"model": MODEL, "block_size": BS, "token_ids": prompt(2), "include_status": true}),
    )
    .await
    .json();
    let rank = &status["status"]["e"]["ranks"]["0"];
    assert_eq!(rank["status"], "exact", "{status}");
    assert_eq!(
        rank["groups"],
        json!([{"group": 1, "kind": "full_attention", "sliding_window": null},
               {"group": 0, "kind": "sliding_window", "sliding_window": WINDOW}]),
        "{status}"
    );

    // A graceful restart: ready means recovered, groups and kinds included.
    assert_eq!(server.terminate(), Some(0));
    let mut server = Server::start_in(server.into_dir(), json!({})).await;
    assert_eq!(answers(&server).await, before, "ready means recovered");

    // A crash: what the last checkpoint missed comes back from the publisher's replay.
    player.publish(remove(2, 1, 0)).await;
    player.publish(store(1)).await;
    deliver(&server, &mut player, "e|default|0").await;
    let after: Vec<(i64, i64)> = (0..PROMPTS)
        .map(|p| if p == 2 { (0, 0) } else { (8, 0) })
        .collect();
    eventually("the removal and the store applied", WAIT, || async {
        (answers(&server).await == after).then_some(())
    })
    .await;
    server.kill();
    let server = Server::start_in(server.into_dir(), json!({})).await;
    eventually(
        "the replay brings the crash's losses back",
        WAIT,
        || async { (answers(&server).await == after).then_some(()) },
    )
    .await;
    let services = http::get(server.http_port, "/services/status").await.json();
    let groups = &services["cache_groups"][0]["groups"];
    assert_eq!(groups.as_array().map(Vec::len), Some(2), "{services}");
}
