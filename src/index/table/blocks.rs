//! One shard's blocks: a dense array of records (key and 32-bit holder-set value) that never
//! move while the block lives, found through a Robin Hood open-addressing index of 32-bit slots.
//!
//! Why this shape: a block costs 12 bytes of record plus one 4-byte slot at 58–88 % load (about
//! 17–19 bytes), where a `HashMap<u64, u64>` costs 17 bytes per bucket at 44–87 % load. Records
//! keep their index for life, so a holder's reverse list can name a block by a `u32` instead of
//! its 64-bit key. Growing rehashes only the slot array, reading records in order, and by half
//! rather than doubling once a shard is past a few thousand blocks, which keeps the load high.
//!
//! A slot is 0 (empty) or `tag << 29 | dist << 25 | (record + 1)`: 3 bits of the key's hash
//! (most probes that are not the key are rejected without touching its record), the distance
//! from the key's home slot saturated at 15 (deletion by backward shift and the Robin Hood
//! early exit need it; only the rare entry displaced 15 or more slots costs a record read to
//! learn its exact distance), and the record index. Deletion shifts the following entries back,
//! so there are no tombstones and probe lengths never degrade under churn.
//!
//! A free record has value 0 (a live block's value never is) and links the free list through its
//! key.
//!
//! # Read without the shard lock
//!
//! The slots and records live in [`Arrays`] of atomic cells (plain loads and stores on x86), so
//! the query walk can read them while the shard's single writer changes them, validating each
//! read with the shard's version (`table::view`). Growing either array builds a new
//! [`Arrays`]; the old one is kept (`retired`) until no such reader can still be in it.

mod fill;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use super::mix64;
use super::prefetch::prefetch;

/// Bits of a slot holding `record + 1`.
pub(super) const IDX_BITS: u32 = 25;
/// Records per shard: `record + 1` must fit [`IDX_BITS`]. 64 shards x 2^25 blocks is far beyond
/// what fits in memory.
pub(super) const MAX_RECORDS: usize = (1 << IDX_BITS) - 1;
const IDX_MASK: u32 = (1 << IDX_BITS) - 1;
const DIST_SHIFT: u32 = IDX_BITS;
const DIST_SAT: u32 = 15;
const TAG_SHIFT: u32 = IDX_BITS + 4;
/// No record: above every record index (they stay below [`MAX_RECORDS`]).
pub(super) const NO_RECORD: u32 = u32::MAX;

/// Grow when the slots would pass 7/8 load.
const LOAD_NUM: usize = 7;
const LOAD_DEN: usize = 8;
const MIN_SLOTS: usize = 8;
const MIN_RECORDS: usize = 8;
/// Below this many slots (16 KiB) a shard doubles: its bytes hardly matter and every growth
/// rehashes it. Larger shards grow by half, so the load after growing is 58 %, not 44 %.
const DOUBLE_BELOW: usize = 4096;

/// Where a probe for a key ended.
pub(super) enum Probe {
    /// Slot position and record index.
    Found(usize, u32),
    /// Absent: the Robin Hood insertion point (an empty slot, or one whose entry is nearer its
    /// home than `dist`) and the key's distance from its home there.
    Vacant { pos: usize, dist: usize, hash: u64 },
}

/// A record as read: a block's key and value.
#[derive(Clone, Copy, Default)]
struct Record {
    key_lo: u32,
    key_hi: u32,
    val: u32,
}

impl Record {
    #[inline]
    fn key(self) -> u64 {
        u64::from(self.key_hi) << 32 | u64::from(self.key_lo)
    }
}

/// 12 bytes, 4-byte aligned: a record's key and value share a cache line on almost every lookup.
#[derive(Default)]
struct Cell {
    key_lo: AtomicU32,
    key_hi: AtomicU32,
    val: AtomicU32,
}

/// A shard's slots and records. Every access is an atomic load or store, so a lock-free reader
/// may look while the writer writes; such a read means something only once validated.
pub(super) struct Arrays {
    slots: Box<[AtomicU32]>,
    records: Box<[Cell]>,
}

#[inline]
const fn pack(idx1: u32, dist: usize, tag: u32) -> u32 {
    let d = if dist < DIST_SAT as usize {
        dist as u32
    } else {
        DIST_SAT
    };
    tag << TAG_SHIFT | d << DIST_SHIFT | idx1
}

#[inline]
const fn stored_dist(slot: u32) -> u32 {
    (slot >> DIST_SHIFT) & DIST_SAT
}

