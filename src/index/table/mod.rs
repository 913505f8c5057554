//! The block table: 64-bit block key → compact set of (holder id, tier bits), split into shards
//! that each sit behind their own `std::sync::RwLock`.
//!
//! A shard keeps its blocks in [`blocks::Blocks`] (dense records found through an open-addressing
//! index). A block's holder set is the record's 32-bit value:
//! - one holder (the common case: a block held by one rank): the value is its entry,
//!   `holder_id << 4 | tier_bits`, whose tier bits are never 0;
//! - two or more holders: the low 4 bits are 0 and `value >> 4` is one more than the offset of
//!   the entry list in the shard's [`arena::Arena`].
//!
//! So a live block's value is never 0. Empty holder sets are never kept: the last removed entry
//! removes the block.
//!
//! A block's record index never changes while the block lives, so [`Table`] hands out a
//! [`BlockRef`] (shard and record in 32 bits) for the holders' reverse lists. Once the block is
//! removed its record may be reused by another block: users check that the holder still has an
//! entry there ([`Table::held_key`]) rather than trusting an old reference.

mod arena;
mod blocks;
#[cfg(test)]
mod ref_tests;

use std::hash::BuildHasher;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::model::Tier;

use arena::Arena;
#[cfg(test)]
use arena::MIN_CLASS;
use blocks::{Blocks, IDX_BITS, Probe};

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
const fn make_entry(id: u32, bits: u8) -> u32 {
    (id << 4) | (bits & ALL_TIERS) as u32
}

#[inline]
const fn is_inline(val: u32) -> bool {
    val & 0xF != 0
}

/// The value naming arena list `off` (below `arena::MAX_WORDS`, so this never overflows).
#[inline]
const fn spilled(off: u32) -> u32 {
    (off + 1) << 4
}

#[inline]
const fn spill_offset(val: u32) -> u32 {
    (val >> 4).wrapping_sub(1)
}

/// The splitmix64 finalizer: a bijective mix, so distinct keys never collide after mixing and
/// sequential or adversarially structured keys still spread over shards and slots.
#[inline]
pub(crate) const fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

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

/// The outcome of merging entry `new` into the same holder's entry `old`.
#[inline]
const fn kept_or_repeated(old: u32, new: u32) -> Added {
    if entry_bits(old) & entry_bits(new) == entry_bits(new) {
        REPEATED
    } else {
        KEPT
    }
}

/// One shard of a context's blocks.
pub(crate) struct Shard {
    blocks: Blocks,
    arena: Arena,
}

