//! A context's whole durable state at one instant, for a peer replica to start from.
//!
//! [`ContextIndex::export_changes`] describes everything the context holds as the first
//! checkpoint of a context new to its store would (`full` and `fresh`), so the checkpoint's own
//! encoding (`durability::checkpoint::context_ops`) turns it into store records. It reads only:
//! the context's own checkpoints go on as if nothing happened. The pairs and the watermarks come
//! from the same call on the context's single writer, so each watermark is paired with exactly
//! the state it describes.

use super::image::{ContextChanges, HolderRecord};
use super::records::PairBits;
use crate::index::table::{entry_bits, entry_id};
use crate::index::write::context::ContextIndex;

impl ContextIndex {
    /// Every holder, pair, repeat count, listing, watermark and alias, as a full checkpoint of
    /// a context its store does not hold yet.
    pub fn export_changes(&self) -> ContextChanges {
        let mut holders = Vec::new();
        for (id, state) in self.holders.iter().enumerate() {
            if !state.vacant {
                holders.push(HolderRecord {
                    id: id as u32,
                    source: state.key.source.clone(),
                    holder: state.key.holder.clone(),
                    raw_pairs: Some(state.raw_live),
                    kind: state.kind,
                });
            }
        }
        // One pass over the table in its own order, then one sort: looking each of a holder's
        // blocks up in turn would be a cache miss per pair on a large context.
        let live = |id: u32| self.holders.get(id as usize).is_some_and(|h| !h.vacant);
        let mut pairs: Vec<PairBits> = Vec::new();
        for shard in self.shared.table.shards() {
            shard.for_each(|key, e| {
                let (id, bits) = (entry_id(e), entry_bits(e));
                if bits != 0 && live(id) {
                    pairs.push(PairBits {
                        holder: id,
                        block: key,
                        bits,
                    });
                }
            });
        }
        pairs.sort_unstable();
        let mut repeats = Vec::new();
        for &PairBits {
            holder: id,
            block,
            bits,
        } in &pairs
        {
            let state = &self.holders[id as usize];
            if state.repeats.is_empty() {
                continue;
            }
            for tier in crate::model::Tier::ALL {
                let bit = crate::index::table::tier_bit(tier);
                if let Some(&n) = state.repeats.get(&(block, bit)).filter(|_| bits & bit != 0) {
                    repeats.push((id, block, bit, n));
                }
            }
        }
        let mut watermarks: Vec<_> = self
            .watermarks
            .iter()
            .map(|(s, w)| (s.clone(), Some(*w)))
            .collect();
        watermarks.sort_by(|a, b| a.0.cmp(&b.0));
        let aliases = self
            .shared
            .aliases
            .all()
            .into_iter()
            .map(|(hash, key)| (hash, Some(key)))
            .collect();
        ContextChanges {
            key: self.key().clone(),
            profile: self.profile().clone(),
            full: true,
            holders,
            holders_gone: Vec::new(),
            pairs,
            repeats,
            attachments: Some(self.attachments()),
            watermarks,
            aliases,
            fresh: true,
        }
    }
}
