//! [`Restorer`]: rebuilds a context from the records a checkpoint wrote (recovery) or a
//! snapshot sent (a replica's bootstrap, `replica::build`).
//!
//! # Why pairs are gathered and the table is built at the end
//!
//! Fed one by one into the live structures, a restored pair cost a random probe and record
//! write in its shard, a share of nine rehashes as the shard grew, a set interned per holder of
//! a shared block, and a push into its holder's reverse list, all on the one thread reading the
//! records: 3 s of a 10 M pair restart on a 2-core machine, against 0.3 s for the same table
//! filled in bulk. So [`Restorer::pair`] only files the pair under the shard its block falls in
//! (a [`PairBatch`], which a scanning thread may fill too), and [`Restorer::finish`] builds the
//! shards in one sequential pass each, on several threads (shards share nothing), then the
//! holders' reverse lists from the built table. The context is the one incremental stores
//! would have made: same blocks, entries, sets, counts and aliases (tests compare them).

use crate::hashing::derived::ChainTuning;
use std::sync::Arc;

use crate::hashing::HashProfile;
use crate::index::shared::Shared;
use crate::index::stored::image::{HolderRecord, Watermark};
use crate::index::table::{self, ALL_TIERS, SHARDS, entry_id, make_entry};
use crate::index::write::holder::HolderState;
use crate::model::{ContextKey, SubscriptionKey};

use super::ContextIndex;

/// Vacant ids a restore accepts below its holders (see [`Restorer::holder`]): at most
/// [`VACANT_FLOOR`] plus [`VACANT_PER_HOLDER`] per holder record read. Each vacant id costs a
/// holder slot (some 230 bytes), so without a bound one record of id 2^27 asked for gigabytes.
/// A real context never comes near it: the writer reuses reclaimed ids before it takes a new one,
/// so its largest id stays below the most holders it had at once (see `docs/durability.md`).
pub const VACANT_FLOOR: usize = 1 << 16;
pub const VACANT_PER_HOLDER: usize = 16;

/// Threads [`Restorer::finish`] builds shards on, at most: past this, the build is no longer
/// what a restart waits for (the scan of the store is).
const FILL_THREADS: usize = 4;

/// Rebuilds a context from what a checkpoint wrote. Feed holders first (in id order), then the
/// pairs in any order, then finish.
pub struct Restorer {
    index: ContextIndex,
    /// Per holder id, its record's count of pairs keyed by published hash.
    raw_pairs: Vec<Option<u64>>,
    pending: PairBatch,
    /// Batches filled elsewhere ([`Restorer::absorb`]), kept whole: the build reads each
    /// shard's parts where they are instead of copying them together first.
    absorbed: Vec<PairBatch>,
    /// Persisted aliases, loaded by [`Restorer::finish`] while the table is built.
    aliases: Vec<(u64, u64)>,
    /// Holder records restored, and the vacant ids left below them.
    records: usize,
    vacant: usize,
}

/// Pairs gathered for [`Restorer::finish`], filed by the shard their block falls in. Made by
/// [`Restorer::batch`] once the holders are fed, so that another thread can decode pairs into
/// one while the restorer is busy; handed back with [`Restorer::absorb`].
pub struct PairBatch {
    shared: Arc<Shared>,
    /// Per holder id: a holder record restored it (pairs of other ids are ignored).
    known: Vec<bool>,
    /// Per shard, its pairs in parts that never move once allocated (the build reads any
    /// number of parts): a vector grown by doubling copied each pair twice on average and
    /// faulted in twice the memory, which showed in a 10 M-pair restart's profile.
    shards: Vec<Vec<Vec<(u64, u32)>>>,
}

/// The first part of a shard holds this many pairs, each next one twice as many as the
/// last, up to [`PART_MAX`] (1 MiB): small contexts reserve little, large ones few parts.
const PART_MIN: usize = 256;
const PART_MAX: usize = 1 << 16;

impl PairBatch {
    fn new(shared: Arc<Shared>, known: Vec<bool>) -> Self {
        PairBatch {
            shared,
            known,
            shards: (0..SHARDS).map(|_| Vec::new()).collect(),
        }
    }

    /// One persisted pair. Pairs naming an unknown holder or no tier are ignored (returns
    /// false).
    pub fn pair(&mut self, holder_id: u32, block: u64, bits: u8) -> bool {
        let bits = bits & ALL_TIERS;
        if bits == 0 || !self.known.get(holder_id as usize).copied().unwrap_or(false) {
            return false;
        }
        let s = self.shared.table.shard_no(block);
        if let Some(parts) = self.shards.get_mut(s) {
            push_to_parts(parts, (block, make_entry(holder_id, bits)));
        }
        true
    }

