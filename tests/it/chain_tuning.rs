//! A store records the chain tuning its derived keys were made with (migration 8): a data
//! directory written by a binary under another tuning than this one's default restarts with
//! every block answered exactly, and a replica that bootstraps from it takes its tuning with the
//! snapshot. The other tuning comes from the test builds' `CONDUCTOR_TEST_CHAIN_TUNING` hook,
//! read only when a new store is created.

use serde_json::json;

use crate::support::deliver::handshake;
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::fleet::{BS, MODEL};
use crate::support::player::Player;
use crate::support::query::device_hits;
use crate::support::server::Server;
use crate::support::{WAIT, eventually};

const SERVICE: &str = "t|default|0";

/// A prompt of `blocks` blocks, stored in one engine message.
fn long_prompt(blocks: i32) -> Vec<i32> {
    (0..blocks * BS as i32).map(|t| 5000 + t).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_written_under_another_tuning_restarts_and_bootstraps_exactly() {
    let a = Server::start_with_env(
        json!({"snapshot_export": "open"}),
        &[("CONDUCTOR_TEST_CHAIN_TUNING", "3,2")],
    )
    .await;
    // No replay socket: after a restart, what the index answers is what the store kept, never a
    // replay of the publisher's buffer under the new binary's keys.
    let mut player = Player::start(false, 0).await;
    // Registered with another hash seed than the engine's: the index keys the blocks by the keys
    // it derives from the tokens (which the tuning shapes), not by the published hashes.
    let mut profile = vllm_cbor_profile();
    profile["python_hash_seed"] = json!("7");
    let registration = Registration::vllm("t", &player.endpoint)
        .model(MODEL)
        .block_size(BS)
        .profile(profile)
        .json();
    a.register_ok(&registration).await;
    let tokens = long_prompt(40);
    let batch = engine::vllm_store_prompt(&vllm_cbor_profile(), &tokens, BS, "GPU", 0);
    handshake(&a, &mut player, SERVICE, batch).await;
    let full = tokens.len() as i64;
    assert!(a.log().contains("chain_tuning=3,2"), "{}", a.log());
    assert_eq!(device_hits(&a, "t", &tokens).await, full);

    // The same data directory under this binary's default tuning.
    let mut a = a;
    assert_eq!(a.terminate(), Some(0), "{}", a.log());
    let a = Server::start_in(a.into_dir(), json!({"snapshot_export": "open"})).await;
    assert!(a.log().contains("chain_tuning=3,2"), "{}", a.log());
    assert_eq!(device_hits(&a, "t", &tokens).await, full, "{}", a.log());

    // A new replica takes the peer's tuning with its snapshot. It reports ready once its
    // subscription is live, which takes a message: the test waits for the bootstrap itself.
    let b = Server::spawn_in(
        tempfile::tempdir().expect("temp dir"),
        json!({
            "bootstrap_from": format!("http://127.0.0.1:{}", a.rpc_port),
            "bootstrap_attempts": 1,
        }),
    );
    eventually("the replica bootstraps", WAIT, || async {
        b.log()
            .contains("bootstrapped from a peer's snapshot")
            .then_some(())
    })
    .await;
    eventually("the replica answers from the snapshot", WAIT, || async {
        (device_hits(&b, "t", &tokens).await == full).then_some(())
    })
    .await;
    // New blocks on the replica are keyed as the peer's were: a longer prompt extends the chain.
    let longer = long_prompt(48);
    let batch = engine::vllm_store_prompt(&vllm_cbor_profile(), &longer, BS, "GPU", 0);
    let mut player = player;
    crate::support::deliver::publish_to_all(&[&a, &b], &mut player, SERVICE, batch).await;
    assert_eq!(device_hits(&b, "t", &longer).await, longer.len() as i64);
    assert_eq!(device_hits(&a, "t", &longer).await, longer.len() as i64);
}
