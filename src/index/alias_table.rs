//! The alias map's table: engine hash → derived key, open addressing with linear probing.
//!
//! Why not `HashMap`: apply inserts one alias per stored block, each a random access into a map
//! of up to one entry per block, and a `HashMap` cannot be asked where a key lives, so those
//! cache misses could not overlap (a fifth of apply's time on the side-by-side benchmark). Here
//! [`AliasTable::prefetch`] brings a key's line in ahead of its insert. A derived key is never
//! 0 (derived keys are odd), so a value of 0 marks an empty slot.

use super::table::{mix64, random_seed};

use crate::index::table::prefetch_line;

/// Grow past 3/4 load: linear probing's misses (every insert of a new hash is one) take about
/// 8.5 probes there, two cache lines, against 32 at 7/8.
const LOAD_NUM: usize = 3;
const LOAD_DEN: usize = 4;
const MIN_SLOTS: usize = 16;
/// [`AliasTable::fill`] groups entries by the top bits of their home slot, into stretches of
/// this many slots (2^13: 128 KiB, which stays in a core's L2 cache while its group goes in).
/// Fewer, larger groups also keep the scatter's write streams few enough to stay cached: with
/// 64 Ki groups of 256 slots the scatter itself missed on every write.
const FILL_GROUP_SLOT_BITS: u32 = 13;

pub(crate) struct AliasTable {
    /// (engine hash, derived key); the key 0 marks an empty slot.
    slots: Vec<(u64, u64)>,
    len: usize,
    seed: u64,
}

impl Default for AliasTable {
    fn default() -> Self {
        AliasTable {
            slots: Vec::new(),
            len: 0,
            seed: random_seed(),
        }
    }
}

impl AliasTable {
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn home(&self, hash: u64) -> usize {
        // The slot count is a power of two.
        (mix64(hash ^ self.seed) as usize) & (self.slots.len() - 1)
    }

