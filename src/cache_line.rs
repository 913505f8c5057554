//! A value alone on its cache lines.
//!
//! Readers of a context write a few words on every query (the table's reader count, the lock
//! words they take), and the context's writer writes others on every batch. Two such words on
//! one line make each side's write evict the line from the other core (false sharing): the
//! writer then misses on the words it reads on every operation (the table's seed, its shard
//! pointers) each time a reader has started a query. Words written by one side and read by the
//! other sit in a [`CacheLine`] (see "Readers and the writer" in `src/index/README.md`).

use std::ops::{Deref, DerefMut};

/// `T` aligned to, and padded to a multiple of, 128 bytes: two 64-byte lines, because x86's
/// adjacent-line prefetcher pulls lines in pairs, so a neighbour one line away still shares.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct CacheLine<T>(pub T);

impl<T> Deref for CacheLine<T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for CacheLine<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_takes_whole_line_pairs() {
        assert_eq!(std::mem::align_of::<CacheLine<u8>>(), 128);
        assert_eq!(std::mem::size_of::<CacheLine<u64>>(), 128);
        assert_eq!(std::mem::size_of::<[CacheLine<u64>; 2]>(), 256);
    }
}