impl Shard {
    pub fn new(seed: u64) -> Self {
        Shard {
            blocks: Blocks::new(seed),
            arena: Arena::default(),
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    #[inline]
    fn visit_val(&self, val: u32, mut f: impl FnMut(u32)) {
        if is_inline(val) {
            f(val);
        } else {
            self.arena
                .list(spill_offset(val))
                .iter()
                .copied()
                .for_each(f);
        }
    }

    /// Call `f` with every entry of block `key`; false when the block is absent.
    #[inline]
    pub fn visit(&self, key: u64, f: impl FnMut(u32)) -> bool {
        let Some((_, idx)) = self.blocks.find(key) else {
            return false;
        };
        self.visit_val(self.blocks.val(idx), f);
        true
    }

    fn bits_in(&self, val: u32, id: u32) -> u8 {
        let mut bits = 0;
        self.visit_val(val, |e| {
            if entry_id(e) == id {
                bits |= entry_bits(e);
            }
        });
        bits
    }

    /// Tier bits of holder `id` on block `key` (0 when it holds nothing there).
    pub fn holder_bits(&self, key: u64, id: u32) -> u8 {
        self.blocks
            .find(key)
            .map_or(0, |(_, idx)| self.bits_in(self.blocks.val(idx), id))
    }

    /// The key of record `idx` when holder `id` has an entry there.
    fn held_key(&self, idx: u32, id: u32) -> Option<u64> {
        let key = self.blocks.key(idx)?;
        (self.bits_in(self.blocks.val(idx), id) != 0).then_some(key)
    }

    /// Every (block, entry) pair, for snapshots.
    pub fn for_each(&self, mut f: impl FnMut(u64, u32)) {
        self.blocks
            .for_each(|key, val| self.visit_val(val, |e| f(key, e)));
    }

    /// Add tier `bits` (non-zero) for holder `id` on block `key`. Idempotent.
    #[cfg(test)]
    pub fn add(&mut self, key: u64, id: u32, bits: u8) -> Added {
        self.add_at(key, id, bits).0
    }

    /// Add tier `bits` (non-zero) for holder `id` on block `key` (idempotent), also returning the
    /// block's record index when it exists afterwards.
    fn add_at(&mut self, key: u64, id: u32, bits: u8) -> (Added, Option<u32>) {
        let new = make_entry(id, bits);
        // One probe finds the block or where it goes; growing first keeps that place valid.
        self.blocks.reserve_one();
        let idx = match self.blocks.probe(key) {
            Probe::Found(_, idx) => idx,
            vacant => {
                // `None` only at the shard's record limit: refuse the entry, stay consistent.
                let idx = self.blocks.insert(key, new, vacant);
                let added = Added {
                    new_holder: idx.is_some(),
                    new_block: idx.is_some(),
                    repeat: false,
                };
                return (added, idx);
            }
        };
        let val = self.blocks.val(idx);
        let (val, added) = self.join(val, id, new);
        self.blocks.set_val(idx, val);
        (added, Some(idx))
    }

    /// `val` with entry `new` of holder `id` merged in.
    fn join(&mut self, val: u32, id: u32, new: u32) -> (u32, Added) {
        if is_inline(val) {
            if entry_id(val) == id {
                return (val | new, kept_or_repeated(val, new));
            }
            // `None` only when the arena is full: refuse the entry, stay consistent.
            return match self.arena.alloc(&[val, new]) {
                Some(off) => (spilled(off), JOINED),
                None => (val, KEPT),
            };
        }
        let off = spill_offset(val);
        if let Some(e) = self
            .arena
            .list_mut(off)
            .iter_mut()
            .find(|e| entry_id(**e) == id)
        {
            let added = kept_or_repeated(*e, new);
            *e |= new;
            return (val, added);
        }
        match self.arena.push(off, new) {
            Some(moved) => (spilled(moved), JOINED),
            None => (val, KEPT),
        }
    }

    /// Clear tier `bits` of holder `id` on block `key`. Idempotent; absent blocks are a no-op.
    pub fn remove(&mut self, key: u64, id: u32, bits: u8) -> Removed {
        match self.blocks.find(key) {
            Some((pos, idx)) => self.remove_found(pos, idx, id, bits),
            None => Removed::default(),
        }
    }

    fn remove_found(&mut self, pos: usize, idx: u32, id: u32, bits: u8) -> Removed {
        let val = self.blocks.val(idx);
        match self.leave(val, id, bits) {
            (Some(val), removed) => {
                self.blocks.set_val(idx, val);
                removed
            }
            (None, removed) => {
                self.blocks.remove(pos, idx);
                removed
            }
        }
    }

    /// `val` with tier `bits` of holder `id` cleared; `None` when no entry is left.
    fn leave(&mut self, val: u32, id: u32, bits: u8) -> (Option<u32>, Removed) {
        if is_inline(val) {
            if entry_id(val) != id {
                return (Some(val), Removed::default());
            }
            let left = entry_bits(val) & !bits;
            if left != 0 {
                return (Some(make_entry(id, left)), Removed::default());
            }
            return (None, GONE_BLOCK);
        }
        let off = spill_offset(val);
        let list = self.arena.list_mut(off);
        let Some(pos) = list.iter().position(|e| entry_id(*e) == id) else {
            return (Some(val), Removed::default());
        };
        let left = entry_bits(list[pos]) & !bits;
        if left != 0 {
            list[pos] = make_entry(id, left);
            return (Some(val), Removed::default());
        }
        // Back to an inline value at one entry; until then the chunk stays, so a holder that
        // comes and goes does not move the list each time.
        if self.arena.swap_remove(off, pos) <= 1 {
            let rest = self.arena.list(off).first().copied();
            self.arena.release(off);
            return match rest {
                Some(e) => (Some(e), GONE_HOLDER),
                None => (None, GONE_BLOCK),
            };
        }
        (Some(val), GONE_HOLDER)
    }
}

/// The shards of one context.
pub(crate) struct Table {
    shards: Box<[RwLock<Shard>]>,
    shard_seed: u64,
}

impl Table {
    pub fn new() -> Self {
        let slot_seed = random_seed();
        let shards = (0..1u32 << SHARD_BITS)
            .map(|_| RwLock::new(Shard::new(slot_seed)))
            .collect();
        // A second seed: the shard is picked from the top bits, and a shard's home slot also comes
        // from the top bits of its hash; the two must not be the same bits of the same hash.
        Table {
            shards,
            shard_seed: mix64(slot_seed ^ 0x5bd1_e995),
        }
    }

    /// The shard of `key`, below [`SHARDS`].
    #[inline]
    pub fn shard_no(&self, key: u64) -> usize {
        (mix64(key ^ self.shard_seed) >> (64 - SHARD_BITS)) as usize & (SHARDS - 1)
    }

    #[inline]
    fn shard_of(&self, key: u64) -> &RwLock<Shard> {
        &self.shards[self.shard_no(key)]
    }

    /// The shard lock and record index behind `r`.
    #[inline]
    fn resolve(&self, r: BlockRef) -> (&RwLock<Shard>, u32) {
        let shard = (r >> IDX_BITS) as usize & ((1 << SHARD_BITS) - 1);
        (&self.shards[shard], r & ((1 << IDX_BITS) - 1))
    }

    #[inline]
    pub fn read(&self, key: u64) -> RwLockReadGuard<'_, Shard> {
        read_lock(self.shard_of(key))
    }

    /// [`Shard::add`] for `items` (block, holder id, tier bits) of shard `shard`, in order, under
    /// one lock. `f` sees each item with its outcome and, when the holder joined the block, the
    /// reference that goes into its reverse list.
    pub fn add_group(
        &self,
        shard: usize,
        items: &[(u64, u32, u8)],
        mut f: impl FnMut((u64, u32, u8), Added, Option<BlockRef>),
    ) {
        let Some(lock) = self.shards.get(shard) else {
            return;
        };
        let mut guard = write_lock(lock);
        if items.len() > 1 {
            guard.blocks.reserve(items.len());
            // Read every item's home slot first: the reads do not depend on each other, so their
            // cache misses overlap instead of costing one full miss per item below.
            let touched = items
                .iter()
                .fold(0u32, |acc, it| acc ^ guard.blocks.home_slot(it.0));
            std::hint::black_box(touched);
        }
        for &item in items {
            let (added, idx) = guard.add_at(item.0, item.1, item.2);
            let r = idx
                .filter(|_| added.new_holder)
                .map(|idx| (shard as u32) << IDX_BITS | idx);
            f(item, added, r);
        }
    }

    /// Whether any holder keeps block `key`.
    pub fn contains(&self, key: u64) -> bool {
        self.read(key).visit(key, |_| {})
    }

    /// [`Shard::remove`] under the block's shard lock.
    #[inline]
    pub fn remove(&self, key: u64, id: u32, bits: u8) -> Removed {
        write_lock(self.shard_of(key)).remove(key, id, bits)
    }

    /// The key of the block behind `r` when holder `id` has an entry there.
    pub fn held_key(&self, r: BlockRef, id: u32) -> Option<u64> {
        let (shard, idx) = self.resolve(r);
        read_lock(shard).held_key(idx, id)
    }

    /// Remove every tier of holder `id` from the block behind `r`; the block's key and what
    /// changed, or `None` when the holder has no entry there (a stale reference).
    pub fn clear_at(&self, r: BlockRef, id: u32) -> Option<(u64, Removed)> {
        let (shard, idx) = self.resolve(r);
        let mut shard = write_lock(shard);
        let key = shard.held_key(idx, id)?;
        let (pos, found) = shard.blocks.find(key)?;
        debug_assert_eq!(found, idx);
        Some((key, shard.remove_found(pos, found, id, ALL_TIERS)))
    }

    pub fn shards(&self) -> impl Iterator<Item = RwLockReadGuard<'_, Shard>> {
        self.shards.iter().map(read_lock)
    }

