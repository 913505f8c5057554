//! The writer's side of the table and its locked readers: a shard ([`Shard`]) and its write
//! section, the sets' writer state ([`WriterSlot`]), adds and removes, and reads under a shard's
//! read lock ([`ShardRead`]).

use super::*;

/// One shard of a context's blocks.
pub(crate) struct Shard {
    pub(super) blocks: Blocks,
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
    pub(super) fn new(seed: u64) -> Self {
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
    /// The removal and the record it was on (0 when the key is absent).
    fn remove(&mut self, w: &mut WriterSlot, key: u64, id: u32, bits: u8) -> (Removed, u32) {
        match self.blocks.find(key) {
            Some((pos, idx)) => (self.remove_found(w, pos, idx, id, bits), idx),
            None => (Removed::default(), 0),
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

impl Table {
    /// Shard `shard` under its write lock, inside a write section of its view, with room for
    /// `room` more blocks made *before* the section opens: a growth builds the new arrays while
    /// readers still read the old ones, which nothing changes meanwhile (this lock excludes every
    /// other writer), so the section only publishes the new pointer and readers never wait for
    /// a rehash.
    pub(super) fn write(&self, shard: usize, room: usize) -> ShardWrite<'_> {
        super::lock_order::outer("a shard lock");
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
            shard: shard_read(self.shard_of(key)),
            sets: &self.sets,
        }
    }

    /// The sets' writer state for a series of [`Self::add_each`] or [`Self::remove_at`]
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
        self.remove_at(&mut self.writer(), key, id, bits).0
    }

    /// [`Self::remove`] with the sets' writer state of a series of calls ([`Self::writer`]),
    /// and the reference of the block's record: the one the holder's
    /// reverse list got when it joined, stale once `holder_gone`.
    #[inline]
    pub fn remove_at(
        &self,
        w: &mut WriterSlot<'_>,
        key: u64,
        id: u32,
        bits: u8,
    ) -> (Removed, BlockRef) {
        let shard = self.shard_no(key);
        let (removed, idx) = self.write(shard, 0).remove(w, key, id, bits);
        (removed, (shard as u32) << IDX_BITS | idx)
    }

    /// The key of the block behind `r` when holder `id` has an entry there.
    pub fn held_key(&self, r: BlockRef, id: u32) -> Option<u64> {
        let (shard, idx) = self.resolve(r);
        shard_read(&self.shards[shard]).held_key(&self.sets, idx, id)
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
            shard: shard_read(s),
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

/// A shard under its read lock, taken in the lock order (see `lock_order`).
pub(super) fn shard_read(lock: &RwLock<Shard>) -> RwLockReadGuard<'_, Shard> {
    super::lock_order::outer("a shard lock");
    read_lock(lock)
}
