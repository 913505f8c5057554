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
        hybrid_parts: Vec::new(),
        hash_profile: profile(),
    }
}

/// Pseudo-random block hash number `i` (splitmix64 of a counter).
pub fn block(i: u64) -> BlockHash {
    BlockHash(Rng(i).next())
}

/// Checkpoint rounds of one context as the service writes them (`durability::checkpoint`): the
/// context's changes and, in the same atomic write, the record of every registered source
/// whose position moved.
#[allow(dead_code)]
pub struct Rounds {
    state: mooncake_conductor::durability::checkpoint::CheckpointState,
    incarnations: std::collections::HashMap<mooncake_conductor::model::SubscriptionKey, u64>,
}

#[allow(dead_code)]
impl Rounds {
    pub fn new() -> Self {
        Rounds {
            state: Default::default(),
            incarnations: Default::default(),
        }
    }

    /// Register `config` on `store` (a new incarnation).
    pub fn register(
        &mut self,
        store: &dyn mooncake_conductor::storage::KvStore,
        config: &PublisherConfig,
    ) {
        let incarnation = mooncake_conductor::durability::sources::put_registration(store, config)
            .expect("registration");
        self.incarnations
            .insert(config.subscription_key(), incarnation);
    }

    pub fn unregister(
        &mut self,
        store: &dyn mooncake_conductor::storage::KvStore,
        key: &mooncake_conductor::model::SubscriptionKey,
    ) -> Result<(), String> {
        self.incarnations.remove(key);
        mooncake_conductor::durability::sources::delete_registration(store, key)
            .map_err(|e| e.to_string())
    }

    /// One round of `changes`, taken from `index`; the pairs it wrote.
    pub fn round(
        &mut self,
        changes: mooncake_conductor::index::ContextChanges,
        index: &mooncake_conductor::index::ContextIndex,
        store: &dyn mooncake_conductor::storage::KvStore,
    ) -> usize {
        use mooncake_conductor::durability::checkpoint::Round;
        use mooncake_conductor::subscription::marks::SourcePosition;
        let began: Vec<_> = self
            .incarnations
            .iter()
            .map(|(key, &incarnation)| {
                let position = SourcePosition {
                    incarnation,
                    generation: 0,
                    mark: index.watermark(key),
                };
                (key.clone(), position)
            })
            .collect();
        let ended = began
            .iter()
            .map(|(key, p)| (key.clone(), (p.incarnation, p.generation)))
            .collect();
        let mut round = Round::default();
        self.state.add_context(changes, &mut round);
        self.state.add_sources(&began, &ended, true, &mut round);
        let (round, retries) = self.state.commit(store, round);
        assert!(retries.is_empty(), "checkpoint write failed");
        round.report.pairs
    }
}
