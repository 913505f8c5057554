//! Removals by published hash: which table key each names, and taking one announcement away.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use crate::model::BlockHash;

use super::ContextIndex;
use crate::index::table::Table;
use crate::index::write::refs::RefList;

/// Buffers of [`ContextIndex::removal_keys`]: the aliases found, and the keys to remove.
pub(super) type RemovalScratch = (Vec<Option<u64>>, Vec<(u64, bool)>);

impl ContextIndex {
    /// The table keys a removal of `hashes` from holder `id`'s tier `bit` names: the derived key
    /// an alias gives, unless the holder keeps the block by its hash (a pair from a store written
    /// by an earlier version, see "Order of sources" in `src/index/README.md`).
    /// Flagged raw where the hash itself is the key.
    /// The buffers are the caller's (engines announce one removal per block: no allocation per
    /// removal).
    pub(super) fn removal_keys(
        &self,
        id: u32,
        bit: u8,
        hashes: &[BlockHash],
        (resolved, keys): &mut RemovalScratch,
    ) {
        let aliases = &self.shared.aliases;
        // Every alias line first, so that the lookups' misses overlap (an engine removes a
        // prompt's tail, dozens of blocks, in one event).
        aliases.prefetch(hashes.iter().map(|h| h.0));
        aliases.resolve_into(hashes.iter().map(|h| h.0), resolved);
        let any_raw = self
            .holders
            .get(id as usize)
            .is_some_and(|s| s.raw_live > 0);
        let table = &self.shared.table;
        keys.clear();
        keys.extend(
            hashes
                .iter()
                .zip(resolved.iter())
                .map(|(h, alias)| match *alias {
                    Some(key) if !any_raw => (key, false),
                    Some(key) if table.read(key).holder_bits(key, id) & bit != 0 => (key, false),
                    _ => (h.0, true),
                }),
        );
    }

    /// Take one announcement of tier `bit` of holder `id` away from each block; a block with
    /// more than one announcement stays held. Returns how many removes only lowered a count.
    pub(super) fn remove(&mut self, id: u32, bit: u8, keys: &[(u64, bool)]) -> u64 {
        let Some(state) = self.holders.get_mut(id as usize) else {
            return 0;
        };
        self.dirty.extend(keys.iter().map(|&(k, _)| (id, k)));
        let table = &self.shared.table;
        {
            // As for stores (see `store_run`): the slot lines of every key, then the records
            // they name, so that the removes below find their lines in the caches. Hints only;
            // registered as a reader so the arrays they look at stay while they do.
            let reading = table.reading();
            keys.iter()
                .for_each(|&(k, _)| table.prefetch(&reading, table.locate(k)));
            keys.iter()
                .for_each(|&(k, _)| table.prefetch_record(&reading, table.locate(k)));
        }
        let mut w = table.writer();
        let (mut gone_blocks, mut gone_pairs, mut counted, mut gone_raw) = (0u64, 0u64, 0u64, 0u64);
        for &(key, raw) in keys {
            if !state.repeats.is_empty()
                && let std::collections::hash_map::Entry::Occupied(mut extra) =
                    state.repeats.entry((key, bit))
            {
                *extra.get_mut() -= 1;
                if *extra.get() == 0 {
                    extra.remove();
                }
                counted += 1;
                continue;
            }
            let (removed, at) = table.remove_at(&mut w, key, id, bit);
            if removed.holder_gone {
                state.gone.push(at);
            }
            gone_pairs += u64::from(removed.holder_gone);
            gone_blocks += u64::from(removed.block_gone);
            gone_raw += u64::from(removed.holder_gone && raw);
        }
        drop(w);
        state.live = state.live.saturating_sub(gone_pairs);
        state.raw_live = state.raw_live.saturating_sub(gone_raw);
        self.shared.raw_pairs.fetch_sub(gone_raw, Ordering::Relaxed);
        self.shared.blocks.fetch_sub(gone_blocks, Ordering::Relaxed);
        self.shared
            .holder_blocks
            .fetch_sub(gone_pairs, Ordering::Relaxed);
        self.compact_refs(id);
        counted
    }

    /// Compact holder `id`'s reverse list once the references of pairs that went reach half
    /// the live ones: by subtracting them ([`RefList::compact_without`], no table lookup); and,
    /// should stale references the removals did not name ever outnumber live ones, by checking
    /// each against the table.
    pub(super) fn compact_refs(&mut self, id: u32) {
        let Some(state) = self.holders.get_mut(id as usize) else {
            return;
        };
        let by_gone = state.gone.len() as u64 > state.live / 2 + 64;
        let by_check = state.blocks.len() as u64 > 2 * state.live + 64;
        if !by_gone && !by_check {
            return;
        }
        // Compaction reorders the list: move its unrecorded tail to `dirty` first.
        let tail = state.blocks.iter_from(state.checkpointed);
        let table = &self.shared.table;
        self.dirty
            .extend(tail.filter_map(|r| table.held_key(r, id).map(|k| (id, k))));
        if by_gone {
            state.blocks.compact_without(&mut state.gone);
        }
        if state.blocks.len() as u64 > 2 * state.live + 64 {
            compact(table, id, &mut state.blocks);
            state.gone.clear();
        }
        state.checkpointed = state.blocks.len();
    }
}

/// Drop stale and duplicate references from a holder's reverse index (a block removed and stored
/// again appears twice).
fn compact(table: &Table, id: u32, blocks: &mut RefList) {
    blocks.compact(|&r| table.held_key(r, id).is_some());
}

impl ContextIndex {
    /// Remove every entry of holder `id`; returns the pairs removed.
    pub(super) fn clear_holder(&mut self, id: u32) -> u64 {
        let Some(state) = self.holders.get_mut(id as usize) else {
            return 0;
        };
        let refs = std::mem::take(&mut state.blocks);
        state.gone = Vec::new();
        state.checkpointed = 0;
        state.repeats = HashMap::new();
        let (mut gone_blocks, mut gone_pairs) = (0u64, 0u64);
        for r in refs.iter() {
            // A stale reference names a pair already gone (and recorded when it went).
            if let Some((key, removed)) = self.shared.table.clear_at(r, id) {
                self.dirty.push((id, key));
                gone_pairs += u64::from(removed.holder_gone);
                gone_blocks += u64::from(removed.block_gone);
            }
        }
        state.live = 0;
        let gone_raw = std::mem::take(&mut state.raw_live);
        self.shared.raw_pairs.fetch_sub(gone_raw, Ordering::Relaxed);
        self.shared.blocks.fetch_sub(gone_blocks, Ordering::Relaxed);
        self.shared
            .holder_blocks
            .fetch_sub(gone_pairs, Ordering::Relaxed);
        gone_pairs
    }
}
