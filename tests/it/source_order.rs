//! An engine's blocks and the Mooncake store's objects under the same hashes give the same global
//! view and the same answers whichever source the Conductor hears first, and across a restart
//! between the two (`src/index/README.md`, "Order of sources").

use serde_json::{Value, json};

use crate::support::deliver::handshake;
use crate::support::engine::{self, Registration};
use crate::support::player::Player;
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http};

const MODEL: &str = "order";
const BS: u32 = 4;

fn prompt() -> Vec<i32> {
    (1..=16).map(|t| t * 3).collect()
}

/// Hashes the registered profile does not reproduce, as vLLM publishes with `PYTHONHASHSEED`
/// unset: only the engine's events tie them to the prompt's tokens.
fn hashes() -> Vec<u64> {
    (0..4).map(|i| 0x00ab_cdef_0000_0000 + i).collect()
}

/// The engine stores the four blocks on its GPU and evicts the last two.
fn engine_events() -> Vec<u8> {
    let h = hashes();
    engine::batch(
        vec![
            engine::vllm_stored(&h, None, &prompt(), BS, "GPU", None),
            engine::vllm_removed(&h[2..], "GPU"),
        ],
        0,
    )
}

/// The store holds all four in its CPU pool.
fn store_events() -> Vec<u8> {
    let events = hashes()
        .iter()
        .enumerate()
        .map(|(i, &h)| {
            engine::mooncake_event(
                "stored",
                MODEL,
                BS,
                "backend-a",
                &format!("obj-{i}"),
                "cpu",
                h,
            )
        })
        .collect();
    engine::mooncake_batch(events)
}

async fn prefix_count(server: &Server) -> Option<u64> {
    let view = http::get(server.http_port, "/global_view").await.json();
    view["contexts"]
        .as_array()?
        .iter()
        .find(|c| c["model_name"] == MODEL)?["prefix_count"]
        .as_u64()
}

async fn query(server: &Server) -> Value {
    let body = json!({"model": MODEL, "block_size": BS, "token_ids": prompt()});
    http::post_json(server.http_port, "/query", &body)
        .await
        .json()
}

/// The instance's counts in an answer: (device, cpu_share).
fn counts(answer: &Value) -> (u64, u64) {
    let v = &answer["instances"]["v"];
    (
        v["device"].as_u64().unwrap_or(0),
        v["cpu_share"].as_u64().unwrap_or(0),
    )
}

/// Both sources' events, the engine's or the store's first (the second sent once the first is
/// visible), with a restart in between when asked; the global view's count and the answer.
async fn run(engine_first: bool, restart: bool) -> (Option<u64>, Value) {
    let mut server = Server::start().await;
    let mut vllm = Player::start(true, 0).await;
    let mut store = Player::start(true, 1).await;
    for (instance, player, kind) in [("v", &vllm, "vLLM"), ("store", &store, "Mooncake")] {
        let registration = Registration::new(kind, instance, &player.endpoint)
            .replay(player.replay_endpoint.as_deref())
            .model(MODEL)
            .block_size(BS)
            .json();
        server.register_ok(&registration).await;
    }
    // What the first source alone leaves: the engine's two blocks, or the store's four.
    if engine_first {
        handshake(&server, &mut vllm, "v|default|0", engine_events()).await;
    } else {
        handshake(&server, &mut store, "store|default|0", store_events()).await;
    }
    let alone = if engine_first { 2 } else { 4 };
    eventually("the first source indexed", WAIT, || async {
        (prefix_count(&server).await == Some(alone)).then_some(())
    })
    .await;
    if restart {
        assert_eq!(server.terminate(), Some(0));
        server = Server::start_in(server.into_dir(), json!({})).await;
        assert_eq!(prefix_count(&server).await, Some(alone), "recovered");
    }
    // The second source's events are applied once their own effect shows: the engine's device
    // blocks, or the store's objects beyond them.
    if engine_first {
        handshake(&server, &mut store, "store|default|0", store_events()).await;
    } else {
        handshake(&server, &mut vllm, "v|default|0", engine_events()).await;
    }
    let applied = |answer: &Value| {
        let (device, cpu_share) = counts(answer);
        device == 8 && (!engine_first || cpu_share > 8)
    };
    let answer = eventually("the second source indexed", WAIT, || async {
        let answer = query(&server).await;
        applied(&answer).then_some(answer)
    })
    .await;
    let view = prefix_count(&server).await;
    let _ = server.terminate();
    (view, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_objects_and_engine_blocks_meet_whichever_arrives_first() {
    let want = json!({"instances": {"v": {
        "longest_matched": 16, "dp": {"0": 8},
        "rank_matches": {"0": {"device": 8, "cpu_local": 8, "cpu_share": 16, "disk": 16}},
        "device": 8, "cpu_local": 8, "cpu_share": 16, "disk": 16,
    }}});
    let engine_first = run(true, false).await;
    assert_eq!(
        engine_first,
        (Some(4), want),
        "four blocks, two of them on the GPU"
    );
    assert_eq!(run(false, false).await, engine_first, "the store first");
    assert_eq!(
        run(false, true).await,
        engine_first,
        "the store first, a restart, then the engine"
    );
}
