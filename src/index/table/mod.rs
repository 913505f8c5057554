//! The block table: 64-bit block key → compact set of (holder id, tier bits), split into 64
//! shards. Each shard sits behind its own `std::sync::RwLock`, which its writer and the locked
//! readers (snapshots, checkpoints, the writer's own look-ups) take; the query walk reads
//! shards without any lock, through each shard's sequence lock ([`view`]), and retries a read
//! a write overlapped.
//!
//! A shard keeps its blocks in [`blocks::Blocks`] (dense records found through an open-addressing
//! index). A block's holder set is the record's 32-bit value:
//! - one holder (the common case: a block held by one rank): the value is its entry,
//!   `holder_id << 4 | tier_bits`, whose tier bits are never 0;
//! - two or more holders: the low 4 bits are 0 and the value names an interned set of the
//!   context ([`sets`]): every block with the same entries has the same value, so a query walk
//!   that sees the value of the previous block again knows every holder's tiers are unchanged.
//!
//! So a live block's value is never 0. Empty holder sets are never kept: the last removed entry
//! removes the block.
//!
//! A block's record index never changes while the block lives, so [`Table`] hands out a
//! [`BlockRef`] (shard and record in 32 bits) for the holders' reverse lists. Once the block is
//! removed its record may be reused by another block: users check that the holder still has an
//! entry there ([`Table::held_key`]) rather than trusting an old reference.
//!
//! Lock order: a shard lock, then the sets' writer mutex, then the set lists' lock; nobody takes
//! a shard lock while holding the lists' lock. The writer may keep the sets' writer mutex across
//! the shard locks of one store run or removal ([`Table::writer`]): only the context's single
//! writer ever takes that mutex (a fill takes it before the context is shared), so no other
//! thread can hold it while waiting for a shard lock.

#[cfg(test)]
mod add_hint_tests;
mod arena;
mod blocks;
#[cfg(test)]
mod blocks_tests;
mod fill;
#[cfg(test)]
mod hint_tests;
mod prefetch;
#[cfg(test)]
mod ref_tests;
#[allow(unsafe_code)] // The lock-free read protocol (see the file).
mod seqlock;
mod set_index;
#[cfg(test)]
mod set_tests;
mod sets;
#[cfg(test)]
mod view_tests;
/// The atomics `seqlock` is written against: std's here, loom's in the loom model.
mod sync {
    pub(super) use std::hint::spin_loop;
    pub(super) use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence};
    pub(super) use std::thread::yield_now;
}
#[allow(unsafe_code)] // Calls into `seqlock`'s reads (see the file).
mod view;

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::model::Tier;

use blocks::{Arrays, Blocks, IDX_BITS, NO_RECORD, Probe};
pub(crate) use prefetch::prefetch as prefetch_line;
pub(crate) use sets::is_inline;
use sets::{SetWriter, Sets};
pub(crate) use view::Reading;
use view::{ShardView, ShardWrite};

pub(crate) const DEVICE: u8 = 1;
pub(crate) const CPU_LOCAL: u8 = 2;
pub(crate) const CPU_SHARE: u8 = 4;
pub(crate) const DISK: u8 = 8;
pub(crate) const ALL_TIERS: u8 = DEVICE | CPU_LOCAL | CPU_SHARE | DISK;

/// Tier bits an engine (instance, rank) holder may carry.
pub(crate) const ENGINE_TIERS: u8 = DEVICE | CPU_LOCAL | DISK;
/// Tier bits a shared (Mooncake backend) holder may carry.
pub(crate) const SHARED_TIERS: u8 = CPU_SHARE | DISK;

/// Holder ids must fit the 28 bits above the tier bits of an entry.
pub(crate) const MAX_HOLDERS: usize = 1 << 28;

/// log2 of the shard count. 64 shards keep concurrent readers of one hot context off each other's
/// lock cache lines while costing a few KiB per context.
pub(crate) const SHARD_BITS: u32 = 6;
pub(crate) const SHARDS: usize = 1 << SHARD_BITS;

// A derived key names its shard in its top bits (`hashing::derived::link`).
const _: () = assert!(crate::hashing::derived::SHARD_BITS == SHARD_BITS);

// A block reference is the shard number above the record index, in 32 bits.
const _: () = assert!(SHARD_BITS + IDX_BITS <= 32);

/// A block's place in the table: shard number and record index. Valid while the block lives;
/// afterwards it may name another block (see the module doc).
pub(crate) type BlockRef = u32;

