//! [`ContextIndex`]: the single writer of one context's prefix index, a plain struct.

mod evict;
pub mod groups;
mod holders;
pub mod persist;
mod rekey;
mod removal;
pub mod restore;

use crate::cache_line::CacheLine;
use crate::hashing::derived::ChainTuning;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::events::{Holder, IndexBatch, IndexOp};
use crate::hashing::{HashProfile, PrefixKeys};
use crate::model::{ContextKey, SubscriptionKey, Tier};

use removal::RemovalScratch;

use super::holder::{FreeIds, HolderKey, HolderState};
use super::keying::{self, KeyOut};
use super::store_run::{self, RUN_MAX, RunItem, StoreRun};
use crate::index::answer::QueryHits;
use crate::index::plan::MetaLock;
use crate::index::read::handle::{ContextView, IndexReader, IndexStats};
use crate::index::read::query;
use crate::index::shared::Shared;
use crate::index::stored::records::Attachment;
use crate::index::table::{
    CPU_LOCAL, CPU_SHARE, DEVICE, DISK, ENGINE_TIERS, SHARED_TIERS, Table, tier_bit,
};

/// What one [`ContextIndex::apply`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Block keys named by valid Store ops, repeats included.
    pub stored: u64,
    /// Of `stored`, announcements of a (block, tier) the holder already had: counted, so that
    /// as many removes are needed before the block goes.
    pub repeated: u64,
    /// Block keys named by valid Remove ops.
    pub removed: u64,
    /// Of `removed`, removes that took one of several announcements away (the block stays).
    pub repeated_removes: u64,
    /// (block, holder) pairs removed by ClearHolder ops.
    pub cleared: u64,
    /// Ops refused: a tier the holder kind cannot hold, or a holder table at its id limit.
    pub invalid_ops: u64,
    /// Of `stored`, blocks keyed by the key derived from their contents (see "Keys").
    pub translated: u64,
    /// Of `stored`, blocks whose contents came with a parent this context never saw (joined
    /// mid-stream): keyed by the key their published hash's alias names, else by the hash.
    pub unlinked: u64,
}

/// One context's prefix index. Owned by exactly one writer (the context actor); readers go
/// through [`IndexReader`]s obtained from [`ContextIndex::reader`].
pub struct ContextIndex {
    pub(in crate::index) shared: Arc<Shared>,
    pub(in crate::index) holders: Vec<HolderState>,
    pub(in crate::index) holder_ids: HashMap<HolderKey, u32>,
    /// Source → holder ids it reported, for drop/detach in O(its blocks).
    pub(in crate::index) by_source: HashMap<SubscriptionKey, Vec<u32>>,
    /// Reclaimed holder ids (see `holder`).
    pub(in crate::index) free_ids: FreeIds,
    /// Reclaimed holder ids whose records the next checkpoint deletes.
    pub(in crate::index) holders_gone: Vec<u32>,
    /// What the store holds of this context besides pairs and aliases (see `persist`).
    pub(in crate::index) on_disk: persist::OnDisk,
    /// Source → (instance, rank) it listed, for detach without scanning the context.
    pub(in crate::index) attached: HashMap<SubscriptionKey, Vec<(String, u32)>>,
    /// (holder, block) pairs touched since the last checkpoint took them, with repeats; the
    /// checkpoint reads their current bits, so its cost follows the change, not the index size.
    /// Pairs a store created are not listed here: they are the tails of the holders' reverse
    /// lists (`HolderState::checkpointed`), which a fill would otherwise pay for twice.
    pub(in crate::index) dirty: Vec<(u32, u64)>,
    /// Per source, its position: the last publisher batch that reached this context, with ops for
    /// it or not (see `persist`).
    pub(in crate::index) watermarks:
        HashMap<SubscriptionKey, crate::index::stored::image::Watermark>,
    /// Engine hashes whose alias was added, moved or dropped since the last checkpoint.
    pub(in crate::index) alias_dirty: Vec<u64>,
    /// `alias_dirty[..rekey_from]` had their blocks re-keyed (see `rekey`); set per batch.
    rekey_from: usize,
    /// Alias count above which the next sweep runs (see `sweep_aliases`).
    next_alias_sweep: usize,
    /// Sweeps so far.
    pub(in crate::index) alias_sweeps: u64,
    /// A checkpoint took this context's changes before, or it was recovered (see
    /// `ContextChanges::fresh`).
    pub(in crate::index) persisted: bool,
    /// Buffers `apply` reuses from batch to batch (see [`ApplyScratch`]).
    scratch: ApplyScratch,
    /// The memory budget's state, when the context has one (see `evict`).
    bounded: Option<evict::Bounded>,
}

