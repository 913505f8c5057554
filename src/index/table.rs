//! The block table: 64-bit block key → compact set of (holder id, tier bits), split into shards
//! that each sit behind their own `std::sync::RwLock`.
//!
//! Layout of one block's holder set (a `u64` slot in the shard's map):
//! - inline, for one or two holders (the common case: a block held by one rank, perhaps also on a
//!   shared tier): the low 32 bits are the first entry, the high 32 bits the second entry or 0.
//!   An entry is `holder_id << 4 | tier_bits` and its tier bits are never 0, so the low half of an
//!   inline slot is never 0;
//! - spilled, for three or more holders: the low 32 bits are 0 and the high 32 bits are the
//!   offset of the entry list in the shard's arena.
//!
//! Empty holder sets are never kept: the last removed entry removes the block.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::model::Tier;

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

/// The splitmix64 finalizer: a bijective mix, so distinct keys never collide after mixing and
/// sequential or adversarially structured keys still spread over shards and buckets.
#[inline]
pub(crate) const fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A per-process random seed, so a publisher cannot aim keys at one bucket chain.
pub(crate) fn random_seed() -> u64 {
    std::hash::RandomState::new().hash_one(0x6d6f_6f6e_u64)
}

/// Hasher for the u64 keys of a shard map (block keys are already digests; one mix suffices).
#[derive(Clone, Copy)]
pub(crate) struct MixState(u64);

pub(crate) struct MixHasher(u64);

impl BuildHasher for MixState {
    type Hasher = MixHasher;
    fn build_hasher(&self) -> MixHasher {
        MixHasher(self.0)
    }
}

impl Hasher for MixHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed; this keeps the trait contract for anything else.
        for &b in bytes {
            self.0 = mix64(self.0 ^ u64::from(b));
        }
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = mix64(self.0 ^ v);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// What an insertion changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Added {
    /// The holder had no entry on this block before.
    pub new_holder: bool,
    /// The block was absent from the table before.
    pub new_block: bool,
}

/// What a removal changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Removed {
    /// The holder's entry on this block disappeared (its last tier bit went).
    pub holder_gone: bool,
    /// The block disappeared from the table (its last holder went).
    pub block_gone: bool,
}

/// Holder lists of blocks with three or more holders, packed into one `Vec<u32>` per shard
/// instead of one heap allocation per block (a `Vec` header alone would cost 24 bytes). A list
/// lives in a chunk of `2^class` words: a header word (`len << 5 | class`) and its entries.
/// Freed chunks are kept per class for reuse.
#[derive(Default)]
struct Arena {
    words: Vec<u32>,
    free: Vec<Vec<u32>>,
}

const MIN_CLASS: u32 = 2;

impl Arena {
    fn header(&self, off: u32) -> (usize, u32) {
        let h = self.words.get(off as usize).copied().unwrap_or(0);
        ((h >> 5) as usize, h & 31)
    }

    fn list(&self, off: u32) -> &[u32] {
        let (len, _) = self.header(off);
        let start = off as usize + 1;
        self.words.get(start..start + len).unwrap_or(&[])
    }

    fn list_mut(&mut self, off: u32) -> &mut [u32] {
        let (len, _) = self.header(off);
        let start = off as usize + 1;
        self.words.get_mut(start..start + len).unwrap_or(&mut [])
    }

    /// A chunk holding `items`; `None` only when offsets would overflow `u32`.
    fn alloc(&mut self, items: &[u32]) -> Option<u32> {
        let mut class = MIN_CLASS;
        while (1usize << class) <= items.len() {
            class += 1;
        }
        if class > 27 {
            return None;
        }
        let off = match self.free.get_mut(class as usize).and_then(Vec::pop) {
            Some(off) => off,
            None => {
                let off = u32::try_from(self.words.len()).ok()?;
                let end = self
                    .words
                    .len()
                    .checked_add(1 << class)
                    .filter(|&e| e <= u32::MAX as usize)?;
                self.words.resize(end, 0);
                off
            }
        };
        let o = off as usize;
        self.words[o] = (items.len() as u32) << 5 | class;
        self.words[o + 1..o + 1 + items.len()].copy_from_slice(items);
        Some(off)
    }

