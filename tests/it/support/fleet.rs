//! A registered vLLM publisher and its prompts: instance `e`'s model [`MODEL`] at block size
//! [`BS`], and the [`PROMPTS`] two-block prompts the ingest, durability, convergence and crash
//! tests store, remove and query.

use super::engine::{self, Registration, vllm_cbor_profile};
use super::player::Player;
use super::server::Server;

pub const MODEL: &str = "m";
pub const BS: u32 = 4;
/// The prompts [`random_batch`] draws from.
pub const PROMPTS: i32 = 16;

/// splitmix64 for seeded rounds.
pub use mooncake_conductor::test_rng::splitmix64 as next;

/// Register `player` as vLLM instance `instance`, rank 0, of model [`MODEL`] (block size [`BS`]),
/// with its replay endpoint if it has one.
pub async fn register(server: &Server, instance: &str, player: &Player) {
    let r = Registration::vllm(instance, &player.endpoint)
        .replay(player.replay_endpoint.as_deref())
        .model(MODEL)
        .block_size(BS)
        .json();
    server.register_ok(&r).await;
}

/// Prompt `p` of 8 tokens: two blocks, distinct per `p`.
pub fn prompt(p: i32) -> Vec<i32> {
    (0..8).map(|i| p * 100 + i).collect()
}

/// Both blocks of prompt `p` stored on `medium`.
pub fn store(p: i32, medium: &str) -> Vec<u8> {
    engine::vllm_store_prompt(&vllm_cbor_profile(), &prompt(p), BS, medium, 0)
}

/// Block `block` of prompt `p` removed from `medium`.
pub fn remove(p: i32, block: usize, medium: &str) -> Vec<u8> {
    let keys = engine::block_keys(&vllm_cbor_profile(), &prompt(p), BS, "");
    engine::batch(
        vec![engine::vllm_removed(&keys[block..block + 1], medium)],
        0,
    )
}

/// Both blocks of prompt `p` stored on the GPU in the context of adapter `lora`.
pub fn adapter_store(p: i32, lora: &str) -> Vec<u8> {
    let keys = engine::block_keys(&vllm_cbor_profile(), &prompt(p), BS, lora);
    engine::batch(
        vec![engine::vllm_stored(
            &keys,
            None,
            &prompt(p),
            BS,
            "GPU",
            Some(lora),
        )],
        0,
    )
}

/// A seeded store or removal of one of the prompts, on a random medium.
pub fn random_batch(rng: &mut u64) -> Vec<u8> {
    let p = (next(rng) % PROMPTS as u64) as i32;
    let medium = ["GPU", "CPU", "DISK"][(next(rng) % 3) as usize];
    if next(rng).is_multiple_of(3) {
        remove(p, (next(rng) % 2) as usize, medium)
    } else {
        store(p, medium)
    }
}
