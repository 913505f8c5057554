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
//!
//! Files, by who reads them: `entry` the entry encoding and change outcomes everyone uses;
//! `walk` the lock-free read API of the query walk ([`Located`], lookups, hints); `write` the
//! writer's side and the locked readers ([`Shard`], [`WriterSlot`], [`ShardRead`]); `seqlock`
//! and `view` the lock-free protocol and a shard's write section; `blocks` a shard's records and
//! slots; `sets`, `set_index` and `arena` the interned holder sets; `fill` a whole table built
//! at once. This file holds the [`Table`] itself and how a key picks its shard.

#[cfg(test)]
mod add_hint_tests;
mod arena;
mod blocks;
#[cfg(test)]
mod blocks_tests;
mod entry;
mod fill;
#[cfg(test)]
mod hint_tests;
mod lock_order;
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
mod walk;
mod write;

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::cache_line::CacheLine;
use blocks::{Arrays, Blocks, IDX_BITS, NO_RECORD, Probe};
pub(crate) use entry::*;
pub(crate) use prefetch::prefetch as prefetch_line;
pub(crate) use sets::is_inline;
use sets::{SetWriter, Sets};
pub(crate) use view::Reading;
use view::{ShardView, ShardWrite};
pub(crate) use walk::Located;
pub(crate) use write::{Shard, read_lock, write_lock};

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

/// Keys are mixed before they pick a shard and a slot (see [`crate::mix`]).
pub(crate) use crate::mix::mix64;

/// A per-process random seed, so a publisher cannot aim keys at one probe cluster.
pub(crate) fn random_seed() -> u64 {
    std::hash::RandomState::new().hash_one(0x6d6f_6f6e_u64)
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
    /// Lock-free readers in flight (see [`view`]). Every query writes it twice: alone on its
    /// lines, so that the writer's reads of the fields around it do not miss (see
    /// [`CacheLine`]).
    readers: CacheLine<AtomicUsize>,
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
            readers: CacheLine(AtomicUsize::new(0)),
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
}