    /// Pairs filed so far.
    pub fn len(&self) -> usize {
        self.shards.iter().flatten().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.iter().flatten().all(Vec::is_empty)
    }
}

/// Add `pair` to a shard's parts, in a new part when the last one is full.
fn push_to_parts(parts: &mut Vec<Vec<(u64, u32)>>, pair: (u64, u32)) {
    match parts.last_mut() {
        Some(part) if part.len() < part.capacity() => part.push(pair),
        last => {
            let size = last.map_or(PART_MIN, |l| (l.capacity() * 2).min(PART_MAX));
            let mut part = Vec::with_capacity(size);
            part.push(pair);
            parts.push(part);
        }
    }
}

/// Loads persisted aliases into a restorer's context (see [`Restorer::alias_loader`]).
pub struct AliasLoader {
    shared: Arc<Shared>,
}

impl AliasLoader {
    /// Persisted aliases, all at once; into an empty map they go in table order.
    pub fn load(&self, all: Vec<(u64, u64)>) {
        self.shared.aliases.load(all);
    }
}

impl Restorer {
    pub fn new(key: ContextKey, profile: HashProfile) -> Self {
        Self::tuned(key, profile, ChainTuning::DEFAULT)
    }

    /// A restorer of a context whose keys were made with `tuning` (its store's).
    pub fn tuned(key: ContextKey, profile: HashProfile, tuning: ChainTuning) -> Self {
        let index = ContextIndex::tuned(key, profile, tuning);
        let pending = PairBatch::new(Arc::clone(&index.shared), Vec::new());
        Restorer {
            index,
            raw_pairs: Vec::new(),
            pending,
            absorbed: Vec::new(),
            aliases: Vec::new(),
            records: 0,
            vacant: 0,
        }
    }

    /// Re-intern a holder at its id; records must come sorted by id. Ids between two records
    /// were reclaimed before the checkpoint and stay free. Refused (corrupt data, the reason
    /// returned): an id out of order, out of range, leaving more vacant ids below it than the
    /// records read allow ([`VACANT_FLOOR`], [`VACANT_PER_HOLDER`]), or naming a holder a record
    /// already named.
    pub fn holder(&mut self, record: &HolderRecord) -> Result<(), String> {
        let id = record.id as usize;
        let next = self.index.holders.len();
        if id < next {
            return Err(format!("holder record {id} out of order or repeated"));
        }
        if id >= table::MAX_HOLDERS {
            return Err(format!(
                "holder record {id} is past the largest holder id {}",
                table::MAX_HOLDERS - 1
            ));
        }
        let vacant = self.vacant + (id - next);
        let allowed = VACANT_FLOOR + VACANT_PER_HOLDER * (self.records + 1);
        if vacant > allowed {
            return Err(format!(
                "holder record {id} leaves {vacant} unused holder ids below it for {} holder \
                 records (at most {allowed}: ids are reused, so a written context has few)",
                self.records + 1
            ));
        }
        self.vacant = vacant;
        self.records += 1;
        if self.index.holders.len() < id {
            let mut meta = self.index.shared.meta.write();
            while self.index.holders.len() < id {
                self.index.holders.push(HolderState::vacant());
                meta.shared.push(false);
            }
        }
        self.raw_pairs.resize(id, None);
        self.raw_pairs.push(record.raw_pairs);
        let interned = self.index.intern(&record.source, &record.holder) == Some(record.id);
        if interned {
            self.index.set_group_kind(record.id, record.kind);
        }
        // Only holders at or past the known ones can have appeared: ids are restored in
        // order, and nothing is reclaimed before the build.
        let known = &mut self.pending.known;
        let from = known.len().min(self.index.holders.len());
        known.truncate(from);
        known.extend(self.index.holders[from..].iter().map(|h| !h.vacant));
        if interned {
            Ok(())
        } else {
            Err(format!(
                "holder record {id} names a holder an earlier record named"
            ))
        }
    }

    /// One persisted alias.
    pub fn alias(&mut self, hash: u64, key: u64) {
        self.aliases.push((hash, key));
    }

    /// Persisted aliases, many at once.
    pub fn aliases(&mut self, mut all: Vec<(u64, u64)>) {
        if self.aliases.is_empty() {
            self.aliases = all;
        } else {
            self.aliases.append(&mut all);
        }
    }

    pub fn attach(&mut self, source: &SubscriptionKey, instance_id: &str, dp_rank: u32) {
        self.index.attach_rank(source, instance_id, dp_rank);
    }

    pub fn watermark(&mut self, source: SubscriptionKey, mark: Watermark) {
        self.index.set_watermark(&source, mark);
        self.index.on_disk.watermarks.insert(source, mark);
    }