pub(crate) const fn tier_bit(tier: Tier) -> u8 {
    match tier {
        Tier::Device => DEVICE,
        Tier::CpuLocal => CPU_LOCAL,
        Tier::CpuShare => CPU_SHARE,
        Tier::Disk => DISK,
    }
}

#[inline]
pub(crate) const fn entry_id(entry: u32) -> u32 {
    entry >> 4
}

#[inline]
pub(crate) const fn entry_bits(entry: u32) -> u8 {
    (entry & 0xF) as u8
}

#[inline]
pub(crate) const fn make_entry(id: u32, bits: u8) -> u32 {
    (id << 4) | (bits & ALL_TIERS) as u32
}

/// Keys are mixed before they pick a shard and a slot (see [`crate::mix`]).
pub(crate) use crate::mix::mix64;

/// A per-process random seed, so a publisher cannot aim keys at one probe cluster.
pub(crate) fn random_seed() -> u64 {
    std::hash::RandomState::new().hash_one(0x6d6f_6f6e_u64)
}

/// What an insertion changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Added {
    /// The holder had no entry on this block before.
    pub new_holder: bool,
    /// The block was absent from the table before.
    pub new_block: bool,
    /// The holder already had every one of these tier bits on this block: a repeated
    /// announcement, which the caller counts (see `ContextIndex`'s repeat counts).
    pub repeat: bool,
}

/// What a removal changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Removed {
    /// The holder's entry on this block disappeared (its last tier bit went).
    pub holder_gone: bool,
    /// The block disappeared from the table (its last holder went).
    pub block_gone: bool,
}

const KEPT: Added = Added {
    new_holder: false,
    new_block: false,
    repeat: false,
};
const REPEATED: Added = Added {
    new_holder: false,
    new_block: false,
    repeat: true,
};
/// The outcome of merging entry `new` into the same holder's entry `old`.
#[inline]
pub(super) const fn kept_or_repeated(old: u32, new: u32) -> Added {
    if entry_bits(old) & entry_bits(new) == entry_bits(new) {
        REPEATED
    } else {
        KEPT
    }
}

/// What a join that changed nothing (`to == from`) or changed the set means: a join that kept
/// the set without adding the holder found every bit already there, a repeat.
#[inline]
pub(super) const fn joined_outcome(from: u32, to: u32, joined: bool) -> Added {
    match (joined, from == to) {
        (true, _) => JOINED,
        (false, true) => REPEATED,
        (false, false) => KEPT,
    }
}

const JOINED: Added = Added {
    new_holder: true,
    new_block: false,
    repeat: false,
};
const GONE_HOLDER: Removed = Removed {
    holder_gone: true,
    block_gone: false,
};
const GONE_BLOCK: Removed = Removed {
    holder_gone: true,
    block_gone: true,
};

/// Inline value `val` with tier `bits` of holder `id` cleared; `None` when nothing is left.
fn leave_inline(val: u32, id: u32, bits: u8) -> (Option<u32>, Removed) {
    if entry_id(val) != id {
        return (Some(val), Removed::default());
    }
    match entry_bits(val) & !bits {
        0 => (None, GONE_BLOCK),
        left => (Some(make_entry(id, left)), Removed::default()),
    }
}

/// One shard of a context's blocks.
pub(crate) struct Shard {
    blocks: Blocks,
}

/// The sets' writer state, locked on first need and kept for the rest of one table call, or of
/// one store run or removal ([`Table::writer`]).
pub(crate) struct WriterSlot<'a> {
    sets: &'a Sets,
    guard: Option<MutexGuard<'a, SetWriter>>,
}

impl<'a> WriterSlot<'a> {
    fn new(sets: &'a Sets) -> Self {
        WriterSlot { sets, guard: None }
    }

    fn get(&mut self) -> &mut SetWriter {
        self.guard.get_or_insert_with(|| self.sets.writer())
    }
}

impl Drop for WriterSlot<'_> {
    /// Joins move set references lazily (see `sets`); they are all applied before the writer
    /// state is let go.
    fn drop(&mut self) {
        if let Some(w) = self.guard.as_mut() {
            self.sets.settle(w);
        }
    }
}

