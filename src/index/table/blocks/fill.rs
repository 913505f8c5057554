//! Filling an empty shard in one pass, for a context rebuilt from a checkpoint or a snapshot.
//!
//! Why: inserted one at a time, a restored block costs a random probe into its shard's slots
//! and a random record write, and the shard rehashes every record about nine times on its way
//! from empty to its final size (growth by half). Given every block of the shard at once,
//! sorted by slot hash (so by home slot, at any slot count), the records are written in order
//! and each slot is the first free one at or after the block's home: two sequential streams,
//! no probe and no rehash. That is the Robin Hood order itself (homes never decrease along a
//! cluster), so the result is the table the one-at-a-time inserts would have built, slot
//! positions aside.

use super::{
    Arrays, Blocks, MAX_RECORDS, MIN_RECORDS, MIN_SLOTS, Record, home_of, pack, slot_hash, tag,
};

/// Slots per block after a fill: 4/5 load, inside the 58–88 % band that growth keeps a live
/// shard in, so a restored shard costs the memory of a live one and probes as briefly, and its
/// first inserts after the restart do not grow it at once.
const FILL_NUM: usize = 4;
const FILL_DEN: usize = 5;

impl Blocks {
    /// Fill this shard, which must be empty, with `recs`: distinct keys with non-zero values,
    /// sorted by [`slot_hash`] under this shard's seed. Record `i` is `recs[i]`. Returns how
    /// many were placed: all of them, or the first [`MAX_RECORDS`].
    pub(in crate::index::table) fn fill_sorted(&mut self, recs: &[(u64, u32)]) -> usize {
        debug_assert!(
            self.len == 0 && self.used == 0,
            "fill_sorted needs an empty shard"
        );
        let recs = &recs[..recs.len().min(MAX_RECORDS)];
        let n = recs.len();
        let slots = (n * FILL_DEN).div_ceil(FILL_NUM).max(MIN_SLOTS);
        let a = Arrays::new(slots, n.max(MIN_RECORDS));
        // Blocks whose cluster runs past the last slot: they wrap to the front, which the
        // sequential pass has not reached in home order, so they go in afterwards.
        let mut wrapped = Vec::new();
        let mut next = 0usize;
        let mut last_home = 0usize;
        for (i, &(key, val)) in recs.iter().enumerate() {
            debug_assert!(val != 0, "a live block's value is never 0");
            a.set_rec(
                i,
                Record {
                    key_lo: key as u32,
                    key_hi: (key >> 32) as u32,
                    val,
                },
            );
            let h = slot_hash(key, self.seed);
            let home = home_of(h, slots);
            debug_assert!(home >= last_home, "records not sorted by slot hash");
            last_home = home;
            let pos = home.max(next);
            if pos >= slots {
                wrapped.push(i);
                continue;
            }
            a.set_slot(pos, pack(i as u32 + 1, pos - home, tag(h)));
            next = pos + 1;
        }
        self.replace_arrays(a);
        self.used = n;
        self.len = n;
        for i in wrapped {
            let h = slot_hash(recs[i].0, self.seed);
            self.place_from(self.home(h), 0, (i as u32 + 1, tag(h)));
        }
        n
    }
}

impl Blocks {
    /// Every live record's index and value, in record order (the reverse lists of a filled
    /// table are built from these).
    pub(in crate::index::table) fn for_each_record(&self, mut f: impl FnMut(u32, u32)) {
        for i in 0..self.used {
            let r = self.a().rec(i);
            if r.val != 0 {
                f(i as u32, r.val);
            }
        }
    }
}