impl ContextIndex {
    /// A context whose derived keys are made with the default tuning (a new store's).
    pub fn new(key: ContextKey, profile: HashProfile) -> Self {
        Self::tuned(key, profile, ChainTuning::DEFAULT)
    }

    /// A context whose derived keys are made with `tuning`: its store's (see [`ChainTuning`]).
    pub fn tuned(key: ContextKey, profile: HashProfile, tuning: ChainTuning) -> Self {
        let shared = Shared {
            key,
            profile,
            tuning,
            table: Table::new(),
            meta: MetaLock::default(),
            blocks: CacheLine(AtomicU64::new(0)),
            holder_blocks: CacheLine(AtomicU64::new(0)),
            invalid_ops: CacheLine(AtomicU64::new(0)),
            aliases: Default::default(),
            raw_pairs: CacheLine(AtomicU64::new(0)),
            unlinked: CacheLine(AtomicU64::new(0)),
            evicted: CacheLine(AtomicU64::new(0)),
        };
        ContextIndex {
            shared: Arc::new(shared),
            holders: Vec::new(),
            holder_ids: HashMap::new(),
            by_source: HashMap::new(),
            free_ids: FreeIds::default(),
            holders_gone: Vec::new(),
            on_disk: persist::OnDisk::new_context(),
            attached: HashMap::new(),
            dirty: Vec::new(),
            watermarks: HashMap::new(),
            alias_dirty: Vec::new(),
            rekey_from: 0,
            next_alias_sweep: 0,
            alias_sweeps: 0,
            persisted: false,
            scratch: ApplyScratch::default(),
            bounded: None,
        }
    }

    pub fn key(&self) -> &ContextKey {
        &self.shared.key
    }

    pub fn profile(&self) -> &HashProfile {
        &self.shared.profile
    }