    /// True when no shard lock is held by anyone (tests check that key hashing runs unlocked).
    #[cfg(test)]
    pub fn all_unlocked(&self) -> bool {
        self.shards.iter().all(|s| s.try_write().is_ok())
    }
}

/// A poisoned lock only means another thread panicked while holding it; every writer here leaves
/// the structure consistent between statements, so keep serving instead of cascading the panic.
pub(crate) fn read_lock<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn write_lock<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(shard: &Shard, key: u64) -> Vec<(u32, u8)> {
        let mut v = Vec::new();
        shard.visit(key, |e| v.push((entry_id(e), entry_bits(e))));
        v.sort_unstable();
        v
    }

    #[test]
    fn inline_then_spill_then_back() {
        let mut s = Shard::new(1);
        assert_eq!(
            s.add(7, 0, DEVICE),
            Added {
                new_holder: true,
                new_block: true,
                repeat: false
            }
        );
        assert_eq!(
            s.add(7, 0, DISK),
            Added {
                new_holder: false,
                new_block: false,
                repeat: false
            }
        );
        assert_eq!(
            s.add(7, 1, CPU_SHARE),
            Added {
                new_holder: true,
                new_block: false,
                repeat: false
            }
        );
        assert_eq!(
            s.add(7, 2, CPU_LOCAL),
            Added {
                new_holder: true,
                new_block: false,
                repeat: false
            }
        );
        assert_eq!(
            s.add(7, 3, DEVICE),
            Added {
                new_holder: true,
                new_block: false,
                repeat: false
            }
        );
        assert_eq!(
            entries(&s, 7),
            vec![
                (0, DEVICE | DISK),
                (1, CPU_SHARE),
                (2, CPU_LOCAL),
                (3, DEVICE)
            ]
        );
        assert_eq!(s.remove(7, 0, DEVICE), Removed::default());
        assert_eq!(
            s.remove(7, 0, DISK),
            Removed {
                holder_gone: true,
                block_gone: false
            }
        );
        assert_eq!(
            s.remove(7, 2, ALL_TIERS),
            Removed {
                holder_gone: true,
                block_gone: false
            }
        );
        assert_eq!(entries(&s, 7), vec![(1, CPU_SHARE), (3, DEVICE)]);
        assert_eq!(s.arena.free[MIN_CLASS as usize].len(), 1);
        assert_eq!(s.remove(7, 9, ALL_TIERS), Removed::default());
        assert_eq!(
            s.remove(7, 1, CPU_SHARE),
            Removed {
                holder_gone: true,
                block_gone: false
            }
        );
        assert_eq!(
            s.remove(7, 3, DEVICE),
            Removed {
                holder_gone: true,
                block_gone: true
            }
        );
        assert_eq!(s.len(), 0);
        assert!(!s.visit(7, |_| {}));
    }

    #[test]
    fn second_inline_entry_updates_in_place() {
        let mut s = Shard::new(1);
        s.add(1, 5, DEVICE);
        s.add(1, 6, CPU_LOCAL);
        s.add(1, 6, DISK);
        assert_eq!(entries(&s, 1), vec![(5, DEVICE), (6, CPU_LOCAL | DISK)]);
        assert_eq!(s.remove(1, 6, CPU_LOCAL), Removed::default());
        assert_eq!(s.holder_bits(1, 6), DISK);
        assert_eq!(
            s.remove(1, 5, DEVICE),
            Removed {
                holder_gone: true,
                block_gone: false
            }
        );
        assert_eq!(entries(&s, 1), vec![(6, DISK)]);
    }

    #[test]
    fn freed_chunks_are_reused() {
        let mut s = Shard::new(3);
        for id in 0..4 {
            s.add(10, id, DEVICE);
        }
        for id in 0..4 {
            s.remove(10, id, DEVICE);
        }
        for id in 0..4 {
            s.add(11, id, DEVICE);
        }
        assert_eq!(
            s.arena.words.len(),
            4 + 8,
            "one chunk of each class, reused"
        );
        assert_eq!(entries(&s, 11).len(), 4);
        for id in 4..40 {
            s.add(11, id, DISK);
        }
        assert_eq!(entries(&s, 11).len(), 40);
        for id in 0..39 {
            assert!(!s.remove(11, id, ALL_TIERS).block_gone);
        }
        assert_eq!(entries(&s, 11), vec![(39, DISK)]);
    }
}
