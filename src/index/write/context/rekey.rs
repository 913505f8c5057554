//! Pairs kept under a published hash move to the derived key once an alias names that hash, so
//! that a block is keyed the same whichever source announced it first (see "Order of sources"
//! in `src/index/README.md`).

use std::sync::atomic::Ordering;

use crate::index::table::{ALL_TIERS, entry_bits, entry_id};
use crate::model::Tier;

use super::ContextIndex;

impl ContextIndex {
    /// Re-key the blocks named by the hashes whose alias appeared or moved since the last call in
    /// this batch (`alias_dirty[rekey_from..]`): every pair kept under such a hash moves to the
    /// key its alias names, with its tiers and announcement counts.
    ///
    /// Only a context that keeps pairs under published hashes looks (one table probe per new
    /// alias): otherwise no block can be keyed by a hash.
    pub(super) fn rekey_new_aliases(&mut self) {
        let from = std::mem::replace(&mut self.rekey_from, self.alias_dirty.len());
        if self.shared.raw_pairs.load(Ordering::Relaxed) == 0 {
            return;
        }
        let Some(fresh) = self.alias_dirty.get(from..) else {
            return;
        };
        let held: Vec<u64> = fresh
            .iter()
            .copied()
            .filter(|&h| self.shared.table.contains(h))
            .collect();
        if held.is_empty() {
            return;
        }
        let keys = self.shared.aliases.resolve(held.iter().copied());
        let mut entries = Vec::new();
        for (hash, key) in held.into_iter().zip(keys) {
            let Some(key) = key.filter(|&k| k != hash) else {
                continue;
            };
            entries.clear();
            // Empty when an earlier hash of this list was the same one, already moved.
            let shared = &self.shared;
            shared.table.read(hash).visit(hash, |e| entries.push(e));
            for &e in &entries {
                self.move_pair(entry_id(e), entry_bits(e), hash, key);
            }
        }
    }

    /// Move holder `id`'s pair from block `from` (a published hash) to block `to`: each tier
    /// with its announcements, added to what the holder already has there.
    fn move_pair(&mut self, id: u32, bits: u8, from: u64, to: u64) {
        let ContextIndex {
            shared,
            holders,
            dirty,
            ..
        } = self;
        let Some(state) = holders.get_mut(id as usize) else {
            return;
        };
        let table = &shared.table;
        let mut w = table.writer();
        // The holder's reference to `from` goes stale, as a removal's does, and is named in its
        // `gone` list; the holder's next removal compacts its list (`removal`).
        let (removed, at) = table.remove_at(&mut w, from, id, ALL_TIERS);
        dirty.push((id, from));
        let (mut blocks, mut pairs) = (0i64, 0i64);
        if removed.holder_gone {
            state.gone.push(at);
            pairs -= 1;
            state.live = state.live.saturating_sub(1);
            state.raw_live = state.raw_live.saturating_sub(1);
            shared.raw_pairs.fetch_sub(1, Ordering::Relaxed);
        }
        blocks -= i64::from(removed.block_gone);
        let at = table.locate(to);
        let shard = table.shard_at(at);
        for bit in Tier::ALL
            .map(crate::index::table::tier_bit)
            .into_iter()
            .filter(|&b| bits & b != 0)
        {
            let mut extra = state.repeats.remove(&(from, bit)).unwrap_or(0);
            table.add_each(
                &mut w,
                shard,
                &[at],
                |at| (at, id, bit),
                |_, added, r| {
                    match r {
                        Some(r) => {
                            state.blocks.push(r);
                            state.live += 1;
                            pairs += 1;
                        }
                        // Not new to the holder: not in its reverse list's unrecorded tail.
                        None => dirty.push((id, to)),
                    }
                    blocks += i64::from(added.new_block);
                    // The holder had this tier there already: its announcements add up.
                    extra += u32::from(added.repeat);
                },
            );
            if extra > 0 {
                *state.repeats.entry((to, bit)).or_default() += extra;
            }
        }
        drop(w);
        let add = |counter: &std::sync::atomic::AtomicU64, n: i64| {
            if n >= 0 {
                counter.fetch_add(n as u64, Ordering::Relaxed);
            } else {
                counter.fetch_sub(n.unsigned_abs(), Ordering::Relaxed);
            }
        };
        add(&shared.blocks, blocks);
        add(&shared.holder_blocks, pairs);
    }
}