    fn release(&mut self, off: u32) {
        let (_, class) = self.header(off);
        if self.free.len() <= class as usize {
            self.free.resize_with(class as usize + 1, Vec::new);
        }
        self.free[class as usize].push(off);
    }

    /// Append `entry`; returns the list's (possibly moved) offset.
    fn push(&mut self, off: u32, entry: u32) -> Option<u32> {
        let (len, class) = self.header(off);
        if len + 1 < 1 << class {
            let o = off as usize;
            self.words[o + 1 + len] = entry;
            self.words[o] = ((len + 1) as u32) << 5 | class;
            return Some(off);
        }
        let mut items = self.list(off).to_vec();
        items.push(entry);
        let new = self.alloc(&items)?;
        self.release(off);
        Some(new)
    }

    /// Remove the entry at `pos` (order is not kept); returns the new length.
    fn swap_remove(&mut self, off: u32, pos: usize) -> usize {
        let (len, class) = self.header(off);
        let o = off as usize;
        if pos < len {
            self.words[o + 1 + pos] = self.words[o + len];
            self.words[o] = ((len - 1) as u32) << 5 | class;
            return len - 1;
        }
        len
    }
}

const KEPT: Added = Added {
    new_holder: false,
    new_block: false,
};
const JOINED: Added = Added {
    new_holder: true,
    new_block: false,
};
const GONE_HOLDER: Removed = Removed {
    holder_gone: true,
    block_gone: false,
};
const GONE_BLOCK: Removed = Removed {
    holder_gone: true,
    block_gone: true,
};

/// One shard of a context's blocks.
pub(crate) struct Shard {
    map: HashMap<u64, u64, MixState>,
    arena: Arena,
}