    /// A read handle sharing this index; valid for as long as any clone lives.
    pub fn reader(&self) -> IndexReader {
        IndexReader {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Apply one batch of ops from one source, in order.
    pub fn apply(&mut self, batch: &IndexBatch) -> ApplyReport {
        let mut report = ApplyReport::default();
        // Stores commute with each other (they only set bits), so consecutive Store ops are
        // gathered and applied grouped by shard; any other op first applies what was gathered.
        let mut scratch = std::mem::take(&mut self.scratch);
        let ApplyScratch {
            run,
            removal,
            keys,
            derived,
        } = &mut scratch;
        let mut seen = SeenHolders::default();
        run.track = self.tracks_order();
        self.rekey_from = self.alias_dirty.len();
        // The first chained store's parent is the one alias lookup of a batch that nothing
        // prefetched (later ones find the store before them gathered): its line comes in while
        // the holder is looked up.
        let first_parent = batch.ops.iter().find_map(|op| match op {
            IndexOp::StoreChained { contents, .. } => contents.parent,
            _ => None,
        });
        if let Some(parent) = first_parent {
            self.shared.aliases.prefetch(std::iter::once(parent.0));
        }
        for op in &batch.ops {
            match op {
                IndexOp::Store {
                    holder,
                    tier,
                    hashes,
                }
                | IndexOp::StoreChained {
                    holder,
                    tier,
                    hashes,
                    ..
                }
                | IndexOp::StoreAliased {
                    holder,
                    tier,
                    hashes,
                }
                | IndexOp::StoreSparse {
                    holder,
                    tier,
                    hashes,
                    ..
                } => {
                    let Some(id) =
                        self.store_holder(&batch.source, holder, *tier, &mut report, &mut seen)
                    else {
                        continue;
                    };
                    let keyed = keying::store_keys(
                        op,
                        KeyOut {
                            aliases: &self.shared.aliases,
                            pending: &mut run.aliases,
                            changed: &mut self.alias_dirty,
                            keys,
                            derived,
                            tuning: self.shared.tuning,
                        },
                    );
                    // One key per block stored (a sparse store's present blocks only).
                    report.stored += keys.len() as u64;
                    report.translated += keyed.translated;
                    report.unlinked += keyed.unlinked;
                    let parent = match op {
                        IndexOp::StoreChained { contents, .. }
                        | IndexOp::StoreSparse { contents, .. } => contents.parent.map(|p| p.0),
                        _ => None,
                    };
                    let mark = (hashes.last().map(|h| h.0), parent);
                    report.repeated += self.gather(run, id, *tier, keys, mark);
                }
                IndexOp::Remove {
                    holder,
                    tier,
                    hashes,
                } => {
                    if !tier_allowed(holder, *tier) {
                        report.invalid_ops += 1;
                        continue;
                    }
                    report.removed += hashes.len() as u64;
                    report.repeated += self.store_run(run);
                    if let Some(id) = self.known_holder(&batch.source, holder, &mut seen) {
                        self.removal_keys(id, tier_bit(*tier), hashes, removal);
                        report.repeated_removes += self.remove(id, tier_bit(*tier), &removal.1);
                    }
                }
                IndexOp::ClearHolder { holder } => {
                    report.repeated += self.store_run(run);
                    for id in self.cleared_holders(&batch.source, holder) {
                        report.cleared += self.clear_holder(id);
                    }
                }
                IndexOp::GroupKind { holder, kind } => {
                    // Only an engine's groups have kinds; the holder is made (and its rank
                    // listed) as by a store, so the kind is known before its first block.
                    if !matches!(holder, Holder::Engine { .. }) {
                        report.invalid_ops += 1;
                        continue;
                    }
                    if let Some(id) = self.store_holder(
                        &batch.source,
                        holder,
                        Tier::Device,
                        &mut report,
                        &mut seen,
                    ) {
                        self.set_group_kind(id, *kind);
                    }
                }
            }
        }
        report.repeated += self.store_run(run);
        scratch.trim();
        self.scratch = scratch;
        if report.invalid_ops > 0 {
            self.shared
                .invalid_ops
                .fetch_add(report.invalid_ops, Ordering::Relaxed);
        }
        if report.unlinked > 0 {
            self.shared
                .unlinked
                .fetch_add(report.unlinked, Ordering::Relaxed);
        }
        if report.translated > 0 {
            self.sweep_aliases();
        }
        if self.bounded.is_some() {
            self.enforce_budget();
        }
        report
    }

    /// The holder id a store op of `holder` into `tier` goes to, after the checks every store
    /// makes (tier allowed, holder table not full; an engine rank gets listed). `None` when the
    /// op is refused (counted in `report`).
    fn store_holder<'b>(
        &mut self,
        source: &SubscriptionKey,
        holder: &'b Holder,
        tier: Tier,
        report: &mut ApplyReport,
        seen: &mut SeenHolders<'b>,
    ) -> Option<u32> {
        if !tier_allowed(holder, tier) {
            report.invalid_ops += 1;
            return None;
        }
        if let Some(id) = SeenHolders::find(&seen.stored, holder) {
            // Listed and interned by an earlier store of this batch.
            return Some(id);
        }
        if let Holder::Engine {
            instance_id,
            dp_rank,
            ..
        } = holder
        {
            self.attach_rank(source, instance_id, *dp_rank);
        }
        let id = self.intern(source, holder);
        match id {
            Some(id) => seen.stored.push((holder, id)),
            None => report.invalid_ops += 1,
        }
        id
    }

    /// The id of a holder this context already knows, without cloning its key for holders an
    /// earlier op of the batch named (engines send one removal per block).
    fn known_holder<'b>(
        &self,
        source: &SubscriptionKey,
        holder: &'b Holder,
        seen: &mut SeenHolders<'b>,
    ) -> Option<u32> {
        if let Some(id) = SeenHolders::find(&seen.stored, holder)
            .or_else(|| SeenHolders::find(&seen.known, holder))
        {
            return Some(id);
        }
        let id = self.listed_holder(source, holder).or_else(|| {
            let key = HolderKey {
                source: source.clone(),
                holder: holder.clone(),
            };
            self.holder_ids.get(&key).copied()
        })?;
        seen.known.push((holder, id));
        Some(id)
    }

    /// Queue stores of `keys` (table key, whether it is a published hash) for holder `id`,
    /// applying the queue first when it would grow past [`RUN_MAX`]; returns the repeats that
    /// flush counted. The keys' slot lines are prefetched here, so that they have arrived when
    /// the run is applied after the rest of the batch was keyed.
    /// `mark` is the op's last published hash and the parent it named (for the eviction order).
    fn gather(
        &mut self,
        run: &mut StoreRun,
        id: u32,
        tier: Tier,
        keys: &[(u64, bool)],
        (last, parent): (Option<u64>, Option<u64>),
    ) -> u64 {
        let bit = tier_bit(tier);
        let mut repeated = 0;
        if run.items.len() + keys.len() > RUN_MAX {
            repeated += self.store_run(run);
        }
        run.mark_op(last, parent);
        let table = &self.shared.table;
        // Hints only; registered as a reader so the arrays they look at stay while they do.
        let reading = table.reading();
        run.find_records(table, &reading);
        run.items.extend(keys.iter().map(|&(key, raw)| {
            // Located once: the slot hash picks the shard and the slot of every later step.
            let at = table.locate(key);
            table.prefetch(&reading, at);
            RunItem { at, id, bit, raw }
        }));
        repeated
    }