impl Shard {
    fn new(seed: u64) -> Self {
        Shard {
            blocks: Blocks::new(seed),
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Add tier `bits` (non-zero) for holder `id` on block `at.key` (idempotent), also returning
    /// the block's record index when it exists afterwards.
    ///
    /// `at` comes from the run's record prefetch ([`Table::locate_record`]): when its record is
    /// the block's, the probe over the slots is skipped (most stores of an engine message join
    /// a block other holders stored first); any other record, or none, falls back to the probe,
    /// which reuses the slot hash `at` carries.
    fn add_at(
        &mut self,
        w: &mut WriterSlot,
        at: Located,
        id: u32,
        bits: u8,
    ) -> (Added, Option<u32>) {
        let new = make_entry(id, bits);
        let idx = match self.blocks.hinted_record(at.key, at.record) {
            Some(idx) => idx,
            None => {
                // One probe finds the block or where it goes; growing first keeps that place
                // valid. `Table::write` made the room before the write section opened, so
                // readers never wait for a rehash; this only guards a caller that did not.
                debug_assert!(
                    self.blocks.has_room(1),
                    "room made before the write section"
                );
                self.blocks.reserve_one();
                match self.blocks.probe_hashed(at.key, at.hash) {
                    Probe::Found(_, idx) => idx,
                    vacant => {
                        // `None` only at the shard's record limit: refuse the entry, stay
                        // consistent.
                        let idx = self.blocks.insert(at.key, new, vacant);
                        let added = Added {
                            new_holder: idx.is_some(),
                            new_block: idx.is_some(),
                            repeat: false,
                        };
                        return (added, idx);
                    }
                }
            }
        };
        let val = self.blocks.val(idx);
        let (val, added) = if is_inline(val) && entry_id(val) == id {
            (val | new, kept_or_repeated(val, new))
        } else {
            let sets = w.sets;
            sets.join(w.get(), val, id, bits)
        };
        self.blocks.set_val(idx, val);
        (added, Some(idx))
    }

    /// Clear tier `bits` of holder `id` on block `key`. Idempotent; absent blocks are a no-op.
    fn remove(&mut self, w: &mut WriterSlot, key: u64, id: u32, bits: u8) -> Removed {
        match self.blocks.find(key) {
            Some((pos, idx)) => self.remove_found(w, pos, idx, id, bits),
            None => Removed::default(),
        }
    }

    fn remove_found(
        &mut self,
        w: &mut WriterSlot,
        pos: usize,
        idx: u32,
        id: u32,
        bits: u8,
    ) -> Removed {
        let val = self.blocks.val(idx);
        let (left, removed) = if is_inline(val) {
            // A single holder needs no set bookkeeping (and no writer mutex).
            leave_inline(val, id, bits)
        } else {
            let sets = w.sets;
            let (left, removed) = sets.leave(w.get(), val, id, bits);
            (Some(left), removed)
        };
        match left {
            Some(val) => self.blocks.set_val(idx, val),
            // Only an inline value empties (a set keeps one entry at least): no set to release.
            None => self.blocks.remove(pos, idx),
        }
        removed
    }

    /// The key of record `idx` when holder `id` has an entry there.
    fn held_key(&self, sets: &Sets, idx: u32, id: u32) -> Option<u64> {
        let key = self.blocks.key(idx)?;
        (sets.bits_of(self.blocks.val(idx), id) != 0).then_some(key)
    }
}

/// A shard under its read lock, with the context's sets to look its multi-holder blocks up in.
pub(crate) struct ShardRead<'a> {
    shard: RwLockReadGuard<'a, Shard>,
    sets: &'a Sets,
}

impl ShardRead<'_> {
    /// The value of block `key` (an inline entry or a set value; 0 when absent). Equal values
    /// mean equal entries while [`Self::sets_reused`] stays the same (see `sets`).
    #[inline]
    pub fn value(&self, key: u64) -> u32 {
        self.shard
            .blocks
            .find(key)
            .map_or(0, |(_, idx)| self.shard.blocks.val(idx))
    }

    /// Call `f` with every entry of block value `val` (from [`Self::value`] under this lock).
    #[inline]
    pub fn visit_value(&self, val: u32, mut f: impl FnMut(u32)) {
        if is_inline(val) {
            f(val);
        } else if val != 0 {
            self.sets.lists().entries(val).iter().copied().for_each(f);
        }
    }

    /// Call `f` with every entry of block `key`; false when the block is absent. (The walk uses
    /// [`Self::value`] and [`Self::entries_into`] to skip unchanged sets; this stays for callers
    /// that want one block's entries.)
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn visit(&self, key: u64, f: impl FnMut(u32)) -> bool {
        let val = self.value(key);
        self.visit_value(val, f);
        val != 0
    }

