//! Applying gathered stores to the block table grouped by shard (one lock per shard per run).
//!
//! Stores commute with each other (they only add entries or counts), so consecutive store ops of
//! a batch are gathered into one [`StoreRun`] and applied together: sorted by shard, each shard's
//! group under one write lock, with every item's slot line prefetched as it is gathered and its
//! record line before the run is applied, so that their cache misses overlap (a run's items fall
//! in many shards, one or two per shard for an engine message, so prefetching per shard group
//! overlapped almost nothing).

use super::aliases::Aliases;
use super::holder::HolderState;
use super::keying::PendingAliases;
use super::table::{SHARDS, Table};

/// What one run added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Added {
    /// Blocks new to the table.
    pub blocks: u64,
    /// (block, holder) pairs new to the table.
    pub pairs: u64,
    /// Of `pairs`, those keyed by a published hash.
    pub raw_pairs: u64,
    /// Stores of tier bits their holder already had (counted as repeats).
    pub repeats: u64,
}

/// Stores gathered for [`apply`]: (block, holder id, tier bit), the alias pairs their ops
/// gave, and scratch.
#[derive(Default)]
pub(super) struct StoreRun {
    /// The tier bit carries [`RAW_KEY`] for keys that are published hashes.
    pub(super) items: Vec<(u64, u32, u8)>,
    /// Inserted into the alias map before the items are applied (see [`PendingAliases`]).
    pub(super) aliases: PendingAliases,
    shard: Vec<u8>,
    sorted: Vec<(u64, u32, u8)>,
    /// `sorted[i]` is a published hash.
    raw: Vec<bool>,
}

/// Marks a queued store whose key is a published hash (the tier bits use the low four bits).
pub(super) const RAW_KEY: u8 = 0x80;

/// Stores applied per grouping pass: enough that each shard gets several (one lock, and their
/// slot reads overlap), few enough that the scratch stays small.
pub(super) const RUN_MAX: usize = 4096;

impl StoreRun {
    /// The largest of its buffers' capacities, in items.
    pub(super) fn capacity(&self) -> usize {
        self.items
            .capacity()
            .max(self.sorted.capacity())
            .max(self.aliases.pairs.capacity())
    }
}

/// Apply the gathered stores, one shard lock per shard they touch, and empty the run: new pairs
/// join their holder's reverse list, a store of tier bits the holder already had adds to its
/// repeat count, and every other store marks its pair for the next checkpoint.
///
/// The run's alias pairs go into `aliases` (changed hashes onto `alias_dirty`) after the record
/// prefetches are issued: the inserts' own lines were prefetched when the pairs were gathered,
/// and meanwhile the records arrive.
pub(super) fn apply(
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
    {
        // Hints only; registered as a reader so the arrays they look at stay while they do.
        // The slot lines were prefetched as the items were gathered; they tell where the
        // records are.
        let reading = table.reading();
        run.items
            .iter()
            .for_each(|it| table.prefetch_record(&reading, table.locate(it.0)));
    }
    run.aliases.flush(aliases, alias_dirty);
    // Counting sort by shard, keeping the order within a shard.
    let mut start = [0usize; SHARDS + 1];
    run.shard.clear();
    run.shard.extend(run.items.iter().map(|it| {
        let s = table.shard_no(it.0);
        start[s + 1] += 1;
        s as u8
    }));
    for i in 0..SHARDS {
        start[i + 1] += start[i];
    }
    let mut next = start;
    run.sorted.clear();
    run.sorted.resize(run.items.len(), (0, 0, 0));
    run.raw.clear();
    run.raw.resize(run.items.len(), false);
    for (it, &s) in run.items.iter().zip(&run.shard) {
        let at = next[s as usize];
        run.sorted[at] = (it.0, it.1, it.2 & !RAW_KEY);
        run.raw[at] = it.2 & RAW_KEY != 0;
        next[s as usize] += 1;
    }
    // One sets' writer lock for the whole run (see `Table::writer`).
    let mut w = table.writer();
    for s in 0..SHARDS {
        let group = &run.sorted[start[s]..start[s + 1]];
        if group.is_empty() {
            continue;
        }
        // `add_group` reports the items in order: `at` follows them into `run.raw`.
        let mut at = start[s];
        let raw = &run.raw;
        table.add_group(&mut w, s, group, |(key, id, bit), added, r| {
            let is_raw = raw.get(at).copied().unwrap_or(false);
            at += 1;
            let Some(state) = holders.get_mut(id as usize) else {
                return;
            };
            match r {
                Some(r) => {
                    state.blocks.push(r);
                    state.live += 1;
                    out.pairs += 1;
                    if is_raw {
                        state.raw_live += 1;
                        out.raw_pairs += 1;
                    }
                }
                None => {
                    if added.repeat {
                        *state.repeats.entry((key, bit)).or_default() += 1;
                        out.repeats += 1;
                    }
                    dirty.push((id, key))
                }
            }
            out.blocks += u64::from(added.new_block);
        });
    }
    run.items.clear();
    out
}