    /// Bring the line of `hash`'s home slot into the caches (a hint; see the module doc).
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        if !self.slots.is_empty() {
            prefetch_line(self.slots.as_ptr().wrapping_add(self.home(hash)));
        }
    }

    pub fn get(&self, hash: u64) -> Option<u64> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut pos = self.home(hash);
        loop {
            let (h, k) = self.slots[pos];
            if k == 0 {
                return None;
            }
            if h == hash {
                return Some(k);
            }
            pos = (pos + 1) & mask;
        }
    }

    /// Set `hash → key` (`key` non-zero); the key it had.
    pub fn insert(&mut self, hash: u64, key: u64) -> Option<u64> {
        debug_assert!(key != 0, "derived keys are never 0");
        if key == 0 {
            return None;
        }
        self.reserve(1);
        let mask = self.slots.len() - 1;
        let mut pos = self.home(hash);
        loop {
            let (h, k) = self.slots[pos];
            if k == 0 {
                self.slots[pos] = (hash, key);
                self.len += 1;
                return None;
            }
            if h == hash {
                self.slots[pos].1 = key;
                return Some(k);
            }
            pos = (pos + 1) & mask;
        }
    }

    /// Room for `n` more entries without growing.
    #[inline]
    pub fn reserve(&mut self, n: usize) {
        let need = self.len + n;
        if need * LOAD_DEN > self.slots.len() * LOAD_NUM {
            self.grow_for(need);
        }
    }

    /// Grow to hold `need` entries (not inlined into every insert: it was a call per insert,
    /// about 1.4 % of apply on the side-by-side benchmark).
    #[cold]
    #[inline(never)]
    fn grow_for(&mut self, need: usize) {
        let mut cap = self.slots.len().max(MIN_SLOTS);
        while need * LOAD_DEN > cap * LOAD_NUM {
            cap *= 2;
        }
        let old = std::mem::replace(&mut self.slots, vec![(0, 0); cap]);
        self.len = 0;
        for (h, k) in old {
            if k != 0 {
                self.insert(h, k);
            }
        }
    }

    /// Fill this empty table with `all` (a later entry of a hash wins, as with inserts).
    ///
    /// Why not one insert each: every insert of a new hash is a random access into a table of
    /// up to one slot per block (256 MiB at 10 M aliases), a cache and TLB miss that took 0.8 s
    /// for 10 M even with prefetching. Here the entries are first grouped by the top bits of
    /// their home slot (a counting sort into a scratch copy), then inserted group by group, so
    /// the probes walk the table from start to end.
    pub fn fill(&mut self, all: Vec<(u64, u64)>) {
        debug_assert_eq!(self.len, 0, "fill needs an empty table");
        self.reserve(all.len());
        if self.slots.is_empty() {
            return;
        }
        let slot_bits = self.slots.len().trailing_zeros();
        let bits = slot_bits.saturating_sub(FILL_GROUP_SLOT_BITS);
        let group = |hash: u64| self.home(hash) >> (slot_bits - bits);
        let mut start = vec![0usize; (1 << bits) + 1];
        for &(hash, _) in &all {
            start[group(hash) + 1] += 1;
        }
        for g in 0..1 << bits {
            start[g + 1] += start[g];
        }
        let mut grouped = vec![(0u64, 0u64); all.len()];
        for &entry in &all {
            let at = &mut start[group(entry.0)];
            grouped[*at] = entry;
            *at += 1;
        }
        drop(all);
        for (hash, key) in grouped {
            self.insert(hash, key);
        }
    }

    /// Keep the entries `keep` accepts (rebuilding the table: sweeps are rare, see `aliases`).
    pub fn retain(&mut self, mut keep: impl FnMut(u64, u64) -> bool) {
        let kept: Vec<(u64, u64)> = self.iter().filter(|&(h, k)| keep(h, k)).collect();
        self.slots = Vec::new();
        self.len = 0;
        self.reserve(kept.len());
        for (h, k) in kept {
            self.insert(h, k);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.slots.iter().copied().filter(|&(_, k)| k != 0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn behaves_like_a_map_under_churn() {
        let mut ours = AliasTable::default();
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut x = 3u64;
        for step in 0..40_000u64 {
            x = mix64(x);
            // Few distinct hashes (0 among them), so updates and sweeps hit existing entries.
            let hash = x % 3_000;
            let key = (x >> 20) | 1;
            assert_eq!(
                ours.insert(hash, key),
                model.insert(hash, key),
                "step {step}"
            );
            if step % 7_000 == 6_999 {
                ours.retain(|h, _| h % 3 != 0);
                model.retain(|h, _| h % 3 != 0);
            }
            assert_eq!(ours.len(), model.len());
        }
        for h in 0..3_100u64 {
            assert_eq!(ours.get(h), model.get(&h).copied(), "hash {h}");
        }
        let mut all: Vec<(u64, u64)> = ours.iter().collect();
        let mut want: Vec<(u64, u64)> = model.into_iter().collect();
        all.sort_unstable();
        want.sort_unstable();
        assert_eq!(all, want);
    }

    #[test]
    fn a_fill_is_the_table_the_inserts_make() {
        for n in [0u64, 1, 5, 1000, 70_000] {
            let mut all: Vec<(u64, u64)> = (0..n).map(|i| (mix64(i), (i << 1) | 1)).collect();
            // A hash given twice: the later entry wins, as with inserts.
            all.extend((0..n.min(3)).map(|i| (mix64(i), 7)));
            let mut filled = AliasTable::default();
            filled.fill(all.clone());
            let mut inserted = AliasTable::default();
            all.iter().for_each(|&(h, k)| {
                inserted.insert(h, k);
            });
            assert_eq!(filled.len(), inserted.len());
            for i in 0..n + 10 {
                assert_eq!(
                    filled.get(mix64(i)),
                    inserted.get(mix64(i)),
                    "n {n} hash {i}"
                );
            }
        }
    }

    #[test]
    fn an_empty_table_answers_and_prefetches() {
        let t = AliasTable::default();
        assert_eq!(t.get(7), None);
        t.prefetch(7);
        assert_eq!(t.iter().count(), 0);
    }
}