    /// Drop aliases whose block no holder keeps, once they outnumber the blocks (amortized O(1)
    /// per alias added).
    ///
    /// The next sweep waits until the aliases have doubled again, whatever the sweep left: many
    /// published hashes can name one live block (hashes of one content under several recipes,
    /// or a publisher that varies what it hashes), and a sweep that keeps them all must not run
    /// again on the next batch.
    fn sweep_aliases(&mut self) {
        let blocks = self.shared.blocks.load(Ordering::Relaxed) as usize;
        let aliases = self.shared.aliases.len();
        if aliases <= self.next_alias_sweep.max(2 * blocks + ALIAS_SLACK) {
            return;
        }
        let table = &self.shared.table;
        self.shared
            .aliases
            .retain(|_, key| table.contains(key), &mut self.alias_dirty);
        self.alias_sweeps += 1;
        self.next_alias_sweep = 2 * self.shared.aliases.len() + ALIAS_SLACK;
    }

    /// List `(instance_id, dp_rank)` on behalf of `source` (a registration, or an engine source
    /// feeding this context). Idempotent.
    pub fn attach_rank(&mut self, source: &SubscriptionKey, instance_id: &str, dp_rank: u32) {
        // Every batch of an engine source lists its rank: look before cloning the key.
        let listed =
            |list: &Vec<(String, u32)>| list.iter().any(|(i, r)| i == instance_id && *r == dp_rank);
        if self.attached.get(source).is_some_and(listed) {
            return;
        }
        let list = self.attached.entry(source.clone()).or_default();
        list.push((instance_id.to_owned(), dp_rank));
        self.on_disk.attachments_changed = true;
        let mut meta = self.shared.meta.write();
        let entry = meta
            .ranks
            .entry(instance_id.to_owned())
            .or_default()
            .entry(dp_rank)
            .or_default();
        entry.attached_by.insert(source.clone());
    }

    /// Remove every block `source` holds, in every tier; its ranks stay listed. Returns the
    /// (block, holder) pairs removed.
    pub fn drop_source(&mut self, source: &SubscriptionKey) -> u64 {
        // What follows from this source is a new stream: forget its position.
        self.watermarks.remove(source);
        let ids = self.by_source.get(source).cloned().unwrap_or_default();
        ids.into_iter().map(|id| self.clear_holder(id)).sum()
    }

    /// [`Self::drop_source`], unlist every rank the source listed and reclaim its holders: the
    /// source no longer feeds this context. Returns the pairs removed.
    pub fn detach_source(&mut self, source: &SubscriptionKey) -> u64 {
        let removed = self.drop_source(source);
        if self.shared.meta.read().sources.contains(source) {
            self.shared.meta.write().sources.remove(source);
        }
        if let Some(list) = self.attached.remove(source) {
            self.on_disk.attachments_changed = true;
            let mut meta = self.shared.meta.write();
            for (instance, rank) in list {
                if let Some(ranks) = meta.ranks.get_mut(&instance) {
                    if let Some(entry) = ranks.get_mut(&rank) {
                        entry.attached_by.remove(source);
                        if !entry.listed() && entry.holders.is_empty() {
                            ranks.remove(&rank);
                        }
                    }
                    if ranks.is_empty() {
                        meta.ranks.remove(&instance);
                    }
                }
            }
        }
        self.reclaim_source(source);
        removed
    }

    /// No block left and no rank listed: the owner may delete this context.
    pub fn is_empty_and_detached(&self) -> bool {
        self.shared.blocks.load(Ordering::Relaxed) == 0
            && !self.shared.meta.read().has_listed_rank()
    }

    /// Distinct blocks held in any tier.
    pub fn prefix_count(&self) -> u64 {
        self.shared.blocks.load(Ordering::Relaxed)
    }

    pub fn instances(&self) -> std::collections::BTreeMap<String, std::collections::BTreeSet<u32>> {
        self.shared.meta.read().instances()
    }

    pub fn query<K: PrefixKeys + ?Sized>(
        &self,
        keys: &mut K,
        instance_filter: Option<&str>,
    ) -> QueryHits {
        query::walk(&self.shared, keys, instance_filter)
    }

