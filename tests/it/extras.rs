//! vLLM events that leave their extras out (`extra_keys` absent or `nil`, which vLLM's schema
//! allows): the event does not prove that nothing but the tokens entered the hash, so the blocks
//! of a salted (or adapter + salted) request are kept under their published hashes and found
//! through the registered profile with the query's salt, never under a key that assumes no salt.

use mooncake_conductor::gateway::pb;
use rmpv::Value;
use serde_json::json;

use crate::support::deliver::handshake;
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::player::Player;
use crate::support::server::Server;
use crate::support::{WAIT, eventually};

const BLOCK: u32 = 4;

/// Device tokens `instance` answers for `tokens` with this adapter and salt ("" = none).
async fn device(server: &Server, instance: &str, tokens: &[i32], lora: &str, salt: &str) -> i64 {
    let request = pb::QueryRequest {
        model_name: "m".into(),
        lora_name: lora.into(),
        block_size: i64::from(BLOCK),
        token_ids: tokens.to_vec(),
        cache_salt: salt.into(),
        ..Default::default()
    };
    let r = server
        .grpc()
        .await
        .query(request)
        .await
        .expect("gRPC query")
        .into_inner();
    r.hits.get(instance).map_or(-1, |h| h.device)
}

/// The two `BlockStored` events of a 4-block prompt hashed with `lora` and `salt`: blocks 0-1
/// without an `extra_keys` key, blocks 2-3 (continuing from block 1) with `extra_keys: nil`.
fn stored_without_extras(tokens: &[i32], lora: &str, salt: &str) -> Vec<Value> {
    let keys = engine::salted_block_keys(&vllm_cbor_profile(), tokens, BLOCK, lora, salt);
    assert_eq!(keys.len(), 4);
    let lora = (!lora.is_empty()).then_some(lora);
    let first = engine::vllm_stored(&keys[..2], None, &tokens[..8], BLOCK, "GPU", lora);
    let second = engine::vllm_stored(&keys[2..], Some(keys[1]), &tokens[8..], BLOCK, "GPU", lora);
    let second = match engine::without(second, "extra_keys") {
        Value::Map(mut pairs) => {
            pairs.push((Value::from("extra_keys"), Value::Nil));
            Value::Map(pairs)
        }
        other => other,
    };
    vec![engine::without(first, "extra_keys"), second]
}

async fn start(instance: &str) -> (Server, Player, String) {
    let server = Server::start().await;
    let player = Player::start(false, 0).await;
    let registration = Registration::vllm(instance, &player.endpoint)
        .block_size(BLOCK)
        .json();
    server.register_ok(&registration).await;
    (server, player, format!("{instance}|default|0"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn salted_blocks_without_extra_keys_answer_only_their_salt() {
    let (server, mut player, service) = start("v").await;
    let tokens: Vec<i32> = (100..116).collect();
    let events = stored_without_extras(&tokens, "", "s1");
    handshake(&server, &mut player, &service, engine::batch(events, 0)).await;

    eventually("the salted query hits", WAIT, || async {
        (device(&server, "v", &tokens, "", "s1").await == 16).then_some(())
    })
    .await;
    assert_eq!(device(&server, "v", &tokens, "", "").await, 0, "no salt");
    assert_eq!(
        device(&server, "v", &tokens, "", "s2").await,
        0,
        "another salt"
    );
    let status = server.service_status(&service).await;
    assert_eq!(status["blocks_kept_as_published"], json!(4), "{status}");

    // A plain request without extra_keys: the registered profile proves it unsalted, so its
    // blocks are keyed as usual and nothing more is kept as published.
    let plain: Vec<i32> = (500..516).collect();
    let plain_events = stored_without_extras(&plain, "", "");
    player.publish(engine::batch(plain_events, 0)).await;
    eventually("the plain query hits", WAIT, || async {
        (device(&server, "v", &plain, "", "").await == 16).then_some(())
    })
    .await;
    assert_eq!(device(&server, "v", &plain, "", "s1").await, 0, "a salt");
    let status = server.service_status(&service).await;
    assert_eq!(status["blocks_kept_as_published"], json!(4), "{status}");
    assert_eq!(status["hash_check"], json!("ok"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_and_salt_blocks_without_extra_keys_answer_only_that_adapter_and_salt() {
    let (server, mut player, service) = start("v").await;
    let tokens: Vec<i32> = (200..216).collect();
    let events = stored_without_extras(&tokens, "ad", "s1");
    handshake(&server, &mut player, &service, engine::batch(events, 0)).await;

    eventually("the adapter's salted query hits", WAIT, || async {
        (device(&server, "v", &tokens, "ad", "s1").await == 16).then_some(())
    })
    .await;
    assert_eq!(device(&server, "v", &tokens, "ad", "").await, 0, "no salt");
    assert_eq!(
        device(&server, "v", &tokens, "ad", "s2").await,
        0,
        "another salt"
    );
    // The base model never had these blocks.
    assert_eq!(
        device(&server, "v", &tokens, "", "s1").await,
        0,
        "base model"
    );
    let status = server.service_status(&service).await;
    assert_eq!(status["blocks_kept_as_published"], json!(4), "{status}");
}
