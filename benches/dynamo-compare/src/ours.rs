//! Everything that touches mooncake-conductor's API, in one place: how the workload's blocks get
//! our 64-bit keys, how engine events become index ops, and how a query is asked and read back.
//!
//! Keys today come from the registered hash profile (`vllm_v1`, `sha256_cbor`, the low 64 bits
//! of each chained digest), exactly as an engine with that profile publishes them and as a query
//! from raw tokens recomputes them. Switching the index to another key (a derived key from token
//! ids, stores carrying token ids and the parent hash) changes only this file: [`Ours::prompt`],
//! [`Ours::batch`] and [`Ours::query_tokens`].

use mooncake_conductor::events::{Holder, IndexBatch, IndexOp};
use mooncake_conductor::hashing::chain::BlockHasher;
use mooncake_conductor::hashing::{HashProfile, PrefixKeys};
use mooncake_conductor::index::{ContextIndex, HashList, IndexReader, QueryHits};
use mooncake_conductor::model::{BlockHash, ContextKey, SubscriptionKey, Tier};

use crate::workload::{BLOCK_SIZE, Event, HOLDERS, PublisherBatch, instance_of, rank_of};

/// One prompt's block keys, computed once from its tokens.
pub struct PromptKeys(Vec<BlockHash>);

/// A query's keys computed ahead of time (the "by precomputed keys" figures).
pub struct QueryKeys(HashList);

/// One publisher batch as our index takes it.
pub struct Batch(IndexBatch);

pub struct Ours {
    index: ContextIndex,
    reader: IndexReader,
    hasher: BlockHasher,
    /// Per holder: the subscription that reports it and the holder it names.
    holders: Vec<(SubscriptionKey, Holder)>,
}

fn instance_id(instance: usize) -> String {
    format!("inst-{instance}")
}

impl Ours {
    pub fn new() -> Self {
        let profile = HashProfile::resolve(
            Some("vllm_v1"),
            Some("sha256_cbor"),
            Some("0"),
            Some("low64_be"),
        )
        .expect("the vllm_v1 / sha256_cbor profile is valid");
        let hasher = profile.hasher("", "");
        let mut index = ContextIndex::new(
            ContextKey::new("", "bench-model", "", BLOCK_SIZE as u32),
            profile,
        );
        let holders: Vec<(SubscriptionKey, Holder)> = (0..HOLDERS)
            .map(|h| {
                let id = instance_id(instance_of(h));
                let rank = rank_of(h) as u32;
                (
                    SubscriptionKey::new(&id, "", rank),
                    Holder::Engine {
                        instance_id: id,
                        dp_rank: rank,
                    },
                )
            })
            .collect();
        // The registrations: every rank is listed (and answered, with zeros) from the start.
        for (source, holder) in &holders {
            if let Holder::Engine {
                instance_id,
                dp_rank,
            } = holder
            {
                index.attach_rank(source, instance_id, *dp_rank);
            }
        }
        let reader = index.reader();
        Ours {
            index,
            reader,
            hasher,
            holders,
        }
    }

    fn keys_of(&self, tokens: &[u32]) -> Vec<BlockHash> {
        let mut chain = self.hasher.chain(BLOCK_SIZE as u32, tokens);
        (0..chain.num_blocks()).map(|i| chain.key(i)).collect()
    }

    /// The keys an engine publishes for this prompt's blocks.
    pub fn prompt(&self, tokens: &[u32]) -> PromptKeys {
        PromptKeys(self.keys_of(tokens))
    }

    pub fn query_keys(&self, tokens: &[u32]) -> QueryKeys {
        QueryKeys(HashList {
            hashes: self.keys_of(tokens),
            block_size: BLOCK_SIZE as u32,
        })
    }

    /// One engine message: one Store or Remove op per event, on the device tier. Today's ops
    /// carry keys only, so the parent link and the token ids are not needed.
    pub fn batch(&self, batch: &PublisherBatch, prompts: &[PromptKeys]) -> Batch {
        let (source, holder) = &self.holders[batch.holder];
        let ops = batch
            .events
            .iter()
            .map(|ev| match *ev {
                Event::Store { prompt, start, end } => IndexOp::Store {
                    holder: holder.clone(),
                    tier: Tier::Device,
                    hashes: prompts[prompt as usize].0[start as usize..end as usize].to_vec(),
                },
                Event::Remove { prompt, start, end } => IndexOp::Remove {
                    holder: holder.clone(),
                    tier: Tier::Device,
                    hashes: prompts[prompt as usize].0[start as usize..end as usize].to_vec(),
                },
            })
            .collect();
        Batch(IndexBatch {
            source: source.clone(),
            ops,
        })
    }

    pub fn apply(&mut self, batch: &Batch) {
        self.index.apply(&batch.0);
    }

    /// (block, holder) pairs the index holds.
    pub fn pairs(&self) -> u64 {
        self.index.stats().holder_blocks
    }

    pub fn query(&self, keys: &mut QueryKeys) -> QueryHits {
        self.reader.query(&mut keys.0, None)
    }

    /// The whole query from raw token ids: keys are computed (lazily, as the walk asks for them)
    /// inside the call.
    pub fn query_tokens(&self, tokens: &[u32]) -> QueryHits {
        let mut chain = self.hasher.chain(BLOCK_SIZE as u32, tokens);
        self.reader.query(&mut chain, None)
    }
}

/// Matched device blocks per holder, from an answer.
pub fn overlap(hits: &QueryHits) -> Vec<u32> {
    let mut out = vec![0u32; HOLDERS];
    for (h, slot) in out.iter_mut().enumerate() {
        let tokens = hits
            .hits
            .get(&instance_id(instance_of(h)))
            .and_then(|row| row.rank_matches.get(&(rank_of(h) as u32)))
            .map_or(0, |c| c.device);
        *slot = (tokens / BLOCK_SIZE as u64) as u32;
    }
    out
}

/// Device tokens of one holder in an answer (for the single-holder long query).
pub fn device_tokens(hits: &QueryHits, holder: usize) -> u64 {
    hits.hits
        .get(&instance_id(instance_of(holder)))
        .and_then(|row| row.rank_matches.get(&(rank_of(holder) as u32)))
        .map_or(0, |c| c.device)
}