    /// Tier bits of holder `id` on block `key` (0 when it holds nothing there).
    pub fn holder_bits(&self, key: u64, id: u32) -> u8 {
        match self.value(key) {
            0 => 0,
            val => self.sets.bits_of(val, id),
        }
    }

    /// Every (block, entry) pair, for snapshots.
    pub fn for_each(&self, mut f: impl FnMut(u64, u32)) {
        let lists = self.sets.lists();
        self.shard.blocks.for_each(|key, val| {
            if is_inline(val) {
                f(key, val);
            } else {
                lists.entries(val).iter().for_each(|&e| f(key, e));
            }
        });
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shard.len()
    }
}

/// A block key, its slot hash (see [`Table::locate`]) and, once [`Table::locate_record`] found
/// one, the record that may hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Located {
    pub key: u64,
    hash: u64,
    record: u32,
    shard: u32,
}

impl Located {
    /// Whether this block is in `other`'s shard.
    #[inline]
    pub fn same_shard(&self, other: &Located) -> bool {
        self.shard == other.shard
    }

    /// The block `run` records after this one's, whose key is `key`: what a walk that followed
    /// those records knows of it (its shard and record; no slot hash, which it will not need).
    #[inline]
    pub fn followed(&self, run: usize, key: u64) -> Located {
        Located {
            key,
            hash: 0,
            record: self.record.saturating_add(run as u32),
            shard: self.shard,
        }
    }

    /// The record after `before`'s when `before` (the block before in a walk) is in the same
    /// shard: what a store run makes of a segment's blocks. [`NO_RECORD`] otherwise.
    #[inline]
    fn record_after(&self, before: &Located) -> u32 {
        if before.shard == self.shard && before.record != NO_RECORD {
            before.record + 1
        } else {
            NO_RECORD
        }
    }

    /// Take [`Self::record_after`] `before` as the record hint when this block has none yet.
    /// The lookup checks it like any hint.
    #[inline]
    pub fn after(&mut self, before: &Located) {
        if self.record == NO_RECORD {
            self.record = self.record_after(before);
        }
    }
}

impl Default for Located {
    fn default() -> Self {
        Located {
            key: 0,
            hash: 0,
            record: NO_RECORD,
            shard: 0,
        }
    }
}

/// The shard of a key with slot hash `h`: bits 3..9 of the hash. A shard's home slot comes from
/// the hash's top bits (multiply-shift) and the slot tag from bits 0..3, so the three never use
/// the same bits.
#[inline]
const fn shard_of_hash(h: u64) -> usize {
    (h >> 3) as usize & (SHARDS - 1)
}

/// The shard of `key` with slot hash `h`: an odd key names its own, in its top bits (every
/// derived key, see `hashing::derived::link`, and the odd half of the published hashes kept
/// raw, which are hashes too); an even key takes bits of its slot hash. A publisher that
/// chooses odd hashes with equal top bits can crowd its raw blocks into one shard: that shard
/// then refuses new blocks at its record limit (`blocks::MAX_RECORDS`, 2^25 - 1), as the whole
/// table otherwise would far later; its other blocks and shards are unaffected.
#[inline]
const fn shard_of_key(key: u64, h: u64) -> usize {
    if key & 1 == 1 {
        (key >> (64 - SHARD_BITS)) as usize
    } else {
        shard_of_hash(h)
    }
}

/// The shards of one context.
pub(crate) struct Table {
    shards: Box<[RwLock<Shard>]>,
    /// Per shard, its version and arrays for lock-free readers (see [`view`]).
    views: Box<[ShardView]>,
    /// Lock-free readers in flight (see [`view`]).
    readers: AtomicUsize,
    /// A panic unwound through a write section: no block is answered (see [`view`]).
    broken: AtomicBool,
    slot_seed: u64,
    sets: Sets,
}

impl Table {
    pub fn new() -> Self {
        let slot_seed = random_seed();
        let shards: Box<[RwLock<Shard>]> = (0..1u32 << SHARD_BITS)
            .map(|_| RwLock::new(Shard::new(slot_seed)))
            .collect();
        let views = shards
            .iter()
            .map(|s| ShardView::new(read_lock(s).blocks.arrays_ptr()))
            .collect();
        Table {
            shards,
            views,
            readers: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
            slot_seed,
            sets: Sets::new(mix64(slot_seed ^ 0x2545_f491)),
        }
    }