impl Shard {
    pub fn new(seed: u64) -> Self {
        Shard {
            map: HashMap::with_hasher(MixState(seed)),
            arena: Arena::default(),
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Call `f` with every entry of block `key`; false when the block is absent.
    #[inline]
    pub fn visit(&self, key: u64, mut f: impl FnMut(u32)) -> bool {
        let Some(&slot) = self.map.get(&key) else {
            return false;
        };
        let low = slot as u32;
        if low != 0 {
            f(low);
            let high = (slot >> 32) as u32;
            if high != 0 {
                f(high);
            }
        } else {
            self.arena
                .list((slot >> 32) as u32)
                .iter()
                .copied()
                .for_each(f);
        }
        true
    }

    /// Tier bits of holder `id` on block `key` (0 when it holds nothing there).
    pub fn holder_bits(&self, key: u64, id: u32) -> u8 {
        let mut bits = 0;
        self.visit(key, |e| {
            if entry_id(e) == id {
                bits |= entry_bits(e);
            }
        });
        bits
    }

    /// Every (block, entry) pair, for snapshots.
    pub fn for_each(&self, mut f: impl FnMut(u64, u32)) {
        for &key in self.map.keys() {
            self.visit(key, |e| f(key, e));
        }
    }

    /// Add tier `bits` (non-zero) for holder `id` on block `key`. Idempotent.
    pub fn add(&mut self, key: u64, id: u32, bits: u8) -> Added {
        let new = make_entry(id, bits);
        let Some(slot) = self.map.get_mut(&key) else {
            self.map.insert(key, u64::from(new));
            return Added {
                new_holder: true,
                new_block: true,
            };
        };
        let low = *slot as u32;
        let high = (*slot >> 32) as u32;
        if low == 0 {
            if let Some(e) = self
                .arena
                .list_mut(high)
                .iter_mut()
                .find(|e| entry_id(**e) == id)
            {
                *e |= new;
                return KEPT;
            }
            // `None` only at 2^32 words in one shard: refuse the entry, stay consistent.
            let Some(moved) = self.arena.push(high, new) else {
                return KEPT;
            };
            *slot = u64::from(moved) << 32;
            return JOINED;
        }
        if entry_id(low) == id {
            *slot |= u64::from(new);
            return KEPT;
        }
        if high != 0 && entry_id(high) == id {
            *slot |= u64::from(new) << 32;
            return KEPT;
        }
        if high == 0 {
            *slot |= u64::from(new) << 32;
            return JOINED;
        }
        let Some(off) = self.arena.alloc(&[low, high, new]) else {
            return KEPT;
        };
        *slot = u64::from(off) << 32;
        JOINED
    }

    /// Clear tier `bits` of holder `id` on block `key`. Idempotent; absent blocks are a no-op.
    pub fn remove(&mut self, key: u64, id: u32, bits: u8) -> Removed {
        let Some(slot) = self.map.get_mut(&key) else {
            return Removed::default();
        };
        let low = *slot as u32;
        let high = (*slot >> 32) as u32;
        if low != 0 {
            let (hit, other) = if entry_id(low) == id {
                (low, high)
            } else if high != 0 && entry_id(high) == id {
                (high, low)
            } else {
                return Removed::default();
            };
            let left = entry_bits(hit) & !bits;
            if left != 0 {
                let kept = u64::from(make_entry(id, left));
                *slot = if hit == low {
                    (*slot & !0xFFFF_FFFF) | kept
                } else {
                    (*slot & 0xFFFF_FFFF) | kept << 32
                };
                return Removed::default();
            }
            if other != 0 {
                *slot = u64::from(other);
                return GONE_HOLDER;
            }
            self.map.remove(&key);
            return GONE_BLOCK;
        }
        let list = self.arena.list_mut(high);
        let Some(pos) = list.iter().position(|e| entry_id(*e) == id) else {
            return Removed::default();
        };
        let left = entry_bits(list[pos]) & !bits;
        if left != 0 {
            list[pos] = make_entry(id, left);
            return Removed::default();
        }
        if self.arena.swap_remove(high, pos) <= 2 {
            let rest = self.arena.list(high);
            let first = rest.first().copied().unwrap_or(0);
            let second = rest.get(1).copied().unwrap_or(0);
            self.arena.release(high);
            if first == 0 {
                self.map.remove(&key);
                return GONE_BLOCK;
            }
            *slot = u64::from(first) | u64::from(second) << 32;
        }
        GONE_HOLDER
    }
}

/// The shards of one context.
pub(crate) struct Table {
    shards: Box<[RwLock<Shard>]>,
    shard_seed: u64,
}

impl Table {
    pub fn new() -> Self {
        let map_seed = random_seed();
        let shards = (0..1u32 << SHARD_BITS)
            .map(|_| RwLock::new(Shard::new(map_seed)))
            .collect();
        // A second seed: the shard is picked from the top bits, and hashbrown also tags buckets
        // with the top bits of the map hash; the two must not be the same bits of the same hash.
        Table {
            shards,
            shard_seed: mix64(map_seed ^ 0x5bd1_e995),
        }
    }

    #[inline]
    fn shard_of(&self, key: u64) -> &RwLock<Shard> {
        let i = (mix64(key ^ self.shard_seed) >> (64 - SHARD_BITS)) as usize;
        &self.shards[i & ((1 << SHARD_BITS) - 1)]
    }

    #[inline]
    pub fn read(&self, key: u64) -> RwLockReadGuard<'_, Shard> {
        read_lock(self.shard_of(key))
    }

    #[inline]
    pub fn write(&self, key: u64) -> RwLockWriteGuard<'_, Shard> {
        write_lock(self.shard_of(key))
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
                new_block: true
            }
        );
        assert_eq!(
            s.add(7, 0, DISK),
            Added {
                new_holder: false,
                new_block: false
            }
        );
        assert_eq!(
            s.add(7, 1, CPU_SHARE),
            Added {
                new_holder: true,
                new_block: false
            }
        );
        assert_eq!(
            s.add(7, 2, CPU_LOCAL),
            Added {
                new_holder: true,
                new_block: false
            }
        );
        assert_eq!(
            s.add(7, 3, DEVICE),
            Added {
                new_holder: true,
                new_block: false
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
