//! [`ContextSnapshot`]: one context's whole content as replayable input.

use std::collections::HashMap;

use crate::events::{IndexBatch, IndexOp};
use crate::hashing::HashProfile;
use crate::model::{BlockHash, ContextKey, SubscriptionKey, Tier};

use crate::index::table::{entry_bits, entry_id, tier_bit};
use crate::index::write::context::ContextIndex;

/// Replayable content of one context: every (source, instance, rank) listing, one batch per
/// source that stores each of its holders' blocks (a repeated announcement as the same store
/// made again), and the aliases. Restoring it into a fresh index reproduces every answer and
/// every count (used for dumps and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextSnapshot {
    pub key: ContextKey,
    pub profile: HashProfile,
    /// What the context's derived keys are made with.
    pub tuning: crate::hashing::derived::ChainTuning,
    /// (source, instance, rank) listings, sorted.
    pub attachments: Vec<crate::index::Attachment>,
    /// One batch of Store ops per source, sorted by source (keys as the table holds them).
    pub batches: Vec<IndexBatch>,
    /// (engine hash, derived key), sorted by hash.
    pub aliases: Vec<(u64, u64)>,
}

impl ContextSnapshot {
    /// The whole of `index` as replayable input.
    pub fn of(index: &ContextIndex) -> ContextSnapshot {
        let ix = index;
        let attachments = ix.attachments();
        let mut per_holder: Vec<[Vec<BlockHash>; 4]> =
            (0..ix.holders.len()).map(|_| Default::default()).collect();
        for shard in ix.shared.table.shards() {
            shard.for_each(|key, e| {
                if let Some(slots) = per_holder.get_mut(entry_id(e) as usize) {
                    for tier in Tier::ALL {
                        if entry_bits(e) & tier_bit(tier) != 0 {
                            slots[tier.index()].push(BlockHash(key));
                        }
                    }
                }
            });
        }
        let mut batches: HashMap<SubscriptionKey, Vec<IndexOp>> = HashMap::new();
        for (state, mut tiers) in ix.holders.iter().zip(per_holder) {
            tiers.iter_mut().for_each(|hashes| hashes.sort_unstable());
            // A KV-cache group's kind comes before its blocks, as a publisher's stores say it.
            if state.kind != crate::model::GroupKind::Full && !state.vacant {
                let op = IndexOp::GroupKind {
                    holder: state.key.holder.clone(),
                    kind: state.kind,
                };
                batches
                    .entry(state.key.source.clone())
                    .or_default()
                    .push(op);
            }
            // Repeated announcements replay as the same store made again, after the first.
            let mut repeats: Vec<(u8, u64, u32)> = state
                .repeats
                .iter()
                .map(|(&(key, bit), &n)| (bit, key, n))
                .collect();
            repeats.sort_unstable();
            for (bit, key, n) in repeats {
                if let Some(tier) = Tier::ALL.into_iter().find(|&t| tier_bit(t) == bit) {
                    tiers[tier.index()].extend(std::iter::repeat_n(BlockHash(key), n as usize));
                }
            }
            for (tier, hashes) in Tier::ALL.into_iter().zip(tiers) {
                if hashes.is_empty() {
                    continue;
                }
                let op = IndexOp::Store {
                    holder: state.key.holder.clone(),
                    tier,
                    hashes,
                };
                batches
                    .entry(state.key.source.clone())
                    .or_default()
                    .push(op);
            }
        }
        let mut batches: Vec<IndexBatch> = batches
            .into_iter()
            .map(|(source, ops)| IndexBatch { source, ops })
            .collect();
        batches.sort_by(|a, b| a.source.cmp(&b.source));
        ContextSnapshot {
            tuning: ix.shared.tuning,
            key: ix.key().clone(),
            profile: ix.profile().clone(),
            attachments,
            batches,
            aliases: ix.shared.aliases.all(),
        }
    }

    /// Rebuild an index from a snapshot.
    pub fn restore(&self) -> ContextIndex {
        let mut index = ContextIndex::tuned(self.key.clone(), self.profile.clone(), self.tuning);
        for a in &self.attachments {
            index.attach_rank(&a.source, &a.instance_id, a.dp_rank);
        }
        for batch in &self.batches {
            index.apply(batch);
        }
        let pairs = self.aliases.iter().copied();
        index.shared.aliases.insert(pairs, &mut index.alias_dirty);
        index
    }
}
