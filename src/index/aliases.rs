//! Engine hash → derived key, for everything that names a block by its published hash.
//!
//! Engine blocks are keyed by the key the index derives from their contents (see "Keys" in
//! `src/index/README.md`); removals, the parent of the next event, store objects and queries by
//! hash name them by the engine's hash, which this map translates. One map per context, shared by
//! all its sources: ranks of one model publish the same hashes for the same blocks, and a store
//! object carries the hash its engine published.
//!
//! The writer inserts; readers (queries by hash) look up under the read lock, never while
//! hashing. Aliases of blocks no holder keeps any more are swept once they outnumber the blocks.

use std::sync::RwLock;

use super::alias_table::AliasTable;
use super::table::{read_lock, write_lock};

/// How far ahead [`Aliases::load`] prefetches: enough misses in flight to cover a DRAM access
/// at a few nanoseconds per insert.
const LOAD_AHEAD: usize = 16;

#[derive(Default)]
pub(crate) struct Aliases {
    map: RwLock<AliasTable>,
}

impl Aliases {
    pub fn get(&self, hash: u64) -> Option<u64> {
        read_lock(&self.map).get(hash)
    }

    /// Each hash's derived key, under one read lock.
    pub fn resolve(&self, hashes: impl Iterator<Item = u64>) -> Vec<Option<u64>> {
        let mut out = Vec::new();
        self.resolve_into(hashes, &mut out);
        out
    }

    /// [`Self::resolve`] into `out` (emptied first), so a caller can reuse one buffer.
    pub fn resolve_into(&self, hashes: impl Iterator<Item = u64>, out: &mut Vec<Option<u64>>) {
        out.clear();
        let map = read_lock(&self.map);
        out.extend(hashes.map(|h| map.get(h)));
    }

    /// Each hash with its derived key, in order, under one read lock.
    pub fn resolve_with(
        &self,
        hashes: impl Iterator<Item = u64>,
        mut f: impl FnMut(u64, Option<u64>),
    ) {
        let map = read_lock(&self.map);
        hashes.for_each(|h| f(h, map.get(h)));
    }

    /// Bring the lines the hashes' inserts will read into the caches (hints; see
    /// `keying::PendingAliases` for why they are issued well before the inserts).
    pub fn prefetch(&self, hashes: impl Iterator<Item = u64>) {
        let map = read_lock(&self.map);
        hashes.for_each(|h| map.prefetch(h));
    }

    pub fn len(&self) -> usize {
        read_lock(&self.map).len()
    }

    /// Record `hash → key` pairs; pushes onto `changed` every hash whose alias is new or moved.
    pub fn insert(&self, pairs: impl Iterator<Item = (u64, u64)>, changed: &mut Vec<u64>) {
        let pairs: Vec<(u64, u64)> = pairs.collect();
        let mut map = write_lock(&self.map);
        map.reserve(pairs.len());
        // Every pair's line first, so the inserts' cache misses overlap (see `alias_table`).
        pairs.iter().for_each(|&(hash, _)| map.prefetch(hash));
        for (hash, key) in pairs {
            if map.insert(hash, key) != Some(key) {
                changed.push(hash);
            }
        }
    }

    /// [`Self::insert`] of pairs whose lines were prefetched ([`Self::prefetch`]) when they were
    /// gathered, without collecting them first.
    pub fn insert_all(&self, pairs: &[(u64, u64)], changed: &mut Vec<u64>) {
        let mut map = write_lock(&self.map);
        map.reserve(pairs.len());
        for &(hash, key) in pairs {
            if map.insert(hash, key) != Some(key) {
                changed.push(hash);
            }
        }
    }

    /// Add persisted aliases in bulk (recovery): nothing is recorded as changed. Into an empty
    /// map (a restore) they go in table order ([`AliasTable::fill`]); otherwise each insert's
    /// line is prefetched [`LOAD_AHEAD`] aliases ahead, so that the misses overlap.
    pub fn load(&self, all: Vec<(u64, u64)>) {
        let mut map = write_lock(&self.map);
        if map.len() == 0 {
            map.fill(all);
            return;
        }
        map.reserve(all.len());
        for (i, &(hash, key)) in all.iter().enumerate() {
            if let Some(&(ahead, _)) = all.get(i + LOAD_AHEAD) {
                map.prefetch(ahead);
            }
            map.insert(hash, key);
        }
    }

    /// Keep the aliases `keep(hash, key)` accepts; pushes the dropped hashes onto `changed`.
    pub fn retain(&self, mut keep: impl FnMut(u64, u64) -> bool, changed: &mut Vec<u64>) {
        write_lock(&self.map).retain(|h, k| {
            let kept = keep(h, k);
            if !kept {
                changed.push(h);
            }
            kept
        });
    }

    /// Every alias, sorted by hash (snapshots).
    pub fn all(&self) -> Vec<(u64, u64)> {
        let mut all: Vec<(u64, u64)> = read_lock(&self.map).iter().collect();
        all.sort_unstable();
        all
    }
}
