//! What several benchmarks build the same way: the profile they register, a registration, and
//! pseudo-random block hashes. Each bench target includes this file as its own module and uses
//! part of it.
#![allow(dead_code, unused_imports)] // each bench target uses only part of it

use mooncake_conductor::hashing::HashProfile;
use mooncake_conductor::model::{BlockHash, PublisherConfig, PublisherType};
pub use mooncake_conductor::test_rng::{Rng, mix64};

/// The profile the benchmarks register: vLLM's default recipe (`sha256_cbor`, seed "0").
pub fn profile() -> HashProfile {
    mooncake_conductor::hashing::profile::vllm_cbor_default()
}

/// A registration of `instance` on `endpoint` for `model`, block size 16, rank 0.
pub fn registration(
    instance: &str,
    endpoint: String,
    kind: PublisherType,
    model: &str,
) -> PublisherConfig {
    PublisherConfig {
        instance_id: instance.into(),
        endpoint,
        replay_endpoint: String::new(),
        publisher_type: kind,
        model_name: model.into(),
        lora_name: String::new(),
        tenant_id: "default".into(),
        block_size: 16,
        dp_rank: 0,
        cache_group: None,
        hash_profile: profile(),
    }
}

/// Pseudo-random block hash number `i` (splitmix64 of a counter).
pub fn block(i: u64) -> BlockHash {
    BlockHash(Rng(i).next())
}