/// The hash that places `key` in a shard's slots, `seed` being the table's slot seed.
#[inline]
pub(super) const fn slot_hash(key: u64, seed: u64) -> u64 {
    mix64(key ^ seed)
}

/// Home slot of hash `h` among `len` slots: the hash's high bits scaled to the slot count, so any
/// count works (growing by half rather than doubling keeps the load, and so the bytes per block,
/// in a narrow band).
#[inline]
pub(super) const fn home_of(h: u64, len: usize) -> usize {
    ((h as u128 * len as u128) >> 64) as usize
}

#[inline]
const fn tag(h: u64) -> u32 {
    (h & 7) as u32
}

#[inline]
fn record_of(slot: u32) -> usize {
    (slot & IDX_MASK) as usize - 1
}

fn zeroed(n: usize) -> Box<[AtomicU32]> {
    (0..n).map(|_| AtomicU32::new(0)).collect()
}

impl Arrays {
    fn new(slots: usize, records: usize) -> Self {
        Arrays {
            slots: zeroed(slots),
            records: (0..records).map(|_| Cell::default()).collect(),
        }
    }

    #[inline]
    fn slot(&self, pos: usize) -> u32 {
        self.slots.get(pos).map_or(0, |s| s.load(Relaxed))
    }

    #[inline]
    fn set_slot(&self, pos: usize, v: u32) {
        if let Some(s) = self.slots.get(pos) {
            s.store(v, Relaxed);
        }
    }

    #[inline]
    fn rec(&self, i: usize) -> Record {
        self.records.get(i).map_or(Record::default(), |c| Record {
            key_lo: c.key_lo.load(Relaxed),
            key_hi: c.key_hi.load(Relaxed),
            val: c.val.load(Relaxed),
        })
    }

    #[inline]
    fn set_rec(&self, i: usize, r: Record) {
        if let Some(c) = self.records.get(i) {
            c.key_lo.store(r.key_lo, Relaxed);
            c.key_hi.store(r.key_hi, Relaxed);
            c.val.store(r.val, Relaxed);
        }
    }

    #[inline]
    fn next(&self, pos: usize) -> usize {
        if pos + 1 >= self.slots.len() {
            0
        } else {
            pos + 1
        }
    }

    /// Exact distance of the entry `slot` at `pos` from its home.
    fn dist(&self, seed: u64, pos: usize, slot: u32) -> usize {
        let d = stored_dist(slot);
        if d < DIST_SAT {
            return d as usize;
        }
        let len = self.slots.len();
        let home = home_of(slot_hash(self.rec(record_of(slot)).key(), seed), len);
        (pos + len - home) % len
    }

    /// Look `key` up. Ends within one pass over the slots and never panics, whatever a writer
    /// does meanwhile; without the shard lock, only a validated answer counts.
    #[inline]
    pub(super) fn probe(&self, seed: u64, key: u64) -> Probe {
        self.probe_at(seed, key, slot_hash(key, seed))
    }

    /// [`Self::probe`] with `key`'s slot hash `h` computed already.
    #[inline]
    pub(super) fn probe_at(&self, seed: u64, key: u64, h: u64) -> Probe {
        let len = self.slots.len();
        let tag = tag(h);
        let mut pos = home_of(h, len);
        let mut d = 0usize;
        while d < len {
            let s = self.slot(pos);
            if s == 0 {
                break;
            }
            let sd = stored_dist(s);
            let dd = d.min(DIST_SAT as usize) as u32;
            // Robin Hood order: an entry nearer its home than we are to ours means the key would
            // have taken that slot, so it is absent.
            if sd < dd {
                break;
            }
            if sd == dd && (dd == DIST_SAT || s >> TAG_SHIFT == tag) {
                let r = record_of(s);
                if self.rec(r).key() == key {
                    return Probe::Found(pos, r as u32);
                }
                if dd == DIST_SAT && self.dist(seed, pos, s) < d {
                    break;
                }
            }
            pos = self.next(pos);
            d += 1;
        }
        Probe::Vacant {
            pos,
            dist: d,
            hash: h,
        }
    }

    /// Bring in the cache line of the home slot of slot hash `h`.
    #[inline]
    pub(super) fn prefetch_slot(&self, h: u64) {
        let len = self.slots.len();
        if len > 0 {
            prefetch(self.slots.as_ptr().wrapping_add(home_of(h, len)));
        }
    }