    /// The shard of `key`, below [`SHARDS`].
    #[inline]
    pub fn shard_no(&self, key: u64) -> usize {
        shard_of_key(key, blocks::slot_hash(key, self.slot_seed))
    }

    #[inline]
    fn shard_of(&self, key: u64) -> &RwLock<Shard> {
        &self.shards[self.shard_no(key)]
    }

    /// The shard number and record index behind `r`.
    #[inline]
    fn resolve(&self, r: BlockRef) -> (usize, u32) {
        let shard = (r >> IDX_BITS) as usize & ((1 << SHARD_BITS) - 1);
        (shard, r & ((1 << IDX_BITS) - 1))
    }

    /// Register a lock-free reader (the query walk) for the lifetime of the guard: the
    /// [`Self::lookup`] family needs one.
    #[inline]
    pub fn reading(&self) -> Reading<'_> {
        Reading::new(&self.readers)
    }

    /// Shard `shard`'s view for `reading`, which must be this table's: another table's
    /// `Reading` would not keep this table's replaced arrays alive. `None` for a shard out of
    /// range, or once the table is broken (see [`view`]).
    #[inline(always)]
    fn view(&self, reading: &Reading<'_>, shard: u32) -> Option<&ShardView> {
        assert!(
            reading.is_of(&self.readers),
            "a block table read with another table's Reading"
        );
        if self.broken.load(Ordering::Relaxed) {
            return None;
        }
        self.views.get(shard as usize)
    }

    /// Without a lock (see [`view`]): the value of block `key` (0 when absent) and the sets'
    /// reuse count read with it, as one consistent read. When `wants(value, reused)` says so,
    /// `out` is cleared and given the value's entries sorted by holder id, in the same read.
    ///
    /// `at`'s record becomes the one that held the key ([`NO_RECORD`] when absent), so that
    /// the walk can guess the next block's record from it ([`Located::after`]).
    #[inline]
    pub fn lookup(
        &self,
        reading: &Reading<'_>,
        at: &mut Located,
        mut wants: impl FnMut(u32, u64) -> bool,
        out: &mut Vec<u32>,
    ) -> (u32, u64) {
        let Some(view) = self.view(reading, at.shard) else {
            return (0, 0);
        };
        view.read(reading, |arrays| {
            let mut record = at.record;
            let val = arrays.value_at_hinted(self.slot_seed, at.key, at.hash, &mut record);
            at.record = record;
            let reused = self.sets.reused();
            if wants(val, reused) {
                out.clear();
                // Inside the validated read: while the block keeps this value, its set cannot
                // be freed, so the entries are the value's.
                if is_inline(val) {
                    out.push(val);
                } else if val != 0 {
                    out.extend_from_slice(self.sets.lists().entries(val));
                }
            }
            (val, reused)
        })
    }

    /// Bring the cache line of `key`'s home slot in (see [`prefetch`]): for a walk that looks
    /// `key` up a few blocks later.
    #[inline]
    pub fn prefetch(&self, reading: &Reading<'_>, at: Located) {
        if let Some(view) = self.view(reading, at.shard) {
            view.arrays(reading).prefetch_slot(at.hash);
        }
    }

    /// Bring the cache line of `key`'s record in, once its slot line is (see [`prefetch`]).
    #[inline]
    pub fn prefetch_record(&self, reading: &Reading<'_>, mut at: Located) {
        self.locate_record(reading, &mut at);
    }

    /// [`Self::prefetch_record`], keeping in `at` which record that was, so that
    /// [`Self::lookup`] reads it without probing the slots a second time.
    ///
    /// Why: on a table in the caches the second probe was most of a walk step; dropping the
    /// record prefetch instead took a 1M-token full hit by keys 2.3 -> 1.4 ms but made walks
    /// over a table out of the caches up to 1.5x slower. A hint is only ever a shortcut: the
    /// lookup takes it when the record holds the key, and probes otherwise.
    #[inline]
    pub fn locate_record(&self, reading: &Reading<'_>, at: &mut Located) {
        if let Some(view) = self.view(reading, at.shard) {
            at.record = view.arrays(reading).prefetch_record(at.hash);
        }
    }

    /// [`Self::locate_record`] for the block a walk looks up after `before`: first the record
    /// after `before`'s, which is the block's record when the two were stored in one run into
    /// one shard (a chain's blocks share a shard for a segment, see
    /// [`crate::hashing::derived::link`], and a run takes records in order), read without
    /// touching the slots. True when that record was the block's.
    #[inline]
    pub fn locate_record_after(
        &self,
        reading: &Reading<'_>,
        at: &mut Located,
        before: &Located,
    ) -> bool {
        self.record_after_or(reading, at, before, |arrays, at| {
            at.record = arrays.prefetch_record(at.hash);
        })
    }

    /// For a block in its predecessor's shard, whose slot line the walk did not prefetch (see
    /// "Segments" in `src/index/README.md`): take the record after `before`'s when it holds the
    /// block, else bring the slot line in for the lookup a few steps on. True when the record
    /// was taken.
    #[inline]
    pub fn guess_record_after(
        &self,
        reading: &Reading<'_>,
        at: &mut Located,
        before: &Located,
    ) -> bool {
        self.record_after_or(reading, at, before, |arrays, at| {
            arrays.prefetch_slot(at.hash)
        })
    }

    /// Take the record after `before`'s as `at`'s when it holds the block, else call
    /// `otherwise`. True when the record was taken.
    #[inline(always)]
    fn record_after_or(
        &self,
        reading: &Reading<'_>,
        at: &mut Located,
        before: &Located,
        otherwise: impl FnOnce(&Arrays, &mut Located),
    ) -> bool {
        let Some(view) = self.view(reading, at.shard) else {
            return false;
        };
        let arrays = view.arrays(reading);
        let next = at.record_after(before);
        if arrays.live_val(next, at.key) != 0 {
            at.record = next;
            return true;
        }
        otherwise(arrays, at);
        false
    }

    /// Without a lock: how many of `keys` (the blocks after `at`'s, in order) are held, with
    /// the value `at` has (`held`: that value and the sets' reuse count read with it), in the
    /// records right after `at`'s, in one validated read of its shard. Those blocks are held
    /// exactly as `at`'s block, as if each were looked up: a record that holds a key with a
    /// live value is that block's record, and an equal set value means the same entries while
    /// no set was reused.
    #[inline]
    pub fn follow(
        &self,
        reading: &Reading<'_>,
        at: &Located,
        held: (u32, u64),
        keys: &[crate::model::BlockHash],
    ) -> usize {
        let (val, reused) = held;
        let Some(view) = self.view(reading, at.shard) else {
            return 0;
        };
        if at.record == NO_RECORD || val == 0 {
            return 0;
        }
        view.read(reading, |arrays| {
            if !is_inline(val) && self.sets.reused() != reused {
                return 0;
            }
            arrays.follow(at.record, val, keys)
        })
    }

    /// `key` with its slot hash, which picks its shard and its slot: computed once for the
    /// prefetches and the lookup of one block.
    #[inline]
    pub fn locate(&self, key: u64) -> Located {
        let hash = blocks::slot_hash(key, self.slot_seed);
        Located {
            key,
            hash,
            record: NO_RECORD,
            shard: shard_of_key(key, hash) as u32,
        }
    }

    /// Shard `shard` under its write lock, inside a write section of its view, with room for
    /// `room` more blocks made *before* the section opens: a growth builds the new arrays while
    /// readers still read the old ones, which nothing changes meanwhile (this lock excludes every
    /// other writer), so the section only publishes the new pointer and readers never wait for
    /// a rehash.
    fn write(&self, shard: usize, room: usize) -> ShardWrite<'_> {
        let mut guard = write_lock(&self.shards[shard]);
        if room > 0 {
            guard.blocks.reserve(room);
        }
        let view = &self.views[shard];
        view.begin_write();
        ShardWrite {
            guard,
            view,
            readers: &self.readers,
            broken: &self.broken,
        }
    }

    #[inline]
    pub fn read(&self, key: u64) -> ShardRead<'_> {
        ShardRead {
            shard: read_lock(self.shard_of(key)),
            sets: &self.sets,
        }
    }

    /// The sets' writer state for a series of [`Self::add_each`] or [`Self::remove_with`]
    /// calls: locked on first need and kept until dropped. Why: nearly every store of an engine
    /// message joins a block other holders have, and its items fall one or two per shard, so
    /// locking the mutex per shard group was one lock per store.
    pub fn writer(&self) -> WriterSlot<'_> {
        WriterSlot::new(&self.sets)
    }

    /// Add tier `bits` for holder `id` on block `at.key` for each item of shard `shard`, in
    /// order, under one lock; `store` tells an item's (located block, holder id, tier bits).
    /// `f` sees each item with its outcome and, when the holder joined the block, the reference
    /// that goes into its reverse list. `w` is from [`Self::writer`] of this table. A record
    /// hint in `at` ([`Self::locate_record`]) spares an existing block its probe.
    pub fn add_each<T: Copy>(
        &self,
        w: &mut WriterSlot<'_>,
        shard: usize,
        items: &[T],
        store: impl Fn(T) -> (Located, u32, u8),
        mut f: impl FnMut(T, Added, Option<BlockRef>),
    ) {
        if shard >= self.shards.len() {
            return;
        }
        let mut guard = self.write(shard, items.len());
        for &item in items {
            let (at, id, bits) = store(item);
            let (added, idx) = guard.add_at(w, at, id, bits);
            let r = idx
                .filter(|_| added.new_holder)
                .map(|idx| (shard as u32) << IDX_BITS | idx);
            f(item, added, r);
        }
    }

    /// [`Self::add_each`] of (block key, holder id, tier bits) items, without record hints.
    #[cfg(test)]
    pub fn add_group(
        &self,
        w: &mut WriterSlot<'_>,
        shard: usize,
        items: &[(u64, u32, u8)],
        f: impl FnMut((u64, u32, u8), Added, Option<BlockRef>),
    ) {
        let store = |(key, id, bits)| (self.locate(key), id, bits);
        self.add_each(w, shard, items, store, f);
    }

    /// The shard of a located block, below [`SHARDS`] (as [`Self::shard_no`] of its key).
    #[inline]
    pub fn shard_at(&self, at: Located) -> usize {
        at.shard as usize
    }

    /// Whether any holder keeps block `key`.
    pub fn contains(&self, key: u64) -> bool {
        self.read(key).visit(key, |_| {})
    }

    /// Clear tier `bits` of holder `id` on block `key` under the block's shard lock. Idempotent;
    /// absent blocks are a no-op.
    #[cfg(test)]
    pub fn remove(&self, key: u64, id: u32, bits: u8) -> Removed {
        self.remove_with(&mut self.writer(), key, id, bits)
    }

    /// [`Self::remove`] with the sets' writer state of a series of calls ([`Self::writer`]).
    #[inline]
    pub fn remove_with(&self, w: &mut WriterSlot<'_>, key: u64, id: u32, bits: u8) -> Removed {
        self.write(self.shard_no(key), 0).remove(w, key, id, bits)
    }

    /// The key of the block behind `r` when holder `id` has an entry there.
    pub fn held_key(&self, r: BlockRef, id: u32) -> Option<u64> {
        let (shard, idx) = self.resolve(r);
        read_lock(&self.shards[shard]).held_key(&self.sets, idx, id)
    }

    /// Remove every tier of holder `id` from the block behind `r`; the block's key and what
    /// changed, or `None` when the holder has no entry there (a stale reference).
    pub fn clear_at(&self, r: BlockRef, id: u32) -> Option<(u64, Removed)> {
        let (shard, idx) = self.resolve(r);
        let mut shard = self.write(shard, 0);
        let key = shard.held_key(&self.sets, idx, id)?;
        let (pos, found) = shard.blocks.find(key)?;
        debug_assert_eq!(found, idx);
        let mut w = WriterSlot::new(&self.sets);
        Some((key, shard.remove_found(&mut w, pos, found, id, ALL_TIERS)))
    }

    pub fn shards(&self) -> impl Iterator<Item = ShardRead<'_>> {
        self.shards.iter().map(|s| ShardRead {
            shard: read_lock(s),
            sets: &self.sets,
        })
    }

    /// True when no shard or set lock is held by anyone (tests check that key hashing runs
    /// unlocked).
    #[cfg(test)]
    pub fn all_unlocked(&self) -> bool {
        self.shards.iter().all(|s| s.try_write().is_ok()) && self.sets.unlocked()
    }
}

/// A poisoned lock means another thread panicked while holding it. A shard's writer may then
/// have left it half-changed: the panic marked the table broken on its way out of the write
/// section (see [`view`]), and lock-free reads answer nothing from then on; the locked paths
/// (reverse lists, exports) go on rather than cascade the panic.
pub(crate) fn read_lock<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn write_lock<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}
