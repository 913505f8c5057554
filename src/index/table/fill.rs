//! Building a whole table at once from (block, entry) pairs: a context rebuilt from a checkpoint
//! or a snapshot, where every pair is known before any query runs.
//!
//! Why not the one-at-a-time path (`add_group`): it pays a random probe, a random record write
//! and the rehashes of growth per block, and a block with several holders interns one set per
//! holder on the way to its final set. Here each shard's pairs are sorted by slot hash (a
//! counting sort on the hash's top bits, then the few keys per bucket), grouped per block, and
//! the shard is written in one sequential pass ([`Blocks::fill_sorted`]) with each multi-holder
//! set interned once. Shards are independent (a key's shard is known from the key alone,
//! [`Table::shard_no`]), so several
//! threads build disjoint shards without sharing anything but the sets' writer, which each
//! takes once per shard.

use std::sync::Mutex;

use super::blocks::{IDX_BITS, slot_hash};
use super::sets::is_inline;
use super::{BlockRef, SHARDS, Table, entry_bits, entry_id, make_entry};

/// What a fill placed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Filled {
    pub blocks: u64,
    pub pairs: u64,
}

/// Bucket count for sorting `n` keys by hash: about one key per bucket, at most 2^20 (4 MiB
/// of counts).
fn bucket_bits(n: usize) -> u32 {
    n.next_power_of_two().trailing_zeros().min(20)
}

/// The (block, entry) items of `parts` sorted by (slot hash, block, entry), via a counting sort
/// on the top bits of the hash and a sort of each (small) bucket.
fn sorted_by_hash(parts: &[Vec<(u64, u32)>], seed: u64) -> Vec<(u64, u32)> {
    let n = parts.iter().map(Vec::len).sum();
    let items = || parts.iter().flatten();
    let bits = bucket_bits(n);
    let bucket = |key: u64| {
        if bits == 0 {
            0
        } else {
            (slot_hash(key, seed) >> (64 - bits)) as usize
        }
    };
    let mut start = vec![0u32; (1usize << bits) + 1];
    for &(key, _) in items() {
        start[bucket(key) + 1] += 1;
    }
    for b in 0..1usize << bits {
        start[b + 1] += start[b];
    }
    let mut next = start.clone();
    let mut out = vec![(0u64, 0u32); n];
    for &item in items() {
        let at = &mut next[bucket(item.0)];
        out[*at as usize] = item;
        *at += 1;
    }
    for b in 0..1usize << bits {
        let group = &mut out[start[b] as usize..start[b + 1] as usize];
        if group.len() > 1 {
            group.sort_unstable_by_key(|&(key, entry)| (slot_hash(key, seed), key, entry));
        }
    }
    out
}

impl Table {
    /// Fill the table, which must be empty, with `shards[s]`: the (block, entry) pairs whose
    /// block falls in shard `s` (see [`Table::shard_no`]), in any order and in any number of
    /// parts, entries with non-zero tier bits. A block named twice for one holder gets the
    /// union of the bits. Shards are built by up to `threads` threads; the result does not
    /// depend on how many.
    pub fn fill(&self, shards: Vec<Vec<Vec<(u64, u32)>>>, threads: usize) -> Filled {
        let work = Mutex::new(shards.into_iter().enumerate().take(SHARDS));
        let take = || {
            work.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .next()
        };
        let build = || {
            let mut filled = Filled::default();
            while let Some((s, items)) = take() {
                let f = self.fill_shard(s, items);
                filled.blocks += f.blocks;
                filled.pairs += f.pairs;
            }
            filled
        };
        let threads = threads.clamp(1, SHARDS);
        if threads == 1 {
            return build();
        }
        std::thread::scope(|scope| {
            let helpers: Vec<_> = (1..threads).map(|_| scope.spawn(build)).collect();
            let mut total = build();
            for h in helpers {
                // A helper that panicked left its shards as they were; the caller's thread
                // carries on (nothing here panics on any input).
                if let Ok(f) = h.join() {
                    total.blocks += f.blocks;
                    total.pairs += f.pairs;
                }
            }
            total
        })
    }

    fn fill_shard(&self, shard: usize, parts: Vec<Vec<(u64, u32)>>) -> Filled {
        let sorted = sorted_by_hash(&parts, self.slot_seed);
        drop(parts);
        // One record per block; a block with several holders keeps its first entry until its
        // set is interned below.
        let mut recs: Vec<(u64, u32)> = Vec::with_capacity(sorted.len());
        let mut multi: Vec<(u32, std::ops::Range<usize>)> = Vec::new();
        let mut entries: Vec<u32> = Vec::new();
        let mut i = 0;
        while i < sorted.len() {
            let key = sorted[i].0;
            let start = entries.len();
            while let Some(&(k, e)) = sorted.get(i).filter(|&&(k, _)| k == key) {
                debug_assert_eq!(k, key);
                let same_holder = entries.len() > start;
                match entries.last_mut() {
                    Some(last) if same_holder && entry_id(*last) == entry_id(e) => {
                        *last = make_entry(entry_id(e), entry_bits(*last) | entry_bits(e));
                    }
                    _ => entries.push(e),
                }
                i += 1;
            }
            let first = entries[start];
            if entries.len() - start > 1 {
                multi.push((recs.len() as u32, start..entries.len()));
            }
            recs.push((key, first));
        }
        drop(sorted);
        let mut guard = self.write(shard, 0);
        let placed = guard.blocks.fill_sorted(&recs);
        let mut pairs = placed as u64;
        if !multi.is_empty() {
            let mut w = self.sets.writer();
            for (rec, range) in multi.into_iter().filter(|(r, _)| (*r as usize) < placed) {
                let list = &entries[range];
                // At the set limit the block keeps its first holder, as a refused join would.
                if let Some(val) = self.sets.adopt(&mut w, list) {
                    guard.blocks.set_val(rec, val);
                    pairs += list.len() as u64 - 1;
                }
            }
        }
        Filled {
            blocks: placed as u64,
            pairs,
        }
    }

    /// Call `f` with every (entry, reference) of the table, shard by shard in record order:
    /// the reverse lists of a filled table.
    pub fn for_each_entry(&self, mut f: impl FnMut(u32, BlockRef)) {
        for (s, shard) in self.shards.iter().enumerate() {
            // The shard first, then the set lists: the table's lock order.
            let shard = super::write::shard_read(shard);
            let lists = self.sets.lists();
            shard.blocks.for_each_record(|idx, val| {
                let r = (s as u32) << IDX_BITS | idx;
                if is_inline(val) {
                    f(val, r);
                } else {
                    lists.entries(val).iter().for_each(|&e| f(e, r));
                }
            });
        }
    }
}