    /// Bring in the cache line of the record of the first slot that may be the one of slot hash
    /// `h` (right distance from its home and matching tag), looking at a few slots (one cache
    /// line, brought in by [`Self::prefetch_slot`]) and no record. Returns that record's index
    /// ([`NO_RECORD`] when no slot matched): a hint for [`Self::value_at_hinted`].
    #[inline]
    pub(super) fn prefetch_record(&self, h: u64) -> u32 {
        let len = self.slots.len();
        let mut pos = home_of(h, len);
        for d in 0..8u32.min(len as u32) {
            let s = self.slot(pos);
            if s == 0 || stored_dist(s) < d {
                return NO_RECORD;
            }
            if stored_dist(s) == d && s >> TAG_SHIFT == tag(h) {
                let r = record_of(s);
                prefetch(self.records.as_ptr().wrapping_add(r));
                return r as u32;
            }
            pos = self.next(pos);
        }
        NO_RECORD
    }

    /// How many of `keys` the records after `r` hold in order, each with value `val` (not 0).
    #[inline]
    pub(super) fn follow(&self, r: u32, val: u32, keys: &[crate::model::BlockHash]) -> usize {
        let first = r as usize + 1;
        keys.iter()
            .enumerate()
            .take_while(|&(k, key)| {
                let rec = self.rec(first + k);
                rec.val == val && rec.key() == key.0
            })
            .count()
    }

    /// The value of record `r` when it is live block `key`'s, else 0 (also for [`NO_RECORD`]
    /// and past the end). A block has one record for life and a free record's value is 0 (its
    /// key field links the free list and may equal `key`), so a live record holding the key is
    /// the block's: the rule every record hint, the readers' and the writer's, is checked by.
    #[inline]
    pub(super) fn live_val(&self, r: u32, key: u64) -> u32 {
        let rec = self.rec(r as usize);
        if rec.key() == key { rec.val } else { 0 }
    }

    /// The value of `key` (slot hash `h`), 0 when absent (see [`Self::probe`] on reading
    /// without the lock), first trying record `hint` (from [`Self::prefetch_record`]): when
    /// it is the block's ([`Self::live_val`]) the probe over the slots is skipped. Any other
    /// record, or none, falls back to the probe. `hint` becomes the record that holds the key
    /// ([`NO_RECORD`] when none does).
    #[inline]
    pub(super) fn value_at_hinted(&self, seed: u64, key: u64, h: u64, hint: &mut u32) -> u32 {
        let val = self.live_val(*hint, key);
        if val != 0 {
            return val;
        }
        match self.probe_at(seed, key, h) {
            Probe::Found(_, idx) => {
                *hint = idx;
                self.rec(idx as usize).val
            }
            Probe::Vacant { .. } => {
                *hint = NO_RECORD;
                0
            }
        }
    }
}

pub(super) struct Blocks {
    arrays: Arc<Arrays>,
    /// Arrays replaced by larger ones, kept while a lock-free reader may still read them.
    retired: Vec<Arc<Arrays>>,
    /// Records handed out so far (live or free); the rest of `arrays.records` is spare.
    used: usize,
    /// `record + 1` of the first free record, 0 when none.
    free_head: u32,
    len: usize,
    seed: u64,
}