    pub fn view(&self) -> ContextView {
        self.reader().view()
    }

    pub fn stats(&self) -> IndexStats {
        self.reader().stats()
    }

    /// Every (source, instance, rank) listing, sorted.
    pub(in crate::index) fn attachments(&self) -> Vec<Attachment> {
        let mut all: Vec<Attachment> = self
            .attached
            .iter()
            .flat_map(|(s, list)| {
                list.iter().map(move |(i, r)| Attachment {
                    source: s.clone(),
                    instance_id: i.clone(),
                    dp_rank: *r,
                })
            })
            .collect();
        all.sort();
        all
    }

    /// Announcements of tier `bit` of holder `id` on block `key`: 0 when not held.
    #[cfg(test)]
    pub(in crate::index) fn announcements(&self, id: u32, key: u64, bit: u8) -> u32 {
        let Some(state) = self.holders.get(id as usize) else {
            return 0;
        };
        if self.shared.table.read(key).holder_bits(key, id) & bit == 0 {
            return 0;
        }
        1 + state.repeats.get(&(key, bit)).copied().unwrap_or(0)
    }

    /// Apply the gathered stores (see [`store_run::apply`]) and count what they added, then move
    /// the blocks kept under hashes that gained an alias meanwhile to their derived keys (before
    /// any later op of the batch names them). Returns how many were repeats (counted, see
    /// [`HolderState::repeats`]).
    fn store_run(&mut self, run: &mut StoreRun) -> u64 {
        let added = store_run::apply(
            &self.shared.table,
            (&self.shared.aliases, &mut self.alias_dirty),
            &mut self.holders,
            &mut self.dirty,
            run,
        );
        let shared = &self.shared;
        shared.blocks.fetch_add(added.blocks, Ordering::Relaxed);
        shared
            .holder_blocks
            .fetch_add(added.pairs, Ordering::Relaxed);
        shared
            .raw_pairs
            .fetch_add(added.raw_pairs, Ordering::Relaxed);
        self.order_new_runs(run);
        self.rekey_new_aliases();
        added.repeats
    }
}

/// Aliases beyond twice the block count before a sweep (keeps small contexts from sweeping).
const ALIAS_SLACK: usize = 4096;

/// Holder ids one batch (all of one source) already looked up: `stored`, holders a store of
/// this batch listed and interned; `known`, holders a removal or clear found. Only the first
/// spares a later store its listing (a holder can outlive its rank's listing).
#[derive(Default)]
struct SeenHolders<'b> {
    stored: Vec<(&'b Holder, u32)>,
    known: Vec<(&'b Holder, u32)>,
}

impl SeenHolders<'_> {
    fn find(list: &[(&Holder, u32)], holder: &Holder) -> Option<u32> {
        list.iter().find(|(h, _)| *h == holder).map(|&(_, id)| id)
    }
}

/// What [`ContextIndex::apply`] gathers into, kept between batches: engines send a message of a
/// few dozen blocks at a time, and allocating these per batch was about a tenth of apply's time
/// (malloc and free of the run's four vectors, the keys of each op, the removal buffers).
#[derive(Default)]
struct ApplyScratch {
    run: StoreRun,
    removal: RemovalScratch,
    /// One store op's table keys.
    keys: Vec<(u64, bool)>,
    /// One chained store's derived keys.
    derived: Vec<u64>,
}

/// Items of capacity [`ApplyScratch::trim`] leaves a context after a batch: a batch of a few
/// messages fits, while one huge batch does not keep its buffers for the context's lifetime.
const SCRATCH_KEEP: usize = 1024;

impl ApplyScratch {
    fn trim(&mut self) {
        if self.run.capacity() > SCRATCH_KEEP
            || self.keys.capacity() > SCRATCH_KEEP
            || self.removal.1.capacity() > SCRATCH_KEEP
        {
            *self = ApplyScratch::default();
        }
    }
}

/// Engines hold device, cpu_local and rank-local disk; a store backend holds cpu_share and
/// shared disk.
fn tier_allowed(holder: &Holder, tier: Tier) -> bool {
    let allowed = match holder {
        Holder::Engine { .. } => ENGINE_TIERS,
        Holder::Shared { .. } => SHARED_TIERS,
    };
    allowed & tier_bit(tier) != 0
}

// The tier constants are part of this module's vocabulary for readers of `tier_allowed`.
const _: () =
    assert!(ENGINE_TIERS == DEVICE | CPU_LOCAL | DISK && SHARED_TIERS == CPU_SHARE | DISK);
