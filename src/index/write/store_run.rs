//! Applying gathered stores to the block table grouped by shard (one lock per shard per run).
//!
//! Stores commute with each other (they only add entries or counts), so consecutive store ops of
//! a batch are gathered into one [`StoreRun`] and applied together: sorted by shard, each shard's
//! group under one write lock, with every item's slot line prefetched as it is gathered and its
//! record line one store op later ([`StoreRun::find_records`]), so that their cache misses
//! overlap (a run's items fall in many shards, one or two per shard for an engine message, so
//! prefetching per shard group overlapped almost nothing). Each item is located once (its slot
//! hash and the record its prefetch found travel with it), and the record found is a hint that
//! spares an existing block the probe over the slots (see "The apply path" in
//! `src/index/README.md`).

use super::holder::HolderState;
use super::keying::PendingAliases;
use crate::index::aliases::Aliases;
use crate::index::table::{Located, Reading, SHARDS, Table};

/// What one run added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::index) struct Added {
    /// Blocks new to the table.
    pub blocks: u64,
    /// (block, holder) pairs new to the table.
    pub pairs: u64,
    /// Of `pairs`, those keyed by a published hash.
    pub raw_pairs: u64,
    /// Stores of tier bits their holder already had (counted as repeats).
    pub repeats: u64,
}

/// One gathered store: its block located once, when its slot line was prefetched (the slot
/// hash picks the shard and the slot, and the record prefetch keeps which record it found, so
/// nothing is hashed or probed twice), the holder id, its tier bit, and whether the key is a
/// published hash.
#[derive(Clone, Copy, Default)]
pub(in crate::index) struct RunItem {
    pub(in crate::index) at: Located,
    pub(in crate::index) id: u32,
    pub(in crate::index) bit: u8,
    pub(in crate::index) raw: bool,
}

/// Stores gathered for [`apply`], the alias pairs their ops gave, and scratch.
#[derive(Default)]
pub(in crate::index) struct StoreRun {
    pub(in crate::index) items: Vec<RunItem>,
    /// Inserted into the alias map before the items are applied (see [`PendingAliases`]).
    pub(in crate::index) aliases: PendingAliases,
    /// `items[..hinted]` have their record hint (see [`StoreRun::find_records`]).
    hinted: usize,
    shard: Vec<u8>,
    /// Under a memory budget: record each op's start and the blocks the run makes new, so that
    /// they join the eviction order as runs of their op (see `evict_order`).
    pub(in crate::index) track: bool,
    /// Per gathered op while tracking: its first item, the published hash of its last block and
    /// the published parent it named.
    ops: Vec<(u32, Option<u64>, Option<u64>)>,
    /// (item, key) of each block the run made new, while tracking.
    fresh: Vec<(u32, u64)>,
    /// Positions in `items`, sorted by shard. Why positions: sorting the items themselves
    /// zeroed and copied 32 bytes per store (the zeroing alone was about 1 % of apply's
    /// instructions).
    order: Vec<u32>,
}

/// Stores applied per grouping pass: enough that each shard gets several (one lock, and their
/// slot reads overlap), few enough that the scratch stays small.
pub(in crate::index) const RUN_MAX: usize = 4096;

impl StoreRun {
    /// The largest of its buffers' capacities, in items.
    pub(in crate::index) fn capacity(&self) -> usize {
        self.items
            .capacity()
            .max(self.order.capacity())
            .max(self.aliases.pairs.capacity())
    }

    /// Find the record of every item gathered since the last call, prefetching its line and
    /// keeping it as the item's hint: their slot lines were prefetched when they were gathered,
    /// and one store op later they have arrived (reading them all at the end of the run had the
    /// last op's reads wait for their lines, and issued the run's record prefetches at once).
    ///
    /// Hints only: `reading` registers the caller as a reader so that the arrays they look at
    /// stay while they do.
    /// Note that the next items gathered are one op's blocks (while tracking).
    pub(in crate::index) fn mark_op(&mut self, last_hash: Option<u64>, parent_hash: Option<u64>) {
        if self.track {
            self.ops
                .push((self.items.len() as u32, last_hash, parent_hash));
        }
    }