impl Blocks {
    pub(super) fn new(seed: u64) -> Self {
        Blocks {
            arrays: Arc::new(Arrays::new(0, 0)),
            retired: Vec::new(),
            used: 0,
            free_head: 0,
            len: 0,
            seed,
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The arrays lock-free readers should read from now on.
    pub(super) fn arrays_ptr(&self) -> *const Arrays {
        Arc::as_ptr(&self.arrays)
    }

    pub(super) fn has_retired(&self) -> bool {
        !self.retired.is_empty()
    }

    /// Free the replaced arrays: only once no lock-free reader can still hold them.
    pub(super) fn drop_retired(&mut self) {
        self.retired.clear();
    }

    fn replace_arrays(&mut self, new: Arrays) {
        let old = std::mem::replace(&mut self.arrays, Arc::new(new));
        self.retired.push(old);
    }

    #[inline]
    fn a(&self) -> &Arrays {
        &self.arrays
    }

    #[inline]
    fn hash(&self, key: u64) -> u64 {
        slot_hash(key, self.seed)
    }

    #[inline]
    fn home(&self, h: u64) -> usize {
        home_of(h, self.a().slots.len())
    }

    /// Slot position and record index of `key`.
    #[inline]
    pub(super) fn find(&self, key: u64) -> Option<(usize, u32)> {
        match self.a().probe(self.seed, key) {
            Probe::Found(pos, idx) => Some((pos, idx)),
            Probe::Vacant { .. } => None,
        }
    }

    /// Look `key` up; the slots must not be empty (see [`Self::reserve_one`]).
    #[cfg(test)]
    pub(super) fn probe(&self, key: u64) -> Probe {
        self.a().probe(self.seed, key)
    }

    /// [`Self::probe`] of `key` with its slot hash `h` computed already.
    #[inline]
    pub(super) fn probe_hashed(&self, key: u64, h: u64) -> Probe {
        self.a().probe_at(self.seed, key, h)
    }

    /// Record `hint` when it is live block `key`'s ([`Arrays::live_val`]); `None` for any
    /// other record, a free one, or [`NO_RECORD`].
    #[inline]
    pub(super) fn hinted_record(&self, key: u64, hint: u32) -> Option<u32> {
        (self.a().live_val(hint, key) != 0).then_some(hint)
    }

    /// Whether `n` more blocks fit without growing.
    #[inline]
    pub(super) fn has_room(&self, n: usize) -> bool {
        (self.len + n) * LOAD_DEN <= self.a().slots.len() * LOAD_NUM
    }

    /// Make room for `n` more blocks without growing in between.
    pub(super) fn reserve(&mut self, n: usize) {
        if !self.has_room(n) {
            self.grow_for(n);
        }
    }

    /// Make room for one more block, so that a following [`Self::probe`] can be followed by
    /// [`Self::insert`] at the position it found.
    #[inline]
    pub(super) fn reserve_one(&mut self) {
        if !self.has_room(1) {
            self.grow_for(1);
        }
    }

    #[inline]
    pub(super) fn val(&self, idx: u32) -> u32 {
        self.a().rec(idx as usize).val
    }

    /// The key of live record `idx`.
    pub(super) fn key(&self, idx: u32) -> Option<u64> {
        let r = self.a().rec(idx as usize);
        (r.val != 0).then(|| r.key())
    }

    #[inline]
    pub(super) fn set_val(&mut self, idx: u32, val: u32) {
        debug_assert!(val != 0, "a live block's value is never 0");
        if let Some(c) = self.a().records.get(idx as usize) {
            c.val.store(val, Relaxed);
        }
    }

    /// A record index for a new block: a free one, else the next unused one (growing the
    /// records when full); `None` at [`MAX_RECORDS`].
    fn take_record(&mut self) -> Option<u32> {
        if self.free_head != 0 {
            let idx = self.free_head - 1;
            self.free_head = self.a().rec(idx as usize).key_lo;
            return Some(idx);
        }
        if self.used >= MAX_RECORDS {
            return None;
        }
        if self.used == self.a().records.len() {
            let cap = (self.used * 2).clamp(MIN_RECORDS, MAX_RECORDS);
            let new = Arrays {
                slots: self
                    .a()
                    .slots
                    .iter()
                    .map(|s| AtomicU32::new(s.load(Relaxed)))
                    .collect(),
                records: (0..cap).map(|_| Cell::default()).collect(),
            };
            self.copy_records_into(&new);
            self.replace_arrays(new);
        }
        self.used += 1;
        Some((self.used - 1) as u32)
    }

    fn copy_records_into(&self, new: &Arrays) {
        for i in 0..self.used {
            new.set_rec(i, self.a().rec(i));
        }
    }

    /// Insert `key` with value `val` (non-zero) where `vacant` (a [`Probe::Vacant`] for `key`,
    /// with no change since) says; returns its record index, or `None` when the shard is at
    /// [`MAX_RECORDS`].
    pub(super) fn insert(&mut self, key: u64, val: u32, vacant: Probe) -> Option<u32> {
        let Probe::Vacant { pos, dist, hash } = vacant else {
            return None;
        };
        debug_assert!(val != 0 && self.find(key).is_none());
        let idx = self.take_record()?;
        self.a().set_rec(
            idx as usize,
            Record {
                key_lo: key as u32,
                key_hi: (key >> 32) as u32,
                val,
            },
        );
        self.place_from(pos, dist, (idx + 1, tag(hash)));
        self.len += 1;
        Some(idx)
    }

    /// Robin Hood insertion of slot `carry` (`record + 1`, tag) at `pos`, `d` slots from its
    /// home: walk on and hand each slot to whichever entry is farther from its own home.
    fn place_from(&mut self, mut pos: usize, mut d: usize, mut carry: (u32, u32)) {
        let a = &*self.arrays;
        loop {
            let s = a.slot(pos);
            if s == 0 {
                a.set_slot(pos, pack(carry.0, d, carry.1));
                return;
            }
            let sd = stored_dist(s);
            let poorer = if sd < DIST_SAT {
                (sd as usize) < d
            } else {
                d > DIST_SAT as usize && a.dist(self.seed, pos, s) < d
            };
            if poorer {
                let exact = a.dist(self.seed, pos, s);
                a.set_slot(pos, pack(carry.0, d, carry.1));
                carry = (s & IDX_MASK, s >> TAG_SHIFT);
                d = exact;
            }
            pos = a.next(pos);
            d += 1;
        }
    }

    /// Remove the block at slot `pos` (record `idx`, from [`Self::find`]): shift the following
    /// entries of its cluster one slot back, then free the record.
    pub(super) fn remove(&mut self, pos: usize, idx: u32) {
        let a = &*self.arrays;
        let mut hole = pos;
        loop {
            let nxt = a.next(hole);
            let s = a.slot(nxt);
            if s == 0 || stored_dist(s) == 0 {
                break;
            }
            let d = a.dist(self.seed, nxt, s);
            a.set_slot(hole, pack(s & IDX_MASK, d - 1, s >> TAG_SHIFT));
            hole = nxt;
        }
        a.set_slot(hole, 0);
        a.set_rec(
            idx as usize,
            Record {
                key_lo: self.free_head,
                key_hi: 0,
                val: 0,
            },
        );
        self.free_head = idx + 1;
        self.len -= 1;
    }

    /// Grow so that `n` more blocks fit.
    fn grow_for(&mut self, n: usize) {
        let old = self.a().slots.len();
        let step = if old < DOUBLE_BELOW { old } else { old / 2 };
        let mut cap = (old + step).max(MIN_SLOTS);
        while (self.len + n) * LOAD_DEN > cap * LOAD_NUM {
            cap += cap / 2;
        }
        let new = Arrays {
            slots: zeroed(cap),
            records: (0..self.a().records.len())
                .map(|_| Cell::default())
                .collect(),
        };
        self.copy_records_into(&new);
        self.replace_arrays(new);
        for i in 0..self.used {
            let r = self.a().rec(i);
            if r.val != 0 {
                let h = self.hash(r.key());
                self.place_from(self.home(h), 0, (i as u32 + 1, tag(h)));
            }
        }
    }

    /// Every live (key, value), in record order.
    pub(super) fn for_each(&self, mut f: impl FnMut(u64, u32)) {
        for i in 0..self.used {
            let r = self.a().rec(i);
            if r.val != 0 {
                f(r.key(), r.val);
            }
        }
    }

    /// A table with `slots` slots, for tests that aim keys at chosen homes.
    #[cfg(test)]
    pub(super) fn with_slots(seed: u64, slots: usize) -> Self {
        let mut b = Blocks::new(seed);
        b.arrays = Arc::new(Arrays::new(slots, 0));
        b
    }

    /// The home slot of `key` at the current size.
    #[cfg(test)]
    pub(super) fn home_of(&self, key: u64) -> usize {
        self.home(self.hash(key))
    }

    #[cfg(test)]
    pub(super) fn slot_count(&self) -> usize {
        self.a().slots.len()
    }

    #[cfg(test)]
    pub(super) fn slot_values(&self) -> Vec<u32> {
        (0..self.slot_count()).map(|p| self.a().slot(p)).collect()
    }

    /// Test support: every slot holds an entry at its true distance, in Robin Hood order, and
    /// each live record is found at its slot.
    #[cfg(test)]
    pub(super) fn check(&self) {
        let slots = self.slot_values();
        let n = slots.len();
        let mut live = 0;
        for (pos, &s) in slots.iter().enumerate() {
            if s == 0 {
                continue;
            }
            live += 1;
            let r = self.a().rec(record_of(s));
            assert_ne!(r.val, 0, "slot {pos} names a free record");
            let h = self.hash(r.key());
            assert_eq!(s >> TAG_SHIFT, tag(h));
            let d = (pos + n - self.home(h)) % n;
            assert_eq!(stored_dist(s) as usize, d.min(DIST_SAT as usize));
            let prev = slots[(pos + n - 1) % n];
            if d > 0 {
                assert_ne!(prev, 0, "a gap before displaced slot {pos}");
                let pd = self.a().dist(self.seed, (pos + n - 1) % n, prev);
                assert!(pd + 1 >= d, "Robin Hood order broken at {pos}");
            }
            assert_eq!(self.find(r.key()).map(|f| f.0), Some(pos));
        }
        assert_eq!(live, self.len);
        let live_records = (0..self.used).filter(|&i| self.a().rec(i).val != 0).count();
        assert_eq!(live_records, self.len);
    }
}