    /// One persisted pair. Pairs naming an unknown holder or no tier are ignored (returns
    /// false).
    pub fn pair(&mut self, holder_id: u32, block: u64, bits: u8) -> bool {
        self.pending.pair(holder_id, block, bits)
    }

    /// An empty batch to file pairs into away from the restorer (the holders fed so far are the
    /// ones it accepts pairs of).
    pub fn batch(&self) -> PairBatch {
        PairBatch::new(Arc::clone(&self.index.shared), self.pending.known.clone())
    }

    /// A handle that loads persisted aliases into this context from another thread (recovery
    /// fills the alias map right after reading it, while the pairs are still being read).
    pub fn alias_loader(&self) -> AliasLoader {
        AliasLoader {
            shared: Arc::clone(&self.index.shared),
        }
    }

    /// Take the pairs of `batch` (from [`Restorer::batch`]).
    pub fn absorb(&mut self, mut batch: PairBatch) {
        if !Arc::ptr_eq(&batch.shared, &self.index.shared) {
            // Another context's batch files by another table's shards: file its pairs again.
            for (block, entry) in batch.shards.drain(..).flatten().flatten() {
                let s = self.index.shared.table.shard_no(block);
                push_to_parts(&mut self.pending.shards[s], (block, entry));
            }
            return;
        }
        self.absorbed.push(batch);
    }

    /// Announcements beyond the first of a persisted pair's tier `bit` (see
    /// [`crate::index::ContextChanges::repeats`]). Returns false for an unknown holder or a zero
    /// count.
    pub fn repeat(&mut self, holder_id: u32, block: u64, bit: u8, extra: u32) -> bool {
        match self.index.holders.get_mut(holder_id as usize) {
            Some(state) if !state.vacant && extra > 0 && bit.is_power_of_two() => {
                state.repeats.insert((block, bit), extra);
                true
            }
            _ => false,
        }
    }

    /// The rebuilt index, with nothing left to checkpoint, its shards built on as many threads
    /// as the machine has (up to [`FILL_THREADS`]).
    pub fn finish(self) -> ContextIndex {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.finish_on(threads.min(FILL_THREADS))
    }

    /// [`Restorer::finish`] on `threads` threads: the same context whatever the count.
    pub fn finish_on(mut self, threads: usize) -> ContextIndex {
        self.build(threads);
        self.index.dirty.clear();
        self.index.persisted = true;
        // What was read is what the store holds.
        self.index.on_disk.full = false;
        self.index.on_disk.attachments_changed = false;
        let mut raw_total = 0;
        for (id, state) in self.index.holders.iter_mut().enumerate() {
            if state.vacant {
                self.index.free_ids.vacant_at_recovery(id as u32);
                continue;
            }
            state.checkpointed = state.blocks.len();
            // Rewritten at the next checkpoint when the record lacks the count (schema 1).
            state.written = self.raw_pairs.get(id).copied().flatten();
            // A schema 1 holder's pairs are all keyed by published hash.
            let raw = self
                .raw_pairs
                .get(id)
                .copied()
                .flatten()
                .unwrap_or(state.live);
            state.raw_live = raw.min(state.live);
            raw_total += state.raw_live;
        }
        self.index
            .shared
            .raw_pairs
            .store(raw_total, std::sync::atomic::Ordering::Relaxed);
        self.index
    }

    /// Build the table from the filed pairs (the aliases load meanwhile, on a thread of their
    /// own: they touch nothing the table does), then each holder's reverse list and count from
    /// the table.
    fn build(&mut self, threads: usize) {
        let mut shards: Vec<Vec<Vec<(u64, u32)>>> = std::mem::take(&mut self.pending.shards);
        for batch in std::mem::take(&mut self.absorbed) {
            for (parts, more) in shards.iter_mut().zip(batch.shards) {
                parts.extend(more);
            }
        }
        let aliases = std::mem::take(&mut self.aliases);
        let shared = &self.index.shared;
        let filled = if threads > 1 && !aliases.is_empty() {
            std::thread::scope(|scope| {
                scope.spawn(|| shared.aliases.load(aliases));
                shared.table.fill(shards, threads)
            })
        } else {
            shared.aliases.load(aliases);
            shared.table.fill(shards, threads)
        };
        let holders = &mut self.index.holders;
        shared.table.for_each_entry(|entry, r| {
            if let Some(state) = holders.get_mut(entry_id(entry) as usize) {
                state.blocks.push(r);
                state.live += 1;
            }
        });
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        shared.blocks.fetch_add(filled.blocks, relaxed);
        shared.holder_blocks.fetch_add(filled.pairs, relaxed);
    }
}
