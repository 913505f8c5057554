//! The walk's look-ahead: the blocks located ahead of the one it looks up, so that the cache
//! misses of consecutive blocks overlap (see `table::prefetch`). A block's slot line is asked
//! for [`PREFETCH_AHEAD`] blocks before its lookup, and, once that line is in, its record line
//! [`RECORD_AHEAD`] blocks before. The walk itself (`query`) only reads the four phases of its
//! semantics; this type keeps the ring of located blocks.

use crate::hashing::PrefixKeys;

use crate::index::table::{Located, Reading, Table};

/// How many blocks ahead of the one it looks up the walk prefetches a block's slot line, and
/// (once that line is in) its record line. It is also how far past the walk the keys are asked
/// for: a walk that stops at block `m` has asked for at most `PREFETCH_AHEAD - 1` keys it did
/// not need (a derived chain links in bursts beyond that, see `DerivedChain`; the registered
/// profile's chain, asked only for raw pairs, is never hashed ahead). Deciding figures, on the
/// side-by-side benchmark: 8 and 4 against no prefetch take a 2,048-token query by keys from
/// 9.4 to 6.5 us, and starting at the full distance rather than growing it from 2 saves a
/// further 3-5 % (most walks there are short).
pub(in crate::index) const PREFETCH_AHEAD: usize = 8;
const RECORD_AHEAD: usize = 4;
/// Located blocks kept: the prefetch window and the block looked up.
const LOCATED: usize = 16;
const _: () = assert!(PREFETCH_AHEAD < LOCATED);

/// Blocks below this have their keys asked for (and their slots prefetched) at walk step `c`.
#[inline]
pub(in crate::index) fn prefetch_window(c: usize, n: usize) -> usize {
    (c + PREFETCH_AHEAD).min(n)
}

/// The ring of located blocks of one walk.
pub(in crate::index) struct Lookahead {
    located: [Located; LOCATED],
    /// Blocks below this were located and their slot lines asked for.
    ahead: usize,
}

impl Lookahead {
    pub(in crate::index) fn new() -> Self {
        Lookahead {
            located: [Located::default(); LOCATED],
            ahead: 0,
        }
    }

    /// Before the lookup of block `c` of `n`: locate the blocks up to the prefetch window
    /// (hashing their keys, outside any lock) and ask for their slot lines, then for the
    /// record line of block `c + RECORD_AHEAD`.
    #[inline]
    pub(in crate::index) fn prepare<K: PrefixKeys + ?Sized>(
        &mut self,
        table: &Table,
        reading: &Reading<'_>,
        keys: &mut K,
        c: usize,
        n: usize,
    ) {
        let window = prefetch_window(c, n);
        while self.ahead < window {
            let i = self.ahead;
            let at = table.locate(keys.key(i).0);
            // A block in its predecessor's shard is most likely in the record after its
            // predecessor's (see "Segments" in the index README): its slot line waits for that
            // guess.
            let in_segment = i > 0 && at.same_shard(&self.located[(i - 1) % LOCATED]);
            if !in_segment {
                table.prefetch(reading, at);
            }
            self.located[i % LOCATED] = at;
            self.ahead += 1;
        }
        if c + RECORD_AHEAD < self.ahead {
            let i = c + RECORD_AHEAD;
            let before = self.located[(i - 1) % LOCATED];
            let later = &mut self.located[i % LOCATED];
            if later.same_shard(&before) {
                table.guess_record_after(reading, later, &before);
            } else {
                table.locate_record_after(reading, later, &before);
            }
        }
    }

    /// Block `c`'s place for its lookup. The first blocks were never located ahead: their
    /// records may follow the block before.
    #[inline]
    pub(in crate::index) fn at(&self, c: usize) -> Located {
        let mut at = self.located[c % LOCATED];
        if c > 0 {
            at.after(&self.located[(c - 1) % LOCATED]);
        }
        at
    }

    /// What the lookup of block `c` found (its record), for the guesses of the blocks after.
    #[inline]
    pub(in crate::index) fn found(&mut self, c: usize, at: Located) {
        self.located[c % LOCATED] = at;
    }

    /// The walk followed a run from `at` up to block `c - 1`, whose key is `key`.
    #[inline]
    pub(in crate::index) fn followed(&mut self, c: usize, at: &Located, run: usize, key: u64) {
        self.located[(c - 1) % LOCATED] = at.followed(run, key);
        self.ahead = self.ahead.max(c);
    }
}