    /// Hand each applied op's new blocks, in chain order, with its last and parent hashes to
    /// `f`, and forget them.
    pub(in crate::index) fn take_new_runs(
        &mut self,
        mut f: impl FnMut(std::iter::Copied<std::slice::Iter<'_, u64>>, Option<u64>, Option<u64>),
    ) {
        if self.fresh.is_empty() {
            self.ops.clear();
            return;
        }
        // Applied shard by shard: back to gathering order.
        self.fresh.sort_unstable_by_key(|&(i, _)| i);
        let mut keys = Vec::new();
        let mut fresh = self.fresh.iter().peekable();
        for (n, &(start, last, parent)) in self.ops.iter().enumerate() {
            let end = self.ops.get(n + 1).map_or(u32::MAX, |o| o.0);
            keys.clear();
            while let Some(&&(i, key)) = fresh.peek() {
                if i >= end {
                    break;
                }
                if i >= start {
                    keys.push(key);
                }
                fresh.next();
            }
            f(keys.iter().copied(), last, parent);
        }
        self.ops.clear();
        self.fresh.clear();
    }

    pub(in crate::index) fn find_records(&mut self, table: &Table, reading: &Reading<'_>) {
        if let Some(fresh) = self.items.get_mut(self.hinted..) {
            fresh
                .iter_mut()
                .for_each(|it| table.locate_record(reading, &mut it.at));
        }
        self.hinted = self.items.len();
    }
}

/// Apply the gathered stores, one shard lock per shard they touch, and empty the run: new pairs
/// join their holder's reverse list, a store of tier bits the holder already had adds to its
/// repeat count, and every other store marks its pair for the next checkpoint.
///
/// The run's alias pairs go into `aliases` (changed hashes onto `alias_dirty`) after the record
/// prefetches are issued: the inserts' own lines were prefetched when the pairs were gathered,
/// and meanwhile the records arrive.
pub(in crate::index) fn apply(
    table: &Table,
    (aliases, alias_dirty): (&Aliases, &mut Vec<u64>),
    holders: &mut [HolderState],
    dirty: &mut Vec<(u32, u64)>,
    run: &mut StoreRun,
) -> Added {
    let mut out = Added::default();
    if run.items.is_empty() {
        run.aliases.flush(aliases, alias_dirty);
        return out;
    }
    run.find_records(table, &table.reading());
    // Counting sort by shard, keeping the order within a shard.
    let mut start = [0usize; SHARDS + 1];
    run.shard.clear();
    run.shard.extend(run.items.iter().map(|it| {
        let s = table.shard_at(it.at);
        start[s + 1] += 1;
        s as u8
    }));
    run.aliases.flush(aliases, alias_dirty);
    for i in 0..SHARDS {
        start[i + 1] += start[i];
    }
    let mut next = start;
    run.order.clear();
    run.order.resize(run.items.len(), 0);
    for (i, &s) in run.shard.iter().enumerate() {
        let at = &mut next[s as usize];
        run.order[*at] = i as u32;
        *at += 1;
    }
    // One sets' writer lock for the whole run (see `Table::writer`).
    let mut w = table.writer();
    let track = run.track;
    let fresh = &mut run.fresh;
    let items = &run.items;
    let item = |i: u32| items.get(i as usize).copied().unwrap_or_default();
    for s in 0..SHARDS {
        let group = &run.order[start[s]..start[s + 1]];
        if group.is_empty() {
            continue;
        }
        let store = |i: u32| {
            let it = item(i);
            (it.at, it.id, it.bit)
        };
        table.add_each(&mut w, s, group, store, |i, added, r| {
            let it = item(i);
            let Some(state) = holders.get_mut(it.id as usize) else {
                return;
            };
            match r {
                Some(r) => {
                    state.blocks.push(r);
                    state.live += 1;
                    out.pairs += 1;
                    if it.raw {
                        state.raw_live += 1;
                        out.raw_pairs += 1;
                    }
                }
                None => {
                    if added.repeat {
                        *state.repeats.entry((it.at.key, it.bit)).or_default() += 1;
                        out.repeats += 1;
                    }
                    dirty.push((it.id, it.at.key))
                }
            }
            out.blocks += u64::from(added.new_block);
            if track && added.new_block {
                fresh.push((i, it.at.key));
            }
        });
    }
    run.items.clear();
    run.hinted = 0;
    out
}
