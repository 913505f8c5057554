//! The lock-free read API the query walk uses: a block's place ([`Located`]), lookups, prefetch
//! hints and record guesses, and following a stored run, all through a [`Reading`] (see
//! `seqlock`).

use super::*;

/// A block key, its slot hash (see [`Table::locate`]) and, once [`Table::locate_record`] found
/// one, the record that may hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Located {
    pub key: u64,
    pub(super) hash: u64,
    pub(super) record: u32,
    pub(super) shard: u32,
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
    pub(super) fn record_after(&self, before: &Located) -> u32 {
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

impl Table {
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
}
